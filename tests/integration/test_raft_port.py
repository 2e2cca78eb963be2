"""Malformed handshakes and messages on the Raft port (cluster/transport.h, wire_check.h): libraft 0.15's decoder trusts
a peer's bytes, and one AppendEntries with an entry of an invalid type crashed the node
(a NULL dereference in uvDecodeMessage). Each malformed message is now refused and its
connection closed; the node keeps serving. Raw sockets speak raft_uv's framing: a
handshake (protocol 1, the sender's ID, its address), then messages of a type, a header
length and the header, all little endian.

Run: IDEM_BIN_DIR=build/bin python3 -m unittest -v test_raft_port
"""
import socket
import struct
import unittest

from harness import ClusterTestCase, http_request, wait_for

RAFT_IO_APPEND_ENTRIES = 1
RAFT_IO_REQUEST_VOTE = 3
RAFT_IO_INSTALL_SNAPSHOT = 5


def _u64(*vals):
    return b"".join(struct.pack("<Q", v) for v in vals)


def _handshake(sender_id=99, address=b"127.0.0.1:1\x00"):
    return _u64(1, sender_id, len(address)) + address


def _message(mtype, header):
    return _u64(mtype, len(header)) + header


def _entry(term, etype, length):
    return _u64(term) + bytes([etype, 0, 0, 0]) + struct.pack("<I", length)


MALFORMED = {
    # The crash: one entry of type 9 (not a command, barrier or change).
    "entry of an invalid type": _message(RAFT_IO_APPEND_ENTRIES,
                                         _u64(1, 0, 0, 0, 1) + _entry(1, 9, 0)),
    # Two entries of 1 and 8 bytes: raft_uv takes a 9-byte payload and walks it in 8-byte
    # steps, the second entry past its end.
    "entry data length not padded": _message(RAFT_IO_APPEND_ENTRIES,
                                             _u64(1, 0, 0, 0, 2) + _entry(1, 1, 1)
                                             + _entry(1, 1, 8)),
    # Four entries declared, no room for their headers.
    "more entries than the header holds": _message(RAFT_IO_APPEND_ENTRIES,
                                                   _u64(1, 0, 0, 0, 4)),
    # Fields read past the header's end.
    "request vote shorter than its fields": _message(RAFT_IO_REQUEST_VOTE, _u64(1)),
    "append entries shorter than its fields": _message(RAFT_IO_APPEND_ENTRIES, _u64(1, 0)),
    # A configuration longer than the header, and one whose address has no NUL.
    "snapshot configuration past the header": _message(
        RAFT_IO_INSTALL_SNAPSHOT, _u64(1, 1, 1, 1, 1000) + _u64(0)),
    "snapshot configuration address unterminated": _message(
        RAFT_IO_INSTALL_SNAPSHOT,
        _u64(1, 1, 1, 1, 9 + 8 + 4) + b"\x01" + _u64(1) + _u64(7) + b"abcd" + _u64(0)),
}


class TestRaftPort(ClusterTestCase):
    malformed_raft_expected = True

    def _send(self, addr, payload):
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            s.sendall(_handshake() + payload)
            s.settimeout(10)
            try:
                # The node closes the connection (EOF), it sends nothing on it.
                self.assertEqual(s.recv(1), b"")
            except ConnectionResetError:
                pass
        finally:
            s.close()

    def _closed_at_once(self, addr, payload, timeout=5):
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            if payload:
                s.sendall(payload)
            s.settimeout(timeout)
            try:
                return s.recv(1) == b""
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False
        finally:
            s.close()

    def test_handshakes_are_bounded(self):
        # raft_uv_tcp took a handshake's address length as given (2^40 bytes: allocated)
        # and waited for it for ever; the listener is now idemd's (cluster/transport.h).
        node = self.c.nodes[[n for n in sorted(self.c.nodes) if n != self.c.leader()][0]]
        self.assertTrue(self._closed_at_once(node.raft, _u64(1, 99, 1 << 40)))
        self.assertTrue(self._closed_at_once(node.raft, _u64(2, 99, 16) + b"127.0.0.1:1\x00" * 2))
        self.assertTrue(self._closed_at_once(node.raft, _u64(1, 99, 8) + b"12345678"))
        # At most 64 handshakes at once: the 65th connection is closed at once.
        host, port = node.raft.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(64)]
        try:
            self.assertTrue(self._closed_at_once(node.raft, b""))
            # A handshake unfinished after 10 s is closed.
            silent[0].settimeout(20)
            self.assertEqual(silent[0].recv(1), b"")
        finally:
            for s in silent:
                s.close()
        logs = self.c.logs()
        for why in ("handshake address length out of range", "unknown handshake protocol",
                    "handshake address not terminated", "too many handshakes in progress",
                    "no handshake within 10 s"):
            self.assertTrue(self.c.logs_contain("raft connection refused: " + why), why)
        self.assertIsNone(node.proc.poll(), logs)
        # The peers' own connections were never refused: the cluster commits.
        rc, out = self.c.ctl("claim", "after-handshakes", "--fingerprint", "b" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)

    def test_malformed_messages_are_refused_and_the_node_serves_on(self):
        lid = self.c.leader()
        fid = [n for n in sorted(self.c.nodes) if n != lid][0]
        for target in (fid, lid):
            node = self.c.nodes[target]
            for name, payload in MALFORMED.items():
                with self.subTest(node=target, message=name):
                    self._send(node.raft, payload)
                    self.assertIsNone(node.proc.poll(), "node %d died on: %s\n%s"
                                      % (target, name, self.c.logs()))
        # Every message was refused and said so (never the bytes themselves).
        logs = self.c.logs()
        self.assertGreaterEqual(logs.count("refused a malformed raft message"),
                                2 * len(MALFORMED), logs)
        self.assertIn("entry 0 has type 9", logs)
        self.assertIn("4 entries declared, room for 0", logs)
        self.assertTrue(self.c.logs_contain("entry 0's data length 1 is not a multiple of 8"))
        # /metrics counts them, on each node that got them.
        for target in (fid, lid):
            text = http_request(self.c.nodes[target].http, "GET", "/metrics").raw
            line = [x for x in text.splitlines()
                    if x.startswith("idem_raft_messages_refused_total ")]
            self.assertEqual(line, ["idem_raft_messages_refused_total %d" % len(MALFORMED)])
        # The cluster still commits, with the same leader, on all three nodes.
        rc, out = self.c.ctl("claim", "after-malformed", "--fingerprint", "a" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.assertEqual(self.c.leader(), lid)
        wait_for(lambda: all(n.proc.poll() is None for n in self.c.nodes.values()), 5,
                 "every node alive")
        self.c.wait_converged(3)


if __name__ == "__main__":
    unittest.main()
