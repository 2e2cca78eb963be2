"""`cmake --install` of the daemon side: idemd, its example configuration, README.md, the
systemd unit (tools/idemd.service.in) and its sysusers.d file (tools/idemd.sysusers.conf),
into a temporary prefix; the installed idemd checks the installed example, serves a
one-node cluster that the installed idemctl claims on, and stops cleanly on SIGTERM. The unit
and the sysusers.d file are in the directories `pkg-config systemd` names under the prefix;
the unit names the installed idemd, is Type=notify with a watchdog, passes
`systemd-analyze verify`, and `systemd-analyze security --offline=true` rates its sandbox
at an exposure of 4.9 (OK) or less; systemd-sysusers makes the user from the file in a
scratch root (the systemd package: tools/setup.sh).
TestInstallDebian: libidem as a Debian package installs it (a build configured with the
prefix /usr, DESTDIR staging): the multiarch libdir, idem.pc, the .so chain and the SONAME,
examples/ built against the staged copy. TestManPages: idemd(8) and idemctl(1), rendered by
groff without a warning, installed, and every command of `idemctl --help` in idemctl(1).
Run: IDEM_BUILD_DIR=build python3 -m unittest -v test_install
"""
import hashlib
import itertools
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
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def cache_var(build, name):
    """The value of NAME in BUILD's CMakeCache.txt (None when it is not there)."""
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^%s:[A-Z]+=(.*)$" % re.escape(name), line.rstrip("\n"))
            if m:
                return m.group(1)
    return None


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


class TestInstallDebian(unittest.TestCase):
    """libidem installed as a Debian package installs it: a build of its own configured with
    -DCMAKE_INSTALL_PREFIX=/usr (so that GNUInstallDirs picks the multiarch libdir), only
    libidem built, and its two install components (libidem, libidem-dev) installed with
    DESTDIR into a staging tree. A few seconds: libidem alone is built."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="idem-deb-")
        try:
            cls.stage_install()
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def stage_install(cls):
        cls.build = os.path.join(cls.tmp, "build")
        cls.stage = os.path.join(cls.tmp, "stage")
        # The multiarch triplet as the toolchain names it (Debian's lib/<triplet>).
        cc = cache_var(BUILD, "CMAKE_C_COMPILER") or "cc"
        cls.multiarch = subprocess.run([cc, "-print-multiarch"], stdout=subprocess.PIPE,
                                       check=True).stdout.decode().strip()
        if not cls.multiarch:
            raise AssertionError("%s -print-multiarch printed nothing: not Debian?" % cc)
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", SOURCE, "-B", cls.build] + gen +
                       ["-DCMAKE_C_COMPILER=" + cc, "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_INSTALL_PREFIX=/usr"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", cls.build, "-j2", "--target", "idem_shared", "idem"],
                       check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, DESTDIR=cls.stage)
        for component in ("libidem", "libidem-dev"):
            subprocess.run(["cmake", "--install", cls.build, "--component", component],
                           env=env, check=True, stdout=subprocess.DEVNULL)
        cls.libdir = "/usr/lib/" + cls.multiarch  # as installed, DESTDIR left out
        cls.staged_libdir = cls.stage + cls.libdir

    def pkg_config(self, *args, sysroot=True):
        """pkg-config on the staged idem.pc; the system's .pc files too, for its
        Requires.private (pkg-config reads them for --cflags as well)."""
        system = subprocess.run(["pkg-config", "--variable", "pc_path", "pkg-config"],
                                stdout=subprocess.PIPE, check=True).stdout.decode().strip()
        env = dict(os.environ, PKG_CONFIG_LIBDIR=os.path.join(self.staged_libdir, "pkgconfig") +
                   ":" + system)
        env.pop("PKG_CONFIG_PATH", None)
        if sysroot:
            env["PKG_CONFIG_SYSROOT_DIR"] = self.stage
        p = subprocess.run(["pkg-config"] + list(args) + ["idem"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return p.stdout.decode().split()

    def test_layout_and_pkg_config(self):
        self.assertEqual(cache_var(self.build, "CMAKE_INSTALL_LIBDIR"), "lib/" + self.multiarch)
        found = sorted(os.path.relpath(os.path.join(d, f), self.stage)
                       for d, _, files in os.walk(self.stage) for f in files)
        lib = self.libdir.lstrip("/")
        self.assertEqual(found, sorted([
            "usr/include/idem.h", lib + "/libidem.a", lib + "/libidem.so",
            lib + "/libidem.so.1", lib + "/libidem.so.1.0.0", lib + "/pkgconfig/idem.pc"]))
        with open(os.path.join(self.staged_libdir, "pkgconfig", "idem.pc")) as f:
            pc = f.read()
        self.assertIn("prefix=/usr\n", pc)
        self.assertNotIn(self.stage, pc)  # DESTDIR is not part of the prefix
        self.assertRegex(pc, r"(?m)^Version: 1\.0\.0$")
        # As the package's users see it once installed: the system's own directories.
        self.assertEqual(self.pkg_config("--variable=libdir", sysroot=False), [self.libdir])
        self.assertEqual(self.pkg_config("--variable=includedir", sysroot=False),
                         ["/usr/include"])
        flags = self.pkg_config("--cflags", "--libs", sysroot=False)
        # pkg-config leaves out the system directories (-I/usr/include, -L of its libdirs).
        self.assertIn("-lidem", flags)
        self.assertLessEqual(set(flags), {"-I/usr/include", "-L" + self.libdir, "-lidem"})
        # Through the staging tree, as a package build against it sees it.
        self.assertEqual(self.pkg_config("--cflags", "--libs"),
                         ["-I" + self.stage + "/usr/include", "-L" + self.staged_libdir,
                          "-lidem"])

    def test_shared_library_chain_and_soname(self):
        so = os.path.join(self.staged_libdir, "libidem.so")
        self.assertEqual(os.readlink(so), "libidem.so.1")
        self.assertEqual(os.readlink(so + ".1"), "libidem.so.1.0.0")
        self.assertFalse(os.path.islink(so + ".1.0.0"))
        dyn = subprocess.run(["readelf", "-d", so + ".1.0.0"], stdout=subprocess.PIPE,
                             check=True).stdout.decode()
        self.assertEqual(re.findall(r"\(SONAME\)\s+Library soname: \[(.*)\]", dyn),
                         ["libidem.so.1"])

    def test_example_builds_against_the_staged_copy(self):
        # examples/claim_run.c compiled and linked with the staged flags, run far enough to
        # load libidem.so.1 and print its usage.
        prog = os.path.join(self.tmp, "claim_run")
        subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                        os.path.join(SOURCE, "examples", "claim_run.c"), "-o", prog] +
                       self.pkg_config("--cflags", "--libs"), check=True)
        dyn = subprocess.run(["readelf", "-d", prog], stdout=subprocess.PIPE,
                             check=True).stdout.decode()
        self.assertEqual(re.findall(r"\(NEEDED\)\s+Shared library: \[(libidem[^]]*)\]", dyn),
                         ["libidem.so.1"])
        p = subprocess.run([prog], env=dict(os.environ, LD_LIBRARY_PATH=self.staged_libdir),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr.decode())
        self.assertIn("usage", p.stderr.decode())


def idemctl_commands():
    """Every command of `idemctl --help`, subcommands spelled out: "status", "members add",
    "key resolve", ... (the lines of its command sections that start with a command)."""
    out = subprocess.run([os.path.join(BIN, "idemctl"), "--help"], stdout=subprocess.PIPE,
                         check=True).stdout.decode()
    commands, section = [], None
    for line in out.splitlines():
        if re.match(r"^(Admin commands|Data commands|Other)\b", line):
            section = line
            continue
        if section is None or not line.startswith("  ") or line.startswith("   "):
            if line and not line.startswith(" "):
                section = None
            continue
        words = line.split()
        name = [w for w in itertools.takewhile(lambda w: re.fullmatch(r"[a-z]+", w), words)]
        if not name:
            continue
        commands.append(" ".join(name))
        # "members [list | add ID ... | promote ID | remove ID]": its subcommands.
        m = re.match(r"^\s*(\w+) \[(.*)\]", line)
        if m and "|" in m.group(2):
            for alt in m.group(2).split("|"):
                sub = alt.split()[0]
                if re.fullmatch(r"[a-z]+", sub):
                    commands.append(m.group(1) + " " + sub)
    return commands


class TestManPages(unittest.TestCase):
    """idemd(8) and idemctl(1) (docs/man/, rendered at build time by lowdown): groff renders
    them without a warning, `cmake --install` puts them in share/man, and idemctl(1) names
    every command that `idemctl --help` lists."""

    PAGES = {"idemd.8": "man8", "idemctl.1": "man1"}

    def setUp(self):
        self.dir = os.path.join(BUILD, "docs", "man")
        lowdown = cache_var(BUILD, "LOWDOWN")
        if not lowdown or lowdown.endswith("-NOTFOUND"):
            self.skipTest("lowdown was not found when the build was configured: no man pages"
                          " (tools/setup.sh installs lowdown)")

    def render(self, page):
        groff = shutil.which("groff")
        self.assertIsNotNone(groff, "groff is missing (tools/setup.sh --test installs groff-base)")
        # -k: preconv for the UTF-8 input; -t: tbl; -ww: every warning.
        p = subprocess.run([groff, "-k", "-t", "-man", "-ww", "-Tutf8",
                            os.path.join(self.dir, page)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=dict(os.environ, LC_ALL="C.UTF-8"))
        self.assertEqual((p.returncode, p.stderr.decode()), (0, ""), page)
        # The text without the overstrikes of bold and underline.
        return re.sub(r".\x08", "", p.stdout.decode())

    def test_render_without_warnings(self):
        for page in self.PAGES:
            text = self.render(page)
            title = page.split(".")[0]
            self.assertRegex(text, r"^%s\(%s\)" % (title, page.split(".")[1]))
            for heading in ("NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "SEE ALSO"):
                self.assertRegex(text, r"(?m)^%s$" % heading, page)

    def test_idemctl_page_names_every_command(self):
        commands = idemctl_commands()
        # The parse found the commands at all (a changed --help layout fails here).
        for c in ("status", "members add", "members remove", "key resolve", "quarantine list",
                  "claim", "bench", "help"):
            self.assertIn(c, commands)
        text = " ".join(self.render("idemctl.1").split())  # lines and hyphenation joined
        text = text.replace("\u2010 ", "").replace("- ", "-")
        missing = [c for c in commands if not re.search(r"(?m)(^|\s)%s\b" % re.escape(c), text)]
        self.assertEqual(missing, [], "commands of idemctl --help missing from idemctl(1)")

    def test_installed(self):
        prefix = tempfile.mkdtemp(prefix="idem-install-man-")
        self.addCleanup(shutil.rmtree, prefix, True)
        subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True,
                       stdout=subprocess.DEVNULL)
        for page, section in self.PAGES.items():
            installed = os.path.join(prefix, "share", "man", section, page)
            with open(installed, "rb") as a, open(os.path.join(self.dir, page), "rb") as b:
                self.assertEqual(a.read(), b.read(), installed)


if __name__ == "__main__":
    unittest.main()
