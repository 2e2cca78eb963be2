#!/usr/bin/env python3
"""failover: how long from stopping the leader to the first successful claim.

Starts a three-node cluster on loopback (tests/integration/harness.py), then ROUNDS times:
stops the leader (SIGKILL by default; --signal term for a planned stop, which hands
leadership over first), claims fresh keys in a tight loop against the survivors (deadline
50 ms each) until one is acquired, records the time from the signal, restarts the stopped
node and waits until it has caught up (the three replicas identical). Prints each round, then the median, 90th percentile and
maximum. A benchmark, not a test: it asserts nothing.

Usage: tools/bench/failover.py [ROUNDS] [--signal kill|term] [--election-ms N]
       [--heartbeat-ms N]   (ROUNDS default 5; timings default to the server's defaults;
       the binaries come from build/bin, or IDEM_BIN_DIR)
"""
import argparse
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from harness import Cluster, fp  # noqa: E402


def first_claim(c, survivors, tag, t0):
    """Claims fresh keys on the survivors until one is acquired: (seconds since t0, tries)."""
    i = 0
    while time.monotonic() - t0 < 30:
        i += 1
        rc, out = c.ctl("claim", "failover-%s-%d" % (tag, i), "--fingerprint", fp(i),
                        ids=survivors, deadline=50)
        if rc == 0 and out and out.get("outcome") == "acquired":
            break
    return time.monotonic() - t0, i


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("--signal", choices=("kill", "term"), default="kill")
    ap.add_argument("--election-ms", type=int, default=None)
    ap.add_argument("--heartbeat-ms", type=int, default=None)
    a = ap.parse_args()
    sig = signal.SIGKILL if a.signal == "kill" else signal.SIGTERM
    c = Cluster(election_ms=a.election_ms, heartbeat_ms=a.heartbeat_ms)
    times = []
    try:
        c.wait_leader(timeout=20)
        for r in range(a.rounds):
            lid = c.leader()
            survivors = [n for n in c.nodes if n != lid]
            node = c.nodes[lid]
            t0 = time.monotonic()
            node.proc.send_signal(sig)
            took, tries = first_claim(c, survivors, "%d" % r, t0)
            node.proc.wait(timeout=30)
            node.proc = None
            times.append(took)
            print("round %d: SIG%s to leader %d, first claim acquired after %.3f s (%d tries)"
                  % (r + 1, a.signal.upper(), lid, took, tries), flush=True)
            c.start(lid)
            # Caught up, not only rejoined: a node still behind the log cannot be elected,
            # and the next kill would measure a cluster with one node short.
            c.wait_converged(3)
        times.sort()
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        print("SIG%s: median %.3f s over %d rounds (min %.3f, p90 %.3f, max %.3f)"
              % (a.signal.upper(), statistics.median(times), len(times), times[0], p90,
                 times[-1]))
    finally:
        c.close()


if __name__ == "__main__":
    main()
