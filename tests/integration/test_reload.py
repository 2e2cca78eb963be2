"""Configuration reloads (SIGHUP and `idemctl reload`; server/reload.c, config_reload.c) on
real nodes on 127.0.0.1:

    TestReloadRotation  three nodes under load from client threads (HTTP JSON API, through
                        every node, and the RPC with idemctl) with tenant alpha's token A:
                        every node's file rewritten to accept A and B, SIGHUP, the load moved
                        to B, A removed, SIGHUP: not one request fails, and A is refused after
    TestReloadRules     a bad file (the node keeps serving with its running configuration and
                        logs FILE:LINE:COLUMN), a changed node id (a warning naming it, the
                        node goes on), `idemctl reload` (needs the admin token; --node, --all),
                        the admin token rotated by a reload, the metrics of reloads
    TestReloadProxy     a proxy route moved to another upstream by a reload: new requests go
                        there, and one in flight through the reload ends on the old route
    TestReloadTls       a renewed certificate (same CA, new key) served to new HTTPS and RPC
                        TLS connections after SIGHUP, while a connection opened before goes on
                        and one accepted before but shaking hands after gets the old one
    TestReloadTlsAllOrNothing
                        tls.cert_file a named pipe whose reads differ (a file rewritten in place
                        between them): a reload that one part's read fails changes no part's
                        certificate and nothing else of the file

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_reload
"""
import errno
import hashlib
import http.client
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import IDEMCTL, ClusterTestCase, fp, http_request, wait_for  # noqa: E402
from test_proxy import ORDER, OrderService, ProxyCluster, route  # noqa: E402
from test_cluster import _claim_body, _frame, _read_response  # noqa: E402
from test_tls_bench import TlsCluster, _openssl  # noqa: E402

OUTCOME_ACQUIRED = 1
OUTCOME_UNAUTHENTICATED = 15

TIMEOUT = 20.0


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


class ReloadTest(ClusterTestCase):
    """Helpers: rewriting a node's file (from the text the harness wrote at start), sending
    SIGHUP and waiting for the reload's count, idemctl with any tokens."""

    def metrics(self, node):
        return http_request(node.http, "GET", "/metrics").raw

    def reload_counts(self, node):
        """(ok, error) of node's idem_config_reloads_total."""
        got = dict(re.findall(r'^idem_config_reloads_total\{result="(ok|error)"\} (\d+)$',
                              self.metrics(node), re.M))
        return int(got.get("ok", -1)), int(got.get("error", -1))

    def original(self, node):
        if not hasattr(self, "_original"):
            self._original = {}
        if node.id not in self._original:
            with open(node.cfg) as f:
                self._original[node.id] = f.read()
        return self._original[node.id]

    def rewrite(self, node, alpha_tokens=None, admin=None, edit=None, append=""):
        """node's file as at start, with tenant alpha's token list, the admin token, an
        edit(text) -> text and lines appended."""
        text = self.original(node)
        if alpha_tokens is not None:
            old = "    token_sha256: %s\n" % sha(self.c.token)
            self.assertIn(old, text)
            text = text.replace(old, "    token_sha256: [%s]\n"
                                % ", ".join(sha(t) for t in alpha_tokens), 1)
        if admin is not None:
            old = "  token_sha256: %s\n" % sha(self.c.admin)
            self.assertIn(old, text)
            text = text.replace(old, "  token_sha256: %s\n" % sha(admin), 1)
        if edit is not None:
            text = edit(text)
        with open(node.cfg, "w") as f:
            f.write(text + append)

    def sighup(self, nodes, result="ok"):
        """SIGHUP to each node; waits until each counted one more reload with `result`."""
        before = {n.id: self.reload_counts(n) for n in nodes}
        for n in nodes:
            n.proc.send_signal(signal.SIGHUP)
        k = 0 if result == "ok" else 1
        for n in nodes:
            wait_for(lambda: self.reload_counts(n)[k] == before[n.id][k] + 1, TIMEOUT,
                     "node %d to count a reload (%s)" % (n.id, result))
            self.assertEqual(self.reload_counts(n)[1 - k], before[n.id][1 - k])

    def ctl(self, *args, cluster=None, admin=None, token=None):
        """idemctl --json with the given tokens: (exit status, JSON or None, stderr)."""
        cmd = [IDEMCTL, "--cluster", cluster or self.c.addrs(), "--json",
               "--admin-token", admin or self.c.admin, "--token", token or self.c.token]
        p = subprocess.run(cmd + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, text=True)
        return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else None), p.stderr

    def log_of(self, node):
        with open(node.log, errors="replace") as f:
            return f.read()


# ---- token rotation under load ------------------------------------------------------------

class Load:
    """Client threads making fresh claims and completing them with `token` (read once per
    iteration, so claim and complete go with the same one): `http` threads through the JSON
    API of every node in turn (followers forward to the leader), `rpc` threads with idemctl.
    A 503 with Retry-After is sent again (what a client does; counted in `retried`); any
    other answer than acquired then ok is a failure."""

    def __init__(self, cluster, token, http=2, rpc=1):
        self.c = cluster
        self.token = token
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.failures = []
        self.done = {}  # (kind, token) -> completed claims
        self.retried = 0
        self.threads = [threading.Thread(target=self.run_http, args=(i,), daemon=True)
                        for i in range(http)]
        self.threads += [threading.Thread(target=self.run_rpc, args=(i,), daemon=True)
                         for i in range(rpc)]
        for t in self.threads:
            t.start()

    def count(self, kind, token):
        with self.lock:
            return self.done.get((kind, token), 0)

    def _ok(self, kind, token):
        with self.lock:
            self.done[(kind, token)] = self.done.get((kind, token), 0) + 1

    def _fail(self, what):
        with self.lock:
            self.failures.append(what)

    def _http(self, addr, method, path, body, token, key):
        h = {"Authorization": "Bearer %s" % token, "Idempotency-Key": key}
        for _ in range(100):
            r = http_request(addr, method, path, body, h, timeout=TIMEOUT)
            if r[0] != 503:
                return r
            with self.lock:
                self.retried += 1
            time.sleep(0.05)
        return r

    def run_http(self, i):
        nodes = sorted(self.c.nodes.values(), key=lambda n: n.id)
        n = 0
        while not self.stop.is_set():
            token = self.token
            key = "http-%d-%d-%s" % (i, n, token[:6])
            addr = nodes[n % len(nodes)].http
            n += 1
            try:
                r = self._http(addr, "POST", "/v1/claims", {"fingerprint": fp(n)}, token, key)
                if r[0] != 200 or r[2].get("outcome") != "acquired":
                    self._fail(("http claim", addr, token[:6], r))
                    continue
                body = {"token": r[2]["token"], "outcome": "succeeded",
                        "response": {"status": 201, "body": "done"}}
                r = self._http(addr, "POST", "/v1/claims/complete", body, token, key)
                if r[0] != 200 or r[2].get("outcome") != "ok":
                    self._fail(("http complete", addr, token[:6], r))
                    continue
                self._ok("http", token)
            except (OSError, http.client.HTTPException, AttributeError) as e:
                self._fail(("http", addr, token[:6], repr(e)))

    def _idemctl(self, token, *args):
        p = subprocess.run([IDEMCTL, "--cluster", self.c.addrs(), "--token", token, "--json",
                            "--deadline", "10000"] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, text=True)
        try:
            return p.returncode, json.loads(p.stdout), p.stderr
        except ValueError:
            return p.returncode, None, p.stderr

    def run_rpc(self, i):
        n = 0
        while not self.stop.is_set():
            token = self.token
            key = "rpc-%d-%d-%s" % (i, n, token[:6])
            n += 1
            rc, out, err = self._idemctl(token, "claim", "--fingerprint", fp(n), "--", key)
            if rc != 0 or not out or out.get("outcome") != "acquired":
                self._fail(("rpc claim", token[:6], rc, out, err))
                continue
            rc, out, err = self._idemctl(token, "complete", "--token", str(out["token"]),
                                         "--status", "201", "--", key)
            if rc != 0 or not out or out.get("outcome") != "ok":
                self._fail(("rpc complete", token[:6], rc, out, err))
                continue
            self._ok("rpc", token)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


class TestReloadRotation(ReloadTest):
    # Long election timeouts: a leader change of a loaded machine (it answers 503 until a
    # new leader is known) is not what this test is about.
    cluster_opts = {"election_ms": 3000, "heartbeat_ms": 300}
    leader_timeout = 40

    def test_token_rotation_under_load(self):
        nodes = sorted(self.c.nodes.values(), key=lambda n: n.id)
        a, b = self.c.token, secrets.token_hex(16)
        load = Load(self.c, a)
        try:
            def did(token, extra=1, since=None):
                since = since or {}
                return all(load.count(k, token) >= since.get(k, 0) + extra
                           for k in ("http", "rpc"))
            wait_for(lambda: did(a, 3) or load.failures, 60, "load with token A")
            # every node accepts A and B
            for n in nodes:
                self.rewrite(n, alpha_tokens=[a, b])
            self.sighup(nodes)
            load.token = b
            wait_for(lambda: did(b, 3) or load.failures, 60, "load with token B")
            # A removed
            for n in nodes:
                self.rewrite(n, alpha_tokens=[b])
            self.sighup(nodes)
            since = {k: load.count(k, b) for k in ("http", "rpc")}
            wait_for(lambda: did(b, 2, since) or load.failures, 60, "load with B after A went")
        finally:
            load.finish()
        self.assertEqual(load.failures, [], "requests failed during the rotation")
        print("completed: %r, 503s sent again: %d" % (load.done, load.retried))
        # A is refused everywhere, over HTTP and the RPC; B works
        for n in nodes:
            r = http_request(n.http, "POST", "/v1/claims", {"fingerprint": fp(1)},
                             {"Authorization": "Bearer %s" % a, "Idempotency-Key": "after-a"})
            self.assertEqual(r[0], 401, r)
            rc, out, _ = self.ctl("get", "--", "after-a", cluster=n.rpc, token=a)
            self.assertEqual((rc, out and out.get("outcome")), (4, "unauthenticated"), out)
        rc, out, _ = self.ctl("claim", "--fingerprint", fp(2), "--", "after-b", token=b)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        for n in nodes:
            self.assertIn("configuration reloaded from %s" % n.cfg, self.log_of(n))


# ---- errors, kept settings, idemctl reload ---------------------------------------------------

class TestReloadRules(ReloadTest):

    def test_bad_file_keeps_running_config(self):
        node = self.c.nodes[1]
        c_token = secrets.token_hex(16)
        # A token C for alpha, and an election timeout out of range further down: nothing of
        # the file is taken.
        def edit(text):
            return text.replace("  election_timeout_ms: 600\n", "  election_timeout_ms: 50\n", 1)
        self.rewrite(node, alpha_tokens=[self.c.token, c_token], edit=edit)
        with open(node.cfg) as f:
            lines = f.read().splitlines()
        line = next(i for i, ln in enumerate(lines, 1) if "election_timeout_ms: 50" in ln)
        where = "%s:%d:24: raft.election_timeout_ms" % (node.cfg, line)
        self.sighup([node], result="error")
        log = self.log_of(node)
        self.assertIn("reload (SIGHUP) failed: %s" % where, log)
        self.assertIn("the running configuration is kept", log)
        self.assertNotIn(sha(c_token), log)
        # still serving, with the running configuration: A works, C does not
        rc, out, _ = self.ctl("claim", "--fingerprint", fp(1), "--", "bad-file", cluster=node.rpc)
        self.assertEqual(out["outcome"], "acquired", out)
        rc, out, _ = self.ctl("get", "--", "bad-file", cluster=node.rpc, token=c_token)
        self.assertEqual(out["outcome"], "unauthenticated", out)
        # idemctl reload of that file: refused with the same position, exit 2
        rc, out, err = self.ctl("reload", "--node", node.rpc)
        self.assertEqual(rc, 2, (out, err))
        self.assertEqual(out["outcome"], "refused")
        self.assertEqual(out["nodes"][0]["outcome"], "invalid")
        self.assertTrue(out["nodes"][0]["error"].startswith(where), out)
        # the file fixed (and C given to every node: a follower sends the request on to the
        # leader, which authenticates it again): C works after a reload
        for n in self.c.nodes.values():
            self.rewrite(n, alpha_tokens=[self.c.token, c_token])
        rc, out, err = self.ctl("reload")
        self.assertEqual((rc, out["outcome"]), (0, "ok"), (out, err))
        rc, out, _ = self.ctl("get", "--", "bad-file", cluster=node.rpc, token=c_token)
        self.assertNotIn(out["outcome"], ("unauthenticated", "forbidden"), out)
        self.assertEqual(self.reload_counts(node), (1, 2))

    def test_a_connection_on_a_removed_token_is_closed(self):
        """An RPC connection authenticated with tenant alpha's token, which a reload then
        removes: its next request with that token is answered unauthenticated without being
        decoded (counted as a refused frame) and the connection is closed, instead of
        keeping an authenticated connection's room on a credential that no longer holds."""
        lid = self.c.wait_leader(timeout=30)
        node = self.c.nodes[lid]
        a, b = self.c.token, secrets.token_hex(16)
        host, port = node.rpc.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.addCleanup(sock.close)
        sock.sendall(_frame(_claim_body(a, "revoked-1")))
        self.assertEqual(_read_response(sock), (5, OUTCOME_ACQUIRED))

        def refused():
            m = re.search(r'^idem_rpc_frames_rejected_total\{reason="unauthenticated"\} (\d+)$',
                          self.metrics(node), re.M)
            return int(m.group(1))
        before = refused()
        for n in self.c.nodes.values():
            self.rewrite(n, alpha_tokens=[b])
        self.sighup(list(self.c.nodes.values()))
        sock.sendall(_frame(_claim_body(a, "revoked-2")))
        self.assertEqual(_read_response(sock), (5, OUTCOME_UNAUTHENTICATED))
        self.assertEqual(refused(), before + 1)
        self.assertEqual(sock.recv(1), b"", "the node closes the connection")
        # The new token works on a new connection.
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s2:
            s2.sendall(_frame(_claim_body(b, "revoked-3")))
            self.assertEqual(_read_response(s2), (5, OUTCOME_ACQUIRED))

    def test_a_deeply_nested_file_is_refused_at_once(self):
        """A file nested 50,000 levels deep (100 KB) kept the parser busy for seconds on the
        node's loop; it is refused by its depth before the document is built, and the node
        answers meanwhile as ever."""
        node = self.c.nodes[1]
        self.rewrite(node, append="extra: " + "[" * 50000 + "]" * 50000 + "\n")
        t0 = time.monotonic()
        self.sighup([node], result="error")
        self.assertIn("nested more than 32 levels deep", self.log_of(node))
        self.assertEqual(http_request(node.http, "GET", "/livez")[0], 200)
        print("refused in %.2f s" % (time.monotonic() - t0))

    def test_restart_only_settings_kept(self):
        node = self.c.nodes[1]
        def edit(text):
            text = text.replace("  id: 1\n", "  id: 9\n", 1)
            text = text.replace("- {id: 1, ", "- {id: 9, ", 1)
            return text.replace("  election_timeout_ms: 600\n", "  election_timeout_ms: 900\n", 1)
        self.rewrite(node, edit=edit, append="log:\n  level: warn\n")
        self.sighup([node])
        log = self.log_of(node)
        for key in ("node.id", "cluster.bootstrap", "raft.election_timeout_ms"):
            self.assertIn("reload: %s: %s differs from the running value and changes only with "
                          "a restart: the running value is kept" % (node.cfg, key), log)
        # still node 1, serving
        st = self.c.status()
        self.assertIn(1, [x["id"] for x in st["nodes"] if "id" in x])
        rc, out, _ = self.ctl("claim", "--fingerprint", fp(1), "--", "kept", cluster=node.rpc)
        self.assertEqual(out["outcome"], "acquired", out)
        # log.level warn took effect: the next reload's info lines are not written
        size = os.path.getsize(node.log)
        self.sighup([node])
        with open(node.log, errors="replace") as f:
            f.seek(size)
            after = f.read()
        self.assertNotIn("configuration reloaded from", after)
        self.assertIn("differs from the running value", after)  # a warning still is

    def test_idemctl_reload(self):
        nodes = sorted(self.c.nodes.values(), key=lambda n: n.id)
        # a tenant's token is not the admin token: forbidden, exit 4, nothing reloaded
        rc, out, err = self.ctl("reload", admin=self.c.token)
        self.assertEqual(rc, 4, (out, err))
        self.assertEqual({x["outcome"] for x in out["nodes"]}, {"forbidden"})
        self.assertIn("reload: the admin token was refused (forbidden)", err)
        rc, out, err = self.ctl("reload", admin=secrets.token_hex(16))
        self.assertEqual(rc, 4, (out, err))
        self.assertEqual({x["outcome"] for x in out["nodes"]}, {"unauthenticated"})
        for n in nodes:
            self.assertEqual(self.reload_counts(n), (0, 0))
        # every node of --cluster, then every member (--all) from one address
        rc, out, err = self.ctl("reload")
        self.assertEqual((rc, out["outcome"]), (0, "ok"), (out, err))
        self.assertEqual(sorted(x["node"] for x in out["nodes"]), sorted(n.rpc for n in nodes))
        rc, out, err = self.ctl("reload", "--all", cluster=nodes[0].rpc)
        self.assertEqual((rc, out["outcome"]), (0, "ok"), (out, err))
        self.assertEqual(sorted(x["node_id"] for x in out["nodes"]), [1, 2, 3])
        # spaces around the commas of --cluster, as every command takes them
        rc, out, err = self.ctl("reload", cluster=" , ".join(n.rpc for n in nodes))
        self.assertEqual((rc, out["outcome"]), (0, "ok"), (out, err))
        self.assertEqual(sorted(x["node"] for x in out["nodes"]), sorted(n.rpc for n in nodes))
        for n in nodes:
            self.assertEqual(self.reload_counts(n), (3, 0))
        # human output, --node without --cluster: one line per node
        p = subprocess.run([IDEMCTL, "--admin-token", self.c.admin, "reload", "--node",
                            nodes[1].rpc], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        self.assertEqual((p.returncode, p.stdout), (0, "%s: ok: configuration reloaded\n"
                                                    % nodes[1].rpc), p.stderr)
        # the admin token rotated by a reload: the old one is refused after it
        new_admin = secrets.token_hex(16)
        for n in nodes:
            self.rewrite(n, admin=new_admin)
        rc, out, err = self.ctl("reload")
        self.assertEqual((rc, out["outcome"]), (0, "ok"), (out, err))
        for n in nodes:
            harness.ADMIN_BY_HTTP[n.http] = new_admin  # /metrics scrapes
        rc, out, err = self.ctl("status")
        self.assertEqual(rc, 4, (out, err))  # every node refused the old admin token
        rc, out, err = self.ctl("status", admin=new_admin)
        self.assertEqual(rc, 0, (out, err))
        self.c.admin = new_admin
        for n in nodes:
            self.assertEqual(self.c.stop(n.id), 0)


# ---- proxy routes -------------------------------------------------------------------------

class TestReloadProxy(ReloadTest):
    def make_cluster(self):
        self.svc1, self.svc2 = OrderService(), OrderService()
        self.addCleanup(self.svc1.close)
        self.addCleanup(self.svc2.close)
        return ProxyCluster([route(self.svc1.url)], n=1)

    def order(self, key):
        return http_request(self.c.nodes[1].proxy, "POST", "/orders", ORDER,
                            {"Idempotency-Key": key}, timeout=TIMEOUT)

    def test_route_moved(self):
        node = self.c.nodes[1]
        self.assertEqual(self.order("k1")[0], 201)
        self.assertEqual((self.svc1.count("k1"), self.svc2.count("k1")), (1, 0))
        # k2 is in flight at svc1 (delayed) while the route moves to svc2
        self.svc1.next_action("delay", 1500)
        got = {}
        t = threading.Thread(target=lambda: got.update(r=self.order("k2")))
        t.start()
        wait_for(lambda: len([x for x in self.svc1.seen() if x["method"] == "POST"]) == 2,
                 TIMEOUT, "k2 at svc1")
        self.rewrite(node, edit=lambda text: text.replace(self.svc1.url, self.svc2.url))
        self.sighup([node])
        self.assertEqual(self.order("k3")[0], 201)
        t.join(timeout=30)
        self.assertEqual(got["r"][0], 201, got)
        self.assertEqual((self.svc1.count("k2"), self.svc2.count("k2")), (1, 0))
        self.assertEqual((self.svc1.count("k3"), self.svc2.count("k3")), (0, 1))
        # k2 recorded: its retry is a replay, not a second execution anywhere
        self.assertEqual(self.order("k2")[0], 201)
        self.assertEqual(self.svc1.count("k2") + self.svc2.count("k2"), 1)
        # a clean stop after reloads: exit 0 (under the sanitizers: nothing leaked)
        self.assertEqual(self.c.stop(1), 0)


# ---- TLS ----------------------------------------------------------------------------------

def peer_cn(addr, pki, raw_tls=False):
    """The CN of the certificate addr serves to a new TLS connection (verified by the CA)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.path.join(pki, "ca.crt"))
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        with ctx.wrap_socket(s, server_hostname=host) as t:
            subject = dict(x[0] for x in t.getpeercert()["subject"])
            return subject["commonName"]


def renew(pki, name, cn):
    """A new key and certificate for `name` (same CA, IP 127.0.0.1, CN cn), written over the
    old files in place, as a renewal does."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key.new", "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=pki)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", name + ".crt.new", "-days", "2", "-extfile", name + ".ext",
             cwd=pki)
    for suffix in (".key", ".crt"):
        os.replace(os.path.join(pki, name + suffix + ".new"), os.path.join(pki, name + suffix))


class TlsReloadTest(ReloadTest):
    """A one-node cluster serving HTTPS: its readiness and metrics read over TLS."""

    def cluster_ready(self):
        ctx = ssl.create_default_context(cafile=os.path.join(self.c.pki, "ca.crt"))
        node = self.c.nodes[1]

        def ready():
            try:
                return self.https(node, "GET", "/readyz", ctx=ctx)[0] == 200
            except (OSError, http.client.HTTPException):
                return False
        wait_for(ready, 30, "node 1 ready over https")

    def metrics(self, node):
        ctx = ssl.create_default_context(cafile=os.path.join(self.c.pki, "ca.crt"))
        return self.https(node, "GET", "/metrics", ctx=ctx,
                          headers={"Authorization": "Bearer %s" % self.c.admin}).raw

    def https(self, node, method, path, conn=None, ctx=None, headers=None):
        host, port = node.http.rsplit(":", 1)
        own = conn is None
        if own:
            conn = http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT, context=ctx)
        try:
            return harness.http_exchange(conn, method, path, None, headers)
        finally:
            if own:
                conn.close()


class TestReloadTls(TlsReloadTest):
    def make_cluster(self):
        return TlsCluster(lambda pki: ["cert_file: %s/node.crt" % pki,
                                       "key_file: %s/node.key" % pki,
                                       "rpc: true", "http: true"], n=1)

    def test_renewed_certificate(self):
        node, pki = self.c.nodes[1], self.c.pki
        ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.assertEqual(peer_cn(node.http, pki), "node")
        self.assertEqual(peer_cn(node.rpc, pki), "node")
        host, port = node.http.rsplit(":", 1)
        kept = http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT, context=ctx)
        self.addCleanup(kept.close)
        admin = {"Authorization": "Bearer %s" % self.c.admin}
        self.assertEqual(self.https(node, "GET", "/metrics", conn=kept, headers=admin)[0], 200)
        kept_sock = kept.sock
        self.assertIsNotNone(kept_sock)
        # A connection accepted but without its handshake yet. The listener accepts in the
        # order connections came, so once a later one is answered, this one was accepted.
        early = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.addCleanup(early.close)
        self.assertEqual(peer_cn(node.http, pki), "node")
        # a key that does not match: refused, the running certificate kept
        os.replace(os.path.join(pki, "node.key"), os.path.join(pki, "node.key.good"))
        os.replace(os.path.join(pki, "other.key"), os.path.join(pki, "node.key"))
        self.sighup([node], result="error")
        self.assertRegex(self.log_of(node), r"reload \(SIGHUP\) failed: %s:\d+:\d+: tls: key_file "
                         % re.escape(node.cfg))
        self.assertEqual(peer_cn(node.http, pki), "node")
        os.replace(os.path.join(pki, "node.key.good"), os.path.join(pki, "node.key"))
        # renewed: new connections get the new certificate, on HTTPS and the RPC
        renew(pki, "node", "node-renewed")
        self.sighup([node])
        self.assertEqual(peer_cn(node.http, pki), "node-renewed")
        self.assertEqual(peer_cn(node.rpc, pki), "node-renewed")
        # the connection opened before goes on with its session: the same socket (http.client
        # would open another one silently), still with the old certificate
        r = self.https(node, "GET", "/metrics", conn=kept, headers=admin)
        self.assertEqual(r[0], 200)
        self.assertIs(kept.sock, kept_sock)
        cn = dict(x[0] for x in kept.sock.getpeercert()["subject"]).get("commonName")
        self.assertEqual(cn, "node")
        self.assertIn('idem_config_reloads_total{result="ok"} 1', r.raw)
        kept.close()
        # One more reload, then the connection accepted before both shakes hands: with the
        # certificate of its accept. (h2o makes its TLS session from the context it was
        # accepted with, which the first reload freed, and the second one's contexts could
        # take its memory: a use after free, a crash or another certificate.)
        self.sighup([node])
        with ctx.wrap_socket(early, server_hostname=host) as t:
            self.assertEqual(dict(x[0] for x in t.getpeercert()["subject"])["commonName"], "node")
        self.assertEqual(self.c.stop(1), 0)


def _readers(path):
    """(pid, fd) of every other process's descriptor open on path (/proc/PID/fd)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        d = "/proc/%s/fd" % pid
        try:
            for fd in os.listdir(d):
                if os.readlink(os.path.join(d, fd)) == path:
                    out.append((pid, fd))
        except OSError:  # gone, or not ours to look at
            continue
    return out


def _open_on(pid_fd, path):
    """Whether descriptor (pid, fd) is still open on path."""
    try:
        return os.readlink("/proc/%s/fd/%s" % pid_fd) == path
    except OSError:  # closed, or its process gone
        return False


class PipedCertCluster(TlsCluster):
    """A TlsCluster whose tls.cert_file (pki/pipe.crt) is a named pipe: each time a process
    opens it, it reads the next bytes of `queue`, or `default` (node.crt until the test sets
    another) once the queue is empty. One writer thread serves one read at a time: it waits
    for a reader, sees its descriptor, writes and closes, then waits until that descriptor
    is closed, so that two reads never share one write. Also makes renewed.crt: node.key's
    certificate with the CN node-renewed."""

    def __init__(self, **kw):
        self.lock = threading.Lock()
        self.queue = []
        self.default = None
        self.reads = 0
        self.errors = []
        self.stopping = threading.Event()
        self.writer = None
        super().__init__(lambda pki: ["cert_file: %s/pipe.crt" % pki,
                                      "key_file: %s/node.key" % pki, "rpc: true", "http: true"],
                         **kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if self.writer is None:
            pki = self.pki
            _openssl("req", "-new", "-key", "node.key", "-out", "renewed.csr",
                     "-subj", "/CN=node-renewed", cwd=pki)
            _openssl("x509", "-req", "-in", "renewed.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                     "-CAcreateserial", "-out", "renewed.crt", "-days", "2",
                     "-extfile", "node.ext", cwd=pki)
            with open(os.path.join(pki, "node.crt"), "rb") as f:
                self.default = f.read()
            self.pipe = os.path.realpath(os.path.join(pki, "pipe.crt"))
            os.mkfifo(self.pipe)
            self.writer = threading.Thread(target=self._serve, daemon=True)
            self.writer.start()

    def _until(self, cond, what):
        """Polls cond until it is true (True), the test stops the writer or 10 s pass."""
        deadline = time.monotonic() + 10
        while not self.stopping.is_set():
            if cond():
                return True
            if time.monotonic() > deadline:
                self.errors.append("the pipe's writer waited 10 s for %s" % what)
                return False
            time.sleep(0.005)
        return False

    def _serve(self):
        while not self.stopping.is_set():
            fd = None
            held = []

            def reader_came():
                nonlocal fd
                try:  # fails with ENXIO while no process has the pipe open to read
                    fd = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
                    return True
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    return False

            def reader_shows():  # its open returns once a writer is there
                held[:] = _readers(self.pipe)
                return bool(held)

            def reader_closed():
                return not any(_open_on(r, self.pipe) for r in held)
            try:
                if not (self._until(reader_came, "a reader")
                        and self._until(reader_shows, "the reader's descriptor")):
                    return
                with self.lock:
                    data = self.queue.pop(0) if self.queue else self.default
                    self.reads += 1
                while data:  # a certificate is smaller than the pipe's buffer
                    data = data[os.write(fd, data):]
                os.close(fd)
                fd = None
                if not self._until(reader_closed, "the reader to close the pipe"):
                    return
            except OSError as e:
                self.errors.append("the pipe's writer: %s" % e)
                return
            finally:
                if fd is not None:
                    os.close(fd)

    def close(self):
        self.stopping.set()
        if self.writer is not None:
            self.writer.join(timeout=30)
        problems = super().close()  # kills the nodes first: none waits on the pipe after
        if self.writer is not None and self.writer.is_alive():
            problems.append("the pipe's writer thread did not end")
        try:
            os.unlink(self.pipe)
        except (AttributeError, FileNotFoundError):
            pass
        return problems


class TestReloadTlsAllOrNothing(TlsReloadTest):
    """A reload reads the TLS files once per part (RPC listener, Raft, HTTP listeners,
    forwarder). When a later part's read fails (here a torn certificate, as from a file
    rewritten in place between two reads), no part may switch: before, the RPC listener
    already served the renewed certificate while HTTPS kept the old one, and the log said
    the running configuration was kept."""

    def make_cluster(self):
        return PipedCertCluster(n=1)

    def claim(self, node, token, key):
        ctx = ssl.create_default_context(cafile=os.path.join(self.c.pki, "ca.crt"))
        host, port = node.http.rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT, context=ctx)
        try:
            return harness.http_exchange(conn, "POST", "/v1/claims", {"fingerprint": fp(key)},
                                         {"Authorization": "Bearer %s" % token,
                                          "Idempotency-Key": key})[0]
        finally:
            conn.close()

    def test_a_part_that_fails_changes_nothing(self):
        node, pki = self.c.nodes[1], self.c.pki
        self.assertEqual((peer_cn(node.rpc, pki), peer_cn(node.http, pki)), ("node", "node"))
        with open(os.path.join(pki, "renewed.crt"), "rb") as f:
            renewed = f.read()
        torn = b"-----BEGIN CERTIFICATE-----\nMIIB\n"
        c_token = secrets.token_hex(16)
        self.rewrite(node, alpha_tokens=[self.c.token, c_token])
        # The first two reads get the renewed certificate, the third a torn one: whichever
        # part reads third (the HTTP listeners, or the forwarder after them), the parts that
        # read before it loaded theirs.
        with self.c.lock:
            self.c.queue = [renewed, renewed, torn]
            self.c.default = renewed
        self.sighup([node], result="error")
        with self.c.lock:
            self.assertEqual(self.c.queue, [], "the reload read the pipe fewer than 3 times")
        # a server's words for the file, or the forwarder's (a client's)
        self.assertRegex(self.log_of(node), r"reload \(SIGHUP\) failed: %s:\d+:\d+: tls: "
                         r"(cert_file|certificate file) %s: .*; the running configuration is "
                         r"kept" % (re.escape(node.cfg), re.escape(self.c.pipe)))
        # every part still serves the old certificate, and the file's token is not taken
        self.assertEqual((peer_cn(node.rpc, pki), peer_cn(node.http, pki)), ("node", "node"))
        self.assertEqual(self.claim(node, c_token, "torn-c"), 401)
        self.assertEqual(self.claim(node, self.c.token, "torn-a"), 200)
        # Every read renewed: the same file is taken whole.
        self.sighup([node])
        self.assertEqual((peer_cn(node.rpc, pki), peer_cn(node.http, pki)),
                         ("node-renewed", "node-renewed"))
        self.assertEqual(self.claim(node, c_token, "renewed-c"), 200)
        self.assertEqual(self.c.errors, [])
        self.assertEqual(self.c.stop(1), 0)


if __name__ == "__main__":
    unittest.main()


class TestReloadTlsUnusedCa(TlsReloadTest):
    """tls.ca_file names a file nothing loads: HTTPS without client certificates, no
    tls.rpc or tls.raft. The node starts without reading it, and a reload must not read it
    either: it did, and refused every reload, the unchanged file's too."""

    def make_cluster(self):
        return TlsCluster(lambda pki: ["cert_file: %s/node.crt" % pki,
                                       "key_file: %s/node.key" % pki,
                                       "ca_file: %s/no-such-ca.crt" % pki, "http: true"], n=1)

    def test_a_reload_does_not_read_it(self):
        node = self.c.nodes[1]
        rc, out, err = self.ctl("reload", "--node", node.rpc)
        self.assertEqual(rc, 0, (out, err))
        self.assertEqual(self.reload_counts(node)[1], 0)

