"""powerdisk: a directory on a disk whose power can be cut: what was fsynced stays, nothing
else does (the chaos suite's powercut nemesis).

    disk = PowerDisk(root_dir)          # ext4 mounted at disk.path
    ... start a node with its data dir under disk.path, let it work ...
    disk.cut(pids=[node_pid], before_restore=reap)   # the power cut, then power back on
    ... start the node again on disk.path: it sees exactly what it had fsynced ...
    disk.close()

The stack, bottom up (as test_stalled_disk.HeldDisk's, one layer changed):
  <dir>/backing.img  a sparse image file (size_mb), ext4 made on it directly (mkfs.ext4
                     -b 4096, inode tables and journal written, no discard);
  <dir>/fuse         syncfs.py (FUSE): shows the image as fuse/disk.img through a volatile
                     write cache: writes stay in the daemon's memory until the image is
                     fsynced, and are thrown away at a cut;
  /dev/loopN         a loop device on fuse/disk.img: it turns the file system's cache flushes
                     (and FUA writes) into fsyncs of disk.img;
  <dir>/mnt          the ext4 on the loop device, default mount options (journal, barriers,
                     data=ordered): disk.path. Its root holds lost+found; give a node a
                     subdirectory of it if it wants an empty data dir.
<dir> is <root_dir>/idem-power-disk-<pid>-XXXXXXXX, <pid> the creating process's: a
PowerDisk whose process died before its close() is undone by sweep_stale() (every new
PowerDisk sweeps its root_dir first).

The cut, in order (cut() does it all; cut_power() and restore() are its two halves):
  1. freeze: SIGSTOP each pid given, and wait until the stop has begun (a thread of the
     process is in state T: from then on no thread of it runs user code again). Without
     this, a node could see an fsync return after step 2 (its writes discarded) and still
     acknowledge it before step 3 killed it: a loss the disk made, not the node.
  2. cut_power(): syncfs throws its pending writes away and from now on accepts and
     discards every write and fsync: the moment of the cut. Whatever the node's threads
     had in flight in the kernel finishes into the void.
  3. SIGKILL each pid and wait until it is dead (a zombie is dead: its files are closed).
  4. before_restore(), if given (e.g. the harness reaps its Popen).
  5. restore(): unmount the ext4 (lazily if something still holds it): its dirty pages
     and a clean superblock are written into the void; detach the loop device; tell syncfs
     "restore" (power on; any disk.img still open from before, e.g. held by a lazily
     unmounted ext4, stays dead for ever); attach a new loop device; mount the ext4 again
     (the kernel replays its journal). With fsck=True it is mounted and unmounted once
     first and `e2fsck -fn` must find nothing wrong.
If restore() fails, the disk is left as it is (no mount, or powered off); close() still
undoes everything.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import pid_alive  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEBIAN_PYTHON = "/usr/bin/python3"  # where Debian's python3-fusepy is importable
SYNCFS = os.path.join(HERE, "syncfs.py")
PREFIX = "idem-power-disk-"  # then the creating process's PID and "-"
TOOLS = ("losetup", "mkfs.ext4", "mount", "umount", "e2fsck")


def missing_prerequisite():
    """Why this machine cannot make a PowerDisk, or None."""
    if os.geteuid() != 0:
        return "needs root (loop devices and mounts)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not os.path.exists("/dev/loop-control") and not glob.glob("/dev/loop[0-9]*"):
        return "no loop devices (/dev/loop-control)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return "no %s" % tool
    if not os.path.exists(DEBIAN_PYTHON) or subprocess.run(
            [DEBIAN_PYTHON, "-c", "import fusepy"], capture_output=True).returncode:
        return "no python3-fusepy for %s" % DEBIAN_PYTHON
    return None


def _run(*cmd, timeout=60):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _must(*cmd, timeout=60):
    out = _run(*cmd, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), out.returncode,
                                                (out.stderr or out.stdout).strip()))
    return out.stdout


def _unescape(field):
    # /proc/self/mounts writes a space, tab, newline and backslash of a path as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted(path):
    """Whether something is mounted at path. Not os.path.ismount: that says no for a FUSE
    mount whose daemon is gone (its stat fails with ENOTCONN)."""
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(_unescape(line.split()[1]) == path for line in f if line.strip())


def _umount(path, patience=2.0):
    """Unmounts path (every mount stacked there) if mounted; lazily when it stays busy for
    patience seconds (a killed process may still be closing its files). True if a lazy
    unmount was needed."""
    lazy = False
    end = time.monotonic() + patience
    while mounted(path):
        if _run("umount", path).returncode == 0:
            continue
        if time.monotonic() < end:
            time.sleep(0.05)
            continue
        if _run("umount", "-l", path).returncode != 0 and mounted(path):
            raise RuntimeError("cannot unmount %s" % path)
        lazy = True
    return lazy


def _loops_on(fuse_dir):
    """The loop devices whose backing file is under fuse_dir."""
    out = _run("losetup", "--list", "--noheadings", "--raw", "--output", "NAME,BACK-FILE")
    loops = []
    for line in out.stdout.splitlines():
        name, _, back = line.partition(" ")
        if back.startswith(fuse_dir.rstrip("/") + "/"):
            loops.append(name)
    return loops


def _proc_state(pid):
    """The states of pid's threads ('R', 'S', 'D', 'T', 'Z', ...); [] once it is gone."""
    states = []
    for stat in glob.glob("/proc/%d/task/*/stat" % pid):
        try:
            with open(stat) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            pass
    return states


def _wait(cond, timeout, step=0.005):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


def freeze(pid, timeout=10.0):
    """SIGSTOP pid and wait until its group stop has begun (some thread in state T, which
    means every thread has the stop pending and stops before it next runs user code).
    True if so (or the process is gone), False on timeout (e.g. a thread that stays in
    uninterruptible sleep)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return True

    def stopped():
        st = _proc_state(pid)
        return not st or any(s in ("T", "t", "Z", "X") for s in st)
    return bool(_wait(stopped, timeout))


def kill(pid, timeout=30.0):
    """SIGKILL pid and wait until it is dead: every thread of it gone or a zombie (then its
    files are closed). True if so."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return bool(_wait(lambda: all(s in ("Z", "X") for s in _proc_state(pid)), timeout))


def sweep_stale(root_dir=None):
    """Undoes what PowerDisks of processes that are gone left in root_dir (default: the
    temp dir): the ext4 mount, its loop devices, syncfs's mount (and syncfs, which exits
    once its parent is gone anyway), and the dir. Those of live processes are not touched.
    Returns the dirs swept."""
    swept = []
    for d in sorted(glob.glob(os.path.join(root_dir or tempfile.gettempdir(),
                                           PREFIX + "*-*"))):
        pid = os.path.basename(d)[len(PREFIX):].split("-")[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        _teardown(d, None, None)
        swept.append(d)
    return swept


def _syncfs_pids(fuse_dir):
    pids = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) >= 3 and args[1].endswith(b"syncfs.py") and args[2] == fuse_dir.encode():
            pids.append(int(cmdline.split("/")[2]))
    return pids


def _teardown(d, loop, daemon):
    """Everything under d undone, each step tried whatever the others did."""
    mnt, fuse = os.path.join(d, "mnt"), os.path.join(d, "fuse")
    errors = []
    try:
        _umount(mnt)
    except Exception as e:  # noqa: BLE001 -- go on with the rest
        errors.append(e)
    loops = set(_loops_on(fuse))
    if loop:
        loops.add(loop)
    for name in sorted(loops):
        _run("losetup", "-d", name)
    lazy = False
    try:
        lazy = _umount(fuse)
    except Exception as e:  # noqa: BLE001
        errors.append(e)
    # syncfs exits once its mount is gone; a lazily unmounted one is still held (by a loop
    # device a lazily unmounted ext4 holds): then it is killed after a short wait.
    patience = 2 if lazy else 10
    if daemon is not None:
        try:
            daemon.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
    for pid in _syncfs_pids(fuse):  # one whose Popen we do not have (a dead run's)
        if not _wait(lambda: not pid_alive(pid), patience, 0.05):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if not mounted(mnt) and not mounted(fuse):
        shutil.rmtree(d, ignore_errors=True)
    else:
        errors.append(RuntimeError("%s: still mounted, left in place" % d))
    return errors


class PowerDisk:
    """An ext4 file system at self.path whose power cut() cuts (see the module's doc)."""

    def __init__(self, root_dir=None, size_mb=256):
        if size_mb < 32:
            raise ValueError("size_mb: at least 32")
        self.root_dir = root_dir or tempfile.gettempdir()
        sweep_stale(self.root_dir)
        self.dir = tempfile.mkdtemp(prefix="%s%d-" % (PREFIX, os.getpid()), dir=self.root_dir)
        self.fuse = os.path.join(self.dir, "fuse")
        self.path = os.path.join(self.dir, "mnt")
        self.image = os.path.join(self.fuse, "disk.img")
        self.ctl_path = os.path.join(self.fuse, "ctl")
        self.backing = os.path.join(self.dir, "backing.img")
        self.log = os.path.join(self.dir, "syncfs.log")
        self.size_mb = size_mb
        self.loop = None
        self.daemon = None
        self.powered = True
        self.cuts = 0
        self.lazy_unmounts = 0  # cuts whose unmount had to be lazy (something held it)
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    # --- making -----------------------------------------------------------------------

    def _make(self):
        os.chmod(self.dir, 0o755)  # mkdtemp's 0700 would keep a node of another user out
        os.mkdir(self.fuse)
        os.mkdir(self.path)
        with open(self.backing, "wb") as f:
            f.truncate(self.size_mb << 20)
        # Made on the image file itself (fast, no FUSE); 4 KiB blocks as on a real disk
        # (mke2fs would pick 1 KiB for a "small" one); tables and journal written (zeros)
        # so that no lazy-init thread writes behind the tests' backs.
        _must("mkfs.ext4", "-F", "-q", "-b", "4096", "-i", "16384",
              "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.backing)
        with open(self.log, "w") as log:
            self.daemon = subprocess.Popen([DEBIAN_PYTHON, SYNCFS, self.fuse, self.backing],
                                           stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=log)
        up = _wait(lambda: self.daemon.poll() is not None or
                   (mounted(self.fuse) and os.path.exists(self.image)), 10, 0.02)
        if not up or self.daemon.poll() is not None:
            raise RuntimeError("syncfs did not come up: " + self._log_tail())
        self._attach_and_mount()
        os.chmod(self.path, 0o777)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)  # the mode is durable: a cut must not take it back
        finally:
            os.close(fd)

    def _log_tail(self):
        try:
            with open(self.log) as f:
                return f.read()[-2000:].strip() or "(syncfs.log empty)"
        except OSError as e:
            return str(e)

    def _attach(self):
        # --direct-io=off: the loop device writes through disk.img's write() (FUSE direct_io
        # anyway) and fsyncs it on each flush.
        self.loop = _must("losetup", "--find", "--show", "--direct-io=off",
                          self.image).strip()

    def _detach(self):
        if self.loop:
            loop, self.loop = self.loop, None  # a second detach must not hit another's
            _run("losetup", "-d", loop)

    def _mount(self):
        _must("mount", "-t", "ext4", self.loop, self.path)

    def _attach_and_mount(self):
        self._attach()
        self._mount()

    # --- the switch ---------------------------------------------------------------------

    def _ctl(self, cmd):
        fd = os.open(self.ctl_path, os.O_WRONLY)
        try:
            os.write(fd, cmd.encode())
        finally:
            os.close(fd)

    def stats(self):
        """syncfs's state and counters (mode "on"/"cut", fsyncs, pending_blocks, ...)."""
        fd = os.open(self.ctl_path, os.O_RDONLY)
        try:
            return json.loads(os.read(fd, 1 << 16))
        finally:
            os.close(fd)

    # --- the cut ------------------------------------------------------------------------

    def cut_power(self):
        """The moment of the cut: syncfs drops its pending writes and discards all later
        ones. Kill whatever runs on the disk next, then restore()."""
        self._ctl("cut")
        self.powered = False
        self.cuts += 1

    def restore(self, fsck=False):
        """Power back on: self.path holds exactly what had been fsynced before the cut
        (after the journal's replay). Call it once the processes using the disk are dead."""
        if _umount(self.path):
            self.lazy_unmounts += 1
        self._detach()
        self._ctl("restore")
        self.powered = True
        self._attach()
        if fsck:
            self._mount()  # the journal replayed by the kernel, as a node's restart would
            _must("umount", self.path)
            out = _run("e2fsck", "-f", "-n", self.loop, timeout=300)
            if out.returncode != 0:
                raise RuntimeError("e2fsck after the cut: exit %d:\n%s%s" % (
                    out.returncode, out.stdout, out.stderr))
        self._mount()

    def cut(self, pids=(), before_restore=None, fsck=False, freeze_timeout=10.0):
        """The power cut with the processes pids on the disk: freeze them, cut the power,
        SIGKILL them, call before_restore(), restore(fsck). Returns the pids that could not
        be frozen in time (the cut went on without them frozen; normally [])."""
        unfrozen = [pid for pid in pids if not freeze(pid, freeze_timeout)]
        self.cut_power()
        for pid in pids:
            if not kill(pid):
                raise RuntimeError("pid %d did not die after SIGKILL" % pid)
        if before_restore is not None:
            before_restore()
        self.restore(fsck=fsck)
        return unfrozen

    # --- the end ------------------------------------------------------------------------

    def close(self):
        """Unmounts and detaches everything and removes the dir; safe on every path (a
        half-made disk, a failed cut, twice). The disk's content is not kept."""
        if self.dir is None:
            return
        daemon, self.daemon = self.daemon, None
        loop, self.loop = self.loop, None
        errors = _teardown(self.dir, loop, daemon)
        if not errors:
            self.dir = None
        else:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
