#!/usr/bin/python3
"""syncfs: a FUSE file system of one disk image that keeps only what was fsynced, for the
chaos suite's power cuts (powerdisk.py).

    syncfs.py MOUNTPOINT BACKING

MOUNTPOINT shows two files:

  disk.img  BACKING's bytes, as a disk with a volatile write cache would show them. A write
            is kept in memory (pending, in 4 KiB blocks, later writes overlaying earlier ones)
            and reads see it; it reaches BACKING only when disk.img is fsynced/fdatasynced.
            A loop device on disk.img turns its file system's cache flushes (REQ_PREFLUSH,
            and FUA, which the loop device does not claim, so the block layer sends a flush
            after the write) into fsyncs of disk.img: what the file system made durable is
            what reaches BACKING. BACKING itself is not fsynced on the host (the host keeps
            its power; the cut is ours), which keeps a flush cheap.
  ctl       the switch. Each write to it is one command (a trailing newline is ignored):
              cut      power off, now: the pending writes are thrown away and every later
                       write and fsync of disk.img is accepted and discarded.
              restore  power on again: pending dropped (there is none), and every disk.img
                       opened before this command stays dead (its writes and fsyncs are
                       accepted and discarded for ever): a loop device left attached by a
                       lazy unmount cannot write its stale file system's pages into the
                       disk that is about to be mounted again. Open disk.img anew (attach a
                       new loop device) after restore.
            The command is done when the write returns. The daemon is single-threaded, so a
            command is ordered with the disk's requests: those the kernel handed over before
            it are done (with power), those after it are not.
            A read of ctl gives the state and counters as one JSON object.

Runs in the foreground until MOUNTPOINT is unmounted, or until the process that started it
is gone (then it exits at once, which is a power cut too: its mount then answers ENOTCONN
until unmounted; powerdisk.sweep_stale() undoes the rest). Debian's python3-fusepy.
"""
import errno
import json
import os
import stat
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations

DISK = "/disk.img"
CTL = "/ctl"
BS = 4096
IOV = 512  # blocks per pwritev (IOV_MAX is 1024)


class SyncFS(Operations):
    use_ns = True

    def __init__(self, backing):
        self.fd = os.open(backing, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        if self.size % BS:
            sys.exit("syncfs: %s: the size is not a multiple of %d" % (backing, BS))
        self.pending = {}  # block number -> bytearray(BS), the disk's volatile cache
        self.cut = False
        self.epoch = 0  # bumped by restore; a disk.img handle of an older epoch is dead
        self.handles = {}  # fh -> epoch it was opened in (None for ctl)
        self.next_fh = 1
        self.now = time.time_ns()
        self.st = dict(writes=0, write_bytes=0, reads=0, fsyncs=0, flushed_blocks=0,
                       discarded_writes=0, discarded_fsyncs=0, stale_writes=0,
                       dropped_blocks=0, cuts=0, restores=0, max_pending_blocks=0)

    # --- the disk ---------------------------------------------------------------------

    def _dead(self, fh):
        return self.cut or self.handles.get(fh) != self.epoch

    def _read(self, size, offset):
        if offset >= self.size or size <= 0:
            return b""
        size = min(size, self.size - offset)
        data = os.pread(self.fd, size, offset)
        if len(data) < size:
            data += bytes(size - len(data))
        if not self.pending:
            return data
        buf = None
        end = offset + size
        for b in range(offset // BS, (end - 1) // BS + 1):
            blk = self.pending.get(b)
            if blk is None:
                continue
            if buf is None:
                buf = bytearray(data)
            s, e = max(offset, b * BS), min(end, (b + 1) * BS)
            buf[s - offset:e - offset] = blk[s - b * BS:e - b * BS]
        return data if buf is None else bytes(buf)

    def _write(self, data, offset):
        mv = memoryview(data)
        pending = self.pending
        i, n = 0, len(data)
        while i < n:
            pos = offset + i
            b, off = divmod(pos, BS)
            k = min(BS - off, n - i)
            blk = pending.get(b)
            if blk is None:
                if k == BS:
                    pending[b] = bytearray(mv[i:i + BS])
                    i += k
                    continue
                blk = bytearray(BS)
                old = os.pread(self.fd, BS, b * BS)
                blk[:len(old)] = old
                pending[b] = blk
            blk[off:off + k] = mv[i:i + k]
            i += k
        if len(pending) > self.st["max_pending_blocks"]:
            self.st["max_pending_blocks"] = len(pending)

    def _flush(self):
        if not self.pending:
            return
        keys = sorted(self.pending)
        run = [keys[0]]
        for b in keys[1:] + [None]:
            if b is not None and b == run[-1] + 1 and len(run) < IOV:
                run.append(b)
                continue
            done = os.pwritev(self.fd, [self.pending[x] for x in run], run[0] * BS)
            if done != len(run) * BS:  # the image's size is a multiple of BS
                raise FuseOSError(errno.EIO)
            run = [b]
        self.st["flushed_blocks"] += len(keys)
        self.pending = {}

    # --- the switch -------------------------------------------------------------------

    def _command(self, data):
        cmd = bytes(data).decode("ascii", "replace").strip()
        if cmd == "cut":
            self.st["dropped_blocks"] += len(self.pending)
            self.pending = {}
            self.cut = True
            self.st["cuts"] += 1
        elif cmd == "restore":
            self.st["dropped_blocks"] += len(self.pending)
            self.pending = {}
            self.epoch += 1
            self.cut = False
            self.st["restores"] += 1
        else:
            raise FuseOSError(errno.EINVAL)

    def _state(self):
        live = sum(1 for e in self.handles.values() if e == self.epoch)
        stale = sum(1 for e in self.handles.values() if e is not None and e != self.epoch)
        return dict(self.st, mode="cut" if self.cut else "on", epoch=self.epoch,
                    pending_blocks=len(self.pending), open_disk=live, open_stale_disk=stale,
                    size=self.size)

    # --- FUSE operations --------------------------------------------------------------

    def getattr(self, path, fh=None):
        t = self.now
        if path == "/":
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_mtime=t, st_ctime=t,
                        st_atime=t)
        if path == DISK:
            return dict(st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=self.size,
                        st_blocks=(self.size + 511) // 512, st_mtime=t, st_ctime=t,
                        st_atime=t)
        if path == CTL:
            return dict(st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=0, st_mtime=t,
                        st_ctime=t, st_atime=t)
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", DISK[1:], CTL[1:]]

    def open(self, path, flags):
        if path not in (DISK, CTL):
            raise FuseOSError(errno.ENOENT)
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = self.epoch if path == DISK else None
        return fh

    def release(self, path, fh):
        self.handles.pop(fh, None)
        return 0

    def read(self, path, size, offset, fh):
        if path == CTL:
            return (json.dumps(self._state()) + "\n").encode()[offset:offset + size]
        self.st["reads"] += 1
        return self._read(size, offset)

    def write(self, path, data, offset, fh):
        if path == CTL:
            self._command(data)
            return len(data)
        if offset < 0 or offset + len(data) > self.size:
            raise FuseOSError(errno.ENOSPC)
        if self._dead(fh):
            self.st["stale_writes" if not self.cut else "discarded_writes"] += 1
            return len(data)
        self._write(data, offset)
        self.st["writes"] += 1
        self.st["write_bytes"] += len(data)
        return len(data)

    def fsync(self, path, datasync, fh):
        if path != DISK:
            return 0
        if self._dead(fh):
            self.st["discarded_fsyncs"] += 1
            return 0
        self._flush()
        self.st["fsyncs"] += 1
        return 0

    def flush(self, path, fh):
        return 0

    def truncate(self, path, length, fh=None):
        if path == CTL or (path == DISK and length == self.size):
            return 0
        raise FuseOSError(errno.EPERM)


def watch_parent(parent):
    # The test that started this is gone (killed): go too. The kernel aborts the FUSE
    # connection; what was pending is lost, as in a power cut.
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: syncfs.py MOUNTPOINT BACKING")
    ops = SyncFS(sys.argv[2])
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    # direct_io: every write and read reaches the methods above (no page cache on disk.img);
    # nothreads: one request at a time, so the switch needs no lock and is ordered with them.
    FUSE(ops, sys.argv[1], foreground=True, nothreads=True, direct_io=True,
         fsname="syncfs", subtype="syncfs")
