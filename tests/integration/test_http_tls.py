"""HTTPS on the HTTP gateway and the proxy listeners (tls.http, tls.proxy,
tls.http_client_certs), and the cluster secret's transport rule (rpc.insecure_cluster_secret).

Certificates are made at test time with the openssl CLI (test_tls_bench.make_pki: a CA, a
server certificate for 127.0.0.1, a client certificate) in the cluster's temp dir. Each class
runs one node (it leads alone: the JSON API and the proxy answer locally) in front of
test_proxy.OrderService, and speaks HTTPS with Python's ssl module:

    TestHttpsGateway      JSON API, probes and /metrics over HTTPS; plain HTTP to the TLS
                          ports gets no answer; ALPN offers HTTP/1.1 only; the proxy listener
                          over HTTPS; a clean stop with a handshake left hanging
    TestHttpsClientCerts  http_client_certs: require (no certificate: refused; the client's:
                          served), optional (both served)
    TestHttpsBadFiles     a missing certificate, a key that does not match: no start, the
                          message placed at the tls section
    TestSecretTransport   a cluster secret without tls.rpc: refused unless
                          rpc.insecure_cluster_secret on loopback addresses only

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_http_tls
"""
import http.client
import os
import secrets
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import harness
from harness import IDEMD, fp, wait_for
from test_proxy import ORDER, OrderService, ProxyCluster, route
from test_tls_bench import make_pki

TIMEOUT = 10.0


def _ctx(pki, cert=None):
    """A client context that trusts the test CA; cert: "client" to present client.crt."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.path.join(pki, "ca.crt"))
    if cert is not None:
        ctx.load_cert_chain(os.path.join(pki, cert + ".crt"), os.path.join(pki, cert + ".key"))
    return ctx


def https(addr, ctx, method, path, body=None, headers=None, timeout=TIMEOUT):
    """One request over a fresh HTTPS connection: a harness.Resp."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=ctx)
    try:
        return harness.http_exchange(conn, method, path, body, headers)
    finally:
        conn.close()


def plain_gets_no_answer(addr):
    """Whether a plain HTTP request to addr gets no HTTP answer (the connection is closed,
    reset, or answered with bytes that are not HTTP: a TLS alert)."""
    try:
        st = harness.http_request(addr, "GET", "/healthz", timeout=5)[0]
    except (OSError, http.client.HTTPException):
        return True
    return st is None


class HttpsCluster(ProxyCluster):
    """One node (ProxyCluster: a proxy listener in front of the routes' upstream) whose config
    carries a tls: section: the server certificate, tls.http and tls.proxy, and `extra`
    lines (a function of the PKI directory)."""

    def __init__(self, routes, extra=None, **kw):
        self.extra = extra or (lambda pki: [])
        self.pki = None
        super().__init__(routes, n=1, **kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if self.pki is None:
            self.pki = os.path.join(self.root, "pki")
            os.makedirs(self.pki, exist_ok=True)
            make_pki(self.pki)
        lines = ["tls:", "  cert_file: %s/server.crt" % self.pki,
                 "  key_file: %s/server.key" % self.pki, "  http: true", "  proxy: true"]
        lines += ["  " + ln for ln in self.extra(self.pki)]
        with open(node.cfg, "a") as f:
            f.write("\n".join(lines) + "\n")


class HttpsTest(unittest.TestCase):
    """A node serving HTTPS (tls_extra: more tls lines) and an order service per class."""
    tls_extra = staticmethod(lambda pki: [])
    client_cert = None  # what the helpers present: None or "client"

    @classmethod
    def setUpClass(cls):
        cls.svc = OrderService()
        try:
            cls.c = HttpsCluster([route(cls.svc.url)], extra=cls.tls_extra)
        except BaseException:
            cls.svc.close()
            raise
        cls.node = cls.c.nodes[1]
        try:
            ctx = _ctx(cls.c.pki, cls.client_cert)

            def ready():
                try:
                    return https(cls.node.http, ctx, "GET", "/readyz", timeout=2)[0] == 200
                except (OSError, http.client.HTTPException):
                    return False
            wait_for(ready, 30, "node 1 ready over https")
        except BaseException:
            print(cls.c.logs())
            cls.c.close()
            cls.svc.close()
            raise

    @classmethod
    def tearDownClass(cls):
        problems = cls.c.close()
        cls.svc.close()
        if problems:
            raise AssertionError("\n\n".join(problems))

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        problems = self.c.check()
        self.assertFalse(problems, "\n\n".join(problems))

    def ctx(self, cert=None):
        return _ctx(self.c.pki, cert)

    def api(self, method, path, body=None, headers=None, ctx=None):
        h = {"Authorization": "Bearer %s" % self.c.token}
        h.update(headers or {})
        return https(self.node.http, ctx or self.ctx(self.client_cert), method, path, body, h)

    def claim_and_replay(self, ctx=None):
        """A claim, its completion and a retry replayed, over HTTPS."""
        key = "tls-" + secrets.token_hex(6)
        hk = {"Idempotency-Key": key}
        r = self.api("POST", "/v1/claims", {"fingerprint": fp(key)}, hk, ctx=ctx)
        self.assertEqual(r[0], 200, r)
        self.assertEqual(r[2].get("outcome"), "acquired", r)
        done = {"token": r[2]["token"], "outcome": "succeeded",
                "response": {"status": 201, "headers": {"content-type": "application/json"},
                             "body": '{"ok":true}'}}
        c = self.api("POST", "/v1/claims/complete", done, hk, ctx=ctx)
        self.assertEqual(c[0], 200, c)
        again = self.api("POST", "/v1/claims", {"fingerprint": fp(key)}, hk, ctx=ctx)
        self.assertEqual(again[0], 201, again)
        self.assertEqual(again[1].get("idempotency-replayed"), "true", again)
        self.assertEqual(again.raw, '{"ok":true}')


class TestHttpsGateway(HttpsTest):
    def test_claim_over_https(self):
        self.claim_and_replay()

    def test_probes_and_metrics_over_https(self):
        for path in ("/healthz", "/readyz"):
            r = https(self.node.http, self.ctx(), "GET", path)
            self.assertEqual(r[0], 200, r)
        m = https(self.node.http, self.ctx(), "GET", "/metrics")
        self.assertEqual(m[0], 200, m)
        self.assertIn('idem_http_requests_total{route="healthz",status="200"}', m.raw)
        self.assertIn('idem_as_tenant_refused_total{reason="tenant"} 0', m.raw)

    def test_plain_http_to_the_tls_ports_gets_no_answer(self):
        for addr in (self.node.http, self.node.proxy):
            with self.subTest(addr=addr):
                self.assertTrue(plain_gets_no_answer(addr))
        # The node goes on serving HTTPS.
        self.claim_and_replay()

    def test_tls_versions_and_alpn(self):
        ctx = self.ctx()
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        host, port = self.node.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                self.assertIn(s.version(), ("TLSv1.2", "TLSv1.3"))
                # The gateway serves HTTP/1.1 only: h2 is never chosen.
                self.assertEqual(s.selected_alpn_protocol(), "http/1.1")
        # A client that speaks TLS 1.2 only is served too.
        ctx12 = self.ctx()
        ctx12.maximum_version = ssl.TLSVersion.TLSv1_2
        r = https(self.node.http, ctx12, "GET", "/healthz")
        self.assertEqual(r[0], 200, r)

    def test_proxy_over_https(self):
        key = "tls-proxy-" + secrets.token_hex(6)
        h = {"Idempotency-Key": key}
        first = https(self.node.proxy, self.ctx(), "POST", "/orders", ORDER, h)
        self.assertEqual(first[0], 201, first)
        again = https(self.node.proxy, self.ctx(), "POST", "/orders", ORDER, h)
        self.assertEqual(again[0], 201, again)
        self.assertEqual(again[1].get("idempotency-replayed"), "true", again)
        self.assertEqual(again.raw, first.raw)
        self.assertEqual(self.svc.count(key), 1)


class TestHttpsStop(unittest.TestCase):
    """SIGTERM with a TLS handshake that never ends and a kept-alive HTTPS connection open:
    the node stops cleanly (exit 0) within the gateway's grace period, long before the
    handshake timeout."""

    def test_clean_stop(self):
        svc = OrderService()
        c = HttpsCluster([route(svc.url)], extra=lambda pki: [])
        try:
            node = c.nodes[1]
            ctx = _ctx(c.pki)
            wait_for(lambda: _ok(node.http, ctx), 30, "node 1 ready over https")
            host, port = node.http.rsplit(":", 1)
            hanging = socket.create_connection((host, int(port)), timeout=TIMEOUT)
            kept = http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT, context=ctx)
            try:
                hanging.sendall(b"\x16\x03\x01")  # a ClientHello's start, never the rest
                self.assertEqual(harness.http_exchange(kept, "GET", "/healthz")[0], 200)
                t0 = time.monotonic()
                self.assertEqual(c.stop(1), 0)
                # Well before http.handshake_timeout_ms (5000) would end the handshake.
                self.assertLess(time.monotonic() - t0, 4.5)
            finally:
                hanging.close()
                kept.close()
        finally:
            problems = c.close()
            svc.close()
        self.assertFalse(problems, "\n\n".join(problems))


def _ok(addr, ctx):
    try:
        return https(addr, ctx, "GET", "/healthz", timeout=2)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def _refused(addr, ctx):
    """Whether a request with ctx is refused during or right after the TLS handshake (with
    TLS 1.3 the client learns of a refused certificate at its first read)."""
    try:
        https(addr, ctx, "GET", "/healthz", timeout=5)
    except (OSError, http.client.HTTPException):
        return True
    return False


class TestHttpsClientCerts(HttpsTest):
    tls_extra = staticmethod(lambda pki: ["ca_file: %s/ca.crt" % pki,
                                          "http_client_certs: require"])
    client_cert = "client"

    def test_without_a_certificate_refused(self):
        for addr in (self.node.http, self.node.proxy):
            with self.subTest(addr=addr):
                self.assertTrue(_refused(addr, self.ctx()))

    def test_with_the_client_certificate_served(self):
        self.claim_and_replay(ctx=self.ctx("client"))
        key = "tls-mutual-" + secrets.token_hex(6)
        r = https(self.node.proxy, self.ctx("client"), "POST", "/orders", ORDER,
                  {"Idempotency-Key": key})
        self.assertEqual(r[0], 201, r)

    def test_a_certificate_of_another_ca_refused(self):
        d = tempfile.mkdtemp(prefix="idem-othercert-")
        try:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout", "self.key", "-out",
                            "self.crt", "-days", "2", "-subj", "/CN=stranger"],
                           cwd=d, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
            ctx = self.ctx()
            ctx.load_cert_chain(os.path.join(d, "self.crt"), os.path.join(d, "self.key"))
            self.assertTrue(_refused(self.node.http, ctx))
        finally:
            subprocess.run(["rm", "-rf", d], check=False)


class TestHttpsClientCertsOptional(HttpsTest):
    tls_extra = staticmethod(lambda pki: ["ca_file: %s/ca.crt" % pki,
                                          "http_client_certs: optional"])

    def test_with_or_without_a_certificate(self):
        self.claim_and_replay(ctx=self.ctx())
        self.claim_and_replay(ctx=self.ctx("client"))


# ---- startup: files and the cluster secret ----------------------------------------------------

class NodeFiles(unittest.TestCase):
    """A temp dir with a PKI and a one-node config writer; idemd run on it directly."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-httptls-")
        self.pki = os.path.join(self.dir, "pki")
        os.makedirs(self.pki)
        make_pki(self.pki)
        self.secret = os.path.join(self.dir, "cluster.secret")
        with open(self.secret, "w") as f:
            f.write(secrets.token_hex(24) + "\n")
        os.chmod(self.secret, 0o600)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.dir], check=False)

    def config(self, rpc_lines=(), tls_lines=(), members=None, rpc="127.0.0.1:%d"):
        """A config file's path: node 1 (rpc address `rpc`, bootstrap `members`: rpc
        addresses of the other members), the rpc and tls lines as given."""
        ports = [harness.free_port() for _ in range(3)]
        me = rpc % ports[1] if "%d" in rpc else rpc
        lines = ["node:", "  id: 1", "  raft_address: 127.0.0.1:%d" % ports[0],
                 "  rpc_address: %s" % me, "  http_address: 127.0.0.1:%d" % ports[2],
                 "  data_dir: %s/data" % self.dir, "cluster:", "  bootstrap:",
                 "    - {id: 1, raft_address: 127.0.0.1:%d, rpc_address: %s}" % (ports[0], me)]
        for i, a in enumerate(members or [], start=2):
            lines.append("    - {id: %d, raft_address: 127.0.0.1:%d, rpc_address: %s}"
                         % (i, harness.free_port(), a))
        lines += ["rpc:"] + ["  " + ln for ln in rpc_lines]
        if not rpc_lines:
            lines.pop()
        if tls_lines:
            lines += ["tls:"] + ["  " + ln for ln in tls_lines]
        lines += ["admin:", "  token_sha256: %s" % ("ab" * 32), "tenants:", "  - name: t",
                  "    token_sha256: %s" % ("cd" * 32)]
        harness.register_gateway("127.0.0.1:%d" % ports[2])
        path = os.path.join(self.dir, "node-%s.yaml" % secrets.token_hex(4))
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def run_idemd(self, *args, timeout=30):
        p = subprocess.run([IDEMD] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace")

    def start_fails(self, path, want):
        """idemd --config path exits by itself, non-zero, saying want."""
        p = subprocess.Popen([IDEMD, "--config", path], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            self.fail("idemd kept running with %s" % path)
        self.assertNotEqual(p.returncode, 0)
        text = out.decode(errors="replace")
        self.assertIn(want, text)
        return text


class TestHttpsBadFiles(NodeFiles):
    def tls(self, **files):
        f = {"cert_file": "%s/server.crt" % self.pki, "key_file": "%s/server.key" % self.pki}
        f.update(files)
        return ["%s: %s" % kv for kv in f.items()] + ["http: true"]

    def test_missing_certificate(self):
        path = self.config(tls_lines=self.tls(cert_file="%s/missing.crt" % self.pki))
        # node 9 lines, rpc 0, tls on line 10, its first key at column 3
        text = self.start_fails(path, "%s:11:3: tls: cert_file %s/missing.crt: " % (path, self.pki))
        self.assertIn("(the HTTP listeners' TLS: tls.http)", text)

    def test_key_that_does_not_match(self):
        path = self.config(tls_lines=self.tls(key_file="%s/other.key" % self.pki))
        text = self.start_fails(path, "%s:11:3: tls: key_file %s/other.key: "
                                % (path, self.pki))
        self.assertIn("key values mismatch", text)

    def test_config_errors_are_placed(self):
        path = self.config(tls_lines=["http: true"])
        rc, out = self.run_idemd("--check-config", path)
        self.assertEqual(rc, 2, out)
        self.assertIn("%s:11:9: tls.http: TLS on the HTTP gateway needs cert_file and key_file"
                      % path, out)


class TestSecretTransport(NodeFiles):
    def test_refused_without_tls(self):
        path = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret])
        for args in (["--check-config", path], ["--config", path]):
            with self.subTest(args=args[0]):
                rc, out = self.run_idemd(*args)
                self.assertEqual(rc, 2, out)
                self.assertIn("%s:11:24: rpc.cluster_secret_file: followers send the cluster "
                              "secret to the leader's RPC address, in clear without tls.rpc"
                              % path, out)

    def test_insecure_switch_on_loopback_only(self):
        ok = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret,
                                    "insecure_cluster_secret: true"],
                         members=["127.0.0.2:7002", "127.0.0.3:7003"])
        rc, out = self.run_idemd("--check-config", ok)
        self.assertEqual(rc, 0, out)
        remote = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret,
                                        "insecure_cluster_secret: true"],
                             members=["127.0.0.2:7002", "10.1.2.3:7003"])
        rc, out = self.run_idemd("--check-config", remote)
        self.assertEqual(rc, 2, out)
        self.assertIn("rpc.insecure_cluster_secret: the RPC address \"10.1.2.3:7003\" is not a "
                      "loopback address", out)
        mine = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret,
                                      "insecure_cluster_secret: true"], rpc="0.0.0.0:%d")
        rc, out = self.run_idemd("--check-config", mine)
        self.assertEqual(rc, 2, out)
        self.assertIn("is not a loopback address", out)

    def test_accepted_with_tls_rpc(self):
        path = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret],
                           members=["10.1.2.3:7003"],
                           tls_lines=["cert_file: %s/server.crt" % self.pki,
                                      "key_file: %s/server.key" % self.pki, "rpc: true"])
        rc, out = self.run_idemd("--check-config", path)
        self.assertEqual(rc, 0, out)

    def test_insecure_node_starts_and_serves(self):
        """The switch on loopback: the node starts (and stops cleanly)."""
        path = self.config(rpc_lines=["cluster_secret_file: %s" % self.secret,
                                      "insecure_cluster_secret: true"])
        p = subprocess.Popen([IDEMD, "--config", path], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        try:
            with open(path) as f:
                http_addr = [ln.split(": ")[1] for ln in f if "http_address" in ln][0]
            wait_for(lambda: _plain_ok(http_addr) or p.poll() is not None, 30,
                     "the node to serve or exit")
            self.assertIsNone(p.poll(), p.stdout.read().decode(errors="replace")
                              if p.poll() is not None else "")
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()


def _plain_ok(addr):
    try:
        return harness.http_request(addr, "GET", "/healthz", timeout=2)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


if __name__ == "__main__":
    unittest.main()
