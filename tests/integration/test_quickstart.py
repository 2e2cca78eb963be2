"""tools/quickstart.sh with --port-base: its checks of the option, and a run on a base other
than the default (in a copy of the script under a temporary directory, with tools/setup.sh
and cmake replaced by stubs and build/bin linked to this build's binaries, so that nothing
is installed or built): the nodes listen where the documented mapping says (RPC B+N, HTTP
B+1000+N, proxy B+1100+N, Raft B+2000+N), .idem/env names them, a run with another base on
the same data is refused, and Ctrl-C stops the nodes.
Run: python3 -m unittest -v tests/integration/test_quickstart.py
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import BIN, IDEMCTL, http_request, wait_for  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(SOURCE, "tools", "quickstart.sh")
OFFSETS = (1, 2, 3, 1001, 1002, 1003, 1101, 1102, 1103, 2001, 2002, 2003)


def free_base():
    """A base B whose twelve ports (B + OFFSETS) nothing holds, reserved against the other
    test processes as harness.free_port() reserves its ports; below the ephemeral range."""
    for _ in range(200):
        base = harness._RANDOM.randrange(10000, 30000)
        ports = [base + o for o in OFFSETS]
        if any(p in harness._PORTS_GIVEN for p in ports):
            continue
        ok = True
        for p in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok and all(harness._reserve(p) for p in ports):
            harness._PORTS_GIVEN.update(ports)
            return base
    raise RuntimeError("no free port base after 200 tries")


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            if "=" in line and not line.startswith("export"):
                k, v = line.strip().split("=", 1)
                env[k] = v
    return env


class TestQuickstart(unittest.TestCase):
    def test_port_base_is_checked(self):
        for args in (["--port-base", "x"], ["--port-base", "1023"], ["--port-base", "63533"],
                     ["--port-base", "07000"], ["--port-base", ""], ["--port-base=-1"],
                     ["--port-base"]):
            p = subprocess.run(["bash", SCRIPT] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(b"--port-base", p.stderr, args)
            self.assertEqual(p.stdout, b"", args)
        p = subprocess.run(["bash", SCRIPT, "--help"], stdout=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 0)
        text = p.stdout.decode()
        for words in ("--port-base B", "B+N", "B+1000+N", "B+1100+N", "B+2000+N", "7000",
                      "127.0.0.1:900N", "127.0.0.1:700N", "127.0.0.1:800N", "127.0.0.1:810N"):
            self.assertIn(words, text)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="idem-quickstart-")
        self.proc = None

    def tearDown(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the script and nodes
            self.proc.wait()
        for n in (1, 2, 3):  # a node started by the script outlives it only by accident
            try:
                with open(os.path.join(self.root, ".idem", "node%d.pid" % n)) as f:
                    pid = int(f.read().strip())
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if self.root.encode() in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def copy_tree(self):
        """tools/quickstart.sh under self.root, with a stub setup.sh and cmake, and build/bin
        this build's binaries; returns the environment to run it with."""
        tools = os.path.join(self.root, "tools")
        os.makedirs(tools)
        shutil.copy(SCRIPT, tools)
        stubs = os.path.join(self.root, "stubs")
        os.makedirs(stubs)
        for path in (os.path.join(tools, "setup.sh"), os.path.join(stubs, "cmake")):
            with open(path, "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(path, 0o755)
        os.makedirs(os.path.join(self.root, "build"))
        os.symlink(os.path.abspath(BIN), os.path.join(self.root, "build", "bin"))
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("IDEM_"):
                del env[k]
        env["PATH"] = stubs + os.pathsep + env.get("PATH", "")
        return env

    def test_runs_on_another_port_base(self):
        env = self.copy_tree()
        base = free_base()
        script = os.path.join(self.root, "tools", "quickstart.sh")
        log = open(os.path.join(self.root, "quickstart.out"), "wb")
        self.addCleanup(log.close)
        self.proc = subprocess.Popen(["bash", script, "--port-base", str(base), "--upstream",
                                      "http://127.0.0.1:1"], stdout=log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

        def out():
            with open(os.path.join(self.root, "quickstart.out"), errors="replace") as f:
                return f.read()
        # The message's last paragraph ("Ctrl-C stops the nodes"): the script writes the
        # message in parts, and the proxy's line comes after the first one.
        wait_for(lambda: "Ctrl-C stops the nodes" in out(), 60, "the quick start's message")
        idem = read_env(os.path.join(self.root, ".idem", "env"))
        rpc = ["127.0.0.1:%d" % (base + n) for n in (1, 2, 3)]
        self.assertEqual(idem["IDEM_CLUSTER"], ",".join(rpc))
        with open(os.path.join(self.root, ".idem", "node2.yaml")) as f:
            cfg = f.read()
        for want in ("raft_address: 127.0.0.1:%d" % (base + 2002),
                     "rpc_address: 127.0.0.1:%d" % (base + 2),
                     "http_address: 127.0.0.1:%d" % (base + 1002),
                     "address: 127.0.0.1:%d" % (base + 1102),
                     "{id: 3, raft_address: 127.0.0.1:%d, rpc_address: 127.0.0.1:%d, "
                     "http_address: 127.0.0.1:%d}" % (base + 2003, base + 3, base + 1003)):
            self.assertIn(want, cfg)
        self.assertIn("127.0.0.1:%d-%d forward" % (base + 1101, base + 1103), out())
        # The cluster at those ports: a leader, every voter healthy.
        ctl_env = dict(env, **idem)

        def healthy():
            p = subprocess.run([IDEMCTL, "status", "--check"], env=ctl_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            return p.returncode == 0
        wait_for(healthy, 30, "a healthy cluster at the new ports")
        for n in (1, 2, 3):
            addr = "127.0.0.1:%d" % (base + 1000 + n)
            harness.register_gateway(addr)  # its answers checked against docs/openapi.yaml
            self.assertEqual(http_request(addr, "GET", "/livez", timeout=5)[0], 200, addr)
            # Each proxy listener accepts connections.
            socket.create_connection(("127.0.0.1", base + 1100 + n), timeout=5).close()
        # Another base on the same data is refused before anything starts (the nodes run:
        # --fresh would be refused too, as they are running).
        p = subprocess.run(["bash", script, "--port-base", str(base + 10)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=30)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        # Ctrl-C: the nodes stop, the script exits 0.
        os.killpg(self.proc.pid, signal.SIGINT)
        self.assertEqual(self.proc.wait(timeout=60), 0, out())
        self.assertIn("quickstart: stopping the cluster", out())
        for n in (1, 2, 3):
            self.assertFalse(os.path.exists(os.path.join(self.root, ".idem", "node%d.pid" % n)))
        # Now another base on the same data is refused, and says why.
        p = subprocess.run(["bash", script, "--port-base", str(base + 10)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"made with --port-base %d" % base, p.stderr)
        self.proc = None


if __name__ == "__main__":
    unittest.main()
