#!/usr/bin/env python3
"""restart: what a restart costs a node that holds many records.

Starts a three-node cluster on loopback (tests/integration/harness.py: free ports on
127.0.0.1, a temporary directory, every process killed and the directory removed at the
end), fills it with --records records through idem-bench (claim and complete each key, so
every record holds a response, or --workload fresh: claims only), then asks every node for
a snapshot (idemctl snapshot --node), with a trickle of claims going so that each one
applies an entry to take it at. Then it SIGKILLs a follower and starts it again, and does
the same to the leader. It prints one figure a line:

  snapshot.<node>.{serialise,store,total}_s   from the node's log line of that snapshot:
                                              serialising the frozen table off the loop,
                                              writing the data to disk (paced, durable),
                                              and both
  <who>_restart.load_s      reading the snapshot (and the log) from disk at start
  <who>_restart.restore_s   the state machine rebuilding its table from it
  <who>_restart.started_s   process start to its "started" log line (listening)
  <who>_restart.ready_s     process start to /readyz answering 200
  <who>_restart.serving_s   process start to a claim sent to that node answered (it
                            forwards it to the leader when it follows)
  <who>_restart.caught_up_s process start to its applied index reaching the leader's
                            commit index as /readyz saw it then

(load_s and restore_s, and the store figures, come from the node's own log lines; a build
without them prints "n/a" there.) A benchmark, not a test: it asserts nothing but that the
cluster did what was asked.

Usage: tools/bench/restart.py [--records N] [--workload claim-complete|fresh]
                              [--bin DIR] [--json] [--keep-logs DIR]
--bin: the build's bin directory (default build/bin), to compare two builds.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def parse_args():
    ap = argparse.ArgumentParser(description="restart cost of a node holding many records")
    ap.add_argument("--records", type=int, default=1000000)
    ap.add_argument("--workload", choices=("claim-complete", "fresh"), default="claim-complete")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the nodes' logs there at the end")
    a = ap.parse_args()
    if a.records < 1 or a.records > 20000000:
        ap.error("--records: 1..20000000")
    return a


ARGS = parse_args()
os.environ["IDEM_BIN_DIR"] = os.path.abspath(ARGS.bin)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from harness import Cluster, http_request, wait_for  # noqa: E402

IDEM_BENCH = os.path.join(os.path.abspath(ARGS.bin), "idem-bench")

# "snapshot at index 123: 1000000 records, 112000000 bytes; loop paused 2.1 ms, written off
# the loop in 650.3 ms at nice 19[; stored in 1100.2 ms]; next after ..."
SNAP_RE = re.compile(r"snapshot at index (\d+): (\d+) records, (\d+) bytes; loop paused ([\d.]+) ms, "
                     r"written off the loop in ([\d.]+) ms at nice -?\d+(?:; stored in ([\d.]+) ms)?")
# The "started" line: "... snapshot: index N (M records[; read from disk with the log in X ms,
# of which the snapshot Y ms; restored in Z ms]) ..."
START_RE = re.compile(r"idemd \S+ started: .*snapshot: (?:none|index (\d+) \((\d+) records"
                      r"(?:; read from disk with the log in ([\d.]+) ms, of which the snapshot "
                      r"([\d.]+) ms; restored in ([\d.]+) ms)?\))")


class Figures:
    def __init__(self):
        self.items = []

    def add(self, name, value, unit="s"):
        self.items.append((name, value, unit))
        if not ARGS.json:
            if value is None:
                print("%-36s n/a" % name, flush=True)
            elif isinstance(value, float):
                print("%-36s %.3f %s" % (name, value, unit), flush=True)
            else:
                print("%-36s %s %s" % (name, value, unit), flush=True)


def bench(c, *extra, duration=600):
    return [IDEM_BENCH, "--cluster", c.addrs(), "--token", c.token, "--json",
            "--no-histogram", "--duration", str(duration), "--deadline", "20000"] + list(extra)


def fill(c, figs):
    t0 = time.monotonic()
    p = subprocess.run(bench(c, "--workload", ARGS.workload, "--requests", str(ARGS.records),
                             "--concurrency", "512", "--connections", "8"),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    took = time.monotonic() - t0
    try:
        out = json.loads(p.stdout)
    except ValueError:
        raise SystemExit("idem-bench failed: %s %s" % (p.stdout[-500:], p.stderr[-500:]))
    if p.returncode != 0 or out.get("errors"):
        raise SystemExit("idem-bench: exit %d, %s errors: %s" % (p.returncode, out.get("errors"),
                                                                  p.stderr[-500:]))
    figs.add("fill.records", ARGS.records, "records")
    figs.add("fill.time_s", took)


def log_text(c, nid, start=0):
    with open(c.nodes[nid].log, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


def log_size(c, nid):
    try:
        return os.path.getsize(c.nodes[nid].log)
    except OSError:
        return 0


def snapshot_all(c, figs):
    """Asks each node for a snapshot, one node at a time, a trickle of claims going (raft
    takes a snapshot at an applied entry, and a table still growing defers it by an entry);
    returns once each node logged one holding the records."""
    for nid in sorted(c.nodes):
        off = log_size(c, nid)
        trickle = subprocess.Popen(bench(c, "--workload", "fresh", "--rate", "200",
                                         "--concurrency", "16", duration=120),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rc, out = c.ctl("snapshot", "--node", c.nodes[nid].rpc)
            if rc != 0:
                raise SystemExit("idemctl snapshot --node %s: %r" % (c.nodes[nid].rpc, out))

            def taken():
                for m in SNAP_RE.finditer(log_text(c, nid, off)):
                    if int(m.group(2)) >= ARGS.records:
                        return m
                return None
            m = wait_for(taken, 110, "node %d's snapshot of the records" % nid, interval=0.1)
        finally:
            trickle.kill()
            trickle.wait()
        ser = float(m.group(5)) / 1000.0
        store = float(m.group(6)) / 1000.0 if m.group(6) else None
        figs.add("snapshot.node%d.records" % nid, int(m.group(2)), "records")
        figs.add("snapshot.node%d.bytes" % nid, int(m.group(3)), "bytes")
        figs.add("snapshot.node%d.serialise_s" % nid, ser)
        figs.add("snapshot.node%d.store_s" % nid, store)
        figs.add("snapshot.node%d.total_s" % nid, ser + store if store is not None else None)


def readyz(c, nid):
    try:
        r = http_request(c.nodes[nid].http, "GET", "/readyz", timeout=2)
    except OSError:
        return None
    return r if r[0] == 200 else None


def claim_through(c, nid, key):
    try:
        r = http_request(c.nodes[nid].http, "POST", "/v1/claims",
                         body={"fingerprint": "ab" * 32},
                         headers={"Authorization": "Bearer %s" % c.token, "Idempotency-Key": key},
                         timeout=5)
    except OSError:
        return None
    return r if r[0] == 200 else None


def restart(c, nid, who, figs):
    c.kill(nid, 9)
    off = log_size(c, nid)
    t0 = time.monotonic()
    c.start(nid)
    ready = wait_for(lambda: readyz(c, nid), 120, "node %d's /readyz 200" % nid, interval=0.005)
    t_ready = time.monotonic() - t0
    key = "restart-%s-%d" % (who, time.time_ns())
    wait_for(lambda: claim_through(c, nid, key), 60, "a claim through node %d" % nid,
             interval=0.005)
    t_serving = time.monotonic() - t0
    target = ready[2].get("commit_index", 0) if isinstance(ready[2], dict) else 0

    def caught_up():
        r = readyz(c, nid)
        return r if r and r[2].get("applied_index", 0) >= target else None
    wait_for(caught_up, 120, "node %d to apply up to index %d" % (nid, target), interval=0.005)
    t_caught = time.monotonic() - t0
    m = wait_for(lambda: START_RE.search(log_text(c, nid, off)), 10,
                 "node %d's started line" % nid)
    # The started line's own wall-clock stamp against the first line this process wrote.
    text = log_text(c, nid, off)
    stamps = re.findall(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", text, re.M)
    start_line = text[:m.start()].rfind("\n") + 1
    st_stamp = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", text[start_line:])
    first_to_started = None
    if stamps and st_stamp:
        def wall(s):
            return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) + float(s[19:])
        first_to_started = wall(st_stamp.group(1)) - wall(stamps[0])
    figs.add("%s_restart.node" % who, nid, "")
    figs.add("%s_restart.snapshot_records" % who, int(m.group(2)) if m.group(2) else 0, "records")
    sec = [float(m.group(i)) / 1000.0 if m.group(i) else None for i in (3, 4, 5)]
    figs.add("%s_restart.load_s" % who, sec[0])
    figs.add("%s_restart.load_snapshot_s" % who, sec[1])
    figs.add("%s_restart.restore_s" % who, sec[2])
    figs.add("%s_restart.first_log_to_started_s" % who, first_to_started)
    figs.add("%s_restart.ready_s" % who, t_ready)
    figs.add("%s_restart.serving_s" % who, t_serving)
    figs.add("%s_restart.caught_up_s" % who, t_caught)


def main():
    figs = Figures()
    c = Cluster(segment_size_mb=None)
    ok = False
    try:
        c.wait_leader(timeout=30)
        fill(c, figs)
        snapshot_all(c, figs)
        lid = c.wait_leader(timeout=30)
        follower = min(n for n in c.nodes if n != lid)
        restart(c, follower, "follower", figs)
        lid = c.wait_leader(timeout=30)
        restart(c, lid, "leader", figs)
        ok = True
    finally:
        if ARGS.keep_logs:
            os.makedirs(ARGS.keep_logs, exist_ok=True)
            for n in c.nodes.values():
                if os.path.exists(n.log):
                    shutil.copy(n.log, ARGS.keep_logs)
        problems = c.close()
        if problems:
            print("\n\n".join(problems), file=sys.stderr)
    if ARGS.json:
        print(json.dumps({name: value for name, value, _ in figs.items}))
    return 0 if ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
