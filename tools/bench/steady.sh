#!/usr/bin/env bash
# steady.sh: does a loaded cluster on a busy machine keep its leader? Three idemd nodes with
# the server's default Raft timings on 127.0.0.1. First the RPC's closed-loop rate is
# measured (idem-bench, fresh keys, CONNS in flight, 10 s); then an open loop at half that
# rate runs for DURATION seconds while BUSY processes spin on the CPUs beside it. Before and
# after, every node's idem_raft_leader_changes_total and term are read: a leader change
# during the run is an election the load or the busy machine caused (each node's delay in
# hearing its leader is what the timeouts must absorb).
# A benchmark, not a test: it prints what it saw and asserts only that the load ran.
#
#   tools/bench/steady.sh          (root on Debian 12; needs build/bin from a normal build)
#
# Env: DURATION (seconds of the open loop, default 600), BUSY (spinning processes, default
# the number of CPUs), CONNS (default 64), IDEM_BIN_DIR (default build/bin), ELECTION_MS
# and HEARTBEAT_MS (both, or neither: raft's timings instead of the server's defaults).
set -euo pipefail

DURATION=${DURATION:-600}
if [ -z "${STEADY_BENCH_BOUNDED:-}" ]; then
  STEADY_BENCH_BOUNDED=1 exec timeout -s TERM $((DURATION + 120)) "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
BUSY=${BUSY:-$(nproc)}
CONNS=${CONNS:-64}

BENCH_NAME=steady.sh
. "$ROOT/tools/bench/lib.sh"

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] && [ -x "$BIN/idem-bench" ] \
  || die "no $BIN/idemd, idemctl or idem-bench: build first"
bench_install python3:python3
bench_tmp idem-steady-bench

# leader_state: "term T changes C1+C2+C3" from the three nodes' status and metrics.
leader_state() {
  local i c sum=0 term
  term=$(IDEM_ADMIN_TOKEN="$ADMIN" "$BIN/idemctl" --cluster "$CLUSTER" --token "$TOKEN" --json status \
    | python3 -c 'import json,sys; print(max(n["term"] for n in json.load(sys.stdin)["nodes"]))')
  for i in 1 2 3; do
    c=$(python3 - "http://${HTTP[$i]}/metrics" "$ADMIN" <<'PY'
import sys, urllib.request
rq = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
for line in urllib.request.urlopen(rq, timeout=10).read().decode().splitlines():
    if line.startswith("idem_raft_leader_changes_total"):
        print(int(float(line.split()[-1])))
PY
)
    sum=$((sum + c))
  done
  echo "$term $sum"
}

idem_start
log "idemd leader: node $LID; closed loop for the rate: idem-bench --concurrency $CONNS -d 10s"
timeout --foreground 60 "$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" --workload fresh \
  --concurrency "$CONNS" --duration 10 --json >"$TMP/max.json" 2>"$TMP/max.log" \
  || { cat "$TMP/max.log" >&2; die "idem-bench failed"; }
MAX=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["ops_per_sec"])' "$TMP/max.json")
RATE=$((MAX / 2))

read -r term0 changes0 < <(leader_state)
log "open loop at $RATE/s (half of $MAX/s) for ${DURATION}s beside $BUSY spinning processes"
for _ in $(seq "$BUSY"); do
  timeout --foreground $((DURATION + 5)) sh -c 'while :; do :; done' &
  PIDS+=($!)
done
timeout --foreground $((DURATION + 60)) "$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" \
  --workload fresh --rate "$RATE" --duration "$DURATION" --json >"$TMP/open.json" 2>"$TMP/open.log" \
  || { cat "$TMP/open.log" >&2; die "idem-bench failed"; }
read -r term1 changes1 < <(leader_state)
read -r ops errors rate p99 < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(d["ops"], d["errors"], "%.0f" % d["ops_per_sec"], d["p99_ms"])' "$TMP/open.json")
if [ "$changes1" != "$changes0" ]; then
  log "the nodes' lines about leaders during the run (first 20):"
  grep -h "leader is now\|no leader known\|asks for a\|stepped down\|slow\|stuck" "$TMP"/node*.log \
    | sort | head -20 >&2 || true
fi
echo "steady ($BIN): ${DURATION}s at ${rate}/s (half of ${MAX}/s) beside $BUSY busy processes:" \
  "$ops claims, $errors errors, p99 ${p99} ms; term $term0 -> $term1," \
  "leader changes seen by the nodes $changes0 -> $changes1"
