#!/usr/bin/env bash
# crossing.sh: the open loop's latency while the record count crosses a given range, e.g. the
# table's 5/8 mark where the next growth is prepared (docs/benchmarks.md: crossing.sh).
# A benchmark, not a test: it asserts nothing about speed, only that each load did what it
# says (no errors, every claim acquired).
#
#   tools/bench/crossing.sh        (needs build/bin from a normal build, or IDEM_BIN_DIR)
#
# One run, on 127.0.0.1 in a temp dir, bounded to 4 minutes: a 3-node idemd cluster (fsync
# on); a closed loop of fresh claims (64 in flight) to FILL records; then an open loop of
# fresh claims at RATE/s for OPEN seconds with a 100 ms timeline. Prints the open loop's
# p50/p99/max, the worst 100 ms interval while the count was within [LO, HI], and the five
# worst intervals of the run with the count each ended at (counted from the records after
# the fill, assuming each interval's operations ended in it).
# Env: FILL (default 1170000), RATE (35000), OPEN (10), LO (1305000), HI (1345000).
set -euo pipefail

if [ -z "${CROSSING_BENCH_BOUNDED:-}" ]; then
  CROSSING_BENCH_BOUNDED=1 exec timeout -s TERM 240 "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${IDEM_BIN_DIR:-$ROOT/build/bin}
FILL=${FILL:-1170000}
RATE=${RATE:-35000}
OPEN=${OPEN:-10}
LO=${LO:-1305000}
HI=${HI:-1345000}

BENCH_NAME=crossing.sh
. "$ROOT/tools/bench/lib.sh"

[ -x "$BIN/idemd" ] && [ -x "$BIN/idemctl" ] && [ -x "$BIN/idem-bench" ] \
  || die "no $BIN/idemd, idemctl or idem-bench: build first"
bench_install python3:python3
bench_tmp idem-crossing-bench
idem_start

bench=("$BIN/idem-bench" --cluster "$CLUSTER" --token "$TOKEN" --workload fresh --json)
log "closed loop to $FILL records"
"${bench[@]}" --concurrency 64 --duration 120 --requests "$FILL" >"$TMP/fill.json"
records=$("$BIN/idemctl" --cluster "$CLUSTER" --token "$TOKEN" --admin-token "$ADMIN" --json \
  status | python3 -c 'import json,sys; print(max(n.get("records", 0) for n in json.load(sys.stdin)["nodes"]))')
log "open loop at $RATE/s for $OPEN s from $records records"
"${bench[@]}" --rate "$RATE" --duration "$OPEN" --timeline 100 >"$TMP/open.json"

python3 - "$TMP/fill.json" "$TMP/open.json" "$records" "$LO" "$HI" <<'PY'
import json, sys
fill, run = (json.load(open(p)) for p in sys.argv[1:3])
records, lo, hi = (int(v) for v in sys.argv[3:6])
for name, d in (("fill", fill), ("open loop", run)):
    if d["errors"] or d["outcomes"] != {"acquired": d["ops"]}:
        sys.exit("crossing.sh: the %s did not acquire every claim: %r" % (name, d))
print("fill: %d claims at %.0f/s; open loop from %d records: %.0f ops/s, p50 %.2f ms, "
      "p99 %.2f ms, max %.1f ms" % (fill["ops"], fill["ops_per_sec"], records,
                                    run["ops_per_sec"], run["p50_ms"], run["p99_ms"],
                                    run["max_ms"]))
rows, count = [], records
for t in run["timeline"]:
    count += t["ops"]
    rows.append((t["max_ms"], t["p99_ms"], count))
inside = [r for r in rows if lo <= r[2] <= hi]
if inside:
    print("while the count was in [%d, %d]: worst 100 ms interval max %.1f ms, p99 %.1f ms"
          % (lo, hi, max(r[0] for r in inside), max(r[1] for r in inside)))
else:
    print("the count never ended an interval in [%d, %d]" % (lo, hi))
for m, p, c in sorted(rows, reverse=True)[:5]:
    print("  interval max %.1f ms, p99 %.1f ms, ending at ~%d records" % (m, p, c))
PY
