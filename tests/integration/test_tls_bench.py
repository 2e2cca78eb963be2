"""TLS on the binary RPC listener, and idem-bench against a real cluster.

TLS: certificates are made at test time with the openssl CLI in the cluster's temp dir
(nothing is committed). A one-node cluster serves the RPC over TLS (tls.rpc: true); the
tests speak the framing through Python's ssl module. Readiness is asked over HTTP
(/readyz).

TLS clusters (TestTlsForward, TestTlsForwardMutual, TestTlsForwardUntrusted): three nodes
with tls.rpc on, a cluster secret and a proxy listener each, in front of
test_proxy.OrderService. A follower's gateway forwards JSON API requests and proxy claims
to the leader over TLS (server/forward.c, libidem's asynchronous client), verifying the leader's certificate against
tls.ca_file, or without one against the system store (here: SSL_CERT_FILE pointing at the
test CA, in the nodes' environment). idemctl (libidem's synchronous client) and idem-bench
reach the nodes with --tls-ca / --tls-cert / --tls-key; a wrong CA is refused with exit 3.

idem-bench: closed and open loop, every workload, the JSON output's consistency, and the
progress line that appears only when stderr is a terminal.
"""
import json
import os
import pty
import select
import signal
import socket
import ssl
import subprocess
import time
import unittest

from harness import (BIN, IDEMCTL, Cluster, ClusterTestCase, fp, free_port, http_request,
                     wait_for)
from test_cluster import _frame, _read_frame, _read_response
from test_proxy import ORDER, OrderService, ProxyCluster, route

IDEM_BENCH = os.path.join(BIN, "idem-bench")

OUTCOME_ACQUIRED = 1
OUTCOME_IN_PROGRESS = 3
OUTCOME_NOT_FOUND = 10


def _pb_bytes(num, payload):
    """A length-delimited protobuf field (payloads < 128 bytes)."""
    assert len(payload) < 128
    return bytes([(num << 3) | 2, len(payload)]) + payload


def _claim_frame(request_id, token, key, fingerprint_hex, attempt):
    claim = (_pb_bytes(1, key.encode()) + _pb_bytes(2, bytes.fromhex(fingerprint_hex))
             + _pb_bytes(3, attempt.encode()))
    body = bytes([0x08, request_id]) + _pb_bytes(3, token.encode()) + _pb_bytes(10, claim)
    return _frame(body)


def _get_frame(request_id, token, key):
    body = bytes([0x08, request_id]) + _pb_bytes(3, token.encode()) + _pb_bytes(14, _pb_bytes(1, key.encode()))
    return _frame(body)


def _read_full(sock):
    """Reads one response frame; returns (request_id, outcome, token) or None at EOF."""
    r = _read_frame(sock)
    return None if r is None else (r[0].get(1, 0), r[1].get(1, 0), r[1].get(2, 0))


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=60)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a second key that
    matches neither; all PEM files in d."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=idem test CA",
             cwd=d)
    # "node": a cluster node's certificate, served by its RPC listener and presented by its
    # forwarder as a client certificate (hence both key usages).
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n"),
                      ("node", "subjectAltName=IP:127.0.0.1\n"
                               "extendedKeyUsage=serverAuth,clientAuth\n")):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext",
                 cwd=d)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", "other.key", cwd=d)
    # A CA that signed nothing here: a client that trusts only it refuses every node.
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "other-ca.key", "-out", "other-ca.crt", "-days", "2",
             "-subj", "/CN=another CA", cwd=d)


class TlsCluster(Cluster):
    """A harness cluster whose configs carry a tls: section (tls_lines, a function of the
    cluster's temp dir, since the certificates live there)."""

    def __init__(self, tls_lines, **kw):
        self._tls_lines = tls_lines
        super().__init__(**kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if not hasattr(self, "pki"):
            self.pki = os.path.join(self.root, "pki")
            os.makedirs(self.pki, exist_ok=True)
            make_pki(self.pki)
        with open(node.cfg, "a") as f:
            f.write("\n".join(["tls:"] + ["  " + ln for ln in self._tls_lines(self.pki)]) + "\n")


def _ready(node):
    try:
        return http_request(node.http, "GET", "/readyz", timeout=2)[0] == 200
    except OSError:
        return False


class TlsTest(unittest.TestCase):
    mutual = False

    def setUp(self):
        def lines(pki):
            out = ["cert_file: %s/server.crt" % pki, "key_file: %s/server.key" % pki, "rpc: true"]
            if self.mutual:
                out.append("ca_file: %s/ca.crt" % pki)
            return out
        self.c = TlsCluster(lines, n=1)
        self.node = self.c.nodes[1]
        try:
            wait_for(lambda: _ready(self.node), 30, "node 1 ready")
        except AssertionError:
            print(self.c.logs())
            self.c.close()
            raise
        host, port = self.node.rpc.split(":")
        self.addr = (host, int(port))

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        # A node that died by itself, or a sanitizer report in its log, fails the test.
        problems = self.c.close()
        self.assertFalse(problems, "\n\n".join(problems))

    def tls_context(self, with_cert=False):
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.path.join(self.c.pki, "ca.crt"))
        if with_cert:
            ctx.load_cert_chain(os.path.join(self.c.pki, "client.crt"), os.path.join(self.c.pki, "client.key"))
        return ctx

    def tls_connect(self, with_cert=False):
        raw = socket.create_connection(self.addr, timeout=10)
        return self.tls_context(with_cert).wrap_socket(raw, server_hostname="127.0.0.1")

    def claim_works(self, s, key):
        s.sendall(_claim_frame(5, self.c.token, key, fp(key), "a1"))
        rid, outcome, token = _read_full(s)
        self.assertEqual((rid, outcome), (5, OUTCOME_ACQUIRED))
        self.assertGreater(token, 0)
        # The same key from another attempt is in progress; pipelined with a get.
        s.sendall(_claim_frame(6, self.c.token, key, fp(key), "a2") + _get_frame(7, self.c.token, "nokey"))
        answers = {}
        for _ in range(2):
            rid, outcome, _tok = _read_full(s)
            answers[rid] = outcome
        self.assertEqual(answers, {6: OUTCOME_IN_PROGRESS, 7: OUTCOME_NOT_FOUND})


class TestTlsRpc(TlsTest):
    def test_claim_over_tls(self):
        s = self.tls_connect()
        self.assertIn(s.version(), ("TLSv1.2", "TLSv1.3"))
        self.claim_works(s, "tls-order-1")
        s.close()

    def test_plain_client_fails_cleanly_and_node_keeps_serving(self):
        good = self.tls_connect()
        # A plain-TCP client sends a well-formed frame: it gets no answer frame, and its
        # connection is closed (possibly after a TLS alert record, content type 21).
        s = socket.create_connection(self.addr, timeout=10)
        s.sendall(_claim_frame(1, self.c.token, "plain-1", fp(1), "a1"))
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
        s.close()
        self.assertTrue(got == b"" or got[0] == 21, "not an alert: %r" % got[:16])
        # Garbage that is not even a frame, and a client that hangs up mid-handshake.
        for data in (b"\x16\x03\x01\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n"):
            s = socket.create_connection(self.addr, timeout=10)
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            s.close()
        # The node still serves: the TLS connection opened before, and a new one.
        self.assertIsNone(self.node.proc.poll(), "idemd exited")
        self.claim_works(good, "tls-after-plain-1")
        good.close()
        s = self.tls_connect()
        self.claim_works(s, "tls-after-plain-2")
        s.close()
        with open(self.node.log, "rb") as f:
            log = f.read().decode(errors="replace")
        self.assertIn("rpc: TLS connection closed: handshake", log)
        self.assertNotIn("plain-1", log, "peer bytes must never be logged")

    def test_clean_shutdown_with_tls_connections_open(self):
        # An idle TLS connection, one that sent a request, one mid-handshake and a plain one:
        # SIGTERM still ends idemd with status 0 (and, in the ASan build, without leaks).
        idle = self.tls_connect()
        busy = self.tls_connect()
        self.claim_works(busy, "tls-shutdown-1")
        half = socket.create_connection(self.addr, timeout=10)
        half.sendall(b"\x16\x03\x01")
        plain = socket.create_connection(self.addr, timeout=10)
        self.assertEqual(self.c.stop(1), 0)
        for s in (idle, busy, half, plain):
            s.close()

    def test_client_that_does_not_trust_the_server_fails(self):
        ctx = ssl.create_default_context()  # system CAs only: our test CA is unknown
        raw = socket.create_connection(self.addr, timeout=10)
        with self.assertRaises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        raw.close()
        s = self.tls_connect()
        self.claim_works(s, "tls-after-untrusted")
        s.close()


class TestTlsMutual(TlsTest):
    mutual = True

    def test_client_certificate_required(self):
        s = self.tls_connect(with_cert=True)
        self.claim_works(s, "mtls-1")
        s.close()
        # Without a certificate: the handshake (TLS 1.2) or the first read (TLS 1.3, where
        # the server's verdict arrives after the client's Finished) fails; no answer frame.
        refused = False
        s = None
        try:
            s = self.tls_connect(with_cert=False)
            s.sendall(_claim_frame(1, self.c.token, "mtls-2", fp(2), "a1"))
            refused = _read_full(s) is None
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            refused = True
        finally:
            if s is not None:
                s.close()
        self.assertTrue(refused, "a client without a certificate got an answer")
        s = self.tls_connect(with_cert=True)
        self.claim_works(s, "mtls-3")
        s.close()


class TestTlsBadConfig(unittest.TestCase):
    def _start_fails(self, lines, expect):
        c = TlsCluster(lines, n=1)
        try:
            node = c.nodes[1]
            rc = node.proc.wait(timeout=30)
            node.proc = None
            with open(node.log, "rb") as f:
                log = f.read().decode(errors="replace")
            self.assertNotEqual(rc, 0, log)
            self.assertIn(expect, log)
        finally:
            problems = c.close()
        # Its refusal is awaited above; a sanitizer report on the way out is still a failure.
        self.assertFalse(problems, "\n\n".join(problems))

    def test_key_that_does_not_match(self):
        self._start_fails(lambda pki: ["cert_file: %s/server.crt" % pki, "key_file: %s/other.key" % pki,
                                       "rpc: true"],
                          "other.key: ")

    def test_missing_cert_file(self):
        self._start_fails(lambda pki: ["cert_file: %s/nope.crt" % pki, "key_file: %s/server.key" % pki,
                                       "rpc: true"],
                          "nope.crt: ")

    def test_not_a_certificate(self):
        self._start_fails(lambda pki: ["cert_file: %s/server.key" % pki, "key_file: %s/server.key" % pki,
                                       "rpc: true"],
                          "tls: cert_file ")

    def test_bad_ca_file(self):
        self._start_fails(lambda pki: ["cert_file: %s/server.crt" % pki, "key_file: %s/server.key" % pki,
                                       "ca_file: %s/missing-ca.crt" % pki, "rpc: true"],
                          "tls: ca_file ")

    def test_raft_bad_files(self):
        # tls.raft loads the same files when the transport opens (before the RPC listener).
        self._start_fails(lambda pki: ["cert_file: %s/nope.crt" % pki, "key_file: %s/server.key" % pki,
                                       "ca_file: %s/ca.crt" % pki, "raft: true"],
                          "raft transport: tls: cert_file ")
        self._start_fails(lambda pki: ["cert_file: %s/server.crt" % pki, "key_file: %s/other.key" % pki,
                                       "ca_file: %s/ca.crt" % pki, "raft: true"],
                          "raft transport: tls: key_file ")


# ---- TLS clusters: forwarding, idemctl, idem-bench -------------------------------------------

class TlsProxyCluster(ProxyCluster):
    """Three nodes with tls.rpc on (node certificates for 127.0.0.1), a cluster secret and a
    proxy listener each. mutual: tls.ca_file is set (the nodes require client certificates
    and verify each other against it); otherwise trust_env decides whether the nodes find
    the test CA through SSL_CERT_FILE (the system store's override) or not at all. The
    harness's idemctl calls (status, leader) carry the TLS flags."""

    insecure_secret = False  # the cluster secret goes over TLS: no switch needed

    def __init__(self, routes, mutual, trust_env, **kw):
        self.mutual = mutual
        self.trust_env = trust_env
        self.pki = None
        super().__init__(routes, **kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if self.pki is None:
            self.pki = os.path.join(self.root, "pki")
            os.makedirs(self.pki, exist_ok=True)
            make_pki(self.pki)
        lines = ["tls:", "  cert_file: %s/node.crt" % self.pki, "  key_file: %s/node.key" % self.pki,
                 "  rpc: true"]
        if self.mutual:
            lines.append("  ca_file: %s/ca.crt" % self.pki)
        with open(node.cfg, "a") as f:
            f.write("\n".join(lines) + "\n")

    def start(self, nid):
        node = self.nodes[nid]
        env = dict(os.environ)
        env.pop("SSL_CERT_FILE", None)
        env.pop("SSL_CERT_DIR", None)
        if self.trust_env:
            env["SSL_CERT_FILE"] = os.path.join(self.pki, "ca.crt")
        self._reap(node, "before the test restarted it")
        log = open(node.log, "ab")
        node.proc = subprocess.Popen([harness_idemd(), "--config", node.cfg], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()

    def tls_args(self, ca="ca.crt", cert=True):
        args = ["--tls-ca", os.path.join(self.pki, ca)]
        if self.mutual and cert:
            args += ["--tls-cert", os.path.join(self.pki, "client.crt"),
                     "--tls-key", os.path.join(self.pki, "client.key")]
        return args

    def run_ctl(self, *args, tls=None, token=None, timeout=60):
        """idemctl --json with the TLS flags (tls: a list to use instead); returns
        (exit code, parsed JSON or None, stderr text)."""
        cmd = [IDEMCTL, "--cluster", self.addrs(), "--token", token or self.token,
               "--admin-token", self.admin, "--json"]
        cmd += self.tls_args() if tls is None else tls
        cmd += [str(a) for a in args]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           env=_env_without_tls())
        out = json.loads(p.stdout) if p.stdout.strip() else None
        return p.returncode, out, p.stderr.decode(errors="replace")

    def ctl(self, *args, ids=None, token=None, deadline=None, timeout=60):
        cmd = [IDEMCTL, "--cluster", self.addrs(ids), "--token", token or self.token,
               "--admin-token", self.admin, "--json"] + self.tls_args()
        if deadline is not None:
            cmd += ["--deadline", str(deadline)]
        cmd += [str(a) for a in args]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           env=_env_without_tls())
        out = json.loads(p.stdout) if p.stdout.strip() else None
        return p.returncode, out


def harness_idemd():
    return os.path.join(BIN, "idemd")


def _env_without_tls():
    """The test's environment without IDEM_TLS* and SSL_CERT_* (so that only the flags count)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("IDEM_TLS") and not k.startswith("SSL_CERT_")}


def _replayed(resp):
    return resp[1].get("idempotency-replayed", "").lower() == "true"


class TlsForwardTest(unittest.TestCase):
    """A shared TLS cluster and order service per class."""
    mutual = False
    trust_env = True
    secret = "tls-cluster-" + "5e" * 16

    @classmethod
    def setUpClass(cls):
        cls.svc = OrderService()
        try:
            cls.c = TlsProxyCluster([route(cls.svc.url)], cls.mutual, cls.trust_env,
                                    secret=cls.secret)
        except BaseException:
            cls.svc.close()
            raise
        try:
            cls.c.wait_leader(timeout=60)
        except BaseException:
            print(cls.c.logs())
            cls.c.close()
            cls.svc.close()
            raise

    @classmethod
    def tearDownClass(cls):
        problems = cls.c.close()
        cls.svc.close()
        # After the last test's check(): a node that died or reported since.
        if problems:
            raise AssertionError("\n\n".join(problems))

    def setUp(self):
        self.svc.ensure_running()

    def tearDown(self):
        result = self._outcome.result
        if any(getattr(t, "test_case", t) is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        # A node that died by itself during the test, or a sanitizer report in a node's log,
        # fails the test (harness: check()).
        problems = self.c.check()
        self.assertFalse(problems, "\n\n".join(problems))

    def key(self, prefix):
        return "%s-%s" % (prefix, os.urandom(6).hex())

    def follower_ids(self):
        lid = self.c.wait_leader(timeout=30)
        return [n for n in sorted(self.c.nodes) if n != lid]

    def api(self, nid, method, path, body=None, headers=None, retry_503=True):
        """A JSON API call on node nid's gateway; a 503 (an election on a loaded machine) is
        retried for a bounded time with the same request."""
        h = {"Authorization": "Bearer %s" % self.c.token}
        h.update(headers or {})
        deadline = time.monotonic() + 30
        while True:
            r = http_request(self.c.nodes[nid].http, method, path, body=body, headers=h, timeout=20)
            if not (retry_503 and r[0] == 503 and time.monotonic() < deadline):
                return r
            time.sleep(0.2)

    def order_via(self, nid, key, retry_503=True):
        deadline = time.monotonic() + 30
        while True:
            r = http_request(self.c.nodes[nid].proxy, "POST", "/orders", body=ORDER,
                             headers={"Idempotency-Key": key}, timeout=20)
            if not (retry_503 and r[0] == 503 and time.monotonic() < deadline):
                return r
            time.sleep(0.2)

    def driver(self, scenario, seeds, *args):
        p = subprocess.run([os.path.join(BIN, "client_driver"), scenario, seeds, self.c.token]
                           + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120, env=_env_without_tls())
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace")[-2000:])
        return json.loads(p.stdout.decode().strip().splitlines()[-1])

    def bench(self, *args, tls=None):
        cmd = [IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token, "--json"]
        cmd += self.c.tls_args() if tls is None else tls
        cmd += [str(a) for a in args]
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                              env=_env_without_tls())


class TlsForwardCases:
    """What every trusted TLS cluster must do (mutual or not); mixed into a TlsForwardTest."""

    def test_json_claim_through_each_follower(self):
        for nid in self.follower_ids():
            with self.subTest(follower=nid):
                key = self.key("tls-json")
                hk = {"Idempotency-Key": key}
                r = self.api(nid, "POST", "/v1/claims", {"fingerprint": fp(key)}, hk)
                self.assertEqual(r[0], 200, r)
                self.assertEqual(r[2].get("outcome"), "acquired", r)
                tok = r[2]["token"]
                self.assertGreater(tok, 0)
                body = {"token": tok, "outcome": "succeeded",
                        "response": {"status": 201, "headers": {"content-type": "application/json"},
                                     "body": '{"id":7}'}}
                r = self.api(nid, "POST", "/v1/claims/%s/complete" % key, body)
                self.assertEqual((r[0], r[2].get("outcome")), (200, "ok"), r)
                # Replays, through this follower and every other node.
                for other in sorted(self.c.nodes):
                    r = self.api(other, "POST", "/v1/claims", {"fingerprint": fp(key)}, hk)
                    self.assertEqual(r[0], 201, r)
                    self.assertTrue(_replayed(r), r)
                    self.assertEqual(r.raw, '{"id":7}', r)

    def test_proxy_claim_through_follower_runs_once(self):
        f1, f2 = self.follower_ids()[:2]
        lid = self.c.wait_leader(timeout=30)
        key = self.key("tls-proxy")
        first = self.order_via(f1, key)
        self.assertEqual(first[0], 201, first)
        self.assertFalse(_replayed(first), first)
        self.assertEqual(self.svc.count(key), 1)
        for nid in (f2, lid, f1):
            again = self.order_via(nid, key)
            self.assertEqual(again[0], 201, again)
            self.assertTrue(_replayed(again), again)
            self.assertEqual(again.raw, first.raw)
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))

    def test_idemctl_status_and_data_commands(self):
        rc, st, err = self.c.run_ctl("status")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len([n for n in st["nodes"] if n.get("role")]), 3, st)
        key = self.key("tls-ctl")
        rc, out, err = self.c.run_ctl("claim", key, "--fingerprint", fp(key))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out["outcome"], "acquired", out)
        rc, out2, err = self.c.run_ctl("complete", key, "--token", out["token"], "--status", 200,
                                       "--body", "done")
        self.assertEqual((rc, out2["outcome"]), (0, "ok"), (out2, err))
        rc, out3, err = self.c.run_ctl("claim", key, "--fingerprint", fp(key))
        self.assertEqual((rc, out3["outcome"]), (0, "replay"), (out3, err))
        # The same with the environment instead of the flags.
        env = _env_without_tls()
        env["IDEM_TLS_CA"] = os.path.join(self.c.pki, "ca.crt")
        if self.mutual:
            env["IDEM_TLS_CERT"] = os.path.join(self.c.pki, "client.crt")
            env["IDEM_TLS_KEY"] = os.path.join(self.c.pki, "client.key")
        p = subprocess.run([IDEMCTL, "--cluster", self.c.addrs(), "--token", self.c.token, "--json",
                            "get", key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                           env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["outcome"], "ok", p.stdout)

    def test_idem_bench_over_tls(self):
        p = self.bench("--workload", "claim-complete", "--concurrency", 4, "--requests", 200,
                       "--duration", 60)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual((out["ops"], out["errors"]), (200, 0), out)
        self.assertEqual(out["outcomes"], {"acquired": 200})
        # The open loop's asynchronous clients take the same TLS options (client
        # certificate included, in the mutual-TLS cluster).
        p = self.bench("--workload", "claim-complete", "--rate", 200, "--duration", 1,
                       "--connections", 2)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual((out["mode"], out["ops"], out["errors"], out["unsent"]),
                         ("open", 200, 0, 0), out)

    def test_wrong_ca_is_refused(self):
        bad = self.c.tls_args(ca="other-ca.crt")
        rc, out, err = self.c.run_ctl("--deadline", 1500, "claim", self.key("tls-bad"),
                                      "--fingerprint", fp(1), tls=bad)
        self.assertEqual(rc, 3, err)
        self.assertEqual(out["outcome"], "unavailable", out)
        self.assertIn("certificate verification failed", err)
        self.assertIn("check --tls-ca", err)
        rc, out, err = self.c.run_ctl("--deadline", 1500, "status", tls=bad)
        self.assertEqual(rc, 3, err)
        self.assertIn("certificate verification failed", json.dumps(out))
        p = self.bench("--workload", "fresh", "--requests", 5, "--deadline", 1500, tls=bad)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(b"certificate verification failed", p.stderr)
        # Plain TCP against a TLS listener: unavailable too.
        rc, out, err = self.c.run_ctl("--deadline", 1500, "get", "k", tls=[])
        self.assertEqual(rc, 3, err)
        self.assertIn("pass --tls-ca", err)
        # A CA file that does not exist is a configuration error.
        rc, out, err = self.c.run_ctl("get", "k", tls=["--tls-ca", "/nonexistent/ca.crt"])
        self.assertEqual(rc, 2, err)
        self.assertIn("/nonexistent/ca.crt", err)
        p = self.bench("--workload", "fresh", "--requests", 5, tls=["--tls-ca", "/nonexistent/ca.crt"])
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_claim_run_example_with_the_tls_environment(self):
        """examples/claim_run.c (build/bin/claim_run) with the TLS variables that
        tools/quickstart.sh --tls writes to .idem/env: the RPC is TLS, with the client
        certificate where the nodes ask for one. It charges once, then replays."""
        env = _env_without_tls()
        env.update(IDEM_CLUSTER=self.c.addrs(), IDEM_TOKEN=self.c.token,
                   IDEM_TLS_CA=os.path.join(self.c.pki, "ca.crt"))
        if self.mutual:
            env["IDEM_TLS_CERT"] = os.path.join(self.c.pki, "client.crt")
            env["IDEM_TLS_KEY"] = os.path.join(self.c.pki, "client.key")
        key = self.key("tls-example")

        def run():
            return subprocess.run([os.path.join(BIN, "claim_run"), key, "10 EUR"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        first = run()
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertIn(b"claim_run: charging 10 EUR", first.stderr)
        again = run()
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertNotIn(b"charging", again.stderr)
        self.assertIn(b"replay", again.stdout)
        self.assertEqual(self.c.run_ctl("get", key)[1]["outcome"], "ok")

    def test_libidem_against_tls_nodes(self):
        """libidem's synchronous client (tests/client/client_driver.c, scenario tls) and, where
        no client certificate is needed, its asynchronous one (async-tls) against the real TLS
        listeners. A follower comes first in the seeds: its not_leader redirect is followed
        to the leader over TLS too."""
        lid = self.c.wait_leader(timeout=30)
        seeds = ",".join(self.c.nodes[n].rpc for n in self.follower_ids() + [lid])
        ca = os.path.join(self.c.pki, "ca.crt")
        args = [ca, ""]
        if self.mutual:
            args += [os.path.join(self.c.pki, "client.crt"), os.path.join(self.c.pki, "client.key")]
        key = self.key("tls-lib")
        out = self.driver("tls", seeds, key, *args)
        self.assertEqual((out["open"], out["rv"], out["outcome"]), (0, 0, "acquired"), out)
        self.assertGreater(out["token"], 0, out)
        # The same key again: the lease is held (in_progress), proving the first claim stuck.
        out = self.driver("tls", seeds, key, *args)
        self.assertEqual((out["rv"], out["outcome"]), (0, "in_progress"), out)
        out = self.driver("tls", seeds, key, os.path.join(self.c.pki, "other-ca.crt"), "", *args[2:])
        self.assertEqual(out["rv"], -3, out)  # IDEM_EUNAVAILABLE
        self.assertIn("certificate verification failed", out["errmsg"])
        if not self.mutual:
            out = self.driver("async-tls", seeds, self.key("tls-async"), 50, 10000, ca)
            self.assertEqual((out["exactly_once"], out["acquired"]), (50, 50), out)
            self.assertEqual(out["loop_close"], 0, out)

    def test_zz_clean_shutdown(self):
        """Runs last (name order): every node ends with status 0 on SIGTERM, followers first
        (their forwarders hold TLS connections to the leader), and in the ASan build without
        leaks."""
        key = self.key("tls-last")
        fid = self.follower_ids()[0]
        self.assertEqual(self.order_via(fid, key)[0], 201)
        lid = self.c.wait_leader(timeout=30)
        for nid in sorted(self.c.nodes, key=lambda n: n == lid):
            self.assertEqual(self.c.stop(nid), 0, "node %d" % nid)
        for node in self.c.nodes.values():
            with open(node.log, "rb") as f:
                log = f.read()
            self.assertNotIn(key.encode(), log, "keys are never logged")
            self.assertNotIn(b"AddressSanitizer", log)
            self.assertNotIn(b"LeakSanitizer", log)


class TestTlsForward(TlsForwardCases, TlsForwardTest):
    """No ca_file: the nodes verify each other against the system store (SSL_CERT_FILE)."""
    mutual = False


class TestTlsForwardMutual(TlsForwardCases, TlsForwardTest):
    """ca_file set: every RPC client (nodes' forwarders included) presents a certificate."""
    mutual = True
    trust_env = False

    def test_client_without_certificate_is_refused(self):
        rc, out, err = self.c.run_ctl("--deadline", 1500, "get", "k",
                                      tls=self.c.tls_args(cert=False))
        self.assertEqual(rc, 3, err)
        self.assertEqual(out["outcome"], "unavailable", out)


class TestTlsForwardUntrusted(TlsForwardTest):
    """No ca_file and a system store without the test CA: a follower cannot verify the leader,
    so its gateway answers 503 (fail closed) and says why in its log; the leader serves."""
    trust_env = False

    def test_follower_refuses_an_unverified_leader(self):
        lid = self.c.wait_leader(timeout=30)
        fid = self.follower_ids()[0]
        key = self.key("tls-untrusted")
        r = self.api(fid, "POST", "/v1/claims", {"fingerprint": fp(key)},
                     {"Idempotency-Key": key}, retry_503=False)
        self.assertEqual(r[0], 503, r)
        before = self.svc.count()
        r = self.order_via(fid, self.key("tls-untrusted-proxy"), retry_503=False)
        self.assertEqual(r[0], 503, r)
        self.assertEqual(self.svc.count(), before, "nothing may run without the leader")
        with open(self.c.nodes[fid].log, "rb") as f:
            log = f.read().decode(errors="replace")
        self.assertIn("forward: TLS connection to %s failed: handshake" % self.c.nodes[lid].rpc, log)
        self.assertIn("certificate verify failed", log)
        self.assertNotIn(key, log)
        r = self.api(lid, "POST", "/v1/claims", {"fingerprint": fp(key)}, {"Idempotency-Key": key})
        self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)


class TestBench(ClusterTestCase):
    # Runs that must see every operation answered (errors 0) fail on a leader change: with
    # the default 600 ms election timeout a loaded machine (stress-ng --cpu 2 beside ctest
    # -j2) starved a leader into one in the middle of a 2 s run (106 of 200 unavailable).
    cluster_opts = dict(election_ms=3000)

    def bench(self, *args, timeout=120):
        p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token, "--json"]
                           + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn(b"\r[", p.stderr, "progress line although stderr is not a terminal")
        out = json.loads(p.stdout)
        # The histogram holds every operation scheduled, failed and unsent ones included;
        # percentiles are ordered.
        self.assertEqual(sum(b[2] for b in out["histogram"]),
                         out["ops"] + out["errors"] + out.get("unsent", 0))
        for lo, hi, n in out["histogram"]:
            self.assertLessEqual(lo, hi)
            self.assertGreater(n, 0)
        ps = [out[k] for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")]
        self.assertEqual(ps, sorted(ps))
        return out

    def bench_while(self, args, during):
        """Runs idem-bench --json ARGS, calls during() while it runs, and returns its parsed
        output once it exited 0 (killed if the test fails first)."""
        p = subprocess.Popen([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token,
                              "--json"] + [str(a) for a in args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            during(p)
            stdout, stderr = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, stderr)
        return json.loads(stdout)

    def acquired_total(self):
        """Claims the live nodes answered `acquired` over the binary RPC (their /metrics)."""
        n = 0
        for node in self.c.alive():
            try:
                text = http_request(node.http, "GET", "/metrics", timeout=5).raw
            except OSError:
                continue
            for line in text.splitlines():
                if (line.startswith("idem_requests_total{") and 'outcome="acquired"' in line
                        and 'transport="rpc"' in line):
                    n += int(float(line.split()[-1]))
        return n

    def wait_run_started(self, p, before):
        """Waits until idem-bench P's run has begun: a claim of its answered acquired (its
        probe and warm-up before the run are gets), i.e. more than BEFORE in
        acquired_total(). Its start-up, probe and warm-up take a while, more under ASan on
        a loaded machine, so a delay counted from the process's start is not one into the
        run. Returns at once if P exited (its exit status tells why)."""
        end = time.monotonic() + 60
        while p.poll() is None and self.acquired_total() <= before:
            self.assertLess(time.monotonic(), end, "idem-bench's run did not start in 60 s")
            time.sleep(0.02)

    def test_closed_loop_fresh(self):
        out = self.bench("--workload", "fresh", "--concurrency", 4, "--requests", 300)
        self.assertEqual(out["mode"], "closed")
        self.assertEqual((out["threads"], out["connections"]), (False, 1))
        self.assertEqual((out["ops"], out["errors"]), (300, 0))
        self.assertEqual(out["outcomes"], {"acquired": 300})
        # The same on threads with a synchronous client each (--threads).
        out = self.bench("--workload", "fresh", "--concurrency", 4, "--threads", "--requests", 300)
        self.assertEqual((out["mode"], out["threads"]), ("closed", True))
        self.assertNotIn("connections", out)
        self.assertEqual((out["ops"], out["errors"]), (300, 0))
        self.assertEqual(out["outcomes"], {"acquired": 300})
        # claim-complete pairs over two connections, closed loop.
        out = self.bench("--workload", "claim-complete", "--concurrency", 16, "--connections", 2,
                         "--requests", 200)
        self.assertEqual((out["ops"], out["errors"], out["connections"]), (200, 0, 2))

    def test_open_loop_claim_complete(self):
        # 100 operations per second for 2 s: exactly 200 are scheduled.
        out = self.bench("--workload", "claim-complete", "--rate", 100, "--duration", 2)
        self.assertEqual(out["mode"], "open")
        self.assertEqual(out["target_rate"], 100)
        self.assertEqual((out["ops"], out["errors"]), (200, 0))
        self.assertEqual(out["outcomes"], {"acquired": 200})
        self.assertIn("service_p99_ms", out)
        # Latency counts from the scheduled time, so it is never below the service time.
        self.assertGreaterEqual(out["p99_ms"] + 0.001, out["service_p50_ms"])
        out = self.bench("--workload", "fresh", "--rate", 50, "--requests", 30, "--duration", 30)
        self.assertEqual((out["ops"], out["errors"]), (30, 0))

    def check_timeline(self, out, every):
        rows = out["timeline"]
        self.assertEqual(out["timeline_ms"], every)
        # Every operation ended in exactly one interval; intervals follow each other.
        self.assertEqual(sum(r["ops"] for r in rows), out["ops"] + out["errors"])
        ends = [r["end_ms"] for r in rows]
        self.assertEqual(ends, sorted(ends))
        for r in rows:
            if r["ops"]:
                self.assertLessEqual(r["p50_ms"], r["p99_ms"])
                self.assertLessEqual(r["p99_ms"], r["max_ms"])
                self.assertLessEqual(r["max_ms"], out["max_ms"] + 0.001)
        # The run's maximum is some interval's.
        self.assertAlmostEqual(max(r["max_ms"] for r in rows), out["max_ms"], delta=0.002)
        return rows

    def test_timeline(self):
        # Open loop, 2 s at 200/s in 250 ms intervals: about 8 full ones, and a last partial
        # one for the answers that come after the schedule's end. How many exactly depends on
        # the machine, not on idem-bench: a slow cluster answers in the grace after the 2 s
        # (more rows: 12 were seen under load), and the interval's timer is re-armed when it
        # fires, so a loop kept off the CPU shifts the rows after it (fewer rows). The rows
        # are checked against the run's own times instead.
        out = self.bench("--workload", "fresh", "--rate", 200, "--duration", 2,
                         "--timeline", 250)
        rows = self.check_timeline(out, 250)
        last = rows[-1]["end_ms"]
        # They cover the run: the last operation is scheduled 1995 ms in and ends in the last
        # row (as does the slowest one), which closes at the run's end at the latest (end_ms
        # and duration_s are each rounded to the millisecond).
        self.assertGreaterEqual(last, 1995, rows)
        self.assertGreaterEqual(last + 1, out["max_ms"], (rows, out["max_ms"]))
        self.assertLessEqual(last, out["duration_s"] * 1000 + 1, (rows, out["duration_s"]))
        # One row per 250 ms of it: the k-th interval closes 250·k ms after the start or
        # later, plus the partial one (and a first timer armed up to an interval late); and
        # at least half the 8 of a quiet run (fewer only if the loop was held over 1.2 s).
        self.assertGreaterEqual(len(rows), 4, rows)
        self.assertLessEqual(len(rows), last // 250 + 2, rows)
        # An interval that starts before the last scheduled operation and is longer than the
        # slowest operation (+ 5 ms between two scheduled ones, + 1 ms of rounding) cannot
        # be empty: the first operation scheduled in it ends in it. On a quiet machine that
        # is every row but the last; a pause of the cluster longer than an interval (which
        # empties it) makes max_ms that long, and the check then skips the short rows.
        prev = 0
        for r in rows:
            if prev + 6 <= 1995 and r["end_ms"] - prev >= out["max_ms"] + 6:
                self.assertGreater(r["ops"], 0, (r, rows, out["max_ms"]))
            prev = r["end_ms"]
        # Closed loop, bounded by --requests.
        out = self.bench("--workload", "fresh", "--concurrency", 4, "--requests", 300,
                         "--timeline", 100)
        self.check_timeline(out, 100)
        self.assertEqual(out["ops"], 300)
        # Text output: a table after the distribution.
        p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token,
                            "--workload", "fresh", "--requests", "50", "--timeline", "50"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"timeline (every 50 ms", p.stdout)
        # Without the flag, no timeline.
        self.assertNotIn("timeline", self.bench("--workload", "fresh", "--requests", 20))

    def test_stall_probe(self):
        # --stall-probe: the machine's holds over the run, and per --timeline interval.
        out = self.bench("--workload", "fresh", "--rate", 200, "--duration", 2,
                         "--timeline", 250, "--stall-probe")
        sp = out["stall_probe"]
        self.assertEqual(sp["cpus"], len(os.sched_getaffinity(0)), sp)
        self.assertIn(sp["scheduling"], ("fifo", "normal"))
        self.assertEqual(sp["period_ms"], 1)
        # From the schedule's start to the last answer (the last operation is scheduled
        # 5 ms before the 2 s end).
        self.assertGreaterEqual(sp["seconds"], 1.9)
        # One wake-up a millisecond per CPU, or fewer when held (or, at normal priority
        # beside a busy test run, kept waiting; the missed periods are not owed): one every
        # 20 ms on average at least, so that a probe that does not run (or wakes every 50 ms
        # and more) still fails, but a machine that keeps it waiting a few ms does not.
        self.assertGreaterEqual(sp["wakeups"], sp["cpus"] * sp["seconds"] * 50, sp)
        self.assertLessEqual(sp["holds"], sp["wakeups"])
        if sp["holds"] == 0:
            self.assertEqual((sp["held_ms_per_cpu"], sp["held_max_ms"]), (0, 0), sp)
        else:
            self.assertGreaterEqual(sp["held_max_ms"], 1, sp)
            # held_ms_per_cpu is rounded to 0.001 ms before it is multiplied back.
            self.assertGreaterEqual(sp["held_ms_per_cpu"] * sp["cpus"] + 0.0005 * sp["cpus"] + 1e-6,
                                    sp["held_max_ms"])
        rows = self.check_timeline(out, 250)
        for r in rows:
            self.assertLessEqual(r["held_max_ms"], sp["held_max_ms"] + 0.001, (r, sp))
            self.assertTrue(r["held_max_ms"] == 0 or r["held_max_ms"] >= 1, r)
        # idem-bench itself stopped for 200 ms about a second into the run (counted from the
        # run's observed start, not the process's: start-up, probe and warm-up come first,
        # over a second under ASan on a loaded machine): a hold of about that long, in the
        # row that closed after it or the next (the probe's thread and the loop's timer both
        # run at SIGCONT), next to a row whose operations waited that long. (Not necessarily
        # the run's slowest row: a pause of the cluster on a loaded machine can be longer.)
        before = self.acquired_total()

        def stop_200ms(p):
            self.wait_run_started(p, before)
            time.sleep(0.8)
            p.send_signal(signal.SIGSTOP)
            time.sleep(0.2)
            p.send_signal(signal.SIGCONT)

        out = self.bench_while(["--workload", "fresh", "--rate", 200, "--duration", 2,
                                "--timeline", 250, "--stall-probe"], stop_200ms)
        sp = out["stall_probe"]
        self.assertGreaterEqual(sp["held_max_ms"], 150, sp)
        rows = self.check_timeline(out, 250)
        held_row = max(range(len(rows)), key=lambda i: rows[i]["held_max_ms"])
        self.assertEqual(rows[held_row]["held_max_ms"], sp["held_max_ms"], rows)
        near = rows[max(held_row - 1, 0):held_row + 2]
        self.assertGreaterEqual(max(r["max_ms"] for r in near), 150, (held_row, rows))
        # Without the flag, none of it; in the text output, a line.
        plain = self.bench("--workload", "fresh", "--requests", 20, "--timeline", 100)
        self.assertNotIn("stall_probe", plain)
        self.assertTrue(all("held_max_ms" not in r for r in plain["timeline"]))
        p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token,
                            "--workload", "fresh", "--requests", "50", "--stall-probe"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"held off     ", p.stdout)

    def threads_during(self, *args):
        """Runs idem-bench --json ARGS, sampling its thread count every 50 ms; returns
        (parsed output, samples)."""
        samples = []

        def sample(p):
            end = time.monotonic() + 30
            while p.poll() is None and time.monotonic() < end:
                try:
                    with open("/proc/%d/status" % p.pid) as f:
                        for line in f:
                            if line.startswith("Threads:"):
                                samples.append(int(line.split()[1]))
                except (FileNotFoundError, ProcessLookupError):
                    break
                time.sleep(0.05)

        return self.bench_while(list(args), sample), samples

    def test_loops_are_single_threaded(self):
        # Both loops send from one thread (a libuv loop with asynchronous clients), so that
        # the load generator does not compete for the CPU with the cluster it measures;
        # before, they ran --concurrency threads. The cluster's addresses are numeric, so
        # libuv's thread pool (getaddrinfo) is never started: one thread. The bound leaves
        # room for one more thread of a library, far from 64.
        out, samples = self.threads_during("--workload", "claim-complete", "--rate", "500",
                                           "--concurrency", "64", "--connections", "2",
                                           "--duration", "3")
        self.assertEqual((out["ops"], out["errors"], out["unsent"]), (1500, 0, 0), out)
        self.assertEqual(out["connections"], 2)
        # Sampled all through the run (3 s at 50 ms: dozens of samples).
        self.assertGreater(len(samples), 20, samples)
        self.assertLessEqual(max(samples), 2, samples)
        out, samples = self.threads_during("--workload", "fresh", "--concurrency", "64",
                                           "--duration", "3")
        self.assertEqual((out["mode"], out["errors"]), ("closed", 0), out)
        self.assertGreater(out["ops"], 0, out)
        self.assertGreater(len(samples), 20, samples)
        self.assertLessEqual(max(samples), 2, samples)
        # --threads: the closed loop on 64 threads, as before (so the sampling does see them).
        out, samples = self.threads_during("--workload", "fresh", "--concurrency", "64",
                                           "--threads", "--duration", "3")
        self.assertEqual(out["errors"], 0, out)
        self.assertGreaterEqual(max(samples), 64, samples)

    def test_open_loop_sends_exactly_the_schedule(self):
        # R × duration operations are scheduled, and on a healthy cluster every one is sent
        # and answered: none unsent, none failed, each fresh key acquired once.
        out = self.bench("--workload", "fresh", "--rate", 1000, "--duration", 3)
        self.assertEqual((out["ops"], out["errors"], out["unsent"]), (3000, 0, 0), out)
        self.assertEqual(out["outcomes"], {"acquired": 3000})
        self.assertEqual(out["connections"], 1)
        # The other workloads run in the open loop too.
        out = self.bench("--workload", "replay", "--keys", 4, "--rate", 200, "--duration", 1)
        self.assertEqual((out["ops"], out["errors"], out["unsent"]), (200, 0, 0), out)
        self.assertEqual(out["outcomes"], {"replay": 200})
        out = self.bench("--workload", "contention", "--keys", 2, "--rate", 200, "--duration", 1,
                         "--connections", 3)
        self.assertEqual((out["ops"], out["errors"], out["unsent"]), (200, 0, 0), out)
        self.assertLessEqual(set(out["outcomes"]), {"acquired", "in_progress"})
        self.assertEqual(sum(out["outcomes"].values()), 200)
        self.assertGreater(out["outcomes"].get("acquired", 0), 0)

    def test_open_loop_in_flight_cap(self):
        # --concurrency 1 in the open loop: one operation in flight at a time; the ones due
        # meanwhile wait (their lag counts) but are all sent, and the run still ends.
        out = self.bench("--workload", "claim-complete", "--rate", 400, "--concurrency", 1,
                         "--duration", 1)
        self.assertEqual(out["concurrency"], 1)
        self.assertEqual(out["ops"] + out["errors"] + out["unsent"], 400, out)
        self.assertEqual(out["errors"], 0, out)

    def test_open_loop_unsent_count_in_latency(self):
        # A schedule the cluster cannot keep up with through one operation in flight: what is
        # still unsent when the sends stop (half the grace after --duration: the grace is 1 s,
        # or one shorter --deadline) counts in the latency with its wait from its scheduled
        # time until the run's end, at least that half grace, so that the percentiles cannot
        # leave out the operations that waited longest.
        # (A deadline of 1 s, not less: on a loaded machine one claim once took over 200 ms
        # and failed the run's no-error check.)
        out = self.bench("--workload", "fresh", "--rate", 20000, "--concurrency", 1,
                         "--duration", 1, "--deadline", 1000)
        self.assertGreater(out["unsent"], 10000, out)
        self.assertEqual(out["errors"], 0, out)
        self.assertEqual(out["ops"] + out["unsent"], 20000, out)
        self.assertEqual(sum(b[2] for b in out["histogram"]), 20000)
        # Over half the schedule is unsent, each having waited 0.5 s or more (the histogram's
        # buckets are within 1/64 of their values).
        waited = sum(n for lo, hi, n in out["histogram"] if hi >= 500000 * 63 // 64)
        self.assertGreaterEqual(waited, out["unsent"], out)
        self.assertGreaterEqual(out["p50_ms"], 500, out)
        self.assertEqual(out["outcomes"], {"acquired": out["ops"]})

    def followers_killed_after(self, seconds, started=None):
        """A during() for bench_while: kills every follower SECONDS into the run (quorum
        lost), counted from when the run was seen to start (wait_run_started), not from the
        process's start: had the followers died during its probe or warm-up, it would exit
        3 without a run. STARTED, if given, is set to the time.monotonic() of that sight."""
        lid = self.c.wait_leader(timeout=20)
        before = self.acquired_total()

        def kill(p):
            self.wait_run_started(p, before)
            if started is not None:
                started.append(time.monotonic())
            time.sleep(seconds)
            for nid in list(self.c.nodes):
                if nid != lid:
                    self.c.kill(nid)
        return kill

    def bench_losing_quorum(self, *args):
        """Runs idem-bench --json --duration 4 --deadline 400 ARGS and kills every follower
        1.5 s in (quorum lost); returns its parsed output. The operations sent after that
        wait their whole deadline and fail: the latency figures must show that wait (not
        only the fast successes), and the histogram must hold every operation sent."""
        out = self.bench_while(["--duration", 4, "--deadline", 400] + list(args),
                               self.followers_killed_after(1.5))
        self.assertGreater(out["ops"], 0, out)
        self.assertGreater(out["errors"], 0, out)
        self.assertEqual(sum(b[2] for b in out["histogram"]),
                         out["ops"] + out["errors"] + out.get("unsent", 0))
        self.assertGreaterEqual(out["max_ms"], 350, out)
        return out

    def test_failed_operations_count_in_latency(self):
        self.bench_losing_quorum("--workload", "fresh", "--concurrency", "2")

    def test_failed_operations_count_in_latency_on_threads(self):
        self.bench_losing_quorum("--workload", "fresh", "--concurrency", "2", "--threads")

    def test_open_loop_failed_operations_count_in_latency(self):
        # In the open loop, whatever was scheduled is accounted for: answered, failed, or
        # unsent.
        out = self.bench_losing_quorum("--workload", "claim-complete", "--rate", "100")
        self.assertGreater(out["transport_errors"], 0, out)
        self.assertEqual(out["ops"] + out["errors"] + out["unsent"], 400, out)
        self.assertGreaterEqual(out["max_ms"], 350, out)

    def bench_bounded(self, *mode):
        """The followers die 1 s into a 2 s run of MODE with 60 s deadlines: the calls in
        flight then (and, open loop, those due after) would wait their whole deadline, but
        --duration bounds the run: every call's deadline is cut to 1 s after the end, where
        the unanswered ones fail. Returns the parsed output.
        Unbounded, the run would last 1 s + 60 s or more; bounded it lasts 3 s: the limits
        below (30 s) tell the two apart without asking how fast a loaded machine is (with
        5 s deadlines they had to sit 2 s above the 3 s)."""
        started = []
        out = self.bench_while(["--duration", 2, "--deadline", 60000] + list(mode),
                               self.followers_killed_after(1.0, started))
        wall = time.monotonic() - started[0]
        self.assertGreater(out["ops"], 0, out)
        self.assertGreater(out["errors"], 0, out)
        # The run's own clock: 2 s, then at most the 1 s grace (and the loop's close).
        self.assertGreaterEqual(out["duration_s"], 2.0, out)
        self.assertLess(out["duration_s"], 30.0, out)
        # The unanswered calls waited until the cut (2 s for those sent when the followers
        # died), not their 60 s deadline.
        self.assertGreaterEqual(out["max_ms"], 900, out)
        self.assertLess(out["max_ms"], 30000, out)
        # The process too ends with the run, not 60 s after its last calls: counted from the
        # run's observed start (after its probe and warm-up), 3 s and its exit.
        self.assertLess(wall, 30.0, (wall, out))
        return out

    def test_duration_bounds_a_run_that_lost_quorum(self):
        self.bench_bounded("--workload", "fresh", "--concurrency", "2")

    def test_duration_bounds_a_run_that_lost_quorum_on_threads(self):
        self.bench_bounded("--workload", "fresh", "--concurrency", "2", "--threads")

    def test_open_loop_duration_bounds_a_run_that_lost_quorum(self):
        out = self.bench_bounded("--workload", "claim-complete", "--rate", "100")
        self.assertEqual(out["ops"] + out["errors"] + out["unsent"], 200, out)

    def test_json_when_the_run_cannot_be_made(self):
        # --json: whatever stops the run before its results is an object too, as idemctl's.
        p = subprocess.run([IDEM_BENCH, "--workload", "fresh", "--rate", "0", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual(out["outcome"], "usage", out)
        self.assertIn("--rate", out["error"])
        dead = "127.0.0.1:%d" % free_port()
        p = subprocess.run([IDEM_BENCH, "--cluster", dead, "--token", "t", "--workload", "fresh",
                            "--deadline", "300", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 3, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual(out["outcome"], "unavailable", out)
        self.assertIn("cluster unreachable", out["error"])
        p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", "not-a-token",
                            "--workload", "fresh", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(json.loads(p.stdout)["outcome"], "usage")
        # --json as another option's value is that value: the usage error is text.
        p = subprocess.run([IDEM_BENCH, "--token", "--json", "--workload", "nope"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual((p.returncode, p.stdout), (2, b""), p.stderr)
        self.assertIn(b"--workload must be fresh", p.stderr)

    def test_contention_and_replay(self):
        out = self.bench("--workload", "contention", "--keys", 2, "--concurrency", 8, "--requests", 200)
        self.assertEqual((out["ops"], out["errors"]), (200, 0))
        self.assertEqual(out["keys"], 2)
        self.assertLessEqual(set(out["outcomes"]), {"acquired", "in_progress"})
        self.assertEqual(sum(out["outcomes"].values()), 200)
        self.assertGreater(out["outcomes"].get("acquired", 0), 0)
        out = self.bench("--workload", "replay", "--keys", 4, "--concurrency", 2, "--requests", 100)
        self.assertEqual((out["ops"], out["errors"]), (100, 0))
        self.assertEqual(out["outcomes"], {"replay": 100})

    def test_usage_errors(self):
        for args in (["--workload", "fresh", "--rate", "0"], ["--workload", "fresh", "--keys", "3"],
                     ["--workload", "contention", "--keys", "0"],
                     ["--workload", "fresh", "--threads", "--connections", "2"],
                     ["--workload", "fresh", "--threads", "--rate", "10"],
                     ["--workload", "fresh", "--rate", "10", "--connections", "0"],
                     ["--workload", "fresh", "--threads", "--timeline", "100"],
                     ["--workload", "fresh", "--timeline", "9"]):
            p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token] + args,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(p.returncode, 2, args)

    def run_on_terminal(self, *args):
        """Runs idem-bench with stderr on a pseudo-terminal; returns (stdout text, stderr)."""
        master, slave = pty.openpty()
        p = subprocess.Popen([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token]
                             + [str(a) for a in args], stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        err = b""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            r, _, _ = select.select([master], [], [], 1)
            if r:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                err += chunk
            elif p.poll() is not None:
                break
        out, _ = p.communicate(timeout=60)
        os.close(master)
        self.assertEqual(p.returncode, 0, err)
        return out.decode(), err

    def test_progress_on_a_terminal_and_text_report(self):
        text, err = self.run_on_terminal("--workload", "fresh", "--concurrency", "2", "--duration", "3")
        self.assertRegex(err, rb"\r\[ +\d+s\] \d+ ops, \d+ ops/s, 0 errors")
        self.assertRegex(text, r"latency ms   p50 [\d.]+  p90 [\d.]+  p99 [\d.]+  p99\.9 [\d.]+  max")
        self.assertIn("distribution (latency ms", text)
        self.assertRegex(text, r"\|#+\n")
        # The open loop's progress line (from its event loop) and report.
        text, err = self.run_on_terminal("--workload", "fresh", "--rate", "200", "--duration", "3",
                                         "--connections", "2")
        self.assertRegex(err, rb"\r\[ +\d+s\] \d+ ops, \d+ ops/s, 0 errors, max lag [\d.]+ ms")
        self.assertIn("open loop, target 200 ops/s, at most 1024 in flight, 2 connections", text)
        self.assertRegex(text, r"ops          600\n")
        self.assertRegex(text, r"unsent       0 ")
        self.assertRegex(text, r"service ms   p50 [\d.]+  p99 [\d.]+")
        self.assertIn("distribution (latency ms", text)

if __name__ == "__main__":
    unittest.main()
