# lib.sh: what the benchmark scripts (http.sh, peers.sh) share. Sourced, not run.
# The caller sets BENCH_NAME (for log lines), ROOT, BIN, WRKDIR, DURATION, CONNS, THREADS
# and RUN (a prefix that makes every key of the run new) before sourcing it.
# Benchmarks, not tests: they assert nothing about speed, only that each load did what it
# says.

log() { printf '[%s] %s\n' "$BENCH_NAME" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# bench_install CMD:PACKAGE...: installs from Debian every PACKAGE whose CMD is missing.
# Installing must not start system services: if the image has no policy-rc.d, a temporary
# one (exit 101) is put in place and removed afterwards.
bench_install() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  log "installing ${need[*]}"
  local own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
    >/dev/null 2>&1 || { if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; die "apt-get install ${need[*]} failed"; }
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
}

# ---- processes and cleanup -----------------------------------------------------------------
# bench_tmp PREFIX: makes TMP and arms the cleanup: every PID in PIDS is killed on exit (and on
# INT/TERM), the tail of every log is shown when the run failed, TMP is removed.
PIDS=()
# kill_tree PID: its children first (Redis forks one to rewrite its AOF, which writes into
# TMP), stopped so that it forks no more meanwhile, then the process itself.
kill_tree() {
  kill -STOP "$1" 2>/dev/null || true
  pkill -9 -P "$1" 2>/dev/null || true
  kill -9 "$1" 2>/dev/null || true
}
bench_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill_tree "$p"; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ] && [ -d "$TMP" ]; then
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done >&2
  fi
  # A process killed a moment ago may still be closing files: retry briefly.
  for _ in 1 2 3 4 5; do rm -rf "$TMP" 2>/dev/null && break; sleep 0.2; done
  [ ! -e "$TMP" ] || echo "$BENCH_NAME: could not remove $TMP" >&2
  exit $rc
}
bench_tmp() {
  TMP=$(mktemp -d "/tmp/$1.XXXXXX")
  trap bench_cleanup EXIT
  trap 'exit 143' INT TERM
}
stop_all() {  # kills what runs now, so that the next system has the machine to itself
  for p in "${PIDS[@]}"; do kill_tree "$p"; wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# free_port: a loopback port nothing listens on, drawn at random below the kernel's
# ephemeral range (32768-60999) and never one this run handed out before ($TMP/ports).
# Not bind(0): that hands out ephemeral ports, which the benchmarks' own client sockets
# also take, and one run's node failed with "address already in use" that way.
free_port() {
  python3 - "${TMP:?bench_tmp first}/ports" <<'PY'
import random, socket, sys
path = sys.argv[1]
try:
    given = set(open(path).read().split())
except FileNotFoundError:
    given = set()
for _ in range(1000):
    port = random.randrange(10000, 32768)
    if str(port) in given:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    with open(path, "a") as f:
        f.write("%d\n" % port)
    print(port)
    sys.exit(0)
sys.exit("free_port: no free port found in 10000-32767")
PY
}
sha() { printf '%s' "$1" | sha256sum | cut -c1-64; }
# wait_until SECONDS WHAT CMD...: poll CMD until it succeeds.
wait_until() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out waiting for $what"
    sleep 0.1
  done
}
LOADS=""
note_load() { LOADS="$LOADS $1 $(cut -d' ' -f1 /proc/loadavg)"; }

# machine_notes DIR: what of the machine itself shapes the tail, on one line. The data
# directory's file system and whether it trims freed blocks at once (online discard: every
# write waits behind each trim); and the kernel's DAMON monitors that are on (a monitor
# that pages out cold memory, left running for minutes, stalled every process here for
# tens of ms at each sample: docs/benchmarks.md, *What shapes the tail here*).
machine_notes() {
  local fs damon="" k
  fs=$(findmnt -n -o FSTYPE,OPTIONS -T "$1" 2>/dev/null | awk '{
    d = ($2 ~ /(^|,)discard(,|$)/) ? "online discard" : "no online discard"; print $1 ", " d; exit }')
  for k in /sys/kernel/mm/damon/admin/kdamonds/*; do
    if [ ! -r "$k/state" ] || [ "$(cat "$k/state" 2>/dev/null)" != on ]; then
      continue
    fi
    local c=$k/contexts/0
    damon="$damon${damon:+; }kdamond ${k##*/} on ($(cat "$c/operations" 2>/dev/null),"
    damon="$damon sample every $(( $(cat "$c/monitoring_attrs/intervals/sample_us" 2>/dev/null || echo 0) / 1000 )) ms,"
    damon="$damon action $(cat "$c/schemes/0/action" 2>/dev/null || echo none))"
  done
  echo "data dir ${fs:-file system unknown}; DAMON: ${damon:-no monitor on}"
}

# damon_counters: "TRIED APPLIED QUOTA_REACHED" (bytes, bytes, times) summed over the first
# scheme of every DAMON monitor that is on, its counters refreshed first (a write of
# update_schemes_stats to its state file, which changes nothing else); "" when none is on
# or they cannot be read (not root).
damon_counters() {
  local k s tried=0 applied=0 qt=0 any=""
  for k in /sys/kernel/mm/damon/admin/kdamonds/*; do
    [ "$(cat "$k/state" 2>/dev/null)" = on ] || continue
    echo update_schemes_stats 2>/dev/null >"$k/state" || continue
    s=$k/contexts/0/schemes/0/stats
    [ -r "$s/sz_tried" ] || continue
    tried=$((tried + $(cat "$s/sz_tried"))); applied=$((applied + $(cat "$s/sz_applied")))
    qt=$((qt + $(cat "$s/qt_exceeds"))); any=1
  done
  [ -n "$any" ] && echo "$tried $applied $qt"
  return 0
}

# ---- wrk ---------------------------------------------------------------------------------------
# run_wrk NAME URL SCRIPT [ENV=...]: one bounded wrk run with --latency; records OPS[NAME]
# (requests/s), P50[NAME], P99[NAME] (ms), NON2XX[NAME] and ERRS[NAME] from its output.
declare -A OPS P50 P99 NON2XX ERRS
run_wrk() {
  local name=$1 url=$2 script=$3; shift 3
  note_load "$name"
  local out=$TMP/wrk-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" "$@" \
    timeout --foreground $((DURATION + 20)) wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 5s \
    --latency -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk $name failed"; }
  sed 's/^/    /' "$out" >&2
  OPS[$name]=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
  P50[$name]=$(awk '$1=="50%" {print $2}' "$out" | to_ms)
  P99[$name]=$(awk '$1=="99%" {print $2}' "$out" | to_ms)
  NON2XX[$name]=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out"); NON2XX[$name]=${NON2XX[$name]:-0}
  # "  Socket errors: connect 3, read 5, write 0, timeout 7" (indented): add up its numbers.
  ERRS[$name]=$(awk '/Socket errors:/ {n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) n += $i + 0; print n}' "$out")
  ERRS[$name]=${ERRS[$name]:-0}
}
# wrk prints latencies as 812.00us / 1.23ms / 1.02s: convert to ms.
to_ms() {
  awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)}
        else if (v ~ /m$/) {sub(/m$/,"",v); v*=60000} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}
        printf "%.2f", v}'
}
# verify_wrk NAME URL SCRIPT EXPECT [ENV=...]: a 1 s, 1-connection run whose response()
# checks each body for EXPECT (shows the Lua script builds valid requests); fails loudly.
verify_wrk() {
  local name=$1 url=$2 script=$3 expect=$4; shift 4
  local out=$TMP/verify-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" VERIFY="$expect" "$@" \
    timeout --foreground 20 wrk -t1 -c1 -d1s -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || true
  local line; line=$(grep '^VERIFY ok=' "$out" || true)
  log "check $name (expect '$expect' in every body): ${line:-no result}"
  if ! grep -q '^VERIFY ok=[1-9][0-9]* bad=0$' "$out"; then cat "$out" >&2; die "check $name failed"; fi
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# ---- idemd ---------------------------------------------------------------------------------------
# idem_start [PROXY_ROUTE_FILE]: a 3-node idemd cluster (fsync on, the default) on free ports in
# TMP, tenant alpha (TOKEN) and an admin token (ADMIN); with a file, every node also gets a
# proxy listener (PROXY[i]) whose routes are that file's lines. Sets RAFT, RPC, HTTP, CLUSTER,
# waits for a leader and sets LID (its node id) and LHTTP (its JSON API address). The server's
# defaults unless ELECTION_MS and HEARTBEAT_MS (raft's timings, both) or BATCH_DELAY_US
# (batch.delay_us, the group commit) are set in the environment.
idem_start() {
  local routes=${1:-}
  TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  ADMIN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  declare -gA RAFT RPC HTTP PROXY
  local i j
  # Raft connections authenticated, as tools/quickstart.sh sets them up.
  head -c32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/raft.secret"
  chmod 600 "$TMP/raft.secret"
  for i in 1 2 3; do
    RAFT[$i]=127.0.0.1:$(free_port); RPC[$i]=127.0.0.1:$(free_port)
    HTTP[$i]=127.0.0.1:$(free_port); PROXY[$i]=127.0.0.1:$(free_port)
  done
  for i in 1 2 3; do
    {
      echo "node:"
      echo "  id: $i"
      echo "  raft_address: ${RAFT[$i]}"
      echo "  rpc_address: ${RPC[$i]}"
      echo "  http_address: ${HTTP[$i]}"
      echo "  data_dir: $TMP/node$i"
      echo "cluster:"
      echo "  bootstrap:"
      for j in 1 2 3; do
        echo "    - {id: $j, raft_address: ${RAFT[$j]}, rpc_address: ${RPC[$j]}, http_address: ${HTTP[$j]}}"
      done
      echo "raft:"
      echo "  secret_file: $TMP/raft.secret"
      [ -n "${ELECTION_MS:-}" ] && echo "  election_timeout_ms: $ELECTION_MS" && echo "  heartbeat_timeout_ms: $HEARTBEAT_MS"
      [ -n "${BATCH_DELAY_US:-}" ] && echo "batch:" && echo "  delay_us: $BATCH_DELAY_US"
      echo "admin:"
      echo "  token_sha256: $(sha "$ADMIN")"
      echo "tenants:"
      echo "  - name: alpha"
      echo "    token_sha256: $(sha "$TOKEN")"
      if [ -n "$routes" ]; then
        echo "proxy:"
        echo "  - address: ${PROXY[$i]}"
        echo "    routes:"
        cat "$routes"
      fi
    } >"$TMP/node$i.yaml"
  done
  for i in 1 2 3; do
    "$BIN/idemd" --config "$TMP/node$i.yaml" >"$TMP/node$i.log" 2>&1 </dev/null &
    PIDS+=($!)
  done
  CLUSTER="${RPC[1]},${RPC[2]},${RPC[3]}"
  wait_until 30 "an idemd leader" idem_leader
  LID=$(idem_leader)
  LHTTP=${HTTP[$LID]}
}
idem_leader() {
  "$BIN/idemctl" --cluster "$CLUSTER" --token "$TOKEN" --admin-token "$ADMIN" --json status 2>/dev/null \
    | python3 -c 'import json,sys; l=json.load(sys.stdin).get("leader_id"); print(l) if l else sys.exit(1)'
}

# ---- etcd 3.4 (Debian) -------------------------------------------------------------------------
# etcd_start: three members (fsync on) on free ports in TMP; waits for a leader and sets
# ELEADER (its client URL) and EVER (the version). Then etcd_check verifies the txn script.
etcd_start() {
  declare -gA ECLIENT EPEER
  local i
  for i in 1 2 3; do ECLIENT[$i]=http://127.0.0.1:$(free_port); EPEER[$i]=http://127.0.0.1:$(free_port); done
  local initial="n1=${EPEER[1]},n2=${EPEER[2]},n3=${EPEER[3]}"
  for i in 1 2 3; do
    etcd --name "n$i" --data-dir "$TMP/etcd$i" \
      --listen-client-urls "${ECLIENT[$i]}" --advertise-client-urls "${ECLIENT[$i]}" \
      --listen-peer-urls "${EPEER[$i]}" --initial-advertise-peer-urls "${EPEER[$i]}" \
      --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "$RUN" \
      --logger zap --log-level warn >"$TMP/etcd$i.log" 2>&1 </dev/null &
    PIDS+=($!)
  done
  EPS="${ECLIENT[1]},${ECLIENT[2]},${ECLIENT[3]}"
  wait_until 30 "an etcd leader" etcd_leader
  ELEADER=$(etcd_leader)
  EVER=$(etcd --version | awk 'NR==1{print $3}')
  log "etcd $EVER leader: $ELEADER"
}
etcd_leader() {  # prints the client URL of the member whose id is the leader id
  ETCDCTL_API=3 etcdctl --endpoints "$EPS" --command-timeout=2s endpoint status -w json 2>/dev/null \
    | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    st = e["Status"]
    if st.get("leader") and st["header"]["member_id"] == st["leader"]:
        print(e["Endpoint"]); sys.exit(0)
sys.exit(1)'
}
# etcd_check: every body of a short txn run says "succeeded":true, and the keys it wrote are
# really there (the Lua base64 of the keys decodes to the keys): counted back with etcdctl.
etcd_check() {
  verify_wrk etcd_check "$ELEADER" etcd_txn.lua '"succeeded":true'
  local n_ok n_keys
  n_ok=$(sed -n 's/^VERIFY ok=\([0-9]*\) .*/\1/p' "$TMP/verify-etcd_check.txt")
  n_keys=$(ETCDCTL_API=3 etcdctl --endpoints "$ELEADER" get "$RUN-etcd_check-1-" --prefix --keys-only \
    | grep -c "^$RUN-etcd_check-1-[0-9]*\$" || true)
  log "etcd keys under $RUN-etcd_check-1-: $n_keys (successful txns: $n_ok)"
  # (one request may be in flight when wrk stops: committed, but its answer not counted)
  [ "$n_keys" -ge "$n_ok" ] && [ "$n_keys" -le $((n_ok + 1)) ] \
    || die "etcd holds $n_keys keys for $n_ok txns: the Lua base64 is wrong"
}
