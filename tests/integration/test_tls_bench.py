"""TLS on the binary RPC listener, and idem-bench against a real cluster.

TLS: certificates are made at test time with the openssl CLI in the cluster's temp dir
(nothing is committed). A one-node cluster serves the RPC over TLS (tls.rpc: true); the
tests speak the framing through Python's ssl module. Readiness is asked over HTTP
(/readyz), because idemctl (libidem) has no TLS yet.

idem-bench: closed and open loop, every workload, the JSON output's consistency, and the
progress line that appears only when stderr is a terminal.
"""
import json
import os
import pty
import select
import socket
import ssl
import subprocess
import time
import unittest

from harness import BIN, Cluster, fp, http_request, wait_for
from test_cluster import _fields, _frame, _read_response

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
    hdr = b""
    while len(hdr) < 4:
        chunk = sock.recv(4 - len(hdr))
        if not chunk:
            return None
        hdr += chunk
    n = int.from_bytes(hdr, "big")
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    fields = _fields(body)
    result = _fields(fields.get(2, b""))
    return fields.get(1, 0), result.get(1, 0), result.get(2, 0)


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=60)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a second key that
    matches neither; all PEM files in d."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=idem test CA",
             cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext",
                 cwd=d)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", "other.key", cwd=d)


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
        self.c.close()

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
            c.close()

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


class TestBench(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        try:
            self.c.wait_leader(timeout=20)
        except AssertionError:
            print(self.c.logs())
            self.c.close()
            raise

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        self.c.close()

    def bench(self, *args, timeout=120):
        p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token, "--json"]
                           + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn(b"\r[", p.stderr, "progress line although stderr is not a terminal")
        out = json.loads(p.stdout)
        # The histogram holds every successful operation; percentiles are ordered.
        self.assertEqual(sum(b[2] for b in out["histogram"]), out["ops"])
        for lo, hi, n in out["histogram"]:
            self.assertLessEqual(lo, hi)
            self.assertGreater(n, 0)
        ps = [out[k] for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")]
        self.assertEqual(ps, sorted(ps))
        return out

    def test_closed_loop_fresh(self):
        out = self.bench("--workload", "fresh", "--concurrency", 4, "--requests", 300)
        self.assertEqual(out["mode"], "closed")
        self.assertEqual((out["ops"], out["errors"]), (300, 0))
        self.assertEqual(out["outcomes"], {"acquired": 300})

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
                     ["--workload", "contention", "--keys", "0"]):
            p = subprocess.run([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token] + args,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(p.returncode, 2, args)

    def test_progress_on_a_terminal_and_text_report(self):
        master, slave = pty.openpty()
        p = subprocess.Popen([IDEM_BENCH, "--cluster", self.c.addrs(), "--token", self.c.token,
                              "--workload", "fresh", "--concurrency", "2", "--duration", "3"],
                             stdout=subprocess.PIPE, stderr=slave)
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
        self.assertRegex(err, rb"\r\[ +\d+s\] \d+ ops, \d+ ops/s, 0 errors")
        text = out.decode()
        self.assertRegex(text, r"latency ms   p50 [\d.]+  p90 [\d.]+  p99 [\d.]+  p99\.9 [\d.]+  max")
        self.assertIn("distribution (latency ms", text)
        self.assertRegex(text, r"\|#+\n")


if __name__ == "__main__":
    unittest.main()
