#!/usr/bin/env python3
"""failover: how long from SIGKILL of the leader to the first successful claim.

Starts a three-node cluster on loopback (tests/integration/harness.py), then ROUNDS times:
kill -9 the leader, claim fresh keys in a tight loop against the survivors (deadline
200 ms each) until one is acquired, record the time, restart the killed node and wait for
it to rejoin. Prints each round and the median. A benchmark, not a test: it asserts
nothing. Usage: tools/bench/failover.py [ROUNDS] (default 5; needs build/bin).
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from harness import Cluster, fp, wait_for  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    c = Cluster()
    times = []
    try:
        c.wait_leader(timeout=20)
        for r in range(rounds):
            lid = c.leader()
            survivors = [n for n in c.nodes if n != lid]
            c.kill(lid, 9)
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < 30:
                i += 1
                rc, out = c.ctl("claim", "failover-%d-%d" % (r, i), "--fingerprint", fp(i),
                                ids=survivors, deadline=200)
                if rc == 0 and out and out.get("outcome") == "acquired":
                    break
            took = time.monotonic() - t0
            times.append(took)
            print("round %d: killed node %d, first claim acquired after %.3f s (%d tries)"
                  % (r + 1, lid, took, i), flush=True)
            c.start(lid)
            wait_for(lambda: sum(1 for n in (c.status() or {}).get("nodes", [])
                                 if n["role"] in ("leader", "follower")) == 3, 30, "rejoin")
        print("median %.3f s over %d rounds (min %.3f, max %.3f)"
              % (statistics.median(times), len(times), min(times), max(times)))
    finally:
        c.close()


if __name__ == "__main__":
    main()
