#!/usr/bin/python3
"""chaos: idemd under repeated faults and concurrent load, every answer checked.

    tools/chaos.sh [--duration S] [--seed N] [--nemesis LIST] [--workers N] [--keys N]
                   [--policy takeover|conflict] [--out DIR]

A three-node cluster (and a spare for membership changes), each node in its own network
namespace (net.py), with a proxy route in front of the ledger (ledger.py, the fenced
upstream); workers (workload.py) send proxy requests, JSON API claims and libidem calls on
shared keys while the nemesis (nemesis.py) kills, pauses, partitions, wipes, re-members and
power-cuts nodes. Every operation, execution and fault is recorded (history.py); after the
faults stop the run heals the cluster, waits for it to serve again and for every replica to
hold the same state (idemctl status --digest), reads back a sample of the acknowledged
keys (workload.final_reads), stops the nodes cleanly, scans their logs for
sanitizer reports and aborts, and hands everything to the checker (checker.py). The figures
and a timeline picture come from report.py. The summary is printed last; the exit status is
0 when the checker found nothing (1: violations, with the seed and the history's path
printed; 2: the run itself could not be made; 77: this machine cannot run it: not root, no
nft, no FUSE for the power cut).

Every process the run starts dies with it however it ends (PR_SET_PDEATHSIG through
setpriv, from the main thread) and is otherwise ended by PID in the `finally` below, which
also removes the namespaces, the power-cut disk and the nodes' directories; the output
directory stays (it is the run's record: the three logs, the nodes' logs, summary.json,
timeline.svg; a directory used before loses its previous run's record first). The
namespaces and disks of a run killed before its cleanup are swept by the next run.
"""
import argparse
import glob
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402
import net as netmod  # noqa: E402
import report  # noqa: E402
from cluster import PROXY_TTL_MS, TENANT_TTL_MS, Cluster, spawn, wait_until  # noqa: E402
from history import JsonlWriter, read_jsonl  # noqa: E402
from nemesis import KINDS, Nemesis  # noqa: E402
from workload import Workload, _http  # noqa: E402

LOG_PROBLEMS = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|"
                          r"runtime error:|Assertion .* failed|assertion failed|"
                          r"\bAborted\b|stack-buffer|heap-use-after-free|SUMMARY: ")
SKIP = 77


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="tools/chaos.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0,
                    help="seconds of load and faults (default 60)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: a new one)")
    ap.add_argument("--nemesis", default=",".join(KINDS),
                    help="comma-separated fault kinds (default: %s)" % ",".join(KINDS))
    ap.add_argument("--workers", type=int, default=9,
                    help="client threads, proxy, json and lib in turn (default 9)")
    ap.add_argument("--keys", type=int, default=8, help="live keys per pool (default 8)")
    ap.add_argument("--policy", choices=("takeover", "conflict"), default="takeover",
                    help="what a claim does with an expired lease (default takeover)")
    ap.add_argument("--out", default=None, help="output directory (default: a new temp dir)")
    ap.add_argument("--bin-dir", default=os.environ.get("IDEM_BIN_DIR") or
                    os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--idemd", default=None, help="the daemon binary (default BIN_DIR/idemd)")
    ap.add_argument("--expect-violation", default=None, metavar="INVARIANT",
                    help="succeed only if the checker flags this invariant (the checker's "
                         "own test against a deliberately broken build)")
    a = ap.parse_args(argv)
    kinds = [k for k in a.nemesis.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error("unknown nemesis kind(s) %s; known: %s" % (",".join(bad), ",".join(KINDS)))
    a.kinds = kinds
    if a.duration <= 0 or a.duration > 7200:
        ap.error("--duration must be in (0, 7200]")
    if not 1 <= a.workers <= 64 or not 1 <= a.keys <= 10000:
        ap.error("--workers must be 1-64 and --keys 1-10000")
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 2**31)
    return a


def prerequisites(a):
    why = netmod.missing_prerequisite()
    if why:
        return why
    if shutil.which("setpriv") is None or shutil.which("nsenter") is None:
        return "no setpriv/nsenter (util-linux)"
    if "powercut" in a.kinds:
        import powerdisk
        why = powerdisk.missing_prerequisite()
        if why:
            return "power cut: " + why
    return None


OUTPUTS = ("history.jsonl", "ledger.jsonl", "nemesis.jsonl", "ledger.log", "summary.json",
           "timeline.svg", "node1.log", "node2.log", "node3.log", "node4.log")
ROOT_PREFIX = "idem-chaos-nodes-"  # then the runner's PID and "-": the nodes' directories


def sweep_stale_roots():
    """Removes the nodes' directories that runs killed before their cleanup left (their
    runner's PID is gone). Their namespaces (net.sweep_stale) and power-cut disks
    (powerdisk.sweep_stale) are swept by those modules."""
    for d in glob.glob(os.path.join(tempfile.gettempdir(), ROOT_PREFIX + "*-*")):
        pid = os.path.basename(d)[len(ROOT_PREFIX):].split("-")[0]
        if pid.isdigit() and not netmod.pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def log_problems(cluster):
    out = []
    for node in cluster.nodes.values():
        try:
            with open(node.log, "rb") as f:
                for line in f:
                    text = line.decode("utf-8", errors="replace").rstrip()
                    if LOG_PROBLEMS.search(text):
                        out.append({"node": node.id, "line": text[:300]})
        except FileNotFoundError:
            pass
    return out


def first_claim(cluster, deadline_s):
    """Seconds until a fresh key is acquired through some node's JSON API, or None."""
    t0 = time.monotonic()
    key = "recovery-" + secrets.token_hex(6)

    def attempt():
        for nid in cluster.voters:
            try:
                st, _, text = _http(cluster.nodes[nid].http, "POST", "/v1/claims",
                                    json.dumps({"fingerprint": "ab" * 32,
                                                "attempt_id": "recovery"}),
                                    {"Authorization": "Bearer " + cluster.token,
                                     "Idempotency-Key": key,
                                     "Content-Type": "application/json"}, 5)
            except Exception:
                continue
            if st == 200 and json.loads(text).get("outcome") == "acquired":
                return True
        return False

    if wait_until(attempt, deadline_s, 0.1):
        return time.monotonic() - t0
    return None


def run(a):
    out = a.out or tempfile.mkdtemp(prefix="idem-chaos-%d-" % a.seed)
    os.makedirs(out, exist_ok=True)
    # A directory used before (ctest's fixed one) holds another run's record: the logs are
    # appended to, so they go first (two runs' histories would mix keys and exec ids).
    for name in OUTPUTS:
        try:
            os.unlink(os.path.join(out, name))
        except FileNotFoundError:
            pass
    for name in glob.glob(os.path.join(out, "lib-driver-*.log")):
        os.unlink(name)
    sweep_stale_roots()
    root = tempfile.mkdtemp(prefix="%s%d-" % (ROOT_PREFIX, os.getpid()))
    bin_dir = os.path.abspath(a.bin_dir)
    print("chaos: seed %d, %g s, nemesis %s, %d workers, %d keys, policy %s, output %s"
          % (a.seed, a.duration, ",".join(a.kinds), a.workers, a.keys, a.policy, out),
          flush=True)
    netmod.sweep_stale()
    import powerdisk
    if powerdisk.missing_prerequisite() is None:
        powerdisk.sweep_stale()
    net = cl = ledger = disk = wl = None
    hist = JsonlWriter(os.path.join(out, "history.jsonl"))
    nlog = JsonlWriter(os.path.join(out, "nemesis.jsonl"))
    ledger_log = os.path.join(out, "ledger.jsonl")
    final = {"recovered": False, "recovery_s": None, "converged": False, "applied_index": None,
             "digest": None, "unexpected_exits": [], "driver_exits": [], "log_problems": []}
    try:
        net = netmod.Network(4)
        netmod.enter(net.hub)
        with open(os.path.join(out, "ledger.log"), "ab") as errlog:
            ledger = spawn([sys.executable, os.path.join(HERE, "ledger.py"), "--listen",
                            netmod.HUB_ADDR + ":8080", "--log", ledger_log, "--seed",
                            str(a.seed)], stdout=subprocess.PIPE, stderr=errlog)
        if not ledger.stdout.readline().strip():
            raise RuntimeError("the ledger did not start")
        ledger_addr = netmod.HUB_ADDR + ":8080"
        data_dirs = {}
        disk_node = 3
        if "powercut" in a.kinds:
            disk = powerdisk.PowerDisk()  # in the temp dir, where the next run sweeps it
            data_dirs[disk_node] = os.path.join(disk.path, "node%d" % disk_node)
        cl = Cluster(net, root, bin_dir, n=3, spares=1, ledger_url="http://" + ledger_addr,
                     policy=a.policy, data_dirs=data_dirs, idemd=a.idemd)
        for nid in cl.voters:
            cl.start(nid)
        cl.wait_leader(timeout=60)
        cl.wait_ready_all(timeout=60)
        nemesis = Nemesis(cl, net, nlog, a.seed, a.kinds, disk=disk, disk_node=disk_node)
        clocks = [time.time() - time.monotonic()]
        t_start = time.monotonic()
        wl = Workload(cl, ledger_addr, hist, a.seed, a.workers, a.keys, a.policy, t_start)
        wl.start_drivers(os.path.join(bin_dir, "client_driver"), out)
        wl.start()
        nemesis.run(t_start + a.duration)
        stuck = wl.finish(timeout=60)
        final["driver_exits"] = wl.driver_exits
        t_end = time.monotonic()
        clocks.append(time.time() - time.monotonic())
        nemesis.heal_all()
        t_heal = time.monotonic()
        rec = first_claim(cl, 60)
        final["recovered"] = rec is not None
        final["recovery_s"] = None if rec is None else round(time.monotonic() - t_heal, 3)
        conv = wait_until(lambda: cl.converged(cl.voters), 90, 0.5)
        if conv:
            final.update(converged=True, **conv)
        # Acknowledged keys read back once everything is healed: a record lost at a later
        # election shows here even when no worker asked for its key again.
        sample = wl.final_sample(read_jsonl(os.path.join(out, "nemesis.jsonl")))
        final["final_reads"] = {"keys": len(sample), "answered": wl.final_reads(sample)}
        for nid, rc in cl.exited():
            nemesis.unexpected.append({"node": nid, "status": rc, "t": time.monotonic()})
        for nid in cl.running():
            found = len(cl.early_exits)
            rc = cl.stop(nid)
            if rc != 0 and len(cl.early_exits) == found:  # else noted as found exited
                nemesis.unexpected.append({"node": nid, "status": rc, "t": time.monotonic(),
                                           "at": "clean shutdown"})
        final["unexpected_exits"] = sorted(nemesis.unexpected + cl.early_exits,
                                           key=lambda x: x["t"])
        final["log_problems"] = log_problems(cl)
        if stuck:
            final["log_problems"].append({"node": None, "line": "workers still running after "
                                          "60 s: %s" % ", ".join(stuck)})
        for text in wl.crashed:
            final["log_problems"].append({"node": None, "line": "worker ended on an "
                                          "exception: " + text})
    finally:
        _cleanup(wl, cl, ledger, disk, net, hist, nlog, root, out)
    ops = read_jsonl(os.path.join(out, "history.jsonl"))
    ledger_recs = read_jsonl(ledger_log)
    faults = read_jsonl(os.path.join(out, "nemesis.jsonl"))
    # Leases run on the leader's wall clock, the history on the monotonic one: if the wall
    # clock was stepped during the run, the time-based rules allow for the step.
    drift = abs(clocks[1] - clocks[0])
    violations = checker.check(ops, ledger_recs, faults, final,
                               {"tolerance_s": checker.DEFAULT_PARAMS["tolerance_s"] + drift,
                                "ttl_s": {"proxy": PROXY_TTL_MS / 1000.0,
                                          "json": TENANT_TTL_MS / 1000.0,
                                          "lib": TENANT_TTL_MS / 1000.0}})
    fig = report.figures(ops, ledger_recs, faults, t_start, t_end)
    report.timeline_svg(ops, faults, t_start, t_end, os.path.join(out, "timeline.svg"))
    summary = {"seed": a.seed, "args": {k: v for k, v in vars(a).items()},
               "t_start": t_start, "t_end": t_end, "wall_clock_drift_s": drift,
               "final": final, "figures": fig,
               "violations": violations, "history": os.path.join(out, "history.jsonl"),
               "timeline": os.path.join(out, "timeline.svg")}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    return out, violations, fig, final


def _cleanup(wl, cl, ledger, disk, net, hist, nlog, root, out):
    """Ends everything the run started, each step on its own (one that fails does not keep
    the next from running; the first error is raised at the end): the lib drivers, the nodes,
    the ledger, the power-cut disk, the namespaces; the logs are closed and the nodes' logs
    kept in the output directory before the nodes' directory goes."""
    # A second Ctrl-C or SIGTERM must not cut the cleanup short (ctest's time-out kills).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def drivers():
        wl.stop.set()
        for p in wl.drivers:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    def nodes():
        cl.close()
        for node in cl.nodes.values():
            if os.path.exists(node.log):
                shutil.copyfile(node.log, os.path.join(out, os.path.basename(node.log)))

    def the_ledger():
        ledger.kill()
        ledger.wait(timeout=10)

    steps = [(wl, drivers), (cl, nodes), (ledger, the_ledger), (disk, lambda: disk.close()),
             (net, lambda: net.close()), (hist, hist.close), (nlog, nlog.close),
             (root, lambda: shutil.rmtree(root, ignore_errors=True))]
    first = None
    for obj, step in steps:
        if obj is None:
            continue
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the next steps must run; raised below
            first = first or e
    if first is not None:
        raise first


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    why = prerequisites(a)
    if why:
        print("chaos: skipped: %s" % why, flush=True)
        return SKIP
    # SIGINT (Ctrl-C; set explicitly: a shell starts background jobs with it ignored) and
    # SIGTERM (kill) end the run through the same cleanup.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        out, violations, fig, final = run(a)
    except KeyboardInterrupt:
        print("chaos: interrupted (seed %d)" % a.seed, flush=True)
        return 130
    except Exception:
        import traceback
        traceback.print_exc()
        print("chaos: the run could not be made (seed %d)" % a.seed, flush=True)
        return 2
    lines = report.summary_lines(fig, violations, final)
    for line in lines:
        print(line)
    names = {v["invariant"] for v in violations}
    if a.expect_violation is not None:
        if a.expect_violation in names:
            print("chaos: the checker flagged %s, as expected of this build (seed %d)"
                  % (a.expect_violation, a.seed))
            print(lines[-1])
            return 0
        print("chaos: FAILED: expected the checker to flag %s; it flagged %s (seed %d, "
              "history %s)" % (a.expect_violation, sorted(names) or "nothing", a.seed,
                               os.path.join(out, "history.jsonl")))
        print(lines[-1])
        return 1
    if violations:
        print("chaos: FAILED: %d violations; replay with --seed %d; history %s"
              % (len(violations), a.seed, os.path.join(out, "history.jsonl")))
        print(lines[-1])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
