"""cluster: idemd nodes for the chaos suite, each in its own network namespace (net.py).

Node i listens on 10.213.0.i (Raft 7001, RPC 7002, HTTP 7003, proxy 7004) with a generated
config: small and frequent snapshots (so a wiped node rejoins from one), a cluster secret (so
followers' gateways and proxies forward to the leader) and one proxy route in front of the
ledger. The secret goes between the nodes' addresses, which are not loopback ones: the RPC is
served over TLS (tls.rpc), with a certificate for every node's address signed by a CA made
at start (make_pki); the nodes trust it through SSL_CERT_FILE, idemctl and the libidem
drivers through their CA option. Every process is started from the runner's main thread through
`setpriv --pdeathsig KILL nsenter --net=NS`, so it dies with the runner however the runner
ends (PR_SET_PDEATHSIG follows the thread that forked it, hence the main thread only), and
is tracked by PID: the runner kills, stops and restarts it with the same argv.
"""
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import http_request, wait_for  # noqa: E402

RAFT, RPC, HTTP, PROXY = 7001, 7002, 7003, 7004
PROXY_PATH = "/pay"
PROXY_TTL_MS = 3600000   # the proxy route's records' ttl
TENANT_TTL_MS = 86400000  # the tenant's: JSON API and libidem claims ask for no ttl


def _sha(t):
    return hashlib.sha256(t.encode()).hexdigest()


def make_pki(d, ips):
    """A CA (ca.crt) and one certificate for every address of ips (node.crt, node.key; server
    and client use) in directory d, with the openssl CLI."""
    def ossl(*args):
        subprocess.run(["openssl"] + list(args), cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
         "-subj", "/CN=idem chaos CA")
    ossl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=idem chaos node")
    with open(os.path.join(d, "node.ext"), "w") as f:
        f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n"
                % ",".join("IP:" + ip for ip in ips))
    ossl("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "node.crt", "-days", "2", "-extfile", "node.ext")


def spawn(argv, log_path=None, stdout=None, stdin=subprocess.DEVNULL, netns=None, stderr=None,
          env=None):
    """Starts argv (in network namespace netns, a path, when given), killed when the calling
    thread ends: call from the main thread only. log_path: stdout and stderr appended there;
    else stdout and stderr as given (None: the runner's). env: its environment (None: the
    runner's)."""
    cmd = ["setpriv", "--pdeathsig", "KILL", "--"]
    if netns is not None:
        cmd += ["nsenter", "--net=" + netns, "--"]
    cmd += argv
    out = stdout
    logf = None
    if log_path is not None:
        logf = open(log_path, "ab")
        out = logf
    try:
        # A session of its own: Ctrl-C in a terminal reaches the runner alone, which then
        # ends every process by PID (a node that got SIGINT too would stop on its own).
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if logf else stderr,
                                stdin=stdin, start_new_session=True, env=env)
    finally:
        if logf is not None:
            logf.close()


class Node:
    def __init__(self, nid, net, root):
        self.id = nid
        self.ip = net.addr(nid)
        self.netns = net.ns_path(nid)
        self.raft = "%s:%d" % (self.ip, RAFT)
        self.rpc = "%s:%d" % (self.ip, RPC)
        self.http = "%s:%d" % (self.ip, HTTP)
        self.proxy = "%s:%d" % (self.ip, PROXY)
        self.dir = os.path.join(root, "node%d" % nid)
        self.cfg = os.path.join(root, "node%d.yaml" % nid)
        self.log = os.path.join(root, "node%d.log" % nid)
        self.proc = None
        self.paused = False
        self.expected_exit = False  # the runner killed or stopped it on purpose


class Cluster:
    """Nodes 1..n as voters (node ids above n are spares, added by the membership nemesis).
    bin_dir holds idemd and idemctl; idemd may name another daemon binary (the checker's
    own test runs a deliberately broken one)."""

    def __init__(self, net, root, bin_dir, n=3, spares=1, ledger_url=None, policy="takeover",
                 data_dirs=None, idemd=None, proxy_lease_ms=2000):
        self.net = net
        self.root = root
        self.bin = bin_dir
        self.idemd = idemd or os.path.join(bin_dir, "idemd")
        self.idemctl = os.path.join(bin_dir, "idemctl")
        self.token = secrets.token_hex(16)
        self.admin = secrets.token_hex(16)
        self.secret = secrets.token_hex(24)
        self.raft_secret = secrets.token_hex(24)
        self.ledger_url = ledger_url
        self.policy = policy
        self.proxy_lease_ms = proxy_lease_ms
        self.nodes = {}
        for i in range(1, n + spares + 1):
            self.nodes[i] = Node(i, net, root)
        for i, d in (data_dirs or {}).items():
            self.nodes[i].dir = d
        self.voters = list(range(1, n + 1))
        # Nodes found already exited when the runner came to kill or stop them, without
        # having been told to exit: crashes a kill would otherwise hide ([{"node", "status",
        # "t", "at"}]; the run reports them with the other unexpected exits).
        self.early_exits = []
        self.pki = os.path.join(root, "pki")
        os.makedirs(self.pki, exist_ok=True)
        make_pki(self.pki, [node.ip for node in self.nodes.values()])
        self.ca = os.path.join(self.pki, "ca.crt")
        boot = [self.nodes[i] for i in self.voters]
        for node in self.nodes.values():
            self.write_config(node, boot if node.id in self.voters else [])

    def _secret_file(self, name, value):
        path = os.path.join(self.root, name)
        with open(path, "w") as f:
            f.write(value + "\n")
        os.chmod(path, 0o600)
        return path

    def write_config(self, node, bootstrap):
        lines = [
            "node:",
            "  id: %d" % node.id,
            "  raft_address: %s" % node.raft,
            "  rpc_address: %s" % node.rpc,
            "  http_address: %s" % node.http,
            "  data_dir: %s" % node.dir,
            "cluster:",
        ]
        if bootstrap:
            lines.append("  bootstrap:")
            for b in bootstrap:
                lines.append("    - {id: %d, raft_address: %s, rpc_address: %s, http_address: %s}"
                             % (b.id, b.raft, b.rpc, b.http))
        else:
            lines.append("  bootstrap: []")
        lines += [
            "raft:",
            # The election timings are the server's defaults: the suite's recovery figures
            # are those of a cluster as it ships.
            # Small and frequent snapshots: a wiped node rejoins from one, and restarts load
            # one and replay a short tail.
            "  snapshot_threshold: 512",
            "  snapshot_trailing: 128",
            "  segment_size_mb: 8",
            "  secret_file: %s" % self._secret_file("raft-secret", self.raft_secret),
            "rpc:",
            "  cluster_secret_file: %s" % self._secret_file("cluster-secret", self.secret),
            "tls:",
            "  cert_file: %s/node.crt" % self.pki,
            "  key_file: %s/node.key" % self.pki,
            "  rpc: true",
            "expiry:",
            "  interval_ms: 1000",
            "admin:",
            "  token_sha256: %s" % _sha(self.admin),
            "tenants:",
            "  - name: alpha",
            "    token_sha256: %s" % _sha(self.token),
            "    ttl_ms: %d" % TENANT_TTL_MS,
        ]
        if self.ledger_url:
            lines += [
                "proxy:",
                "  - address: %s" % node.proxy,
                "    routes:",
                "      - methods: [POST]",
                "        path_prefix: %s" % PROXY_PATH,
                "        upstream: %s" % self.ledger_url,
                "        tenant: alpha",
                "        lease_ms: %d" % self.proxy_lease_ms,
                "        ttl_ms: %d" % PROXY_TTL_MS,
                "        lease_policy: %s" % self.policy,
                "        upstream_timeout_ms: 5000",
                "        response_headers: [content-type]",
            ]
        with open(node.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")

    # ---- processes ------------------------------------------------------------------------

    def start(self, nid):
        node = self.nodes[nid]
        assert node.proc is None
        node.expected_exit = False
        node.paused = False
        env = dict(os.environ)
        env.pop("SSL_CERT_DIR", None)
        env["SSL_CERT_FILE"] = self.ca  # a follower verifies the leader's RPC certificate
        node.proc = spawn([self.idemd, "--config", node.cfg], log_path=node.log,
                          netns=node.netns, env=env)

    def _found_exited(self, node, at):
        """Notes node's process as an unexpected exit when it ended before the runner asked
        (it crashed while, or just before, being killed or stopped), unless the runner said
        it expected that exit (expect_exit)."""
        rc = node.proc.poll()
        if rc is not None and not node.expected_exit:
            self.early_exits.append({"node": node.id, "status": rc, "t": time.monotonic(),
                                     "at": "found exited when %s" % at})

    def expect_exit(self, nid):
        """The runner is about to end node nid by other means (a power cut kills it)."""
        self.nodes[nid].expected_exit = True

    def kill(self, nid):
        node = self.nodes[nid]
        if node.proc is None:
            return
        self._found_exited(node, "killed")
        node.expected_exit = True
        node.proc.kill()
        node.proc.wait(timeout=30)
        node.proc = None
        node.paused = False

    def pause(self, nid):
        node = self.nodes[nid]
        node.proc.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, nid):
        node = self.nodes[nid]
        if node.proc is not None and node.paused:
            node.proc.send_signal(signal.SIGCONT)
        node.paused = False

    def stop(self, nid, timeout=30):
        """SIGTERM and wait; returns the exit status (a clean shutdown exits 0)."""
        node = self.nodes[nid]
        if node.proc is None:
            return None
        self._found_exited(node, "stopped")
        node.expected_exit = True
        self.resume(nid)
        node.proc.terminate()
        try:
            rc = node.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            rc = node.proc.wait(timeout=30)
        node.proc = None
        return rc

    def wipe(self, nid):
        """Deletes what node nid's data directory holds (the directory itself may be a
        mount point)."""
        d = self.nodes[nid].dir
        if not os.path.isdir(d):
            return
        for name in os.listdir(d):
            p = os.path.join(d, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    def exited(self):
        """[(id, status)] of nodes whose process ended without the runner asking."""
        out = []
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is not None:
                out.append((node.id, node.proc.returncode))
                node.proc = None
        return out

    def running(self):
        return [n.id for n in self.nodes.values() if n.proc is not None]

    def close(self):
        for node in self.nodes.values():
            if node.proc is not None:
                if node.paused:
                    node.proc.send_signal(signal.SIGCONT)
                node.proc.kill()
                node.proc.wait(timeout=30)
                node.proc = None

    # ---- admin ----------------------------------------------------------------------------

    def ctl(self, *args, ids=None, timeout=30, deadline=3000):
        ids = ids if ids is not None else [i for i in self.running()
                                           if not self.nodes[i].paused]
        if not ids:
            return 1, None
        cmd = [self.idemctl, "--cluster", ",".join(self.nodes[i].rpc for i in ids),
               "--token", self.token, "--admin-token", self.admin, "--json",
               "--tls-ca", self.ca, "--deadline", str(deadline)] + [str(a) for a in args]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 1, None
        try:
            out = json.loads(p.stdout) if p.stdout.strip() else None
        except ValueError:
            out = None
        return p.returncode, out

    def leader(self):
        """The leader's id as the nodes that answer report it, or None."""
        rc, st = self.ctl("status")
        if rc != 0 or not st:
            return None
        return st.get("leader_id") or None

    def ready(self, nid):
        try:
            return http_request(self.nodes[nid].http, "GET", "/readyz", timeout=2)[0] == 200
        except OSError:
            return False
        except Exception:  # http.client errors of a node going down
            return False

    def converged(self, ids):
        """The status when the nodes ids report one applied index and one state digest."""
        rc, st = self.ctl("status", "--digest", ids=ids, timeout=60)
        if rc != 0 or not st:
            return None
        nodes = [x for x in st.get("nodes", []) if x.get("digest") and x.get("id") in ids]
        if len(nodes) != len(ids):
            return None
        if len({x["applied_index"] for x in nodes}) != 1 or len({x["digest"] for x in nodes}) != 1:
            return None
        return {"applied_index": nodes[0]["applied_index"], "digest": nodes[0]["digest"]}

    def wait_leader(self, timeout=30):
        return wait_for(self.leader, timeout, "a leader")

    def wait_ready_all(self, timeout=30):
        return wait_for(lambda: all(self.ready(i) for i in self.voters), timeout,
                        "every voter ready")


def wait_until(cond, timeout, interval=0.1):
    """cond()'s first truthy value within timeout seconds, else None (never raises)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)
