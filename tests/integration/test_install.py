"""`cmake --install` of the daemon side: idemd, its example configuration, README.md and the
systemd unit (tools/idemd.service.in), into a temporary prefix; the installed idemd checks
the installed example, serves a one-node cluster that the installed idemctl claims on, and
stops cleanly on SIGTERM; the unit names the installed idemd and passes
`systemd-analyze verify` (the systemd package: tools/setup.sh).
Run: IDEM_BUILD_DIR=build python3 -m unittest -v test_install
"""
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, fp, free_port, log_reports, wait_for  # noqa: E402

BUILD = os.environ.get("IDEM_BUILD_DIR") or os.path.join(BIN, "..")


class TestInstall(unittest.TestCase):
    def setUp(self):
        self.prefix = tempfile.mkdtemp(prefix="idem-install-")
        self.proc = None
        subprocess.run(["cmake", "--install", BUILD, "--prefix", self.prefix], check=True,
                       stdout=subprocess.DEVNULL)
        self.bin = os.path.join(self.prefix, "bin")
        self.doc = os.path.join(self.prefix, "share", "doc", "idemd")
        self.unit = os.path.join(self.prefix, "lib", "systemd", "system", "idemd.service")

    def tearDown(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.prefix, ignore_errors=True)

    def test_files(self):
        self.assertEqual(sorted(os.listdir(self.bin)), ["idem-bench", "idem-stallprobe", "idemctl", "idemd"])
        self.assertEqual(sorted(os.listdir(self.doc)),
                         ["README.md", "idemctl.md", "idemd.example.yaml"])
        p = subprocess.run([os.path.join(self.bin, "idemd"), "--check-config",
                            os.path.join(self.doc, "idemd.example.yaml")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn(b": ok (node 1,", p.stdout)

    def test_unit(self):
        with open(self.unit) as f:
            text = f.read()
        idemd = os.path.join(self.bin, "idemd")
        execs = dict(re.findall(r"^(ExecStart(?:Pre)?)=(.*)$", text, re.M))
        self.assertEqual(execs, {
            "ExecStartPre": idemd + " --check-config /etc/idemd/idemd.yaml",
            "ExecStart": idemd + " --config /etc/idemd/idemd.yaml",
        })
        self.assertNotIn("@", text.split("[Unit]", 1)[1])  # every @VAR@ was replaced
        self.assertRegex(text, r"(?m)^Restart=on-failure$")
        analyze = shutil.which("systemd-analyze")
        self.assertIsNotNone(analyze, "systemd-analyze is missing (tools/setup.sh installs it)")
        p = subprocess.run([analyze, "verify", self.unit], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        self.assertEqual((p.returncode, p.stdout.decode()), (0, ""))

    def test_installed_node_serves_and_stops(self):
        root = self.prefix
        token, admin = secrets.token_hex(16), secrets.token_hex(16)
        raft, rpc = "127.0.0.1:%d" % free_port(), "127.0.0.1:%d" % free_port()
        h = lambda t: hashlib.sha256(t.encode()).hexdigest()
        cfg = os.path.join(root, "idemd.yaml")
        with open(cfg, "w") as f:
            f.write("\n".join([
                "node:", "  id: 1", "  raft_address: " + raft, "  rpc_address: " + rpc,
                "  data_dir: " + os.path.join(root, "data"),
                "cluster:", "  bootstrap:",
                "    - {id: 1, raft_address: %s, rpc_address: %s}" % (raft, rpc),
                "admin:", "  token_sha256: " + h(admin),
                "tenants:", "  - name: alpha", "    token_sha256: " + h(token), ""]))
        log = open(os.path.join(root, "idemd.log"), "wb")
        self.proc = subprocess.Popen([os.path.join(self.bin, "idemd"), "--config", cfg],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        ctl = [os.path.join(self.bin, "idemctl"), "--cluster", rpc, "--token", token,
               "--admin-token", admin, "--json"]

        def leader():
            p = subprocess.run(ctl + ["status"], stdout=subprocess.PIPE, timeout=60)
            return p.returncode == 0 and json.loads(p.stdout).get("leader_id") == 1

        wait_for(leader, 20, "the installed node to lead")
        p = subprocess.run(ctl + ["claim", "order-1", "--fingerprint", fp(1)],
                           stdout=subprocess.PIPE, timeout=60)
        self.assertEqual(p.returncode, 0)
        self.assertEqual(json.loads(p.stdout)["outcome"], "acquired")
        self.proc.terminate()
        self.assertEqual(self.proc.wait(timeout=30), 0)
        # No sanitizer report or failed assertion on the way (harness: log_reports).
        reports = log_reports(os.path.join(root, "idemd.log"))
        self.assertFalse(reports, "\n\n".join(text for _, text in reports))


if __name__ == "__main__":
    unittest.main()
