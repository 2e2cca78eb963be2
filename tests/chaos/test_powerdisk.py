"""The power-cut disk (powerdisk.py over syncfs.py): after a cut, what was fsynced is there
byte for byte and nothing else is; the O_DIRECT writes and fsyncs raft_uv makes work through
it; close() and sweep_stale() leave no mount, loop device or process behind.

    cd tests/chaos && /usr/bin/python3 -m unittest -v test_powerdisk

Needs root, /dev/fuse, losetup, mkfs.ext4, e2fsck and Debian's python3-fusepy for
/usr/bin/python3; skipped without them.
"""
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import powerdisk
from powerdisk import PowerDisk, mounted, sweep_stale

HERE = os.path.dirname(os.path.abspath(__file__))
WHY = powerdisk.missing_prerequisite()
BS = 4096


def write_file(path, data, sync=True, mode="wb"):
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def aligned(data):
    """data in a page-aligned buffer (an anonymous mmap), as O_DIRECT wants."""
    buf = mmap.mmap(-1, len(data))
    buf[:] = data
    return buf


def losetup_all():
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout


def proc_mounts():
    with open("/proc/mounts") as f:
        return f.read()


@unittest.skipIf(WHY, WHY)
class TestSyncFS(unittest.TestCase):
    """syncfs.py alone, its disk.img written and read directly (no loop device)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test-syncfs-")
        self.backing = os.path.join(self.dir, "backing.img")
        self.mnt = os.path.join(self.dir, "fuse")
        os.mkdir(self.mnt)
        self.orig = os.urandom(1 << 20)
        write_file(self.backing, self.orig)
        self.daemon = subprocess.Popen([powerdisk.DEBIAN_PYTHON, powerdisk.SYNCFS, self.mnt,
                                        self.backing])
        self.img = os.path.join(self.mnt, "disk.img")
        self.assertTrue(powerdisk._wait(lambda: os.path.exists(self.img), 10, 0.02))

    def tearDown(self):
        subprocess.run(["umount", self.mnt])
        try:
            self.daemon.wait(timeout=10)
        finally:
            if self.daemon.poll() is None:
                self.daemon.kill()
                self.daemon.wait()
            shutil.rmtree(self.dir, ignore_errors=True)

    def ctl(self, cmd):
        with open(os.path.join(self.mnt, "ctl"), "w") as f:
            f.write(cmd)

    def test_pending_until_fsync_then_cut_and_restore(self):
        want = bytearray(self.orig)
        fd = os.open(self.img, os.O_RDWR)
        try:
            # Unaligned, overlapping, across block boundaries; later writes overlay earlier.
            for off, data in ((100, b"a" * 5000), (4090, b"b" * 10), (3000, b"c" * 9000),
                              (BS * 7, b"d" * BS), (BS * 7 + 1, b"e"), ((1 << 20) - 3, b"fff")):
                self.assertEqual(os.pwrite(fd, data, off), len(data))
                want[off:off + len(data)] = data
            self.assertEqual(os.pread(fd, 1 << 20, 0), bytes(want))  # reads see them
            self.assertEqual(os.pread(fd, 20, 4085), bytes(want[4085:4105]))
            self.assertEqual(read_file(self.backing), self.orig)  # not on the disk yet
            os.fsync(fd)
            self.assertEqual(read_file(self.backing), bytes(want))
            synced = bytes(want)
            os.pwrite(fd, b"lost" * 100, 50)
            self.ctl("cut")  # pending dropped; later writes and fsyncs discarded
            self.assertEqual(os.pread(fd, 1 << 20, 0), synced)
            os.pwrite(fd, b"void" * 100, 50)
            os.fsync(fd)
            self.assertEqual(read_file(self.backing), synced)
            self.ctl("restore")
            os.pwrite(fd, b"stale" * 100, 50)  # a handle from before the power came back
            os.fsync(fd)
            self.assertEqual(read_file(self.backing), synced)
            fd2 = os.open(self.img, os.O_RDWR)
            try:
                os.pwrite(fd2, b"new", 0)
                os.fdatasync(fd2)
            finally:
                os.close(fd2)
            self.assertEqual(read_file(self.backing), b"new" + synced[3:])
            with self.assertRaises(OSError):
                os.pwrite(fd, b"x", 1 << 20)  # past the end of the disk
        finally:
            os.close(fd)
        with open(os.path.join(self.mnt, "ctl")) as f:
            st = json.load(f)
        self.assertEqual((st["mode"], st["cuts"], st["restores"]), ("on", 1, 1), st)
        self.assertEqual(st["fsyncs"], 2, st)
        self.assertEqual(st["discarded_fsyncs"], 2, st)  # one cut, one stale
        with self.assertRaises(OSError):
            self.ctl("bogus")

    def test_exits_when_its_parent_goes(self):
        child = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys, time; "
             "p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); time.sleep(60)",
             powerdisk.DEBIAN_PYTHON, powerdisk.SYNCFS, self.mnt + "2", self.backing],
            stdout=subprocess.PIPE, text=True)
        os.mkdir(self.mnt + "2")
        try:
            pid = int(child.stdout.readline())
            self.assertTrue(powerdisk._wait(
                lambda: os.path.exists(os.path.join(self.mnt + "2", "disk.img")), 10, 0.02))
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
        self.assertTrue(powerdisk._wait(lambda: not powerdisk.pid_alive(pid), 10, 0.02))
        self.assertTrue(mounted(self.mnt + "2"))  # dead: ENOTCONN until unmounted
        subprocess.run(["umount", self.mnt + "2"], check=True)
        self.assertFalse(mounted(self.mnt + "2"))


@unittest.skipIf(WHY, WHY)
class PowerDiskCase(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="test-powerdisk-")
        self.disk = PowerDisk(self.root, size_mb=128)
        self.p = self.disk.path

    def tearDown(self):
        try:
            self.disk.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class TestPowerCut(PowerDiskCase):
    def test_fsynced_file_survives_byte_for_byte(self):
        data = os.urandom(3 << 20) + b"tail"
        write_file(os.path.join(self.p, "synced"), data)
        self.disk.cut()
        self.assertEqual(read_file(os.path.join(self.p, "synced")), data)

    def test_unsynced_writes_are_gone(self):
        old = os.urandom(100000)
        write_file(os.path.join(self.p, "appended"), old)
        write_file(os.path.join(self.p, "overwritten"), old)
        fsync_dir(self.p)
        write_file(os.path.join(self.p, "new"), b"never synced", sync=False)
        write_file(os.path.join(self.p, "appended"), b"tail, never synced", sync=False,
                   mode="ab")
        with open(os.path.join(self.p, "overwritten"), "r+b") as f:
            f.write(b"X" * 50000)
        self.assertTrue(os.path.exists(os.path.join(self.p, "new")))
        self.disk.cut()
        self.assertFalse(os.path.exists(os.path.join(self.p, "new")))
        self.assertEqual(read_file(os.path.join(self.p, "appended")), old)
        self.assertEqual(read_file(os.path.join(self.p, "overwritten")), old)

    def test_file_and_directory_fsynced_survive(self):
        sub = os.path.join(self.p, "sub")
        os.mkdir(sub)
        write_file(os.path.join(sub, "f"), b"created, fsynced, dir fsynced")
        fsync_dir(sub)
        fsync_dir(self.p)
        # The atomic replace a careful program does: temp file, fsync, rename, fsync dir.
        write_file(os.path.join(sub, "meta"), b"v1")
        fsync_dir(sub)
        write_file(os.path.join(sub, "meta.tmp"), b"v2")
        os.rename(os.path.join(sub, "meta.tmp"), os.path.join(sub, "meta"))
        fsync_dir(sub)
        self.disk.cut()
        self.assertEqual(read_file(os.path.join(sub, "f")), b"created, fsynced, dir fsynced")
        self.assertEqual(read_file(os.path.join(sub, "meta")), b"v2")
        self.assertEqual(sorted(os.listdir(sub)), ["f", "meta"])

    def test_fdatasynced_append_survives(self):
        path = os.path.join(self.p, "log")
        write_file(path, b"A" * 10000)
        fsync_dir(self.p)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"B" * 5000)
            os.fdatasync(fd)
            os.write(fd, b"C" * 5000)  # not synced
        finally:
            os.close(fd)
        self.disk.cut()
        self.assertEqual(read_file(path), b"A" * 10000 + b"B" * 5000)

    def test_o_direct_writes_and_fsync(self):
        # As raft_uv writes a segment: preallocated, then 4 KiB-aligned O_DIRECT writes from
        # an aligned buffer, each made durable by fdatasync.
        path = os.path.join(self.p, "open-1")
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
        try:
            os.posix_fallocate(fd, 0, 64 * BS)
            os.fsync(fd)
            fsync_dir(self.p)
            blocks = [os.urandom(BS) for _ in range(16)]
            self.assertEqual(os.pwrite(fd, aligned(b"".join(blocks[:8])), 0), 8 * BS)
            os.fdatasync(fd)
            for i in range(8, 16):
                self.assertEqual(os.pwrite(fd, aligned(blocks[i]), i * BS), BS)
                os.fdatasync(fd)
            before = self.disk.stats()
            self.assertEqual(os.pwrite(fd, aligned(b"U" * 2 * BS), 16 * BS), 2 * BS)
            # The unsynced O_DIRECT write reached the disk, and waits in its cache.
            after = self.disk.stats()
            self.assertGreaterEqual(after["pending_blocks"], 2, after)
            self.assertEqual(after["fsyncs"], before["fsyncs"], (before, after))
            # And an O_DIRECT read sees it (reads see pending writes).
            buf = mmap.mmap(-1, 2 * BS)
            self.assertEqual(os.preadv(fd, [buf], 16 * BS), 2 * BS)
            self.assertEqual(bytes(buf), b"U" * 2 * BS)
        finally:
            os.close(fd)
        self.disk.cut()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 18 * BS)
            self.assertEqual(os.preadv(fd, [buf], 0), 18 * BS)
        finally:
            os.close(fd)
        self.assertEqual(bytes(buf[:16 * BS]), b"".join(blocks))
        self.assertEqual(bytes(buf[16 * BS:]), bytes(2 * BS))  # unwritten again
        self.assertEqual(os.path.getsize(path), 64 * BS)

    def test_flushes_reach_syncfs_as_fsyncs(self):
        before = self.disk.stats()
        self.assertEqual(before["mode"], "on")
        write_file(os.path.join(self.p, "f"), os.urandom(1 << 20))
        after = self.disk.stats()
        self.assertGreater(after["fsyncs"], before["fsyncs"], (before, after))
        self.assertGreaterEqual(after["flushed_blocks"] - before["flushed_blocks"], 256)
        self.assertEqual(after["pending_blocks"], 0, after)

    def test_the_cut_in_halves(self):
        write_file(os.path.join(self.p, "kept"), b"kept")
        self.disk.cut_power()
        st = self.disk.stats()
        self.assertEqual(st["mode"], "cut")
        # Power is off: the write and its fsync are accepted, and go nowhere.
        write_file(os.path.join(self.p, "lost"), b"lost")
        fsync_dir(self.p)
        st2 = self.disk.stats()
        self.assertGreater(st2["discarded_fsyncs"], st["discarded_fsyncs"])
        self.assertEqual(st2["fsyncs"], st["fsyncs"])
        self.disk.restore()
        self.assertEqual(self.disk.stats()["mode"], "on")
        self.assertEqual(sorted(os.listdir(self.p)), ["kept", "lost+found"])
        self.assertEqual(read_file(os.path.join(self.p, "kept")), b"kept")

    def test_several_cuts_in_a_row(self):
        for i in range(5):
            write_file(os.path.join(self.p, "synced-%d" % i), b"s%d" % i * 1000)
            fsync_dir(self.p)
            write_file(os.path.join(self.p, "unsynced-%d" % i), b"u", sync=False)
            self.disk.cut(fsck=(i % 2 == 0))  # e2fsck -fn finds nothing wrong
            self.assertEqual(sorted(os.listdir(self.p)),
                             ["lost+found"] + ["synced-%d" % j for j in range(i + 1)])
            for j in range(i + 1):
                self.assertEqual(read_file(os.path.join(self.p, "synced-%d" % j)),
                                 b"s%d" % j * 1000)
        self.assertEqual(self.disk.cuts, 5)
        self.assertEqual(self.disk.lazy_unmounts, 0)


WRITER = r"""
import os, sys
d = sys.argv[1]
fd = os.open(os.path.join(d, "log"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(dfd)
n = 0
while True:
    os.write(fd, b"%08d\n" % n)
    os.fdatasync(fd)
    os.write(1, b"L %d\n" % n)  # one write: a kill cannot leave half an ack
    if n % 25 == 0:
        f = os.open(os.path.join(d, "f%d" % n), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(f, b"file %d" % n)
        os.fsync(f)
        os.close(f)
        os.fsync(dfd)
        os.write(1, b"F %d\n" % n)
    n += 1
"""


class TestAcknowledgedSurvive(PowerDiskCase):
    def test_a_writer_cut_while_it_writes_loses_nothing_it_acknowledged(self):
        # A process appends records, each fdatasynced, and creates files (fsync, dir fsync),
        # saying so on stdout after each: the disk's power is cut under it (frozen, cut,
        # killed), several times; everything it said is there, in order.
        for round_ in range(3):
            d = os.path.join(self.p, "w%d" % round_)
            os.mkdir(d)
            fsync_dir(self.p)
            w = subprocess.Popen([sys.executable, "-c", WRITER, d], stdout=subprocess.PIPE,
                                 text=True)
            acks = []
            reader = threading.Thread(target=lambda: acks.extend(w.stdout))
            reader.start()
            self.assertTrue(powerdisk._wait(lambda: len(acks) >= 20, 30, 0.01),
                            "the writer got going")
            time.sleep(0.2 * round_)  # cut at 20 acks, and later
            unfrozen = self.disk.cut(pids=[w.pid], before_restore=w.wait)
            reader.join(10)
            w.stdout.close()
            self.assertEqual(unfrozen, [])
            self.assertEqual(w.returncode, -signal.SIGKILL)
            lines = [a.split() for a in acks]
            self.assertEqual([a for a in acks if len(a.split()) != 2], [], acks[-5:])
            logged = [int(n) for k, n in lines if k == "L"]
            files = [int(n) for k, n in lines if k == "F"]
            data = read_file(os.path.join(d, "log"))
            have = [int(x) for x in data.split(b"\n")[:-1]]
            self.assertTrue(data.endswith(b"\n"), data[-20:])
            self.assertEqual(have, list(range(len(have))))
            self.assertGreaterEqual(len(have), logged[-1] + 1, (len(have), logged[-1]))
            for n in files:
                self.assertEqual(read_file(os.path.join(d, "f%d" % n)), b"file %d" % n)


class TestOverhead(PowerDiskCase):
    def test_write_and_fsync_overhead(self):
        def bench(dirpath, n=300):
            path = os.path.join(dirpath, "bench-%d" % os.getpid())
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
            try:
                os.posix_fallocate(fd, 0, n * BS)
                os.fsync(fd)
                buf = aligned(b"x" * BS)
                t = time.perf_counter()
                for i in range(n):
                    os.pwrite(fd, buf, i * BS)
                    os.fdatasync(fd)
                direct = (time.perf_counter() - t) / n
            finally:
                os.close(fd)
                os.unlink(path)
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
            try:
                t = time.perf_counter()
                for i in range(n):
                    os.write(fd, b"y" * BS)
                    os.fdatasync(fd)
                buffered = (time.perf_counter() - t) / n
            finally:
                os.close(fd)
                os.unlink(path)
            return direct * 1e3, buffered * 1e3
        on_disk = bench(self.p)
        plain = bench(self.root)
        st = self.disk.stats()
        sys.stderr.write(
            "\n  4 KiB O_DIRECT pwrite+fdatasync: %.3f ms on the power disk, %.3f ms on %s"
            "\n  4 KiB append+fdatasync:          %.3f ms on the power disk, %.3f ms on %s"
            "\n  syncfs: %d writes, %d fsyncs, at most %d blocks pending\n" % (
                on_disk[0], plain[0], self.root, on_disk[1], plain[1], self.root,
                st["writes"], st["fsyncs"], st["max_pending_blocks"]))
        self.assertLess(on_disk[0], 20.0)
        self.assertLess(on_disk[1], 20.0)


@unittest.skipIf(WHY, WHY)
class TestCleanup(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="test-powerdisk-")

    def tearDown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def assertNothingLeft(self, d, syncfs_pid=None):
        self.assertFalse(os.path.exists(d), d)
        self.assertNotIn(d, proc_mounts())
        # A loop device detached while a lazily unmounted file system still held it goes
        # once that lets go (the kernel's autoclear): give it a moment.
        powerdisk._wait(lambda: d not in losetup_all(), 10, 0.05)
        self.assertNotIn(d, losetup_all())
        if syncfs_pid is not None:
            self.assertTrue(powerdisk._wait(lambda: not powerdisk.pid_alive(syncfs_pid), 10),
                            "syncfs %d still running" % syncfs_pid)

    def test_close_leaves_nothing(self):
        disk = PowerDisk(self.root, size_mb=64)
        d, pid = disk.dir, disk.daemon.pid
        write_file(os.path.join(disk.path, "f"), b"x")
        disk.cut()
        self.assertIn(d, proc_mounts())
        self.assertIn(d, losetup_all())
        cwd = os.open(".", os.O_RDONLY)
        try:
            os.chdir(disk.path)  # something holds the mount: close() unmounts it lazily
            disk.close()
        finally:
            os.fchdir(cwd)
            os.close(cwd)
        self.assertNothingLeft(d, pid)
        disk.close()  # twice: nothing to do

    def test_close_after_a_cut_that_was_not_restored(self):
        disk = PowerDisk(self.root, size_mb=64)
        d, pid = disk.dir, disk.daemon.pid
        write_file(os.path.join(disk.path, "f"), b"x", sync=False)
        disk.cut_power()
        disk.close()
        self.assertNothingLeft(d, pid)

    def test_a_cut_with_the_mount_held_still_gives_what_was_synced(self):
        # Something keeps the old file system busy (a cwd in it): the unmount is lazy, the
        # old loop device stays attached until it lets go, and whatever that old file system
        # still writes goes nowhere (syncfs keeps disk.img handles from before the power came
        # back dead).
        disk = PowerDisk(self.root, size_mb=64)
        try:
            write_file(os.path.join(disk.path, "synced"), b"synced")
            fsync_dir(disk.path)
            holder = subprocess.Popen(["sleep", "60"], cwd=disk.path)
            try:
                write_file(os.path.join(disk.path, "unsynced"), b"u", sync=False)
                disk.cut()
                self.assertEqual(disk.lazy_unmounts, 1)
                self.assertEqual(sorted(os.listdir(disk.path)), ["lost+found", "synced"])
                self.assertEqual(disk.stats()["open_stale_disk"], 1)
                write_file(os.path.join(disk.path, "after"), b"after")
                disk.cut()
                self.assertEqual(sorted(os.listdir(disk.path)),
                                 ["after", "lost+found", "synced"])
            finally:
                holder.kill()
                holder.wait()
            d, pid = disk.dir, disk.daemon.pid
        finally:
            disk.close()
        self.assertNothingLeft(d, pid)

    def test_sweep_after_a_killed_process(self):
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys, time, powerdisk; "
             "d = powerdisk.PowerDisk(sys.argv[1], size_mb=64); "
             "open(d.path + '/f', 'w').write('x'); "
             "print(d.dir, d.loop, d.daemon.pid, flush=True); time.sleep(120)", self.root],
            cwd=HERE, stdout=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline().split()
        finally:
            child.kill()
            child.wait(timeout=10)
            child.stdout.close()
        self.assertEqual(len(line), 3, "the child's PowerDisk: %r" % line)
        d, loop, syncfs = line[0], line[1], int(line[2])
        # What a killed run leaves: the mounts and the loop device (its syncfs exits once
        # its parent is gone, leaving its mount dead).
        self.assertTrue(mounted(os.path.join(d, "mnt")))
        self.assertTrue(mounted(os.path.join(d, "fuse")))
        self.assertIn(d + "/fuse/", subprocess.run(["losetup", "--list", "--raw", loop],
                                                   capture_output=True, text=True).stdout)
        self.assertTrue(powerdisk._wait(lambda: not powerdisk.pid_alive(syncfs), 10))
        live = PowerDisk(self.root, size_mb=64)  # sweeps the child's; its own is kept
        live_dir = live.dir
        try:
            self.assertFalse(os.path.exists(d))
            self.assertEqual(sweep_stale(self.root), [])
            self.assertTrue(mounted(live.path))
            write_file(os.path.join(live.path, "g"), b"y")
            live.cut()
            self.assertEqual(read_file(os.path.join(live.path, "g")), b"y")
        finally:
            live.close()
        self.assertNothingLeft(d)
        self.assertNothingLeft(live_dir)


if __name__ == "__main__":
    unittest.main()
