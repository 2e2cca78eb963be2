#!/usr/bin/env bash
# peers.sh: the same claim workload ("create this key if it does not exist, durably") against
# idemd, etcd and Redis, one after another on one machine, in one table.
# A benchmark, not a test: it asserts nothing about speed, only that each load did what it
# says (the expected answers, the keys really written).
#
#   tools/bench/peers.sh           (root on Debian 12; needs build/bin from a normal build)
#
# One run, all on 127.0.0.1 with free ports below the ephemeral range (never the quick
# start's 700N/800N/900N), in a temp dir, bounded to 5 minutes:
#   1. idemd, 3 nodes (fsync on, the default):
#      a. idem-bench over the binary RPC, closed loop (CONNS in flight from one thread), fresh
#         keys (each claim one Raft write);
#      b. wrk on the leader's JSON API, POST /v1/claims with fresh keys;
#      c. idem-bench open loop (--rate) at half the ops/s measured in (a): its p99, counted
#         from each request's scheduled send time (target: p99 <= 5 ms), and how long the
#         machine held its CPUs off meanwhile (idem-bench --stall-probe: a thread per CPU at
#         SCHED_FIFO priority, which no thread of idemd's or the generator's can keep waiting).
#   2. etcd 3.4 (Debian), 3 members (fsync on): wrk on the leader's JSON gateway, POST
#      /v3/kv/txn create-if-absent (compare create_revision == 0, then put) with fresh keys.
#   3. Redis, 1 node (appendonly yes, appendfsync always): redis-benchmark
#      `SET key:__rand_int__ v NX PX 60000` with -r 100000000 (random keys).
# Each system runs alone: the previous one is killed before the next starts, so they never
# share the cores. Every process started is killed by PID on exit; the temp dir is removed.
# Env: DURATION (seconds per run, default 10), OPEN_DURATION (seconds of the open loop,
# default DURATION), CONNS (connections / closed-loop callers, default 64), THREADS (wrk
# threads, default 2).
set -euo pipefail

# The whole run is bounded: rerun ourselves under timeout(1) (TERM -> trap -> cleanup).
# Each step's own timeout runs with --foreground, so that it stays in our process group
# and the TERM ends the step at once (bash runs the trap only once the step is over).
if [ -z "${PEERS_BENCH_BOUNDED:-}" ]; then
  PEERS_BENCH_BOUNDED=1 exec timeout -s TERM 300 "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
WRKDIR=$ROOT/tools/bench/wrk
DURATION=${DURATION:-10}
OPEN_DURATION=${OPEN_DURATION:-$DURATION}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
FP=$(printf 'bench' | sha256sum | cut -c1-64)   # the fingerprint of every JSON API claim
RUN=p$(date +%s)-$$                        # prefix that makes every key of this run new

BENCH_NAME=peers.sh
. "$ROOT/tools/bench/lib.sh"

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] && [ -x "$BIN/idem-bench" ] \
  || die "no $BIN/idemd, idemctl or idem-bench: build first"

bench_install pkill:procps wrk:wrk etcd:etcd-server etcdctl:etcd-client redis-server:redis-server \
  redis-benchmark:redis-tools python3:python3
bench_tmp idem-peers-bench

jget() {  # jget FILE FIELD: one field of a JSON object
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v)' "$1" "$2"
}

# ---- result rows: OPS[name], P50[name], P99[name] (ms) as lib.sh's run_wrk, NOTE[name] ---------
declare -A NOTE
wrk_note() { NOTE[$1]="non-2xx ${NON2XX[$1]}, socket errors ${ERRS[$1]}"; }
# idem-bench runner: run_bench NAME ARGS...: --json, records OPS/P50/P99 and errors.
run_bench() {
  local name=$1; shift
  note_load "$name"
  local out=$TMP/bench-$name.json
  timeout --foreground $((DURATION + 30)) "$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" \
    --duration "$DURATION" --json "$@" >"$out" 2>"$TMP/bench-$name.log" \
    || { cat "$TMP/bench-$name.log" >&2; die "idem-bench $name failed"; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("histogram"); d.pop("timeline", None); print("    " + json.dumps(d))' "$out" >&2
  OPS[$name]=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["ops_per_sec"])' "$out")
  P50[$name]=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["p50_ms"])' "$out")
  P99[$name]=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["p99_ms"])' "$out")
  NOTE[$name]="errors $(jget "$out" errors), outcomes $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["outcomes"]))' "$out")"
  [ "$(jget "$out" errors)" = 0 ] || die "idem-bench $name: $(jget "$out" errors) errors ($(cat "$TMP/bench-$name.log"))"
}

# ================================================================================================
# 1. idemd: three nodes, generated configs (as tests/integration/harness.py)
# ================================================================================================
idem_start
log "idemd leader: node $LID, RPC ${RPC[$LID]}, JSON API http://$LHTTP"

log "idemd RPC, fresh keys, closed loop: idem-bench --concurrency $CONNS -d ${DURATION}s"
run_bench idem_rpc --workload fresh --concurrency "$CONNS"

wait_until 20 "the leader's gateway to acquire a claim" sh -c "curl -s -X POST http://$LHTTP/v1/claims \
  -H 'Authorization: Bearer $TOKEN' -H 'Idempotency-Key: $RUN-probe' -H 'Content-Type: application/json' \
  -d '{\"fingerprint\": \"$FP\"}' | grep -q '\"acquired\"'"
verify_wrk idem_check "http://$LHTTP" idem_claim.lua '"acquired"' IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh
log "idemd JSON API, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk idem_http "http://$LHTTP" idem_claim.lua IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh
wrk_note idem_http

HALF=$(( ${OPS[idem_rpc]} / 2 ))
[ "$HALF" -ge 1 ] || die "idem-bench measured no throughput"
log "idemd RPC, fresh keys, open loop at half the measured max: idem-bench --rate $HALF"
# Each node's log append histogram (idem_raft_append_duration_seconds) before and after: how
# many appends the disk held up during the open loop, per node.
append_hist() {  # append_hist OUT: "node le count" lines of every node's cumulative buckets
  for i in 1 2 3; do
    curl -s -H "Authorization: Bearer $ADMIN" "http://${HTTP[$i]}/metrics" | sed -n "s/^idem_raft_append_duration_seconds_bucket{le=\"\([^\"]*\)\"} \(.*\)/$i \1 \2/p"
  done >"$1"
}
append_hist "$TMP/append-before"
DAMON_BEFORE=$(damon_counters)
DURATION=$OPEN_DURATION run_bench idem_open --workload fresh --rate "$HALF" --timeline 100 --stall-probe
DAMON_AFTER=$(damon_counters)
append_hist "$TMP/append-after"
# What the kernel's DAMON monitors did meanwhile (docs/benchmarks.md: its page-out tries come
# with stalls of every process here).
OPEN_DAMON="no monitor on"
if [ -n "$DAMON_BEFORE" ] && [ -n "$DAMON_AFTER" ]; then
  OPEN_DAMON=$(echo "$DAMON_BEFORE $DAMON_AFTER" | awk '{printf "page-out tried on %.0f MiB, applied to %.1f MiB, its quota reached %d times", ($4 - $1) / 1048576, ($5 - $2) / 1048576, $6 - $3}')
fi
OPEN_DISK=$(python3 -c 'import sys,collections
def load(p):
    d = collections.defaultdict(dict)
    for l in open(p):
        n, le, c = l.split(); d[n][le] = float(c)
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
out = []
for n in sorted(b):
    tot = b[n]["+Inf"] - a[n].get("+Inf", 0)
    slow = tot - (b[n].get("0.008", 0) - a[n].get("0.008", 0))
    worst = max((float(le) for le in b[n] if le != "+Inf" and b[n][le] - a[n].get(le, 0) < tot), default=0)
    out.append("node %s: %d appends, %d over 8 ms, slowest up to %g ms" % (n, tot, slow, worst * 2000 if worst else 0.5))
print("; ".join(out))' "$TMP/append-before" "$TMP/append-after")
# Where the tail came from: the 100 ms intervals with the highest p99.
OPEN_WORST=$(python3 -c 'import json,sys
rows = json.load(open(sys.argv[1]))["timeline"]
slow = sorted(rows, key=lambda r: -r["p99_ms"])[:3]
print(", ".join("%.1f s: p99 %.1f ms, max %.1f ms (%d ops; CPUs held off up to %.1f ms)" % (r["end_ms"] / 1000, r["p99_ms"], r["max_ms"], r["ops"], r.get("held_max_ms", 0)) for r in slow))' "$TMP/bench-idem_open.json")
# How long the machine itself kept the CPUs from this system (idem-bench --stall-probe).
OPEN_HELD=$(python3 -c 'import json,sys
sp = json.load(open(sys.argv[1])).get("stall_probe")
if sp is None:
    print("not measured")
else:
    print("%.1f ms per CPU in %d holds of 1 ms or more, the longest %.1f ms, %s" % (sp["held_ms_per_cpu"], sp["holds"], sp["held_max_ms"], "by the machine (hypervisor or kernel), not by any thread: the probe ran at SCHED_FIFO priority" if sp["scheduling"] == "fifo" else "by the machine or by other threads: the probe ran at normal priority (no CAP_SYS_NICE)"))' "$TMP/bench-idem_open.json")
OPEN_P999=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.2f ms, max %.2f" % (d["p999_ms"], d["max_ms"]))' "$TMP/bench-idem_open.json")
OPEN_SVC_P99=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["service_p99_ms"])' "$TMP/bench-idem_open.json")
OPEN_LAG=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["max_lag_ms"])' "$TMP/bench-idem_open.json")
OPEN_UNSENT=$(jget "$TMP/bench-idem_open.json" unsent)
stop_all

# ================================================================================================
# 2. etcd 3.4 (Debian): three members, fsync on; txn create-if-absent on the leader
# ================================================================================================
etcd_start
etcd_check
log "etcd txn create-if-absent, fresh keys: wrk -t$THREADS -c$CONNS -d${DURATION}s"
run_wrk etcd_txn "$ELEADER" etcd_txn.lua
wrk_note etcd_txn
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
  timeout --foreground $((DURATION * 3 + 30)) redis-benchmark -h 127.0.0.1 -p "$RPORT" -c "$CONNS" -n "$1" \
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
row() {  # row LABEL NAME
  printf '%-46s %9s %8s %8s   %s\n' "$1" "${OPS[$2]}" "${P50[$2]}" "${P99[$2]}" "${NOTE[$2]}"
}
echo
echo "== claim / create-if-absent, fresh keys: $CONNS callers, ${DURATION}s each, $(nproc) cores, loopback, fsync on =="
echo "   load average before each run (other processes share the machine): $LOADS"
echo "   machine: $(machine_notes "$TMP")"
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
echo "open loop, idemd RPC at half the measured max (idem-bench --rate $HALF, fresh keys, ${OPEN_DURATION}s):"
echo "  achieved ${OPS[idem_open]} ops/s; latency from the scheduled send: p50 ${P50[idem_open]} ms, p99 ${P99[idem_open]} ms" \
     "(target p99 <= 5 ms: $(awk -v p="${P99[idem_open]}" -v u="$OPEN_UNSENT" 'BEGIN { print (p <= 5.0 && u == 0) ? "met" : "NOT met" }'));" \
     "p99.9 $OPEN_P999 ms; service p99 $OPEN_SVC_P99 ms; max lag behind schedule $OPEN_LAG ms; unsent $OPEN_UNSENT"
echo "  worst 100 ms intervals (by the time operations ended): $OPEN_WORST"
echo "  CPUs held off during the open loop: $OPEN_HELD"
echo "  DAMON during the open loop: $OPEN_DAMON"
echo "  log appends (write + sync) during the open loop: $OPEN_DISK"
