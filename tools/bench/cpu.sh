#!/usr/bin/env bash
# cpu.sh: what a claim costs the cluster in CPU. Three idemd nodes (fsync on, the default) on
# 127.0.0.1; fresh claims at a fixed rate, first over the binary RPC, then over the leader's
# JSON API; for each, the three nodes' CPU time (user + system, from /proc/PID/stat) during
# the load divided by the claims answered; last, the same open loop of GET /livez (answered
# at once, no cluster work): the floor an HTTP request costs before a claim's own work.
# A benchmark, not a test: it asserts nothing about speed, only that every load did what it
# says (no errors, no non-2xx answers).
#
#   tools/bench/cpu.sh             (root on Debian 12; needs build/bin from a normal build)
#
# Env: RATE (claims/s, default 10000), DURATION (seconds per load, default 10), CONNS (wrk's
# connections, default 64), DELAY_MS (unset by default), IDEM_BIN_DIR (the build's bin/,
# default build/bin: run it once per build to compare two, alternating), BATCH_DELAY_US
# (the nodes' batch.delay_us; unset: their default). Beside each figure, the claims that
# went into one log entry (from the leader's idem_raft_commit_index): at a fixed rate, a
# longer batch.delay_us makes fewer, larger entries.
#
# Both loads are open loops at RATE: idem-bench --rate RATE over the RPC; over HTTP, wrk
# with tools/bench/wrk/idem_claim.lua pacing each of its THREADS threads to RATE/THREADS
# requests/s on a fixed schedule (a request every THREADS/RATE s on whichever of its
# connections is free, whatever the latency). With DELAY_MS set, the HTTP load is the
# earlier closed loop instead: each connection waits DELAY_MS after every answer, so the
# rate is CONNS / (DELAY_MS + latency), and the arrivals come in waves. The rate reached is
# printed beside the figure; compare builds at the same settings.
set -euo pipefail

if [ -z "${CPU_BENCH_BOUNDED:-}" ]; then
  CPU_BENCH_BOUNDED=1 exec timeout -s TERM 240 "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
WRKDIR=$ROOT/tools/bench/wrk
RATE=${RATE:-10000}
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
DELAY_MS=${DELAY_MS:-}
FP=$(printf 'bench' | sha256sum | cut -c1-64)
RUN=c$(date +%s)-$$

BENCH_NAME=cpu.sh
. "$ROOT/tools/bench/lib.sh"

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] && [ -x "$BIN/idem-bench" ] \
  || die "no $BIN/idemd, idemctl or idem-bench: build first"
bench_install wrk:wrk python3:python3 curl:curl
bench_tmp idem-cpu-bench

# The nodes' CPU ticks (utime + stime, fields 14 and 15 of /proc/PID/stat), summed.
node_ticks() {
  local pid t=0
  for pid in "${PIDS[@]}"; do
    t=$((t + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat")))
  done
  echo "$t"
}
HZ=$(getconf CLK_TCK)
# per_claim TICKS CLAIMS: microseconds of CPU per claim
per_claim() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }'; }
# The leader's commit index (its /metrics): the log entries a load made, and so how many
# claims went into each (batch.delay_us sets how long a batch waits for more).
commit_index() {
  local ci
  ci=$(curl -s -H "Authorization: Bearer $ADMIN" "http://$LHTTP/metrics" |
    awk '$1 == "idem_raft_commit_index" { printf "%d", $2 }')
  [ -n "$ci" ] || die "no idem_raft_commit_index in the leader's /metrics"
  echo "$ci"
}
# per_entry CLAIMS ENTRIES: claims per log entry
per_entry() { awk -v n="$1" -v e="$2" 'BEGIN { printf "%.1f", (e > 0 ? n / e : 0) }'; }

idem_start
log "idemd leader: node $LID; RPC open loop at $RATE/s for ${DURATION}s"

c0=$(commit_index)
t0=$(node_ticks)
timeout --foreground $((DURATION + 30)) "$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" \
  --workload fresh --rate "$RATE" --duration "$DURATION" --json >"$TMP/rpc.json" 2>"$TMP/rpc.log" \
  || { cat "$TMP/rpc.log" >&2; die "idem-bench failed"; }
t1=$(node_ticks)
c1=$(commit_index)
read -r rpc_ops rpc_errors rpc_rate < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(d["ops"], d["errors"], "%.0f" % d["ops_per_sec"])' "$TMP/rpc.json")
[ "$rpc_errors" = 0 ] || die "idem-bench: $rpc_errors errors"

if [ -n "$DELAY_MS" ]; then
  PACE=(DELAY_MS="$DELAY_MS")
  log "JSON API on the leader: wrk -c$CONNS, ${DELAY_MS} ms between a connection's requests, ${DURATION}s"
else
  PACE=(RATE="$RATE" THREADS="$THREADS")
  log "JSON API on the leader: wrk -c$CONNS, open loop at $RATE/s, ${DURATION}s"
fi
c2=$(commit_index)
t2=$(node_ticks)
env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-http" IDEM_TOKEN="$TOKEN" FP="$FP" MODE=fresh "${PACE[@]}" \
  timeout --foreground $((DURATION + 20)) wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 5s \
  -s "$WRKDIR/idem_claim.lua" "http://$LHTTP" >"$TMP/wrk.txt" 2>&1 || { cat "$TMP/wrk.txt" >&2; die "wrk failed"; }
t3=$(node_ticks)
c3=$(commit_index)
http_ops=$(awk '/requests in/ {print $1}' "$TMP/wrk.txt")
http_rate=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$TMP/wrk.txt")
if grep -q 'Non-2xx\|Socket errors' "$TMP/wrk.txt"; then cat "$TMP/wrk.txt" >&2; die "wrk: errors"; fi

# The floor of the JSON API's figure: the same open loop of GET /livez on the leader, which
# the gateway answers at once (no token, no claim, no log entry). What the nodes spend per
# request here is what any HTTP request costs them on this machine before a claim's work.
log "GET /livez on the leader: wrk -c$CONNS, the same pacing, ${DURATION}s"
t4=$(node_ticks)
env BENCH_WRK_DIR="$WRKDIR" RUN="$RUN-livez" FP="$FP" MODE=livez "${PACE[@]}" \
  timeout --foreground $((DURATION + 20)) wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 5s \
  -s "$WRKDIR/idem_claim.lua" "http://$LHTTP" >"$TMP/livez.txt" 2>&1 || { cat "$TMP/livez.txt" >&2; die "wrk failed"; }
t5=$(node_ticks)
livez_ops=$(awk '/requests in/ {print $1}' "$TMP/livez.txt")
livez_rate=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$TMP/livez.txt")
if grep -q 'Non-2xx\|Socket errors' "$TMP/livez.txt"; then cat "$TMP/livez.txt" >&2; die "wrk: errors on /livez"; fi

echo "cpu per claim ($BIN): RPC $(per_claim $((t1 - t0)) "$rpc_ops") us at ${rpc_rate}/s ($rpc_ops claims," \
  "$(per_entry "$rpc_ops" $((c1 - c0))) per log entry);" \
  "HTTP $(per_claim $((t3 - t2)) "$http_ops") us at ${http_rate}/s ($http_ops claims," \
  "$(per_entry "$http_ops" $((c3 - c2))) per log entry); HTTP floor (GET /livez)" \
  "$(per_claim $((t5 - t4)) "$livez_ops") us per request at ${livez_rate}/s"
