"""Integration test of the Go client (client/go) against a real three-node cluster: the
Go side is client/go/integration_test.go (build tag `integration`), built here into a test
binary in the build tree and run with the cluster's gateways and a tenant's token in its
environment. Its scenarios: 32 goroutines in Run on one key (the function runs once, all
get its response); a 2 s lease renewed through a 5 s function; the net/http middleware
over an httptest server; and 32 goroutines in Run while this driver SIGKILLs the leader,
when the Go side asks for it from inside the function (a line IDEM-KILL-LEADER on its
stdout; the answer is a line on its stdin): every one of them must end with the function's
response (one ran, 31 replayed), none with an error. The middleware's refusal of a reused key is
checked as the gateway's problem details (application/problem+json, every member).
Skipped, and reported so, without `go` (Debian's golang-go; tools/setup.sh --test installs
it).

TestGoFingerprintOptions runs TestServerFingerprintOptions of the same file: Run and the
middleware with fingerprint_fields / fingerprint_ignore, which needs a gateway that applies
them (a retry whose ignored value changed replays; one whose hashed value changed is
refused as a reused key).

TestGoTls runs TestServerTLS of the same file against three nodes serving HTTPS with a
required client certificate (certificates made with openssl: test_tls_bench.make_pki):
Run over TLS, through a follower, and no answer without the certificate, with another CA
or in plain HTTP.

TestGoExamples builds examples/go into a temp dir and runs each program against the
cluster, checking what its README and comments say (orders: replays, 409 problem details,
the handler run once; charge: its exit statuses). Their processes are stopped by PID.

Run: IDEM_BIN_DIR=build/bin IDEM_BUILD_DIR=build python3 -m unittest -v test_go_client
"""
import http.client
import os
import re
import secrets
import select
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BIN, ClusterTestCase, free_port, http_request,  # noqa: E402
                     request_past_503, wait_for)
from test_tls_bench import TlsCluster  # noqa: E402

BUILD = os.environ.get("IDEM_BUILD_DIR") or os.path.join(BIN, "..")
SOURCE = os.environ.get("IDEM_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
GO_TIMEOUT = 90  # seconds for the Go binary's whole run (it takes about 15)
TESTS = ("TestIntegrationConcurrentRun", "TestIntegrationRenewal", "TestIntegrationMiddleware",
         "TestIntegrationLeaderKill")


def go_env(out):
    """The environment of a Go build whose caches live under out (the build tree): no
    network (GOPROXY=off), nothing written to $HOME, no go.env file read."""
    env = dict(os.environ)
    env.update(GOCACHE=os.path.join(out, "cache"), GOPATH=os.path.join(out, "path"),
               GOMODCACHE=os.path.join(out, "path", "pkg", "mod"), GOPROXY="off",
               GOFLAGS="-mod=mod", GOENV="off", GO111MODULE="on", GOSUMDB="off",
               GOTOOLCHAIN="local")
    return env


def _status(addr, path):
    try:
        return http_request(addr, "GET", path, timeout=2)[0]
    except OSError:
        return None


class GoCluster(ClusterTestCase):
    """A cluster for Go programs: skipped without go; build() (Go's caches under the build
    tree's go/), then the cluster, every gateway ready."""
    scheme = "http"

    def setUp(self):
        if shutil.which("go") is None:
            self.skipTest("go is not installed (Debian's golang-go; tools/setup.sh --test)")
        self.out = os.path.join(os.path.abspath(BUILD), "go")
        os.makedirs(self.out, exist_ok=True)
        self.build()
        super().setUp()
        for node in self.c.nodes.values():
            wait_for(lambda: self.gateway_ready(node), 30,
                     "node %d's gateway to be ready" % node.id)

    def build(self):
        pass

    def gateway_ready(self, node):
        return _status(node.http, "/readyz") == 200

    def gateways(self):
        """The gateways' base URLs, the leader first."""
        leader = self.c.leader()
        self.assertTrue(leader, "no leader")
        order = [leader] + [i for i in sorted(self.c.nodes) if i != leader]
        return ["%s://%s" % (self.scheme, self.c.nodes[i].http) for i in order]


class GoTest(GoCluster):
    """Builds the Go integration test binary, then starts the cluster."""

    def build(self):
        # One binary per class: ctest may run the classes at once.
        self.binary = os.path.join(self.out, "idem-go-%s.test" % type(self).__name__.lower())
        p = subprocess.run(["go", "test", "-c", "-tags", "integration", "-o", self.binary, "."],
                           cwd=os.path.join(SOURCE, "client", "go"), env=go_env(self.out),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(p.returncode, 0, "go test -c failed:\n" + p.stdout.decode(errors="replace"))

    def go_env(self):
        """The binary's environment: the gateways, the leader first, and the token."""
        env = go_env(self.out)
        env.update(IDEM_GO_NODES=",".join(self.gateways()), IDEM_GO_TOKEN=self.c.token)
        return env


class TestGoFingerprintOptions(GoTest):
    def test_fingerprint_options(self):
        p = subprocess.run([self.binary, "-test.run", "^TestServerFingerprintOptions$",
                            "-test.v", "-test.count=1", "-test.timeout", "60s"],
                           env=self.go_env(), cwd=os.path.dirname(self.binary),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        out = p.stdout.decode(errors="replace")
        print(out)
        self.assertEqual(p.returncode, 0, "the Go test failed")
        self.assertIn("--- PASS: TestServerFingerprintOptions ", out)


class TestGoClient(GoTest):
    def test_go_client(self):
        env = self.go_env()
        p = subprocess.Popen([self.binary, "-test.run", "^TestIntegration", "-test.v",
                              "-test.count=1", "-test.timeout", "%ds" % GO_TIMEOUT],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env, cwd=os.path.dirname(self.binary))
        lines, killed = [], None
        deadline = time.monotonic() + GO_TIMEOUT + 30
        try:
            buf = b""
            while True:
                left = deadline - time.monotonic()
                self.assertGreater(left, 0, "the Go tests did not end:\n" + "\n".join(lines))
                ready, _, _ = select.select([p.stdout], [], [], left)
                if not ready:
                    continue
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    lines.append(text)
                    if text == "IDEM-KILL-LEADER":
                        self.assertIsNone(killed, "asked twice to kill the leader")
                        killed = self.c.leader()
                        self.assertTrue(killed, "no leader to kill")
                        self.c.kill(killed, 9)
                        p.stdin.write(b"killed node %d\n" % killed)
                        p.stdin.flush()
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdin.close()
            p.stdout.close()
        out = "\n".join(lines)
        print(out)
        self.assertEqual(rc, 0, "the Go integration tests failed")
        for name in TESTS:
            self.assertIn("--- PASS: %s " % name, out)
        self.assertIsNotNone(killed, "the leader was never killed")


class TestGoTls(GoTest):
    """TestServerTLS of client/go/integration_test.go against three nodes whose gateways
    serve HTTPS and require a client certificate signed by the test CA (tls.http,
    tls.http_client_certs: require; certificates made by test_tls_bench.make_pki)."""
    scheme = "https"

    def make_cluster(self):
        return TlsCluster(lambda pki: ["cert_file: %s/server.crt" % pki,
                                       "key_file: %s/server.key" % pki, "http: true",
                                       "ca_file: %s/ca.crt" % pki,
                                       "http_client_certs: require"], n=3)

    def gateway_ready(self, node):
        ctx = ssl.create_default_context(cafile=os.path.join(self.c.pki, "ca.crt"))
        ctx.load_cert_chain(os.path.join(self.c.pki, "client.crt"),
                            os.path.join(self.c.pki, "client.key"))
        host, port = node.http.rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), timeout=2, context=ctx)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def test_tls(self):
        env = self.go_env()
        env["IDEM_GO_PKI"] = self.c.pki
        p = subprocess.run([self.binary, "-test.run", "^TestServerTLS$", "-test.v",
                            "-test.count=1", "-test.timeout", "60s"],
                           env=env, cwd=os.path.dirname(self.binary), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        out = p.stdout.decode(errors="replace")
        print(out)
        self.assertEqual(p.returncode, 0, "the Go test failed")
        self.assertIn("--- PASS: TestServerTLS ", out)

    def test_charge_example_with_the_tls_environment(self):
        """examples/go's charge with the TLS variables that tools/quickstart.sh --tls
        writes to .idem/env: it trusts the CA and presents the client certificate the
        gateways require."""
        bin_dir = tempfile.mkdtemp(prefix="idem-go-charge-")
        self.addCleanup(shutil.rmtree, bin_dir, ignore_errors=True)
        p = subprocess.run(["go", "build", "-o", bin_dir + "/", "./charge"],
                           cwd=os.path.join(SOURCE, "examples", "go"), env=go_env(self.out),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(p.returncode, 0, "go build failed:\n" + p.stdout.decode(errors="replace"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}
        env.update(IDEM_HTTP=",".join(self.gateways()), IDEM_TOKEN=self.c.token,
                   IDEM_TLS_CA=os.path.join(self.c.pki, "ca.crt"),
                   IDEM_TLS_CERT=os.path.join(self.c.pki, "client.crt"),
                   IDEM_TLS_KEY=os.path.join(self.c.pki, "client.key"))
        key = "go-tls-charge-" + secrets.token_hex(6)

        def charge():
            return subprocess.run([os.path.join(bin_dir, "charge"), key, "10 EUR"], env=env,
                                  capture_output=True, text=True, timeout=60)
        r1, r2 = charge(), charge()
        self.assertEqual((r1.returncode, r2.returncode), (0, 0), (r1, r2))
        self.assertTrue(r1.stdout.startswith("charged: "), r1)
        self.assertIn("charging 10 EUR", r1.stderr)
        self.assertTrue(r2.stdout.startswith("replayed, not charged again: "), r2)
        self.assertNotIn("charging", r2.stderr)


# The gateway's answers' problem details members (docs/http-api.md, Errors).
PROBLEM_MEMBERS = {"type", "title", "status", "detail", "instance", "code", "message",
                   "request_id"}


class TestGoExamples(GoCluster):
    """examples/go, built into a temp dir and run against the cluster as their README and
    comments say: orders (a net/http service behind idem.Middleware: a retried POST is
    replayed with Idempotency-Replayed: true and the handler ran once; a changed body under
    the key is refused 409 with the gateway's problem details; a POST without a key and a
    GET pass through; a 4xx is released) and charge (its exit statuses 0, 1, 2 and 3)."""

    def build(self):
        self.bin = tempfile.mkdtemp(prefix="idem-go-examples-")
        self.addCleanup(shutil.rmtree, self.bin, ignore_errors=True)
        p = subprocess.run(["go", "build", "-o", self.bin + "/", "./..."],
                           cwd=os.path.join(SOURCE, "examples", "go"), env=go_env(self.out),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(p.returncode, 0, "go build failed:\n" + p.stdout.decode(errors="replace"))

    def example_env(self, **kw):
        """The examples' environment (examples/go/internal/config): the gateways and the
        token, nothing of the caller's IDEM_*; kw overrides."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}
        env.update(IDEM_HTTP=",".join(self.gateways()), IDEM_TOKEN=self.c.token)
        env.update(kw)
        return {k: v for k, v in env.items() if v is not None}

    def start_orders(self):
        """Starts orders on 127.0.0.1, a port of the kernel's; returns (its address, the
        lines of its log so far, kept up to date). Stopped (SIGTERM, then SIGKILL, by its
        PID) after the test."""
        p = subprocess.Popen([os.path.join(self.bin, "orders"), "-listen", "127.0.0.1:0"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=self.example_env())
        lines = []

        def read():
            for raw in iter(p.stderr.readline, b""):
                lines.append(raw.decode(errors="replace").rstrip("\n"))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def stop():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            reader.join(10)
            p.stderr.close()
        self.addCleanup(stop)

        def listening():
            self.assertIsNone(p.poll(), "orders exited:\n" + "\n".join(lines))
            for ln in lines:
                m = re.search(r"orders on http://(127\.0\.0\.1:\d+)$", ln)
                if m:
                    return m.group(1)
            return None
        return wait_for(listening, 30, "orders to listen"), lines

    def assert_gateway_problem(self, r, status, code, key):
        """r: a middleware's refusal of a claim the cluster refused, as problem details
        with the members, title and request id the gateway writes, never the key."""
        self.assertEqual((r[0], r[1].get("content-type")), (status, "application/problem+json"), r)
        p = r[2]
        self.assertEqual(set(p), PROBLEM_MEMBERS, r)
        self.assertEqual((p["type"], p["code"], p["status"]),
                         ("urn:idemd:problem:" + code, code, status), r)
        self.assertTrue(p["detail"], r)
        self.assertEqual(p["message"], p["detail"], r)
        self.assertRegex(p["request_id"], r"^[0-9a-f]{16}$")
        self.assertEqual(p["instance"], "urn:idemd:request:" + p["request_id"])
        self.assertNotIn(key, r.raw)
        return p

    def test_orders(self):
        addr, log = self.start_orders()

        def post(body, key=None):
            h = {"Content-Type": "application/json"}
            if key:
                h["Idempotency-Key"] = key
            return http_request(addr, "POST", "/orders", headers=h, raw=body.encode())

        def created():
            return [ln for ln in log if re.search(r"order \d+ created", ln)]

        key = "go-ex-" + secrets.token_hex(6)
        a = post('{"amount": 10}', key)
        self.assertEqual((a[0], a[1].get("content-type"), a[1].get("location")),
                         (201, "application/json", "/orders/1"), a)
        self.assertNotIn("idempotency-replayed", a[1])
        self.assertEqual((a[2]["id"], a[2]["amount"]), (1, 10), a)
        self.assertGreater(a[2]["fence"], 0, a)
        # The retry: the same 201 replayed, the handler not run again.
        b = post('{"amount": 10}', key)
        self.assertEqual((b[0], b.raw, b[1].get("location"), b[1].get("content-type")),
                         (201, a.raw, "/orders/1", "application/json"), b)
        self.assertEqual(b[1].get("idempotency-replayed"), "true", b)
        # Another body under the key: refused as the gateway refuses it.
        c = post('{"amount": 99}', key)
        p = self.assert_gateway_problem(c, 409, "idempotency_key_reused", key)
        gw = request_past_503(self.c.nodes[sorted(self.c.nodes)[0]].http, "POST", "/v1/claims",
                              {"fingerprint": "ab" * 32, "attempt_id": "go-ex-other"},
                              token=self.c.token, headers={"Idempotency-Key": key})
        self.assertEqual((gw[0], gw[1].get("content-type")), (409, "application/problem+json"), gw)
        self.assertEqual((p["type"], p["title"]), (gw[2]["type"], gw[2]["title"]))
        wait_for(lambda: len(created()) >= 1, 10, "orders to log its order")
        self.assertEqual(len(created()), 1, log)
        self.assertRegex(created()[0], r"order 1 created \(amount 10, fencing token %d\)$"
                         % a[2]["fence"])
        # GET /orders/{id} is not behind the middleware; no second order was made.
        g = http_request(addr, "GET", "/orders/1")
        self.assertEqual((g[0], g[2]), (200, a[2]), g)
        self.assertEqual(http_request(addr, "GET", "/orders/2")[0], 404)
        # A 4xx is released: the next try runs the handler again (not a replay).
        bad = "go-ex-bad-" + secrets.token_hex(6)
        for _ in range(2):
            r = post('{"amount": 0}', bad)
            self.assertEqual(r[0], 400, r)
            self.assertNotIn("idempotency-replayed", r[1])
        # A POST without a key goes to the handler unchecked.
        n = post('{"amount": 5}')
        self.assertEqual((n[0], n[2]["id"], n[2]["fence"]), (201, 2, 0), n)
        wait_for(lambda: len(created()) == 2, 10, "orders to log its second order")

    def charge(self, *args, env=None):
        return subprocess.run([os.path.join(self.bin, "charge")] + list(args),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=env or self.example_env(), timeout=60)

    def test_charge(self):
        key = "go-ex-charge-" + secrets.token_hex(6)
        r1 = self.charge(key, "10 EUR")
        self.assertEqual(r1.returncode, 0, r1)
        m = re.fullmatch(r'charged: (\{"charged": "10 EUR", "fence": (\d+)\})\n', r1.stdout)
        self.assertTrue(m, r1)
        self.assertIn("charging 10 EUR (fencing token %s)" % m.group(2), r1.stderr)
        r2 = self.charge(key, "10 EUR")
        self.assertEqual((r2.returncode, r2.stdout, r2.stderr),
                         (0, "replayed, not charged again: %s\n" % m.group(1), ""), r2)
        r3 = self.charge(key, "99 EUR")
        self.assertEqual((r3.returncode, r3.stdout), (1, ""), r3)
        self.assertIn("this key was used for another amount", r3.stderr)
        self.assertNotIn("charging", r3.stderr)
        # 2: usage, setup, a request refused as it stands.
        r = self.charge(key)
        self.assertEqual((r.returncode, r.stderr), (2, "usage: charge KEY AMOUNT\n"), r)
        r = self.charge(key, "10 EUR", env=self.example_env(IDEM_TOKEN=None))
        self.assertEqual(r.returncode, 2, r)
        self.assertIn("IDEM_TOKEN is not set", r.stderr)
        r = self.charge(key, "10 EUR", env=self.example_env(IDEM_TOKEN="0" * 32))
        self.assertEqual(r.returncode, 2, r)
        self.assertIn("unauthenticated", r.stderr)
        self.assertNotIn("charging", r.stderr)
        # 3: nothing ran, retry later with the same key: the key held by another attempt
        # (a claim of the same request, its lease 60 s) until the run's 10 s deadline; and
        # no node reachable (a loopback port nothing listens on). At once: 10 s each.
        held = "go-ex-held-" + secrets.token_hex(6)
        req = {"method": "POST", "path": "/charges", "body": {"amount": "10 EUR"}}
        h = request_past_503(self.c.nodes[sorted(self.c.nodes)[0]].http, "POST", "/v1/claims",
                             {"request": req, "attempt_id": "go-ex-holder", "lease_ms": 60000},
                             token=self.c.token, headers={"Idempotency-Key": held})
        self.assertEqual((h[0], h[2].get("outcome")), (200, "acquired"), h)
        nowhere = self.example_env(IDEM_HTTP="http://127.0.0.1:%d" % free_port())
        out = {}
        runs = [threading.Thread(target=lambda k, a, e: out.__setitem__(k, self.charge(*a, env=e)),
                                 args=(k, a, e))
                for k, a, e in (("held", (held, "10 EUR"), None),
                                ("nowhere", (key + "-x", "10 EUR"), nowhere))]
        for t in runs:
            t.start()
        for t in runs:
            t.join(90)
        for name, r in sorted(out.items()):
            self.assertEqual((r.returncode, r.stdout), (3, ""), (name, r))
            self.assertIn("nothing ran; retry later with the same key", r.stderr)
            self.assertNotIn("charging", r.stderr)
        self.assertEqual(sorted(out), ["held", "nowhere"])
        self.assertIn("request_in_progress", out["held"].stderr)


if __name__ == "__main__":
    unittest.main()
