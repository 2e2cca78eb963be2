# bash completion for idemctl (commands, subcommands, flags and the values of a few flags).
# Install: copy to /usr/share/bash-completion/completions/idemctl (cmake --install does), or
# `source tools/completion/idemctl.bash` in a shell. docs/idemctl.md is the manual.

_idemctl_flags_of() {
    # The flags of one command word (and its subcommand), --json --deadline --help included.
    local cmd=$1 sub=$2 common="--json --deadline --help"
    case "$cmd" in
        status) echo "--digest --max-lag $common" ;;
        members|transfer) echo "$common" ;;
        snapshot) echo "--node $common" ;;
        key)
            case "$sub" in
                get) echo "--reveal $common" ;;
                resolve) echo "--release --status --body $common" ;;
                *) echo "$common" ;;
            esac ;;
        quarantine) echo "--tenant --limit --reveal $common" ;;
        resolve) echo "--tenant --release --status --body $common" ;;
        claim) echo "--fingerprint --attempt --lease --ttl --policy $common" ;;
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

_idemctl() {
    local cur prev commands globals words cword
    # The words typed so far. Bash's COMP_WORDS is split at ':' and '=' too
    # (COMP_WORDBREAKS), so "--cluster 127.0.0.1:7001" would arrive as four words: take the
    # line up to the cursor instead, split at blanks only (a "--name=value" stays one word).
    if [ -n "${COMP_LINE+set}" ] && [ -n "${COMP_POINT+set}" ]; then
        local line=${COMP_LINE:0:COMP_POINT}
        read -r -a words <<< "$line"
        if [ ${#words[@]} -eq 0 ] || [[ "$line" =~ [[:space:]]$ ]]; then
            words+=("")
        fi
    else
        words=("${COMP_WORDS[@]:0:COMP_CWORD+1}")
    fi
    cword=$((${#words[@]} - 1))
    cur=${words[cword]}
    prev=""
    [ "$cword" -gt 0 ] && prev=${words[cword-1]}
    commands="status members transfer snapshot key quarantine claim complete release renew get"
    commands="$commands resolve bench help"
    globals="--cluster --token --admin-token --json --deadline --help"
    globals="$globals --tls --tls-ca --tls-cert --tls-key --tls-server-name"
    COMPREPLY=()

    # Values of flags: suggest what is known, nothing for free text.
    case "$prev" in
        --policy) COMPREPLY=($(compgen -W "conflict takeover" -- "$cur")); return 0 ;;
        --outcome) COMPREPLY=($(compgen -W "succeeded failed_final unknown" -- "$cur")); return 0 ;;
        --workload) COMPREPLY=($(compgen -W "fresh replay claim-complete mixed contention" \
                                 -- "$cur")); return 0 ;;
        --tls-ca|--tls-cert|--tls-key) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
        --cluster|--token|--admin-token|--deadline|--max-lag|--node|--tenant|--limit|\
        --status|--body|--fingerprint|--attempt|--lease|--ttl|--concurrency|--duration|\
        --requests|--rate|--connections|--keys|--timeline|--tls-server-name)
            return 0 ;;
    esac

    # The command word: the first word after the global options (and their values).
    local i=1 cmd="" cmd_at=0 sub="" w
    while [ $i -lt $cword ]; do
        w=${words[i]}
        case "$w" in
            --cluster|--token|--admin-token|--deadline|--tls-ca|--tls-cert|--tls-key|\
            --tls-server-name) i=$((i + 2)); continue ;;
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
    while [ $i -lt $cword ]; do
        w=${words[i]}
        case "$w" in
            --cluster|--token|--admin-token|--deadline|--max-lag|--node|--tenant|--limit|\
            --status|--body|--fingerprint|--attempt|--lease|--ttl|--policy|--outcome|\
            --tls-ca|--tls-cert|--tls-key|--tls-server-name)
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
