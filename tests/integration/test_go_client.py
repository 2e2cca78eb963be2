"""Integration test of the Go client (client/go) against a real three-node cluster: the
Go side is client/go/integration_test.go (build tag `integration`), built here into a test
binary in the build tree and run with the cluster's gateways and a tenant's token in its
environment. Its scenarios: 32 goroutines in Run on one key (the function runs once, all
get its response); a 2 s lease renewed through a 5 s function; the net/http middleware
over an httptest server; and 32 goroutines in Run while this driver SIGKILLs the leader,
when the Go side asks for it from inside the function (a line IDEM-KILL-LEADER on its
stdout; the answer is a line on its stdin). The middleware's refusal of a reused key is
checked as the gateway's problem details (application/problem+json, every member).
Skipped, and reported so, without `go` (Debian's golang-go; tools/setup.sh --test installs
it).

TestGoFingerprintOptions runs TestServerFingerprintOptions of the same file: Run and the
middleware with fingerprint_fields / fingerprint_ignore, which needs a gateway that applies
them (a retry whose ignored value changed replays; one whose hashed value changed is
refused as a reused key).

Run: IDEM_BIN_DIR=build/bin IDEM_BUILD_DIR=build python3 -m unittest -v test_go_client
"""
import os
import select
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ClusterTestCase, http_request, wait_for  # noqa: E402

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


class GoTest(ClusterTestCase):
    """Builds the Go integration test binary, then starts the cluster."""

    def setUp(self):
        if shutil.which("go") is None:
            self.skipTest("go is not installed (Debian's golang-go; tools/setup.sh --test)")
        out = os.path.join(os.path.abspath(BUILD), "go")
        os.makedirs(out, exist_ok=True)
        # One binary per class: ctest may run the classes at once.
        self.binary = os.path.join(out, "idem-go-%s.test" % type(self).__name__.lower())
        p = subprocess.run(["go", "test", "-c", "-tags", "integration", "-o", self.binary, "."],
                           cwd=os.path.join(SOURCE, "client", "go"), env=go_env(out),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(p.returncode, 0, "go test -c failed:\n" + p.stdout.decode(errors="replace"))
        super().setUp()
        for node in self.c.nodes.values():
            wait_for(lambda: _status(node.http, "/readyz") == 200, 30,
                     "node %d's gateway to be ready" % node.id)

    def go_env(self):
        """The binary's environment: the gateways, the leader first, and the token."""
        leader = self.c.leader()
        self.assertTrue(leader, "no leader")
        order = [leader] + [i for i in sorted(self.c.nodes) if i != leader]
        env = go_env(os.path.dirname(self.binary))
        env.update(IDEM_GO_NODES=",".join("http://" + self.c.nodes[i].http for i in order),
                   IDEM_GO_TOKEN=self.c.token)
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


if __name__ == "__main__":
    unittest.main()
