#!/usr/bin/env python3
"""rehearsal: three idemd nodes run as a platform team runs them on three hosts.

Each node has its own network namespace, address and host name (idem-n1..idem-n3, in a
hosts file per namespace that `ip netns exec` mounts over /etc/hosts), and runs from a
`cmake --install` of the build into a staging prefix, started the way the installed systemd
unit says: its ExecStartPre (the config check) must pass, its ExecStart runs with
NOTIFY_SOCKET set to a socket of this script's, which must receive READY=1 (and STOPPING=1
on the unit's KillSignal). Every address in the configuration is a host name; the nodes bind
0.0.0.0. Then, in order:

  1. token rotation under load: an RPC load (idem-bench, open loop) and an HTTP load (JSON
     API claims to every gateway) run with token A; every node's file gets A and B, SIGHUP;
     the loads move to B; A is removed, SIGHUP. No request may fail, and A is refused after.
  2. a node's address changes: node 3 stops, its namespace's address changes, the hosts
     files say so, node 3 starts with the same configuration. It rejoins under its name:
     with another node stopped, node 3 is needed for the quorum, and claims still succeed.
  3. the alert rules against the nodes' real /metrics (`promtool test rules`): scrapes of a
     healthy cluster fire no alert; scrapes with two nodes stopped and claims refused fire
     IdemNoLeader and IdemFailClosedAnswers for the survivor and IdemNodeDown for the others.

Needs root, ip(8), nft(8) (the chaos suite's network), promtool and cmake.
Run: python3 tests/rehearsal/rehearsal.py --build-dir build
Exit status 0 when every step passed, 1 when one failed, 77 when a prerequisite is missing.
"""
import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import net as netmod  # noqa: E402

NAMES = {1: "idem-n1", 2: "idem-n2", 3: "idem-n3"}
RAFT, RPC, HTTP = 9001, 7001, 8001
RULES = os.path.join(ROOT, "tools", "monitoring", "idemd-alerts.yml")
SKIP = 77


def say(msg):
    print("rehearsal: " + msg, flush=True)


def sha(t):
    return hashlib.sha256(t.encode()).hexdigest()


def wait_for(cond, timeout, what, interval=0.1):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


# ---- the outer process: namespaces, hosts files, staging install, cleanup ---------------------

def hosts_text(addrs):
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += ["%s %s" % (addrs[i], NAMES[i]) for i in sorted(addrs)]
    return "\n".join(lines) + "\n"


def write_in_place(path, text):
    """Rewrites path keeping its inode: `ip netns exec` bind-mounted it over /etc/hosts in
    the namespaces' mount namespaces, and a new file would not be seen through that mount."""
    with open(path, "r+" if os.path.exists(path) else "w") as f:
        f.seek(0)
        f.truncate()
        f.write(text)


def outer(a):
    why = netmod.missing_prerequisite()
    for tool in ("promtool", "cmake"):
        if why is None and shutil.which(tool) is None:
            why = "no %s (tools/setup.sh --test installs it)" % tool
    if why is not None:
        print("rehearsal: skipped: " + why)
        return SKIP
    netmod.sweep_stale()
    tmp = tempfile.mkdtemp(prefix="idem-rehearsal-")
    os.chmod(tmp, 0o755)
    stage = os.path.join(tmp, "stage")
    net = None
    etc_dirs = []
    try:
        say("installing %s into %s" % (a.build_dir, stage))
        subprocess.run(["cmake", "--install", a.build_dir, "--prefix", stage], check=True,
                       stdout=subprocess.DEVNULL)
        net = netmod.Network(3)
        addrs = {i: net.addr(i) for i in net.ids}
        for ns in [net.hub] + [net.ns(i) for i in net.ids]:
            d = "/etc/netns/" + ns
            os.makedirs(d, exist_ok=True)
            etc_dirs.append(d)
            write_in_place(os.path.join(d, "hosts"), hosts_text(addrs))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        cmd = ["ip", "netns", "exec", net.hub, sys.executable, os.path.abspath(__file__),
               "--inner", "--tmp", tmp, "--stage", stage, "--tag", net.tag]
        p = subprocess.run(cmd, env=env, timeout=a.timeout)
        return p.returncode
    finally:
        pids_file = os.path.join(tmp, "pids")
        if os.path.exists(pids_file):
            with open(pids_file) as f:
                for line in f:
                    try:
                        os.kill(int(line), signal.SIGKILL)
                    except (ValueError, ProcessLookupError):
                        pass
        if net is not None:
            net.close()
        for d in etc_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if a.keep:
            say("kept " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# ---- the inner process (in the hub namespace, with its hosts file) ---------------------------

class Unit:
    """The installed systemd unit: what a service manager would run."""

    def __init__(self, stage):
        path = None
        for base, _, files in os.walk(stage):
            if "idemd.service" in files:
                path = os.path.join(base, "idemd.service")
        if path is None:
            raise AssertionError("the install has no idemd.service")
        with open(path) as f:
            text = f.read()
        self.path = path
        self.kv = {}
        for line in text.splitlines():
            m = re.match(r"^([A-Za-z]+)=(.*)$", line)
            if m:
                self.kv.setdefault(m.group(1), m.group(2))
        if self.kv.get("Type") != "notify":
            raise AssertionError("%s: Type=%s, not notify" % (path, self.kv.get("Type")))
        for k in ("ExecStartPre", "ExecStart"):
            if not self.kv.get(k, "").startswith(stage):
                raise AssertionError("%s: %s does not run the staged idemd: %s"
                                     % (path, k, self.kv.get(k)))
        self.kill_signal = getattr(signal, self.kv.get("KillSignal", "SIGTERM"))
        self.stop_timeout = float(re.sub(r"s$", "", self.kv.get("TimeoutStopSec", "90")))

    def command(self, key, config):
        """The unit's command line `key`, with this node's config file for the unit's."""
        return [config if w == "/etc/idemd/idemd.yaml" else w for w in self.kv[key].split()]


class Node:
    def __init__(self, nid, tmp, tag):
        self.id = nid
        self.ns = "%s-n%d" % (tag, nid)
        self.dir = os.path.join(tmp, "n%d" % nid)
        self.state = os.path.join(self.dir, "state")  # the unit's WorkingDirectory
        self.cfg = os.path.join(self.dir, "idemd.yaml")
        self.log = os.path.join(self.dir, "idemd.log")
        self.sock_path = os.path.join(self.dir, "notify")
        os.makedirs(self.state, mode=0o700)
        self.proc = None
        self.sock = None
        self.messages = []

    def notify_socket(self):
        if self.sock is not None:
            self.sock.close()
        if os.path.exists(self.sock_path):
            os.unlink(self.sock_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.setblocking(False)
        self.messages = []

    def read_notify(self):
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return self.messages
            for line in data.decode(errors="replace").splitlines():
                self.messages.append(line)

    def notified(self, what):
        return any(m == what for m in self.read_notify())


class Rehearsal:
    def __init__(self, a):
        self.tmp = a.tmp
        self.stage = a.stage
        self.tag = a.tag
        self.bin = os.path.join(a.stage, "bin")
        self.unit = Unit(a.stage)
        self.nodes = {i: Node(i, a.tmp, a.tag) for i in NAMES}
        self.admin = secrets.token_hex(16)
        self.token_a = "A-" + secrets.token_hex(16)
        self.token_b = "B-" + secrets.token_hex(16)
        self.cluster = ",".join("%s:%d" % (NAMES[i], RPC) for i in NAMES)

    # -- configuration and processes --

    def write_config(self, node, tokens):
        lines = [
            "node:",
            "  id: %d" % node.id,
            "  raft_address: %s:%d" % (NAMES[node.id], RAFT),
            "  raft_listen: 0.0.0.0:%d" % RAFT,
            "  rpc_address: %s:%d" % (NAMES[node.id], RPC),
            "  rpc_listen: 0.0.0.0:%d" % RPC,
            "  http_address: %s:%d" % (NAMES[node.id], HTTP),
            "  http_listen: 0.0.0.0:%d" % HTTP,
            "  data_dir: data",
            "cluster:",
            "  bootstrap:",
        ]
        for i in NAMES:
            lines.append("    - {id: %d, raft_address: %s:%d, rpc_address: %s:%d, "
                         "http_address: %s:%d}" % (i, NAMES[i], RAFT, NAMES[i], RPC, NAMES[i], HTTP))
        lines += [
            "raft:",
            "  segment_size_mb: 8",
            "log:",
            "  format: json",
            "admin:",
            "  token_sha256: %s" % sha(self.admin),
            "tenants:",
            "  - name: payments",
            "    token_sha256: [%s]" % ", ".join(sha(t) for t in tokens),
        ]
        with open(node.cfg + ".new", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(node.cfg + ".new", node.cfg)

    def ns_cmd(self, node, argv):
        return ["ip", "netns", "exec", node.ns] + argv

    def start(self, node):
        p = subprocess.run(self.ns_cmd(node, self.unit.command("ExecStartPre", node.cfg)),
                           cwd=node.state, capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise AssertionError("node %d: ExecStartPre failed (%d): %s"
                                 % (node.id, p.returncode, p.stderr.strip()))
        node.notify_socket()
        env = dict(os.environ, NOTIFY_SOCKET=node.sock_path)
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(self.ns_cmd(node, self.unit.command("ExecStart", node.cfg)),
                                         cwd=node.state, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        with open(os.path.join(self.tmp, "pids"), "a") as f:
            f.write("%d\n" % node.proc.pid)

    def wait_ready(self, node, timeout=60):
        wait_for(lambda: node.notified("READY=1") or node.proc.poll() is not None, timeout,
                 "READY=1 from node %d" % node.id)
        if node.proc.poll() is not None:
            raise AssertionError("node %d exited (%d) before READY=1"
                                 % (node.id, node.proc.returncode))

    def stop(self, node):
        node.proc.send_signal(self.unit.kill_signal)
        rc = node.proc.wait(timeout=self.unit.stop_timeout)
        if rc != 0:
            raise AssertionError("node %d: exit status %d on %s" % (node.id, rc,
                                 self.unit.kill_signal.name))
        if not node.notified("STOPPING=1"):
            raise AssertionError("node %d sent no STOPPING=1 (got %s)" % (node.id,
                                 node.messages))

    def hup(self):
        before = {i: self.reloads(n, "ok") for i, n in self.nodes.items()}
        for n in self.nodes.values():
            n.proc.send_signal(signal.SIGHUP)
        for i, n in self.nodes.items():
            wait_for(lambda: self.reloads(n, "ok") > before[i], 10, "node %d's reload" % i)
            if n.proc.poll() is not None:
                raise AssertionError("node %d exited on SIGHUP" % i)

    # -- HTTP --

    def http(self, nid, method, path, body=None, headers=None, timeout=10):
        c = http.client.HTTPConnection(NAMES[nid], HTTP, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
        finally:
            c.close()

    def metrics(self, nid):
        st, _, body = self.http(nid, "GET", "/metrics",
                                headers={"Authorization": "Bearer " + self.admin})
        if st != 200:
            raise AssertionError("node %d: /metrics answered %d" % (nid, st))
        return body.decode()

    def reloads(self, node, result):
        try:
            text = self.metrics(node.id)
        except OSError:
            return -1
        m = re.search(r'^idem_config_reloads_total\{result="%s"\} (\S+)$' % result, text, re.M)
        return float(m.group(1)) if m else -1

    def claim(self, nid, token, key, n=1):
        body = json.dumps({"request": {"method": "POST", "path": "/pay", "body": {"n": n}}})
        return self.http(nid, "POST", "/v1/claims", body=body,
                         headers={"Authorization": "Bearer " + token, "Idempotency-Key": key,
                                  "content-type": "application/json"})

    def ctl(self, *args, token=None, timeout=60):
        env = dict(os.environ, IDEM_CLUSTER=self.cluster, IDEM_ADMIN_TOKEN=self.admin,
                   IDEM_TOKEN=token or self.token_b)
        return subprocess.run([os.path.join(self.bin, "idemctl")] + list(args), env=env,
                              capture_output=True, text=True, timeout=timeout)

    def status(self):
        p = self.ctl("status", "--json")
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    # -- the steps --

    def boot(self):
        for n in self.nodes.values():
            self.write_config(n, [self.token_a])
        for n in self.nodes.values():
            self.start(n)
        for n in self.nodes.values():
            self.wait_ready(n)
        say("three nodes READY=1 (names %s, started from %s)"
            % (", ".join(NAMES.values()), self.unit.path))

    def rotate_token(self):
        """Step 1: token A to token B under load, no failed request."""
        tokens = {"now": self.token_a}
        failures, counts, stop = [], {"http": 0}, threading.Event()

        def http_load(nid):
            k = 0
            while not stop.is_set():
                k += 1
                key = "h%d-%d" % (nid, k)
                try:
                    st, _, body = self.claim(nid, tokens["now"], key)
                except OSError as e:
                    failures.append("node %d: %s" % (nid, e))
                    continue
                if st != 200 or json.loads(body).get("outcome") != "acquired":
                    failures.append("node %d: %d %s" % (nid, st, body[:200]))
                counts["http"] += 1
                time.sleep(0.01)

        def bench(token, seconds):
            return subprocess.Popen(
                [os.path.join(self.bin, "idem-bench"), "--cluster", self.cluster, "--token",
                 token, "--workload", "fresh", "--rate", "300", "--duration", str(seconds),
                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        threads = [threading.Thread(target=http_load, args=(i,)) for i in NAMES]
        bench_a = bench(self.token_a, 10)
        for t in threads:
            t.start()
        try:
            time.sleep(2)
            for n in self.nodes.values():
                self.write_config(n, [self.token_a, self.token_b])
            self.hup()
            say("A and B accepted on every node (SIGHUP)")
            bench_b = bench(self.token_b, 10)
            tokens["now"] = self.token_b
            out_a, err_a = bench_a.communicate(timeout=60)
            for n in self.nodes.values():
                self.write_config(n, [self.token_b])
            self.hup()
            say("A removed on every node (SIGHUP)")
            out_b, err_b = bench_b.communicate(timeout=60)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        for name, p, out, err in (("A", bench_a, out_a, err_a), ("B", bench_b, out_b, err_b)):
            if p.returncode != 0:
                raise AssertionError("idem-bench with token %s: exit %d: %s"
                                     % (name, p.returncode, err.strip()[-500:]))
            r = json.loads(out)
            errors = r.get("errors", r.get("failed"))
            if errors is None or errors != 0 or r.get("ops", 0) <= 0:
                raise AssertionError("idem-bench with token %s: %s" % (name, out.strip()[:800]))
            say("RPC load with token %s: %d ops, 0 errors" % (name, r["ops"]))
        if failures:
            raise AssertionError("%d HTTP claims failed during the rotation, first: %s"
                                 % (len(failures), failures[:3]))
        say("HTTP load: %d claims, 0 failed" % counts["http"])
        st, _, _ = self.claim(1, self.token_a, "after-rotation")
        if st != 401:
            raise AssertionError("token A after its removal: %d, not 401" % st)
        p = self.ctl("claim", "after-rotation", "--fingerprint", "%064d" % 1, token=self.token_a)
        if p.returncode != 4:
            raise AssertionError("idemctl claim with token A: exit %d, not 4: %s"
                                 % (p.returncode, p.stdout + p.stderr))

    def leader(self):
        st = self.status()
        if not st:
            return None
        for n in st.get("nodes", []):
            if n.get("role") == "leader":
                return n.get("id")
        return None

    def change_address(self, net_addr):
        """Step 2: node 3 moves to a new address under the same name."""
        n3 = self.nodes[3]
        self.stop(n3)
        old = net_addr(3)
        new = old.rsplit(".", 1)[0] + ".13"
        subprocess.run(["ip", "-n", n3.ns, "addr", "del", old + "/24", "dev", "eth0"], check=True)
        subprocess.run(["ip", "-n", n3.ns, "addr", "add", new + "/24", "dev", "eth0"], check=True)
        addrs = {1: net_addr(1), 2: net_addr(2), 3: new}
        for ns in [self.tag + "-hub"] + [n.ns for n in self.nodes.values()]:
            write_in_place(os.path.join("/etc/netns", ns, "hosts"), hosts_text(addrs))
        if socket.gethostbyname(NAMES[3]) != new:
            raise AssertionError("the hub does not resolve %s to %s" % (NAMES[3], new))
        self.start(n3)
        self.wait_ready(n3)
        say("node 3 restarted at %s (was %s) as %s" % (new, old, NAMES[3]))
        # Node 3 must be a working voter again: stop another follower, and claims still pass
        # only with node 3 in the quorum.
        lead = wait_for(self.leader, 30, "a leader")
        other = [i for i in (1, 2) if i != lead][0] if lead != 3 else 1
        self.stop(self.nodes[other])
        live = [i for i in NAMES if i != other]

        def claims_pass():
            try:
                st, _, body = self.claim(live[0], self.token_b, "moved-%s" % secrets.token_hex(4))
            except OSError:
                return False
            return st == 200 and json.loads(body).get("outcome") == "acquired"
        wait_for(claims_pass, 30, "a claim with node %d stopped and node 3 moved" % other, 0.5)
        say("with node %d stopped, claims succeed through node 3's new address" % other)
        self.start(self.nodes[other])
        self.wait_ready(self.nodes[other])

    def scrape_all(self):
        out = {}
        for i in NAMES:
            try:
                out[i] = self.metrics(i)
            except (OSError, AssertionError):
                out[i] = None
        return out

    def settled_scrape(self):
        """The nodes' scrapes once every node has applied what the leader committed: the
        state the synthetic series below hold for minutes (a follower a heartbeat behind
        would read there as one lagging for good)."""
        def settled():
            got = self.scrape_all()
            if any(v is None for v in got.values()):
                return None
            applied = {re.search(r"^idem_raft_applied_index (\S+)$", t, re.M).group(1)
                       for t in got.values()}
            commit = {re.search(r"^idem_raft_commit_index (\S+)$", t, re.M).group(1)
                      for t in got.values()}
            return got if len(applied) == 1 and applied == commit else None
        return wait_for(settled, 30, "every node to apply the leader's commit index", 0.2)

    def alerts(self):
        """Step 3: the alert rules against real scrapes."""
        for i in NAMES:
            self.claim(i, self.token_b, "m-%d" % i)
        healthy0 = self.settled_scrape()
        # Between the two scrapes, a few hundred claims: each rate the rules take (requests,
        # log appends and their latency histogram) then stands on many events, not a handful
        # whose slowest would be the p99 of IdemLogAppendSlow.
        p = subprocess.run(
            [os.path.join(self.bin, "idem-bench"), "--cluster", self.cluster, "--token",
             self.token_b, "--workload", "fresh", "--concurrency", "16", "--requests", "600",
             "--duration", "20", "--json"], capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or json.loads(p.stdout).get("errors") != 0:
            raise AssertionError("idem-bench between the healthy scrapes: %s %s"
                                 % (p.stdout[-500:], p.stderr[-500:]))
        healthy1 = self.settled_scrape()
        check_rules(self.tmp, "healthy", healthy0, healthy1, expect={})
        say("healthy scrapes: no alert fires")
        lead = wait_for(self.leader, 30, "a leader")
        survivor = [i for i in NAMES if i != lead][0]
        for i in NAMES:
            if i != survivor:
                self.stop(self.nodes[i])
        wait_for(lambda: re.search(r"^idem_has_leader 0$", self.metrics(survivor), re.M),
                 30, "node %d to know it has no leader" % survivor, 0.5)
        before = self.scrape_all()
        refused = 0
        for k in range(20):
            st, _, _ = self.claim(survivor, self.token_b, "q-%d" % k, n=k)
            refused += st == 503
        if refused == 0:
            raise AssertionError("no claim was refused 503 without a quorum")
        after = self.scrape_all()
        down = [i for i in NAMES if i != survivor]
        job = {"job": "idemd"}
        expect = {"IdemNoLeader": [job], "IdemFailClosedAnswers": [job],
                  "IdemNodeDown": [dict(job, instance=instance(i)) for i in down]}
        check_rules(self.tmp, "no_quorum", before, after, expect)
        say("quorum lost: %s fire as expected"
            % ", ".join(sorted(expect)))
        for i in NAMES:
            if i != survivor:
                self.start(self.nodes[i])
        for i in NAMES:
            self.wait_ready(self.nodes[i])

    def shutdown(self):
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                self.stop(n)


# ---- promtool: the scrapes as input series ---------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)(?: \d+)?$')


def parse_metrics(text):
    """{(name, labels text): value} and {family: type} of one exposition."""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, typ = line.split(None, 3)
            types[fam] = typ
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                raise AssertionError("unparsable /metrics line: %r" % line[:200])
            samples[(m.group(1), m.group(2) or "{}")] = float(m.group(3))
    return samples, types


def is_counter(name, types):
    """Whether sample `name` only grows: a counter's, or a histogram's or summary's _bucket,
    _count or _sum (the exposition's TYPE line names the family)."""
    if types.get(name) == "counter":
        return True
    for suffix, kinds in (("_total", ("counter",)), ("_bucket", ("histogram",)),
                          ("_count", ("histogram", "summary")), ("_sum", ("histogram", "summary"))):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in kinds:
            return True
    return False


def series_label(labels, instance):
    inner = labels[1:-1]
    extra = 'instance="%s", job="idemd"' % instance
    return "{" + (inner + ", " if inner else "") + extra + "}"


def fmt(v):
    return repr(float(v)) if v != int(v) else str(int(v))


def input_series(before, after, minutes=30, change_at=10):
    """Promtool input: each series holds its `before` value until minute change_at; from
    there a counter keeps growing by what it grew between the two scrapes every minute (the
    state of the second scrape goes on), a gauge holds its `after` value. A node whose
    scrape failed is `up 0` from change_at."""
    out = []
    for nid in NAMES:
        inst = instance(nid)
        b, a = before.get(nid), after.get(nid)
        up_b, up_a = int(b is not None), int(a is not None)
        out.append({"series": 'up{instance="%s", job="idemd"}' % inst,
                    "values": "%dx%d %dx%d" % (up_b, change_at - 1, up_a, minutes - change_at)})
        if b is None:
            continue
        sb, types = parse_metrics(b)
        sa = parse_metrics(a)[0] if a is not None else {}
        for (name, labels), vb in sorted(sb.items()):
            tail = minutes - change_at
            if a is None:
                vals = "%sx%d _x%d" % (fmt(vb), change_at - 1, tail)
            elif is_counter(name, types):
                va = sa.get((name, labels), vb)
                step = max(0.0, va - vb)
                vals = "%sx%d %s+%sx%d" % (fmt(vb), change_at - 1, fmt(va), fmt(step), tail)
            else:
                va = sa.get((name, labels), vb)
                vals = "%sx%d %sx%d" % (fmt(vb), change_at - 1, fmt(va), tail)
            out.append({"series": name + series_label(labels, inst), "values": vals})
    return out


def load_rules():
    import yaml
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    if not rules:
        raise AssertionError("%s has no alert" % RULES)
    return rules


def duration_s(text):
    total = 0
    for num, unit in re.findall(r"(\d+)([smhd])", text or "0s"):
        total += int(num) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return total


def instance(nid):
    return "%s:%d" % (NAMES[nid], HTTP)


def rules_without_annotations(tmp):
    """A copy of the rules file without the annotations: what is checked here is whether
    each alert's expression, `for` and labels fire on real series (the annotations' text is
    checked by tools/monitoring/idemd-alerts.test.yml)."""
    import yaml
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    for g in doc["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    path = os.path.join(tmp, "rules-no-annotations.yml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def check_rules(tmp, name, before, after, expect):
    """Runs promtool test rules on the scrapes; expect: {alert: [label sets]}: the alerts
    that must fire, each with the labels its expression leaves (every other alert must not
    fire)."""
    import yaml
    rules = load_rules()
    longest_for = max(duration_s(r.get("for")) for r in rules)
    change_at = 10
    eval_min = change_at + (longest_for + 59) // 60 + 1
    tests = []
    for r in rules:
        exp = [{"exp_labels": dict(r.get("labels", {}), **labels)}
               for labels in expect.get(r["alert"], [])]
        tests.append({"eval_time": "%dm" % eval_min, "alertname": r["alert"], "exp_alerts": exp})
    unknown = set(expect) - {r["alert"] for r in rules}
    if unknown:
        raise AssertionError("no such alert in %s: %s" % (RULES, sorted(unknown)))
    doc = {"rule_files": [rules_without_annotations(tmp)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m",
                      "input_series": input_series(before, after, eval_min + 5, change_at),
                      "alert_rule_test": tests}]}
    path = os.path.join(tmp, "promtool-%s.yml" % name)
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    p = subprocess.run(["promtool", "test", "rules", path], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise AssertionError("promtool test rules %s (%s):\n%s%s"
                             % (path, name, p.stdout[-4000:], p.stderr[-2000:]))


def inner(a):
    r = Rehearsal(a)
    ok = False
    try:
        r.boot()
        r.rotate_token()
        r.change_address(lambda i: "%s.%d" % (netmod.SUBNET, i))
        r.alerts()
        r.shutdown()
        ok = True
        say("passed")
    except AssertionError as e:
        say("FAILED: %s" % e)
    finally:
        for n in r.nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        if not ok:
            for n in r.nodes.values():
                if os.path.exists(n.log):
                    with open(n.log, errors="replace") as f:
                        tail = f.readlines()[-15:]
                    say("node %d's log, last lines:\n%s" % (n.id, "".join(tail)))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        return inner(a)
    a.build_dir = os.path.abspath(a.build_dir)
    return outer(a)


if __name__ == "__main__":
    sys.exit(main())
