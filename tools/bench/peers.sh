#!/usr/bin/env bash
# peers.sh: the same claim workload ("create this key if it does not exist, durably") against
# idemd, etcd and Redis, one after another on one machine, in one table.
# A benchmark, not a test: it asserts nothing about speed, only that each load did what it
# says (the expected answers, the keys really written).
#
#   tools/bench/peers.sh           (root on Debian 12; needs build/bin from a normal build)
#
# One run, all on 127.0.0.1 with free ephemeral ports (never the quick start's 700N/800N/900N),
# in a temp dir, bounded to 5 minutes:
#   1. idemd, 3 nodes (fsync on, the default):
#      a. idem-bench over the binary RPC, closed loop, fresh keys (each claim one Raft write);
#      b. wrk on the leader's JSON API, POST /v1/claims with fresh keys;
#      c. idem-bench open loop (--rate) at half the ops/s measured in (a): its p99, counted
#         from each request's scheduled send time (target: p99 <= 5 ms).
#   2. etcd 3.4 (Debian), 3 members (fsync on): wrk on the leader's JSON gateway, POST
#      /v3/kv/txn create-if-absent (compare create_revision == 0, then put) with fresh keys.
#   3. Redis, 1 node (appendonly yes, appendfsync always): redis-benchmark
#      `SET key:__rand_int__ v NX PX 60000` with -r 100000000 (random keys).
# Each system runs alone: the previous one is killed before the next starts, so they never
# share the cores. Every process started is killed by PID on exit; the temp dir is removed.
# Env: DURATION (seconds per run, default 10), CONNS (connections / closed-loop callers,
# default 64), THREADS (wrk threads, default 2).
set -euo pipefail

# The whole run is bounded: rerun ourselves under timeout(1) (TERM -> trap -> cleanup).
if [ -z "${PEERS_BENCH_BOUNDED:-}" ]; then
  PEERS_BENCH_BOUNDED=1 exec timeout -s TERM 300 "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
WRKDIR=$ROOT/tools/bench/wrk
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
FP=$(printf 'bench' | sha256sum | cut -c1-64)   # the fingerprint of every JSON API claim
RUN=p$(date +%s)-$$                        # prefix that makes every key of this run new

log() { printf '[peers.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] && [ -x "$BIN/idem-bench" ] \
  || die "no $BIN/idemd, idemctl or idem-bench: build first"

# ---- dependencies (idempotent) -------------------------------------------------------------
# Installing must not start system services: if the image has no policy-rc.d, a temporary
# one (exit 101) is put in place and removed afterwards.
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
    >/dev/null 2>&1 || { if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; die "apt-get install ${need[*]} failed"; }
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

# ---- processes and cleanup -----------------------------------------------------------------
TMP=$(mktemp -d /tmp/idem-peers-bench.XXXXXX)
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ] && [ -d "$TMP" ]; then
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done >&2
  fi
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' INT TERM
stop_all() {  # kills what runs now, so that the next system has the machine to itself
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
sha() { printf '%s' "$1" | sha256sum | cut -c1-64; }
wait_until() {  # wait_until SECONDS WHAT CMD...: poll CMD until it succeeds.
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out waiting for $what"
    sleep 0.1
  done
}
jget() {  # jget FILE FIELD: one field of a JSON object
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v)' "$1" "$2"
}

# ---- result rows: OPS[name], P50[name], P99[name] (ms), NOTE[name] ------------------------------
declare -A OPS P50 P99 NOTE

# wrk runner, as tools/bench/http.sh: run_wrk NAME URL SCRIPT [ENV=...]
run_wrk() {
  local name=$1 url=$2 script=$3; shift 3
  note_load "$name"
  local out=$TMP/wrk-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" "$@" \
    timeout $((DURATION + 20)) wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 5s \
    --latency -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk $name failed"; }
  sed 's/^/    /' "$out" >&2
  OPS[$name]=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
  P50[$name]=$(awk '$1=="50%" {print $2}' "$out" | to_ms)
  P99[$name]=$(awk '$1=="99%" {print $2}' "$out" | to_ms)
  local non2xx errs
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out"); non2xx=${non2xx:-0}
  errs=$(awk -F'[ ,]+' '/Socket errors:/ {print $4+$6+$8+$10}' "$out"); errs=${errs:-0}
  NOTE[$name]="non-2xx $non2xx, socket errors $errs"
}
to_ms() {
  awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)}
        else if (v ~ /m$/) {sub(/m$/,"",v); v*=60000} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}
        printf "%.2f", v}'
}
verify_wrk() {  # verify_wrk NAME URL SCRIPT EXPECT [ENV=...]: every body of a 1 s run holds EXPECT
  local name=$1 url=$2 script=$3 expect=$4; shift 4
  local out=$TMP/verify-$name.txt
  env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-$name" VERIFY="$expect" "$@" \
    timeout 20 wrk -t1 -c1 -d1s -s "$WRKDIR/$script" "$url" >"$out" 2>&1 || true
  local line; line=$(grep '^VERIFY ok=' "$out" || true)
  log "check $name (expect '$expect' in every body): ${line:-no result}"
  if ! grep -q '^VERIFY ok=[1-9][0-9]* bad=0$' "$out"; then cat "$out" >&2; die "check $name failed"; fi
}
# idem-bench runner: run_bench NAME ARGS...: --json, records OPS/P50/P99 and errors.
LOADS=""
note_load() { LOADS="$LOADS $1 $(cut -d' ' -f1 /proc/loadavg)"; }
run_bench() {
  local name=$1; shift
  note_load "$name"
  local out=$TMP/bench-$name.json
  timeout $((DURATION + 30)) "$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" \
    --duration "$DURATION" --json "$@" >"$out" 2>"$TMP/bench-$name.log" \
    || { cat "$TMP/bench-$name.log" >&2; die "idem-bench $name failed"; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("histogram"); print("    " + json.dumps(d))' "$out" >&2
  OPS[$name]=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["ops_per_sec"])' "$out")
  P50[$name]=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["p50_ms"])' "$out")
  P99[$name]=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["p99_ms"])' "$out")
  NOTE[$name]="errors $(jget "$out" errors), outcomes $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["outcomes"]))' "$out")"
  [ "$(jget "$out" errors)" = 0 ] || die "idem-bench $name: $(jget "$out" errors) errors ($(cat "$TMP/bench-$name.log"))"
}

# ================================================================================================
# 1. idemd: three nodes, generated configs (as tests/integration/harness.py)
# ================================================================================================
TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
ADMIN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
declare -A RAFT RPC HTTP
for i in 1 2 3; do
  RAFT[$i]=127.0.0.1:$(free_port); RPC[$i]=127.0.0.1:$(free_port); HTTP[$i]=127.0.0.1:$(free_port)
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
    echo "admin:"
    echo "  token_sha256: $(sha "$ADMIN")"
    echo "tenants:"
    echo "  - name: alpha"
    echo "    token_sha256: $(sha "$TOKEN")"
  } >"$TMP/node$i.yaml"
done
for i in 1 2 3; do
  "$BIN/idemd" --config "$TMP/node$i.yaml" >"$TMP/node$i.log" 2>&1 </dev/null &
  PIDS+=($!)
done
CLUSTER="${RPC[1]},${RPC[2]},${RPC[3]}"
idem_leader() {
  "$BIN/idemctl" --cluster "$CLUSTER" --token "$TOKEN" --admin-token "$ADMIN" --json status 2>/dev/null \
    | python3 -c 'import json,sys; l=json.load(sys.stdin).get("leader_id"); print(l) if l else sys.exit(1)'
}
wait_until 30 "an idemd leader" idem_leader
LID=$(idem_leader)
LHTTP=${HTTP[$LID]}
log "idemd leader: node $LID, RPC ${RPC[$LID]}, JSON API http://$LHTTP"

log "idemd RPC, fresh keys, closed loop: idem-bench --concurrency $CONNS -d ${DURATION}s"
run_bench idem_rpc --workload fresh --concurrency "$CONNS"

wait_until 20 "the leader's gateway to acquire a claim" sh -c "curl -s -X POST http://$LHTTP/v1/claims \
  -H 'Authorization: Bearer $TOKEN' -H 'Idempotency-Key: $RUN-probe' -H 'Content-Type: application/json' \
  -d '{\"fingerprint\": \"$FP\"}' | grep -q '\"acquired\"'"
verify_wrk idem_check "http://$LHTTP" idem_claim.lua '"acquired"' IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh
log "idemd JSON API, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk idem_http "http://$LHTTP" idem_claim.lua IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh

HALF=$(( ${OPS[idem_rpc]} / 2 ))
[ "$HALF" -ge 1 ] || die "idem-bench measured no throughput"
log "idemd RPC, fresh keys, open loop at half the measured max: idem-bench --rate $HALF"
run_bench idem_open --workload fresh --rate "$HALF"
OPEN_SVC_P99=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["service_p99_ms"])' "$TMP/bench-idem_open.json")
OPEN_LAG=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["max_lag_ms"])' "$TMP/bench-idem_open.json")
OPEN_UNSENT=$(jget "$TMP/bench-idem_open.json" unsent)
stop_all

# ================================================================================================
# 2. etcd 3.4 (Debian): three members, fsync on; txn create-if-absent on the leader
# ================================================================================================
declare -A ECLIENT EPEER
for i in 1 2 3; do ECLIENT[$i]=http://127.0.0.1:$(free_port); EPEER[$i]=http://127.0.0.1:$(free_port); done
INITIAL="n1=${EPEER[1]},n2=${EPEER[2]},n3=${EPEER[3]}"
for i in 1 2 3; do
  etcd --name "n$i" --data-dir "$TMP/etcd$i" \
    --listen-client-urls "${ECLIENT[$i]}" --advertise-client-urls "${ECLIENT[$i]}" \
    --listen-peer-urls "${EPEER[$i]}" --initial-advertise-peer-urls "${EPEER[$i]}" \
    --initial-cluster "$INITIAL" --initial-cluster-state new --initial-cluster-token "$RUN" \
    --logger zap --log-level warn >"$TMP/etcd$i.log" 2>&1 </dev/null &
  PIDS+=($!)
done
EPS="${ECLIENT[1]},${ECLIENT[2]},${ECLIENT[3]}"
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
wait_until 30 "an etcd leader" etcd_leader
ELEADER=$(etcd_leader)
EVER=$(etcd --version | awk 'NR==1{print $3}')
log "etcd $EVER leader: $ELEADER"
verify_wrk etcd_check "$ELEADER" etcd_txn.lua '"succeeded":true'
# The Lua base64 of the keys must decode to the keys: count them back by prefix with etcdctl.
n_ok=$(sed -n 's/^VERIFY ok=\([0-9]*\) .*/\1/p' "$TMP/verify-etcd_check.txt")
n_keys=$(ETCDCTL_API=3 etcdctl --endpoints "$ELEADER" get "$RUN-etcd_check-1-" --prefix --keys-only \
  | grep -c "^$RUN-etcd_check-1-[0-9]*\$" || true)
log "etcd keys under $RUN-etcd_check-1-: $n_keys (successful txns: $n_ok)"
[ "$n_keys" -ge "$n_ok" ] && [ "$n_keys" -le $((n_ok + 1)) ] \
  || die "etcd holds $n_keys keys for $n_ok txns: the Lua base64 is wrong"
log "etcd txn create-if-absent, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk etcd_txn "$ELEADER" etcd_txn.lua
stop_all

# ================================================================================================
# 3. Redis: one node, appendonly yes + appendfsync always; SET NX PX on random keys
# ================================================================================================
RPORT=$(free_port)
mkdir -p "$TMP/redis"
redis-server --bind 127.0.0.1 --port "$RPORT" --dir "$TMP/redis" --appendonly yes \
  --appendfsync always --save '' --daemonize no --protected-mode yes \
  --logfile "$TMP/redis.log" </dev/null >/dev/null 2>&1 &
PIDS+=($!)
RCLI=(redis-cli -h 127.0.0.1 -p "$RPORT")
wait_until 20 "redis on $RPORT" sh -c "${RCLI[*]} ping | grep -q PONG"
[ "$("${RCLI[@]}" config get appendfsync | tail -1)" = always ] || die "redis: appendfsync is not always"
REVER=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
# redis-benchmark runs a count, not a time: a 2 s calibration sizes the real run to DURATION.
redis_run() {  # redis_run N OUT: N requests of SET key NX PX on random keys, CSV to OUT
  timeout $((DURATION * 3 + 30)) redis-benchmark -h 127.0.0.1 -p "$RPORT" -c "$CONNS" -n "$1" \
    -r 100000000 --csv SET "$RUN:key:__rand_int__" v NX PX 60000 >"$2" 2>"$TMP/redis-bench.log" \
    || { cat "$2" "$TMP/redis-bench.log" >&2; die "redis-benchmark failed"; }
}
csv_field() {  # csv_field FILE COLUMN-NAME: the value in the data row
  python3 -c '
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
print(rows[1][rows[0].index(sys.argv[2])])' "$1" "$2"
}
redis_run 10000 "$TMP/redis-cal.csv"
cal=$(csv_field "$TMP/redis-cal.csv" rps)
N=$(awk -v r="$cal" -v d="$DURATION" 'BEGIN { n = int(r * d); if (n < 10000) n = 10000; print n }')
"${RCLI[@]}" flushall >/dev/null
log "redis $REVER SET NX PX, random keys: redis-benchmark -c $CONNS -n $N -r 100000000"
note_load redis
redis_run "$N" "$TMP/redis.csv"
sed 's/^/    /' "$TMP/redis.csv" >&2
OPS[redis]=$(csv_field "$TMP/redis.csv" rps | awk '{printf "%.0f", $1}')
P50[redis]=$(csv_field "$TMP/redis.csv" p50_latency_ms | awk '{printf "%.2f", $1}')
P99[redis]=$(csv_field "$TMP/redis.csv" p99_latency_ms | awk '{printf "%.2f", $1}')
# Every SET NX on a fresh random key writes it: the keys must be (almost) all there
# (-r draws from 1e8 keys, so a handful of repeats is expected).
dbsize=$("${RCLI[@]}" dbsize)
log "redis keys after $N SET NX: $dbsize"
[ "$dbsize" -ge $((N * 99 / 100)) ] && [ "$dbsize" -le "$N" ] || die "redis holds $dbsize keys after $N SET NX"
NOTE[redis]="keys written $dbsize of $N"
stop_all

# ================================================================================================
# 4. the table
# ================================================================================================
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
row() {  # row LABEL NAME
  printf '%-46s %9s %8s %8s   %s\n' "$1" "${OPS[$2]}" "${P50[$2]}" "${P99[$2]}" "${NOTE[$2]}"
}
echo
echo "== claim / create-if-absent, fresh keys: $CONNS callers, ${DURATION}s each, $(nproc) cores, loopback, fsync on =="
echo "   load average before each run (other processes share the machine): $LOADS"
printf '%-46s %9s %8s %8s   %s\n' "system" "ops/s" "p50 ms" "p99 ms" "check"
row "idemd 3 nodes, binary RPC (idem-bench)" idem_rpc
row "idemd 3 nodes, HTTP JSON API (wrk)" idem_http
row "etcd $EVER 3 nodes, txn create-if-absent (wrk)" etcd_txn
row "redis $REVER 1 node, SET NX PX, fsync always" redis
echo
echo "ratios (ops/s):"
echo "  idemd RPC / etcd:     $(ratio "${OPS[idem_rpc]}" "${OPS[etcd_txn]}")"
echo "  idemd HTTP / etcd:    $(ratio "${OPS[idem_http]}" "${OPS[etcd_txn]}")"
echo "  idemd RPC / redis:    $(ratio "${OPS[idem_rpc]}" "${OPS[redis]}")"
echo "  idemd HTTP / redis:   $(ratio "${OPS[idem_http]}" "${OPS[redis]}")"
echo
echo "open loop, idemd RPC at half the measured max (idem-bench --rate $HALF, fresh keys):"
echo "  achieved ${OPS[idem_open]} ops/s; latency from the scheduled send: p50 ${P50[idem_open]} ms, p99 ${P99[idem_open]} ms" \
     "(target p99 <= 5 ms: $(awk -v p="${P99[idem_open]}" 'BEGIN { print (p <= 5.0) ? "met" : "NOT met" }'));" \
     "service p99 $OPEN_SVC_P99 ms; max lag behind schedule $OPEN_LAG ms; unsent $OPEN_UNSENT"
