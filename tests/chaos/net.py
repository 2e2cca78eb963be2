"""net: the chaos suite's own network: one network namespace per node and a hub, and the
partitions cut inside them with nftables.

    hub namespace:  bridge "br0" 10.213.0.254/24; the runner, its clients and the ledger
    node i:         "eth0" 10.213.0.i/24, one end of a veth pair whose other end is a port
                    of br0

Every node reaches every other node and the hub through the bridge. A partition is a set of
nftables rules in the cut nodes' own namespaces (table inet chaos): `isolate(i)` drops
everything node i receives from or sends to the other nodes (the hub, hence the clients and
the ledger, still reach it); `cut_one_way(src, dst)` drops what dst receives from src only.
`heal()` removes every rule. Nothing here touches the namespace the suite was started in:
traffic flows only between the suite's own namespaces, whose names carry the runner's PID
(`idemch<PID>-hub`, `idemch<PID>-n<i>`), so that runs side by side never meet and a sweep
can tell the namespaces of a dead run (sweep_stale) from those of a live one.

Needs root, ip(8) and nft(8) (tools/setup.sh --test installs nftables).
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import pid_alive  # noqa: E402

SUBNET = "10.213.0"
HUB_ADDR = SUBNET + ".254"
PREFIX = "idemch"
CLONE_NEWNET = 0x40000000


def missing_prerequisite():
    """Why this machine cannot build the suite's network, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return "no %s (tools/setup.sh --test installs it)" % tool
    return None


def _run(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), p.stderr.strip() or p.returncode))
    return p


def _ns_path(name):
    return "/run/netns/" + name


def enter(name):
    """Moves the calling thread into namespace name (call before starting any thread: new
    threads and children inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(_ns_path(name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns(%s): %s" % (name, os.strerror(e)))
    finally:
        os.close(fd)


def sweep_stale():
    """Deletes the namespaces of runs whose runner is gone (killed before its close)."""
    swept = []
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return swept
    for name in names:
        m = re.match(r"%s(\d+)-" % PREFIX, name)
        if m and not pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name, check=False)
            swept.append(name)
    return swept


class Network:
    """The hub and n node namespaces (ids 1..n), made at once; close() removes them."""

    def __init__(self, n):
        self.tag = "%s%d" % (PREFIX, os.getpid())
        self.hub = self.tag + "-hub"
        self.ids = list(range(1, n + 1))
        self.made = []
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def ns(self, nid):
        return "%s-n%d" % (self.tag, nid)

    def addr(self, nid):
        return "%s.%d" % (SUBNET, nid)

    def ns_path(self, nid):
        return _ns_path(self.ns(nid))

    def _add_ns(self, name):
        _run("ip", "netns", "add", name)
        self.made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _make(self):
        self._add_ns(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "addr", "add", HUB_ADDR + "/24", "dev", "br0")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i in self.ids:
            ns = self.ns(i)
            self._add_ns(ns)
            # Both ends are made inside the suite's namespaces: no device ever exists in
            # the namespace the suite was started in.
            _run("ip", "-n", self.hub, "link", "add", "p%d" % i, "type", "veth", "peer",
                 "name", "eth0", "netns", ns)
            _run("ip", "-n", self.hub, "link", "set", "p%d" % i, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", "p%d" % i, "up")
            _run("ip", "-n", ns, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", ns, "nft", "add table inet chaos; "
                 "add chain inet chaos in { type filter hook input priority 0; }; "
                 "add chain inet chaos out { type filter hook output priority 0; }")

    def _nft(self, nid, cmd):
        _run("ip", "netns", "exec", self.ns(nid), "nft", cmd)

    def isolate(self, nid):
        """Node nid neither receives from nor sends to any other node."""
        others = ", ".join(self.addr(i) for i in self.ids if i != nid)
        self._nft(nid, "add rule inet chaos in ip saddr { %s } drop" % others)
        self._nft(nid, "add rule inet chaos out ip daddr { %s } drop" % others)

    def cut_one_way(self, src, dst):
        """dst no longer receives what src sends (src still receives from dst)."""
        self._nft(dst, "add rule inet chaos in ip saddr %s drop" % self.addr(src))

    def heal(self):
        for i in self.ids:
            self._nft(i, "flush chain inet chaos in; flush chain inet chaos out")

    def close(self):
        for name in reversed(self.made):
            _run("ip", "netns", "del", name, check=False)
        self.made = []
