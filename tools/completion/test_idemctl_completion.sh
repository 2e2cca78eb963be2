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

# As bash calls it: COMP_LINE and COMP_POINT, and COMP_WORDS split at ':' and '=' too.
check_line() {
    local expect=$1 line=$2
    COMP_LINE=$line
    COMP_POINT=${#line}
    local IFS=$' \t\n'
    # COMP_WORDS as bash makes them (COMP_WORDBREAKS includes ':' and '='), for the record.
    COMP_WORDS=($(printf '%s' "$line" | sed 's/\([:=]\)/ \1 /g'))
    [[ "$line" =~ [[:space:]]$ ]] && COMP_WORDS+=("")
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

check "key" idemctl ke
check "quarantine" idemctl --cluster 127.0.0.1:7001 --json qu
check "--admin-token --cluster --deadline --help --json --tls --tls-ca --tls-cert --tls-key --tls-server-name --token" idemctl --
check "quarantine" idemctl --tls-ca /etc/ca.pem --tls-server-name n1 qu
check "get purge resolve" idemctl key ""
check "purge" idemctl --admin-token x key pu
check "--reveal" idemctl key get alpha k --rev
check "--release" idemctl key resolve alpha k --re
check "--body --deadline --help --json --release --status" idemctl key resolve alpha k --
check "list" idemctl quarantine ""
check "--limit" idemctl quarantine list --li
check "--tenant" idemctl quarantine list --t
check "add list promote remove" idemctl members ""
check "--digest" idemctl status --di
check "--max-lag" idemctl status --m
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
check "get purge resolve" idemctl help key ""
check "status" idemctl help st

if [ "$fails" -ne 0 ]; then
    echo "$fails completion case(s) failed"
    exit 1
fi
echo "completion: all cases passed"
