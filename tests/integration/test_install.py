"""`cmake --install` of the daemon side: idemd, its example configuration, README.md, the
systemd unit (tools/idemd.service.in) and its sysusers.d file (tools/idemd.sysusers.conf),
into a temporary prefix; the installed idemd checks the installed example, serves a
one-node cluster that the installed idemctl claims on, and stops cleanly on SIGTERM. The unit
and the sysusers.d file are in the directories `pkg-config systemd` names under the prefix;
the unit names the installed idemd, is Type=notify with a watchdog, passes
`systemd-analyze verify`, and `systemd-analyze security --offline=true` rates its sandbox
at an exposure of 4.9 (OK) or less; systemd-sysusers makes the user from the file in a
scratch root (the systemd package: tools/setup.sh).
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
        self.unit = os.path.join(self.systemd_dir("systemdsystemunitdir", "lib/systemd/system"),
                                 "idemd.service")
        self.sysusers = os.path.join(self.systemd_dir("sysusersdir", "lib/sysusers.d"),
                                     "idemd.conf")

    def systemd_dir(self, variable, fallback):
        """Where tools/CMakeLists.txt installs to: the directory `pkg-config systemd` names,
        with its prefixes set to the install prefix (fallback under it without the .pc)."""
        p = self.prefix
        r = subprocess.run(["pkg-config", "--define-variable=prefix=" + p,
                            "--define-variable=root_prefix=" + p,
                            "--define-variable=rootprefix=" + p, "--variable=" + variable,
                            "systemd"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        d = r.stdout.decode().strip()
        return d if r.returncode == 0 and d.startswith(p + "/") else os.path.join(p, fallback)

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
        self.assertNotRegex(text, r"@[A-Z_]+@")  # every @VAR@ was replaced
        self.assertRegex(text, r"(?m)^Restart=on-failure$")
        analyze = shutil.which("systemd-analyze")
        self.assertIsNotNone(analyze, "systemd-analyze is missing (tools/setup.sh installs it)")
        p = subprocess.run([analyze, "verify", self.unit], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        self.assertEqual((p.returncode, p.stdout.decode()), (0, ""))
        # server/notify.c's side of it.
        for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=30s", "User=idemd"):
            self.assertRegex(text, r"(?m)^%s$" % re.escape(line))

    def test_unit_sandbox(self):
        """systemd-analyze security rates the unit's sandbox: 4.9 or less is "OK" (10 is no
        sandbox at all); docs/operations.md gives the figure."""
        p = subprocess.run(["systemd-analyze", "security", "--offline=true", self.unit],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout.decode()
        m = re.search(r"Overall exposure level for idemd\.service: (\d+\.\d+) (\w+)", out)
        self.assertIsNotNone(m, out)
        exposure = float(m.group(1))
        self.assertLessEqual(exposure, 4.9, out)
        self.assertIn(m.group(2), ("OK", "SAFE"), out)

    def test_sysusers(self):
        with open(self.sysusers) as f:
            lines = [l for l in f.read().splitlines() if l and not l.startswith("#")]
        self.assertEqual(lines, ['u idemd - "idemd node" /var/lib/idemd'])
        # systemd-sysusers reads it and makes the user, in a scratch root.
        root = os.path.join(self.prefix, "root")
        os.makedirs(os.path.join(root, "etc"))
        p = subprocess.run(["systemd-sysusers", "--root=" + root, self.sysusers],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(p.returncode, 0, p.stdout.decode())
        with open(os.path.join(root, "etc", "passwd")) as f:
            self.assertRegex(f.read(), r"(?m)^idemd:x:\d+:\d+:idemd node:/var/lib/idemd:")

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
