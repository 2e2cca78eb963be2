#!/bin/bash
# Checks tools/completion/idemctl.bash: what it completes for a few command lines. Each case
# is the words typed (the last one being completed) and the completions expected, sorted.
# Run: bash tools/completion/test_idemctl_completion.sh (ctest runs it as tools.idemctl.completion).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=idemctl.bash
. "$here/idemctl.bash"

fails=0
check() {
    local expect=$1
    shift
    COMP_WORDS=("$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    _idemctl
    local got
    got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ *$//')
    if [ "$got" != "$expect" ]; then
        echo "FAIL: [$*] -> '$got', expected '$expect'"
        fails=$((fails + 1))
    fi
}

# bash's default COMP_WORDBREAKS, so that the cases do not depend on the caller's.
COMP_WORDBREAKS=$' \t\n"\'@><=;|&(:'

# COMP_WORDS as bash makes them from a line, for the record (the script reads COMP_LINE):
# split at blanks and at the other COMP_WORDBREAKS characters outside quotes and backslash
# escapes, a run of those characters being one word of its own, the quotes kept in the words
# ("--cluster h:1" gives --cluster h : 1; "--token 'x y'" gives --token 'x y'). Checked against
# what bash 5.2 puts in COMP_WORDS on a terminal.
comp_words() {
    local line=$1 i c w="" q="" inbrk=0 brk=${COMP_WORDBREAKS//[$' \t\n\'"']/}
    COMP_WORDS=()
    for ((i = 0; i < ${#line}; i++)); do
        c=${line:i:1}
        if [ -n "$q" ]; then
            w+=$c
            if [ "$c" = "$q" ]; then
                q=""
            elif [ "$q" = '"' ] && [ "$c" = "\\" ]; then
                i=$((i + 1)); w+=${line:i:1}
            fi
        elif [[ "$c" == [[:blank:]] ]]; then
            [ -n "$w" ] && COMP_WORDS+=("$w")
            w=""; inbrk=0
        elif [[ "$brk" == *"$c"* ]]; then
            [ "$inbrk" -eq 0 ] && [ -n "$w" ] && { COMP_WORDS+=("$w"); w=""; }
            w+=$c; inbrk=1
        else
            [ "$inbrk" -eq 1 ] && { COMP_WORDS+=("$w"); w=""; inbrk=0; }
            if [ "$c" = "\\" ]; then
                i=$((i + 1)); c+=${line:i:1}
            elif [ "$c" = "'" ] || [ "$c" = '"' ]; then
                q=$c
            fi
            w+=$c
        fi
    done
    # The word being completed, empty after a blank.
    COMP_WORDS+=("$w")
}

# As bash calls it: COMP_LINE and COMP_POINT, and COMP_WORDS split at ':' and '=' too.
check_line() {
    local expect=$1 line=$2
    COMP_LINE=$line
    COMP_POINT=${#line}
    comp_words "$line"
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    _idemctl
    unset COMP_LINE COMP_POINT
    local got
    got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ *$//')
    if [ "$got" != "$expect" ]; then
        echo "FAIL: line [$line] -> '$got', expected '$expect'"
        fails=$((fails + 1))
    fi
}

check_line "key" "idemctl --cluster 127.0.0.1:7001 k"
check_line "key" "idemctl --cluster=127.0.0.1:7001 k"
check_line "--deadline --digest" "idemctl --cluster h:1 status --d"
check_line "get purge resolve" "idemctl --cluster 127.0.0.1:7001,127.0.0.1:7002 key "
check_line "add list promote remove" "idemctl members "
check_line "--stall-probe" "idemctl bench --st"

# A quoted (or backslash-escaped) value with a blank in it is one word, so the command and
# subcommand after it are found. The word being completed may start with a quote (compgen -W
# took care of that before, compgen -f did not: see './a:b/c below).
check_line "key" "idemctl --token 'x y' k"
check_line "key" "idemctl --admin-token \"x y\" k"
check_line "key" "idemctl --token x\\ y k"
check_line "quarantine" "idemctl --tls-ca 'my dir/ca.pem' --tls-server-name n1 qu"
check_line "list" "idemctl quarantine --tenant 'a b' "
check_line "list" "idemctl --token \"x y\" quarantine --tenant 'a b' l"
check_line "conflict" "idemctl claim k --policy 'con"

# A word with ':' (or '=' or '@', the other COMP_WORDBREAKS characters a word may hold): bash
# replaces only the part after the last one ('@' included), so the completions must hold only
# that part.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/a:b" "$tmp/k=v" "$tmp/u@h"
touch "$tmp/a:b/ca.pem" "$tmp/a:b/cert.pem" "$tmp/k=v/ca.pem" "$tmp/u@h/ca.pem"
cd "$tmp" || exit 1
check_line "b/ca.pem b/cert.pem" "idemctl --tls-ca ./a:b/c"
check_line "b/cert.pem" "idemctl --cluster h:1 --tls-cert ./a:b/ce"
check_line "v/ca.pem" "idemctl --tls-key ./k=v/c"
check_line "@h/ca.pem" "idemctl --tls-ca ./u@h/c"
# ... except where the ':' is quoted: bash then replaces the whole word (after an open quote).
check_line "./a:b/ca.pem ./a:b/cert.pem" "idemctl --tls-ca './a:b/c"
check_line "./a:b/ca.pem ./a:b/cert.pem" "idemctl --tls-ca ./a\\:b/c"
# "--name=value": the value completed as after "--name" (bash replaces only what follows
# the '=', or the last ':' after it); a file name with a blank is one completion.
mkdir "$tmp/my dir"
touch "$tmp/my dir/ca.pem"
check_line "b/ca.pem b/cert.pem" "idemctl --tls-ca=./a:b/c"
check_line "v/ca.pem" "idemctl --tls-key=./k=v/c"
check_line "my dir" "idemctl --tls-ca my"
check_line "my dir/ca.pem" "idemctl --tls-cert 'my dir/c"
check_line "fresh" "idemctl bench --workload=fr"
check_line "takeover" "idemctl claim k --policy=t"
check_line "" "idemctl bench --duration=1"
check_line "" "idemctl status --json=x"
cd - >/dev/null || exit 1

check "key" idemctl ke
check "quarantine" idemctl --cluster 127.0.0.1:7001 --json qu
check "--admin-token --cluster --deadline --help --json --tls --tls-ca --tls-cert --tls-key --tls-server-name --token --version" idemctl --
check "-o" idemctl -o
check "json text" idemctl -o ""
check "json" idemctl status -o j
check "quarantine" idemctl -o json qu
check "list" idemctl quarantine -o text ""
check "version" idemctl ver
check "--client" idemctl version --c
check "--check" idemctl status --ch
check "" idemctl status --max-lag-ms ""
check "quarantine" idemctl --tls-ca /etc/ca.pem --tls-server-name n1 qu
check "get purge resolve" idemctl key ""
check "purge" idemctl --admin-token x key pu
check "--reveal" idemctl key get alpha k --rev
check "--release" idemctl key resolve alpha k --re
check "--body --deadline --help --json --release --status" idemctl key resolve alpha k --
check "list" idemctl quarantine ""
check "--limit" idemctl quarantine list --li
check "--lease-ended" idemctl quarantine list --le
check "--tenant" idemctl quarantine list --t
check "add list promote remove" idemctl members ""
check "--digest" idemctl status --di
check "--max-lag --max-lag-entries --max-lag-ms" idemctl status --m
check "conflict takeover" idemctl claim k --policy ""
check "failed_final" idemctl complete k --outcome fa
check "claim-complete" idemctl bench --workload cl
check "contention" idemctl bench --workload con
check "mixed" idemctl bench --workload m
check "--rate" idemctl bench --ra
check "--threads --timeline --tls --tls-ca --tls-cert --tls-key --tls-server-name --token" idemctl bench --t
check "get purge resolve" idemctl key --deadline 100 ""
check "list" idemctl quarantine --deadline 5000 ""
check "--concurrency --connections" idemctl bench --con
check "" idemctl claim k --fingerprint ""
check "--request-body" idemctl claim k --req
check "PATCH POST PUT" idemctl claim k --method P
check "application/json" idemctl claim k --content-type app
check "" idemctl claim k --path ""
check "--fingerprint --fingerprint-field --fingerprint-ignore" idemctl claim k --fing
check "" idemctl claim k --fingerprint-ignore ""
check "--policy" idemctl claim k --fingerprint-field /a --fingerprint-field /b --po
check "get purge resolve" idemctl help key ""
check "status" idemctl help st

if [ "$fails" -ne 0 ]; then
    echo "$fails completion case(s) failed"
    exit 1
fi
echo "completion: all cases passed"
