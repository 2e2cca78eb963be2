#!/usr/bin/python3
"""holdfs: a FUSE file system of one file whose writes can be held, for tests of a disk that
stops answering (test_stalled_disk.py).

    holdfs.py MOUNTPOINT BACKING CONTROL

MOUNTPOINT shows one file, `disk.img`, whose bytes are BACKING's. While the file CONTROL
exists every write and fsync of `disk.img` waits (reads do not); once CONTROL is removed
they go on, in order; they also go on once the process that started this one is gone. A loop device on `disk.img` with a file system on it is then a disk
whose writes are accepted and never completed until the test says so: what a stalled
device looks like to the kernel's submitters (io_submit returns, the completion does not
come). Runs in the foreground until MOUNTPOINT is unmounted. Debian's python3-fusepy.
"""
import errno
import os
import sys
import time

from fusepy import FUSE, FuseOSError, Operations

NAME = "/disk.img"


class HoldFS(Operations):
    def __init__(self, backing, control):
        self.fd = os.open(backing, os.O_RDWR)
        self.control = control
        self.parent = os.getppid()

    def _wait(self):
        # A test killed while it held the writes must not leave the disk held (its idemd
        # would wait in the kernel for ever): once the test is gone, the writes go on.
        while os.path.exists(self.control) and os.getppid() == self.parent:
            time.sleep(0.02)

    def getattr(self, path, fh=None):
        if path == "/":
            return dict(st_mode=0o40700, st_nlink=2)
        if path != NAME:
            raise FuseOSError(errno.ENOENT)
        return dict(st_mode=0o100600, st_nlink=1, st_size=os.fstat(self.fd).st_size)

    def readdir(self, path, fh):
        return [".", "..", NAME[1:]]

    def open(self, path, flags):
        if path != NAME:
            raise FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        return os.pread(self.fd, size, offset)

    def write(self, path, data, offset, fh):
        self._wait()
        return os.pwrite(self.fd, data, offset)

    def fsync(self, path, datasync, fh):
        self._wait()
        os.fdatasync(self.fd)
        return 0

    def flush(self, path, fh):
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: holdfs.py MOUNTPOINT BACKING CONTROL")
    # direct_io: every write reaches write() above (no page cache in between).
    FUSE(HoldFS(sys.argv[2], sys.argv[3]), sys.argv[1], foreground=True, direct_io=True)
