# bash completion for idemctl (commands, subcommands, flags and the values of a few flags:
# --policy, --outcome, -o, bench's --workload).
# Install: copy to /usr/share/bash-completion/completions/idemctl (cmake --install does), or
# `source tools/completion/idemctl.bash` in a shell. docs/idemctl.md is the manual.

_idemctl_flags_of() {
    # The flags of one command word (and its subcommand), --json --deadline --help included.
    local cmd=$1 sub=$2 common="--json -o --deadline --help"
    case "$cmd" in
        status) echo "--digest --max-lag --max-lag-entries --max-lag-ms --check $common" ;;
        version) echo "--client $common" ;;
        members|transfer) echo "$common" ;;
        snapshot) echo "--node $common" ;;
        reload) echo "--node --all $common" ;;
        key)
            case "$sub" in
                get) echo "--reveal $common" ;;
                resolve) echo "--release --status --body $common" ;;
                *) echo "$common" ;;
            esac ;;
        quarantine) echo "--tenant --limit --reveal --lease-ended $common" ;;
        resolve) echo "--tenant --release --status --body $common" ;;
        claim) echo "--fingerprint --attempt --lease --ttl --policy --request-body --method" \
                    "--path --content-type --tenant --fingerprint-field" \
                    "--fingerprint-ignore $common" ;;
        complete) echo "--token --status --body --outcome $common" ;;
        release) echo "--token $common" ;;
        renew) echo "--token --lease $common" ;;
        get) echo "$common" ;;
        bench) echo "--cluster --token --workload --concurrency --threads --rate" \
                    "--connections --keys --duration --requests --deadline --no-histogram" \
                    "--timeline --stall-probe --json --tls --tls-ca --tls-cert --tls-key" \
                    "--tls-server-name --help" ;;
    esac
}

_idemctl_split() {
    # Splits $1, the command line up to the cursor, into the caller's array words as the shell
    # will split it: at blanks outside quotes, the quotes and backslashes removed ('a b', "a b"
    # and a\ b are each the one word "a b"). The last word is the one being completed, empty
    # after a blank.
    # Sets the caller's keep to the start of that last word (unquoted) which bash will NOT
    # replace with a completion. Readline completes only the text after the last unquoted
    # COMP_WORDBREAKS character of the word (':' '=' '@' ...), '@' itself included, or the
    # text after the opening quote if a quote is still open; the completions must hold only
    # that text (bash-completion's __ltrim_colon_completions does this for ':').
    local line=$1 i c w="" inword=0 q="" qkeep=0
    words=()
    keep=""
    for ((i = 0; i < ${#line}; i++)); do
        c=${line:i:1}
        if [ "$q" = "'" ]; then
            # Everything is literal in single quotes, up to the closing one.
            if [ "$c" = "'" ]; then q=""; else w+=$c; fi
        elif [ "$q" = '"' ]; then
            # In double quotes a backslash quotes only $ ` " \ (and newline).
            if [ "$c" = '"' ]; then
                q=""
            elif [ "$c" = "\\" ] && [[ "${line:i+1:1}" == [\$\`\"\\$'\n'] ]]; then
                i=$((i + 1)); w+=${line:i:1}
            else
                w+=$c
            fi
        elif [[ "$c" == [[:space:]] ]]; then
            [ "$inword" -eq 1 ] && words+=("$w")
            w=""; inword=0; keep=""
        else
            inword=1
            if [ "$c" = "\\" ]; then
                i=$((i + 1)); w+=${line:i:1}
            elif [ "$c" = "'" ] || [ "$c" = '"' ]; then
                q=$c; qkeep=${#w}
            else
                w+=$c
                if [ "$c" = "@" ]; then
                    [[ "${COMP_WORDBREAKS-}" == *@* ]] && keep=${w%@}
                elif [[ "${COMP_WORDBREAKS-}" == *"$c"* ]]; then
                    keep=$w
                fi
            fi
        fi
    done
    words+=("$w")
    [ -n "$q" ] && keep=${w:0:qkeep}
    return 0
}

_idemctl() {
    local cur prev words cword keep="" i
    # The words typed so far. Bash's COMP_WORDS is split at ':' and '=' too
    # (COMP_WORDBREAKS), so "--cluster 127.0.0.1:7001" would arrive as four words: take the
    # line up to the cursor instead and split it at blanks only, as the shell will (a
    # "--name=value" stays one word, and so does a quoted value with blanks in it).
    if [ -n "${COMP_LINE+set}" ] && [ -n "${COMP_POINT+set}" ]; then
        _idemctl_split "${COMP_LINE:0:COMP_POINT}"
    else
        words=("${COMP_WORDS[@]:0:COMP_CWORD+1}")
    fi
    cword=$((${#words[@]} - 1))
    cur=${words[cword]}
    prev=""
    [ "$cword" -gt 0 ] && prev=${words[cword-1]}
    COMPREPLY=()
    _idemctl_complete
    # Bash puts a completion in place of the text after the last ':' (say) of the word only:
    # drop what comes before from each, or "./a:b/c" would become "./a:./a:b/ca.pem".
    if [ -n "$keep" ]; then
        for i in "${!COMPREPLY[@]}"; do
            COMPREPLY[i]=${COMPREPLY[i]#"$keep"}
        done
    fi
    return 0
}

_idemctl_value() {
    # Completes $2 as the value of option $1: what is known, file names for files, nothing
    # for free text. Returns 1 when $1 is no option that takes a value.
    case "$1" in
        --policy) COMPREPLY=($(compgen -W "conflict takeover" -- "$2")) ;;
        --outcome) COMPREPLY=($(compgen -W "succeeded failed_final unknown" -- "$2")) ;;
        -o) COMPREPLY=($(compgen -W "json text" -- "$2")) ;;
        --workload) COMPREPLY=($(compgen -W "fresh replay claim-complete mixed contention" \
                                 -- "$2")) ;;
        --method) COMPREPLY=($(compgen -W "POST PUT PATCH DELETE GET HEAD OPTIONS" -- "$2")) ;;
        --content-type) COMPREPLY=($(compgen -W "application/json text/plain" -- "$2")) ;;
        --tls-ca|--tls-cert|--tls-key|--request-body)
            # One name a line (a name with a blank stays whole); readline then adds '/' to a
            # directory and quotes what needs it (outside a completion, compopt just fails).
            mapfile -t COMPREPLY < <(compgen -f -- "$2")
            compopt -o filenames 2>/dev/null ;;
        --cluster|--token|--admin-token|--deadline|--max-lag|--max-lag-entries|--max-lag-ms|\
        --node|--tenant|--limit|--status|--body|--fingerprint|--attempt|--lease|--ttl|--path|\
        --fingerprint-field|--fingerprint-ignore|\
        --concurrency|--duration|--requests|--rate|--connections|--keys|--timeline|\
        --tls-server-name) ;;
        *) return 1 ;;
    esac
    return 0
}

_idemctl_complete() {
    # Sets COMPREPLY, the completions of cur (the whole word, see _idemctl), from the words
    # before it: words[0..cword-1], prev being the last of them.
    local commands globals
    commands="status members transfer snapshot reload key quarantine claim complete release renew get"
    commands="$commands resolve version bench help"
    globals="--cluster --token --admin-token --json -o --deadline --help --version"
    globals="$globals --tls --tls-ca --tls-cert --tls-key --tls-server-name"

    # "--name=value" (idemctl takes it as "--name value"): the value is completed as after
    # "--name", and each completion keeps the "--name=" before it (_idemctl then drops what
    # bash does not replace). An option that takes no value gets nothing after its '='.
    if [[ "$cur" == --*=* ]]; then
        _idemctl_value "${cur%%=*}" "${cur#*=}" || return 0
        local k
        for k in "${!COMPREPLY[@]}"; do
            COMPREPLY[k]="${cur%%=*}=${COMPREPLY[k]}"
        done
        return 0
    fi
    # The value of the option before it.
    _idemctl_value "$prev" "$cur" && return 0

    # The command word: the first word after the global options (and their values).
    local i=1 cmd="" cmd_at=0 sub="" w
    while [ "$i" -lt "$cword" ]; do
        w=${words[i]}
        case "$w" in
            --cluster|--token|--admin-token|--deadline|--tls-ca|--tls-cert|--tls-key|\
            --tls-server-name|-o) i=$((i + 2)); continue ;;
            -*) i=$((i + 1)); continue ;;
        esac
        cmd=$w
        cmd_at=$i
        break
    done
    if [ -z "$cmd" ]; then
        if [[ "$cur" == -* ]]; then
            COMPREPLY=($(compgen -W "$globals" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$commands" -- "$cur"))
        fi
        return 0
    fi

    # The subcommand: the first word after the command that is neither an option nor the
    # value of one.
    i=$((cmd_at + 1))
    local sub_at=0
    while [ "$i" -lt "$cword" ]; do
        w=${words[i]}
        case "$w" in
            --cluster|--token|--admin-token|--deadline|--max-lag|--max-lag-entries|\
            --max-lag-ms|--node|--tenant|--limit|--status|--body|--fingerprint|--attempt|\
            --lease|--ttl|--policy|--outcome|--tls-ca|--tls-cert|--tls-key|--request-body|\
            --method|--path|--content-type|--fingerprint-field|--fingerprint-ignore|\
            --tls-server-name|-o)
                i=$((i + 2)); continue ;;
        esac
        if [[ "$w" != -* ]]; then
            sub=$w
            sub_at=$i
            break
        fi
        i=$((i + 1))
    done

    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_idemctl_flags_of "$cmd" "$sub")" -- "$cur"))
        return 0
    fi
    if [ "$sub_at" -eq 0 ]; then
        case "$cmd" in
            members) COMPREPLY=($(compgen -W "list add promote remove" -- "$cur")) ;;
            key) COMPREPLY=($(compgen -W "get resolve purge" -- "$cur")) ;;
            quarantine) COMPREPLY=($(compgen -W "list" -- "$cur")) ;;
            help) COMPREPLY=($(compgen -W "$commands" -- "$cur")) ;;
        esac
        return 0
    fi
    if [ "$cmd" = help ] && [ "$sub_at" -eq $((cword - 1)) ]; then
        case "$sub" in
            members) COMPREPLY=($(compgen -W "list add promote remove" -- "$cur")) ;;
            key) COMPREPLY=($(compgen -W "get resolve purge" -- "$cur")) ;;
            quarantine) COMPREPLY=($(compgen -W "list" -- "$cur")) ;;
        esac
    fi
    return 0
}

complete -F _idemctl idemctl
