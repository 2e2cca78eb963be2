"""The Raft port (cluster/transport.h, wire_check.h): its authentication, and malformed
handshakes and messages.

Every node of the harness's clusters has the same raft.secret_file: a connection gets
into raft only after both ends proved they hold it (HMAC-SHA256 over both ends' nonces and
the connector's ID and address). Without it, or with another secret, a connection is
closed before raft reads a byte of it, and a node with another secret cannot join.

libraft 0.15's decoder trusts a peer's bytes: one AppendEntries with an entry of an
invalid type crashed the node (a NULL dereference in uvDecodeMessage). Each malformed
message is now refused and its connection closed; the node keeps serving. Raw sockets
speak raft_uv's framing: a handshake (protocol 1, the sender's ID, its address), then
messages of a type, a header length and the header, all little endian; here the
authentication comes between the two, as a member's would.

With tls.raft (cluster/raft_tls.h) the same runs inside TLS with certificates both ways
(TestRaftTls...): a 3-node cluster serves through a leader kill and a follower restart, a
connection without TLS or with a certificate the CA did not sign gets nothing, a member
without tls.raft cannot join, and a relay between two members sees no plaintext
(TestRaftTlsWire; TestRaftPlainWire shows the same relay seeing a claim's key without TLS).

Run: IDEM_BIN_DIR=build/bin python3 -m unittest -v test_raft_port
"""
import hashlib
import hmac
import os
import secrets
import socket
import ssl
import struct
import threading
import time
import unittest

from harness import Cluster, ClusterTestCase, free_port, http_request, recv_exact, wait_for
from test_tls_bench import make_pki

AUTH_MAGIC = b"IDRAFTA1"
AUTH_LABEL = b"idemd raft transport 1"
GREETING = 8 + 32  # magic, nonce_l
TARGET_MAGIC = b"IDTARGET"  # nonce_c's first 8 bytes when it names the target (transport.h)

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


def _key(secret):
    return hmac.new(secret.encode(), AUTH_LABEL, hashlib.sha256).digest()


def _mac(secret, label, nonce_l, nonce_c, sender_id, target_id, address, macs=b""):
    """The connector's MAC, or (label b"listener", macs the connector's 64 bytes) the
    listener's, as cluster/transport.h defines them."""
    key = _key(secret)
    msg = (label + b"\x00" + nonce_l + nonce_c + struct.pack("<QQ", sender_id, target_id)
           + macs + address)
    return hmac.new(key, msg, hashlib.sha256).digest()


def _nonce_c(target_id):
    """A connector's nonce as idemd makes it: TARGET_MAGIC, the ID of the node it means to
    reach (u64 little endian), 16 random bytes; an earlier idemd's is 32 random bytes."""
    return TARGET_MAGIC + struct.pack("<Q", target_id) + os.urandom(16)


def _connect(addr, secret, target_id, sender_id=99, address=b"127.0.0.1:1", mac_secrets=None,
             mac_target=None, expect_secret=None, nonce_names=None, tls=None):
    """A connection to node target_id's Raft port that did what a member does before raft's
    first message: read the greeting, send the handshake and our MACs (under mac_secrets,
    newest first, for mac_target, if given; else under secret), read and check the node's
    (made with expect_secret, else secret). The nonce names node nonce_names, if given (as
    idemd's names the target), else it is random (as an earlier idemd's). With tls (an
    ssl.SSLContext), all of it inside TLS, as a member with tls.raft does it. Returns
    (socket, the node's MAC or b"" if it closed)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    if tls is not None:
        s = tls.wrap_socket(s, server_hostname=host)
    hello = recv_exact(s, GREETING)
    assert hello[:8] == AUTH_MAGIC, hello
    nonce_l = hello[8:40]
    nonce_c = os.urandom(32) if nonce_names is None else _nonce_c(nonce_names)
    macs = b"".join(_mac(sec, b"connector", nonce_l, nonce_c, sender_id,
                         target_id if mac_target is None else mac_target, address)
                    for sec in (mac_secrets or [secret]))
    macs = macs.ljust(64, b"\x00")
    s.sendall(_handshake(sender_id, address + b"\x00") + nonce_c + macs)
    theirs = recv_exact(s, 32)
    if theirs:
        assert theirs == _mac(expect_secret or secret, b"listener", nonce_l, nonce_c, sender_id,
                              target_id, address, macs), "the node's MAC is not the listener's"
    return s, theirs


def _closed(s, timeout):
    """Whether the peer closes s within timeout, whatever it sent before (its greeting)."""
    s.settimeout(timeout)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if s.recv(4096) == b"":
                return True
        return False
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _metric(addr, name):
    text = http_request(addr, "GET", "/metrics").raw
    line = [x for x in text.splitlines() if x.startswith(name + " ")]
    return int(line[0].split()[1]) if line else None


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
    raft_auth_failure_expected = True

    def _send(self, nid, payload):
        s, theirs = _connect(self.c.nodes[nid].raft, self.c.raft_secret, nid)
        try:
            self.assertEqual(len(theirs), 32, "authenticated with the cluster's secret")
            s.sendall(payload)
            s.settimeout(10)
            try:
                # The node closes the connection (EOF), it sends nothing more on it.
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
            return _closed(s, timeout)
        finally:
            s.close()

    def test_handshakes_are_bounded(self):
        # raft_uv_tcp took a handshake's address length as given (2^40 bytes: allocated)
        # and waited for it for ever; the listener is now idemd's (cluster/transport.h).
        node = self.c.nodes[[n for n in sorted(self.c.nodes) if n != self.c.leader()][0]]
        self.assertTrue(self._closed_at_once(node.raft, _u64(1, 99, 1 << 40)))
        self.assertTrue(self._closed_at_once(node.raft, _u64(2, 99, 16) + b"127.0.0.1:1\x00" * 2))
        self.assertTrue(self._closed_at_once(node.raft, _u64(1, 99, 8) + b"12345678"))
        # At most 64 handshakes at once: the 65th connection closes the oldest unfinished
        # one, so connections held open cannot lock the members out.
        # Held on the leader: a follower restarted meanwhile must connect to it anew.
        lid = self.c.leader()
        host, port = self.c.nodes[lid].raft.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(64)]
        try:
            time.sleep(0.2)  # every one accepted, in order
            newest = socket.create_connection((host, int(port)), timeout=10)
            silent.append(newest)
            self.assertTrue(_closed(silent[0], 5))
            self.assertFalse(_closed(silent[1], 0.2))
            # A member still gets in while they are held: a restarted follower catches up
            # (its answers to the leader go over a connection of its own, which pushes out
            # the oldest held one), and the cluster commits.
            other = [n for n in sorted(self.c.nodes) if n != lid][-1]
            self.c.kill(other)
            rc, out = self.c.ctl("claim", "while-held", "--fingerprint", "e" * 64)
            self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
            self.c.start(other)
            # Before the held ones' 10 s run out (without the eviction it would wait for
            # them).
            self.c.wait_converged(3, timeout=7)
            # A handshake unfinished after 10 s is closed (after the greeting it sent).
            self.assertTrue(_closed(newest, 20))
        finally:
            for s in silent:
                s.close()
        logs = self.c.logs()
        for why in ("handshake address length out of range", "unknown handshake protocol",
                    "handshake address not terminated",
                    "too many handshakes in progress (the oldest closed)",
                    "no handshake (or authentication) within 10 s"):
            self.assertTrue(self.c.logs_contain(": " + why), why)
        # Each refusal names the peer it came from, in a log line of the node's own format
        # (time, node, level: clog.h), not a bare "idemd: ..." on stderr.
        self.assertTrue(self.c.logs_contain("raft connection refused from 127.0.0.1:"))
        self.assertRegex(logs, r"(?m)^\d{4}-\d\d-\d\dT[\d:.]+Z idemd\[\d+\] warn raft "
                         r"connection refused from 127\.0\.0\.1:")
        self.assertIsNone(node.proc.poll(), logs)
        # The peers' own connections were never refused: the cluster commits.
        rc, out = self.c.ctl("claim", "after-handshakes", "--fingerprint", "b" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)

    def test_refusals_from_many_addresses_do_not_flood_the_log(self):
        # Each refusal used to be logged at once when its source address was new to the
        # table of 32 peers and reasons: connections from ever other addresses (127/8, an
        # IPv6 /64) made a log line each. Past the table, they are counted in one line.
        node = self.c.nodes[self.c.leader()]
        host, port = node.raft.rsplit(":", 1)

        def named():
            return self.c.logs().count("raft connection refused from 127.0.0.")
        before = named()
        for i in range(200):
            s = socket.socket()
            try:
                s.bind(("127.0.0.%d" % (2 + i % 40), 0))
                s.connect((host, int(port)))
                s.sendall(_u64(2, 99, 8) + b"12345678")  # an unknown handshake protocol
                self.assertTrue(_closed(s, 5))
            finally:
                s.close()
        wait_for(lambda: self.c.logs_contain("beyond the 32 peers and reasons named at a time"),
                 10, "the refusals past the table to be said together")
        self.assertLessEqual(named() - before, 32)
        self.assertIsNone(node.proc.poll())

    def test_malformed_messages_are_refused_and_the_node_serves_on(self):
        lid = self.c.leader()
        fid = [n for n in sorted(self.c.nodes) if n != lid][0]
        for target in (fid, lid):
            node = self.c.nodes[target]
            for name, payload in MALFORMED.items():
                with self.subTest(node=target, message=name):
                    self._send(target, payload)
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

    def test_connections_without_the_secret_get_nothing_into_raft(self):
        lid = self.c.leader()
        node = self.c.nodes[lid]
        crash = MALFORMED["entry of an invalid type"]
        before = _metric(node.http, "idem_raft_connections_refused_total")
        # raft_uv's own handshake and the message that crashed libraft 0.15, with no
        # authentication: closed before raft reads it.
        # (twice: what follows the handshake is taken for the 96-byte answer)
        self.assertTrue(self._closed_at_once(node.raft, _handshake() + crash * 2))
        # The authentication under another secret: the node does not answer it with its
        # own MAC, and closes.
        s, theirs = _connect(node.raft, self.c.raft_secret, lid,
                             mac_secrets=["another-" + "x" * 30])
        try:
            self.assertEqual(theirs, b"")
            s.sendall(crash)
            self.assertTrue(_closed(s, 5))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            s.close()
        # The same with the right secret but a MAC for another sender than the handshake
        # names (the MAC binds the connector's ID).
        host, port = node.raft.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            nonce_l, nonce_c = recv_exact(s, GREETING)[8:40], os.urandom(32)
            mac = _mac(self.c.raft_secret, b"connector", nonce_l, nonce_c, 98, lid,
                       b"127.0.0.1:1")
            s.sendall(_handshake(99) + nonce_c + mac + bytes(32))
            self.assertTrue(_closed(s, 5))
        finally:
            s.close()
        # And a MAC made for a connection to another node (the MAC binds the target): one
        # member's connection to a second cannot be relayed to a third.
        other = [n for n in sorted(self.c.nodes) if n != lid][0]
        s, theirs = _connect(node.raft, self.c.raft_secret, lid, mac_target=other)
        try:
            self.assertEqual(theirs, b"")
        finally:
            s.close()
        self.assertIsNone(node.proc.poll(), self.c.logs())
        wait_for(lambda: self.c.logs_contain(": authentication failed ("),
                 5, "the refusal in the log")
        self.assertEqual(_metric(node.http, "idem_raft_connections_refused_total"), before + 4)
        # Nothing got as far as raft's decoder: no message was refused there.
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 0)
        self.assertFalse(self.c.logs_contain("refused a malformed raft message"))
        self.assertEqual(self.c.leader(), lid)
        rc, out = self.c.ctl("claim", "after-unauthenticated", "--fingerprint", "c" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)

    def test_a_connection_meant_for_another_node_is_told_so(self):
        # A member whose configuration gives node 6 this node's Raft address (`members add
        # 6` with node N's addresses) holds the secret, but its MACs are for node 6. The
        # node refuses it as before; its nonce names node 6 (transport.h), so the node
        # checks the MACs for node 6 as well, and then logs the wrong ID, not the secret,
        # and answers, under the secret, which node it is, so the connector can say so too.
        lid = self.c.leader()
        nid = [n for n in sorted(self.c.nodes) if n != lid][0]
        node, secret = self.c.nodes[nid], self.c.raft_secret
        before = _metric(node.http, "idem_raft_connections_refused_total")
        host, port = node.raft.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            nonce_l, nonce_c = recv_exact(s, GREETING)[8:40], _nonce_c(6)
            macs = _mac(secret, b"connector", nonce_l, nonce_c, 99, 6, b"127.0.0.1:1")
            macs = macs.ljust(64, b"\x00")
            s.sendall(_handshake(99) + nonce_c + macs)
            refusal = recv_exact(s, 32)
            # Its ID, then a MAC under the secret over it and everything the MACs cover.
            self.assertEqual(refusal[:8], struct.pack("<Q", nid))
            self.assertEqual(refusal[8:], _mac(secret, b"refusal", nonce_l, nonce_c, 99, nid,
                                               b"127.0.0.1:1", macs)[:24])
            self.assertTrue(_closed(s, 5))
        finally:
            s.close()
        wait_for(lambda: self.c.logs_contain(
            ": node 99 (raft address 127.0.0.1:1) asked for node 6, and this is node %d: "
            % nid), 5, "the wrong ID in the node's log")
        # Under another secret the MACs prove nothing: closed without an answer, and the
        # log says both.
        s, theirs = _connect(node.raft, secret, nid, mac_secrets=["another-" + "x" * 30],
                             mac_target=6, nonce_names=6)
        s.close()
        self.assertEqual(theirs, b"")
        wait_for(lambda: self.c.logs_contain(
            ": authentication failed (the peer has another raft.secret_file, or none); it "
            "also asked for node 6, and this is node %d" % nid), 5, "both in the log")
        # An earlier idemd's nonce is random: the node cannot tell, closes without an
        # answer as before, and names the wrong ID as a possible cause.
        s, theirs = _connect(node.raft, secret, nid, mac_target=6)
        s.close()
        self.assertEqual(theirs, b"")
        wait_for(lambda: self.c.logs_contain(
            ": authentication failed (the peer has another raft.secret_file, or none; or it "
            "runs an earlier idemd and meant to reach another node than this one, node %d)"
            % nid), 5, "the possible cause in the log")
        # A nonce that names this node, for MACs made for another: nothing more than that.
        s, theirs = _connect(node.raft, secret, nid, mac_target=6, nonce_names=nid)
        s.close()
        self.assertEqual(theirs, b"")
        self.assertEqual(_metric(node.http, "idem_raft_connections_refused_total"), before + 4)
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 0)
        self.assertIsNone(node.proc.poll())
        # The right target still gets in, the nonce naming it or not.
        for names in (nid, None):
            s, theirs = _connect(node.raft, secret, nid, nonce_names=names)
            s.close()
            self.assertEqual(len(theirs), 32, names)
        rc, out = self.c.ctl("claim", "after-wrong-target", "--fingerprint", "d" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)

    def test_a_member_sends_nothing_to_a_listener_without_the_secret(self):
        # A stand-in on a stopped follower's Raft address: it greets as idemd does, checks
        # the leader's MAC (the leader computes it as transport.h says), then answers a
        # wrong one. The leader must close without sending raft a byte.
        lid = self.c.leader()
        fid = [n for n in sorted(self.c.nodes) if n != lid][0]
        self.c.kill(fid)
        host, port = self.c.nodes[fid].raft.rsplit(":", 1)
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, int(port)))
        srv.listen(8)
        srv.settimeout(10)
        leader = self.c.nodes[lid]
        before = _metric(leader.http, "idem_raft_connect_auth_failures_total")

        def accept():
            """The leader's next connection, read up to our answer: (socket, nonce_l,
            nonce_c, its MACs as sent). The other follower connects to the stopped node's
            address too (its connection to it was closed: it dials again, as a non-leader
            does before a vote); such a connection is closed after its greeting."""
            deadline = time.monotonic() + 10
            while True:
                conn, _ = srv.accept()  # the leader reconnects every 100 ms
                conn.settimeout(10)
                nonce_l = os.urandom(32)
                conn.sendall(AUTH_MAGIC + nonce_l)
                pre = recv_exact(conn, 24)
                proto, sender, alen = struct.unpack("<QQQ", pre)
                if sender == lid or time.monotonic() > deadline:
                    break
                conn.close()
            self.assertEqual((proto, sender), (1, lid))
            addr = recv_exact(conn, alen).rstrip(b"\x00")
            self.assertEqual(addr, leader.raft.encode())
            auth = recv_exact(conn, 96)
            # One key: its MAC, then zeros.
            nonce_c, mac, rest = auth[:32], auth[32:64], auth[64:]
            self.assertEqual(rest, bytes(32))
            # The nonce names the node it means to reach.
            self.assertEqual(nonce_c[:16], TARGET_MAGIC + struct.pack("<Q", fid))
            self.assertEqual(mac, _mac(self.c.raft_secret, b"connector", nonce_l, nonce_c,
                                       lid, fid, addr))
            return conn, nonce_l, nonce_c, auth[32:]

        try:
            conn, _, _, _ = accept()
            try:
                conn.sendall(os.urandom(32))
                # Closed, and not one byte of a raft message came first.
                self.assertEqual(conn.recv(1), b"")
            finally:
                conn.close()
            # A listener that holds the secret and is another node (77) says so, under the
            # secret: the leader logs that, and still sends raft nothing.
            conn, nonce_l, nonce_c, macs = accept()
            try:
                conn.sendall(struct.pack("<Q", 77) + _mac(
                    self.c.raft_secret, b"refusal", nonce_l, nonce_c, lid, 77,
                    leader.raft.encode(), macs)[:24])
                self.assertEqual(conn.recv(1), b"")
            finally:
                conn.close()
        finally:
            srv.close()
        wait_for(lambda: self.c.logs_contain("failed: the peer's authentication is wrong"), 5,
                 "the failure in the leader's log")
        wait_for(lambda: self.c.logs_contain(
            "raft connection to node %d failed: the node at %s is node 77, not node %d "
            % (fid, self.c.nodes[fid].raft, fid)), 5, "the other node in the leader's log")
        self.assertGreater(_metric(leader.http, "idem_raft_connect_auth_failures_total"),
                           before)
        # The real follower again: it catches up over an authenticated connection.
        self.c.start(fid)
        self.c.wait_converged(3)


class TestRaftWithoutSecret(ClusterTestCase):
    """Without raft.secret_file (the default): raft_uv's own handshake, no authentication;
    the nodes warn at start, the cluster commits, and what reaches raft is still checked."""
    cluster_opts = dict(raft_secret=None)
    malformed_raft_expected = True

    def test_a_cluster_without_the_secret_serves(self):
        rc, out = self.c.ctl("claim", "no-secret", "--fingerprint", "f" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)
        self.assertTrue(self.c.logs_contain("raft.secret_file is not set"))
        lid = self.c.leader()
        node = self.c.nodes[lid]
        # No greeting: the node waits for the handshake, and the malformed message gets as
        # far as the check in front of libraft's decoder.
        host, port = node.raft.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            s.sendall(_handshake() + MALFORMED["entry of an invalid type"])
            self.assertTrue(_closed(s, 5))
        finally:
            s.close()
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 1)
        self.assertEqual(_metric(node.http, "idem_raft_connections_refused_total"), 0)
        self.assertIsNone(node.proc.poll())
        self.assertEqual(self.c.leader(), lid)


class TestRaftSecretMismatch(ClusterTestCase):
    """Node 3 starts with another raft.secret_file than nodes 1 and 2: it gets nothing of
    theirs and they nothing of its, both ways refused; with none at all likewise. With the
    right one it catches up."""
    cluster_opts = dict(node_raft_secrets={3: "wrong-" + secrets.token_hex(20)})
    raft_auth_failure_expected = True

    def cluster_ready(self):
        self.c.wait_leader(timeout=self.leader_timeout, ids=[1, 2])

    def _isolated(self, what):
        for i in range(5):
            rc, out = self.c.ctl("claim", "%s-%d" % (what, i), "--fingerprint", "d" * 64,
                                 ids=[1, 2])
            self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        # Node 3 never hears of a leader nor applies an entry: looked at once the members
        # tried to reach it with those entries committed, and failed (their count of failed
        # connections grew: at once for a wrong secret, at the 10 s authentication timeout
        # for a node without one), rather than after a fixed time.
        def failures():
            return sum(_metric(self.c.nodes[nid].http, "idem_raft_connect_auth_failures_total")
                       for nid in (1, 2))
        before = failures()
        wait_for(lambda: failures() > before, 30,
                 "nodes 1 and 2 to fail a connection to node 3 again")

        # And once node 3 itself went an election timeout without hearing of a leader: it
        # stands for election (no longer a follower), and stays so, never elected.
        def own_row():
            st = self.c.status(ids=[3])
            n3 = [x for x in (st or {}).get("nodes", []) if x.get("id") == 3]
            return (st, n3) if len(n3) == 1 and n3[0]["role"] != "follower" else None
        st, n3 = wait_for(own_row, 30, "node 3 to stand for election")
        # Its own status: no leader, nothing applied past the bootstrap configuration.
        self.assertIsNone(n3[0]["leader_id"], st)
        self.assertLessEqual(n3[0]["applied_index"], 1, st)
        self.assertNotEqual(n3[0]["role"], "follower", st)

    def test_a_node_with_another_secret_or_none_cannot_join(self):
        self._isolated("wrong")
        # Each listener finds no MAC made with its key and closes: node 3 refuses the
        # leader's connections, and nodes 1 and 2 those of node 3 (a candidate); each
        # connector sees its peer close during the authentication.
        self.assertTrue(self.c.logs_contain(": authentication failed ("))
        self.assertTrue(self.c.logs_contain("failed: the peer closed the connection during the "
                                            "authentication"))
        lid = self.c.leader(ids=[1, 2])
        for nid in (1, 2, 3):
            self.assertGreater(_metric(self.c.nodes[nid].http,
                                       "idem_raft_connections_refused_total"), 0, nid)
        for nid in (lid, 3):
            self.assertGreater(_metric(self.c.nodes[nid].http,
                                       "idem_raft_connect_auth_failures_total"), 0, nid)
        # Each reason is logged once per 10 s with a count, not once per 100 ms retry.
        with open(self.c.nodes[1].log, "rb") as f:
            self.assertLess(f.read().count(b"raft connection"), 10)

        # No secret at all on node 3: still refused both ways, and it warns at start.
        self.c.stop(3)
        self.c.node_raft_secrets[3] = None
        self.c._write_config(self.c.nodes[3], self.c.bootstrap)
        self.c.start(3)
        wait_for(lambda: self.c.logs_contain("raft.secret_file is not set"), 10, "the warning")
        self._isolated("none")
        # Its raft_uv handshake and messages, without authentication, are refused by both
        # (once 96 bytes of messages came, taken for an answer; or at the 10 s limit), and
        # its own listener sends no greeting: the others' connections to it time out.
        before = {nid: _metric(self.c.nodes[nid].http, "idem_raft_connections_refused_total")
                  for nid in (1, 2)}
        wait_for(lambda: all(_metric(self.c.nodes[nid].http,
                                     "idem_raft_connections_refused_total") > before[nid]
                             for nid in (1, 2)), 15, "both to refuse node 3 again")
        # idemctl status says so, and shows each node's setting and counts.
        st = self.c.status()
        nodes = {x["id"]: x for x in st["nodes"]}
        self.assertEqual({i: nodes[i]["raft_authenticated"] for i in (1, 2, 3)},
                         {1: True, 2: True, 3: False}, st)
        for nid in (1, 2):
            self.assertGreater(nodes[nid]["raft_connections_refused"], 0, st)
        self.assertIn("Raft authentication differs: node(s) 1, 2 authenticate their Raft "
                      "connections (raft.secret_file) and node(s) 3 do not", " ".join(st["warnings"]))

        # The right secret: node 3 catches up with everything committed meanwhile.
        self.c.stop(3)
        del self.c.node_raft_secrets[3]
        self.c._write_config(self.c.nodes[3], self.c.bootstrap)
        self.c.start(3)
        self.c.wait_converged(3)


class TestRaftSecretRotation(ClusterTestCase):
    """Moving every member to a new raft.secret_file without an outage: one node at a time
    gets the new secret with the old one as raft.previous_secret_file (it accepts both and
    offers a MAC under each), then one at a time drops the old one."""
    raft_auth_failure_expected = True  # the old secret is refused at the end, on purpose

    def test_rolling_move_to_a_new_secret(self):
        old, new = self.c.raft_secret, "new-" + secrets.token_hex(20)
        for i in range(4):
            rc, out = self.c.ctl("claim", "before-%d" % i, "--fingerprint", "1" * 64)
            self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        steps = [(nid, new, old) for nid in (1, 2, 3)] + [(nid, new, None) for nid in (1, 2, 3)]
        for n, (nid, sec, prev) in enumerate(steps):
            with self.subTest(step=n, node=nid):
                self.c.stop(nid)
                self.c.node_raft_secrets[nid] = sec
                self.c.node_raft_previous[nid] = prev
                self.c._write_config(self.c.nodes[nid], self.c.bootstrap)
                self.c.start(nid)
                # The restarted node is back in the cluster, and writes commit on all three.
                self.c.wait_leader(timeout=20)
                rc, out = self.c.ctl("claim", "step-%d" % n, "--fingerprint", "2" * 64)
                self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
                self.c.wait_converged(3)
        # Between the members themselves no MAC was ever wrong, at any step (a node with
        # both secrets that offered only its newest would be refused by one with the old).
        self.assertFalse(self.c.logs_contain(": authentication failed (")
                         or self.c.logs_contain("the peer's authentication is wrong"),
                         self.c.logs())
        # Every node now has only the new secret: the old one is refused, the new taken.
        lid = self.c.leader()
        node = self.c.nodes[lid]
        s, theirs = _connect(node.raft, old, lid)
        s.close()
        self.assertEqual(theirs, b"")
        s, theirs = _connect(node.raft, new, lid)
        s.close()
        self.assertEqual(len(theirs), 32)
        self.assertTrue(self.c.logs_contain(": authentication failed ("))

    def test_the_newest_common_key_is_used(self):
        old, new = self.c.raft_secret, "new-" + secrets.token_hex(20)
        lid = self.c.leader()
        fid = [n for n in sorted(self.c.nodes) if n != lid][0]
        self.c.stop(fid)
        self.c.node_raft_secrets[fid] = new
        self.c.node_raft_previous[fid] = old
        self.c._write_config(self.c.nodes[fid], self.c.bootstrap)
        self.c.start(fid)
        self.c.wait_converged(3)
        addr = self.c.nodes[fid].raft
        # A peer with both: answered with the new one, whatever their order.
        for order in ([new, old], [old, new]):
            s, theirs = _connect(addr, new, fid, mac_secrets=order, expect_secret=new)
            s.close()
            self.assertEqual(len(theirs), 32)
        # A peer with the old one only: answered with it.
        s, theirs = _connect(addr, old, fid)
        s.close()
        self.assertEqual(len(theirs), 32)
        # The answer covers the MACs as sent: one struck out (zeroed) on the way would make
        # the connector check against what it did not send, and refuse.
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            nonce_l, nonce_c = recv_exact(s, GREETING)[8:40], os.urandom(32)
            sent = (_mac(new, b"connector", nonce_l, nonce_c, 99, fid, b"127.0.0.1:1")
                    + _mac(old, b"connector", nonce_l, nonce_c, 99, fid, b"127.0.0.1:1"))
            stripped = bytes(32) + sent[32:]
            s.sendall(_handshake(99) + nonce_c + stripped)
            theirs = recv_exact(s, 32)
            self.assertEqual(theirs, _mac(old, b"listener", nonce_l, nonce_c, 99, fid,
                                          b"127.0.0.1:1", stripped))
            self.assertNotEqual(theirs, _mac(old, b"listener", nonce_l, nonce_c, 99, fid,
                                             b"127.0.0.1:1", sent))
        finally:
            s.close()


# ---- TLS between the members (tls.raft) --------------------------------------------------

class RaftTlsCluster(Cluster):
    """A harness cluster with tls.raft on every node but those in `plain`: one PKI (made with
    the openssl CLI in the cluster's temp dir, test_tls_bench.make_pki), node certificates
    for 127.0.0.1 with both key usages, tls.ca_file set (mutual TLS). The RPC stays plain
    TCP (tls.rpc off), so the harness's idemctl calls need no TLS flags."""

    def __init__(self, plain=(), **kw):
        self.plain = set(plain)
        self.pki = None
        super().__init__(**kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if self.pki is None:
            self.pki = os.path.join(self.root, "pki")
            os.makedirs(self.pki, exist_ok=True)
            make_pki(self.pki)
        if node.id in self.plain:
            return
        with open(node.cfg, "a") as f:
            f.write("tls:\n  cert_file: %s/node.crt\n  key_file: %s/node.key\n"
                    "  ca_file: %s/ca.crt\n  raft: true\n" % (self.pki, self.pki, self.pki))

    def tls_client(self, cert="node", ca="ca"):
        """A TLS client context as a member's: trusts ca.crt (or another CA), presents
        cert.crt (None: no certificate)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(os.path.join(self.pki, ca + ".crt"))
        if cert is not None:
            ctx.load_cert_chain(os.path.join(self.pki, cert + ".crt"),
                                os.path.join(self.pki, cert + ".key"))
        return ctx


class RaftTlsTestCase(ClusterTestCase):
    def make_cluster(self):
        return RaftTlsCluster(**self.cluster_opts)


def _tls_refused(ctx, addr):
    """Whether a TLS connection of ctx to addr is refused: its handshake fails, or (TLS 1.3:
    the client is done before the server checked its certificate) the server's alert or
    close comes before any byte."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s = ctx.wrap_socket(s, server_hostname=host)
        s.settimeout(10)
        return s.recv(1) == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.close()


class TestRaftTls(RaftTlsTestCase):
    """Three members with tls.raft and the cluster's raft.secret_file: the authentication
    runs inside TLS."""
    raft_auth_failure_expected = True  # a MAC under another secret, on purpose

    def _claims(self, prefix, n=3, ids=None):
        for i in range(n):
            rc, out = self.c.ctl("claim", "%s-%d" % (prefix, i), "--fingerprint", "7" * 64,
                                 ids=ids)
            self.assertEqual((rc, out and out["outcome"]), (0, "acquired"), out)

    def test_serves_through_a_leader_kill_and_a_follower_restart(self):
        self._claims("first")
        self.c.wait_converged(3)
        # The leader dies (SIGKILL): the two others elect one of theirs and commit.
        old = self.c.leader()
        self.c.kill(old)
        new = self.c.wait_leader(timeout=20, exclude=old)
        self.assertNotEqual(new, old)
        self._claims("after-kill")
        # The old leader comes back as a follower and catches up over TLS.
        self.c.start(old)
        self.c.wait_converged(3)
        # A follower stopped while claims commit catches up when it starts again.
        fid = [n for n in sorted(self.c.nodes) if n != self.c.leader()][0]
        self.assertEqual(self.c.stop(fid), 0)
        self._claims("while-stopped")
        self.c.start(fid)
        self.c.wait_converged(3)
        # Between the members no TLS handshake ever failed (a killed node's connections may
        # end during one: that is the peer closing, not a failure).
        self.assertFalse(self.c.logs_contain("TLS handshake failed"), self.c.logs())
        self.assertFalse(self.c.logs_contain(": TLS error: "), self.c.logs())

    def test_a_connection_without_tls_gets_nothing(self):
        lid = self.c.leader()
        node = self.c.nodes[lid]
        before = _metric(node.http, "idem_raft_connections_refused_total")
        # raft_uv's handshake and the message that crashed libraft 0.15, in the clear: the
        # TLS handshake fails on the first bytes, the connection is closed.
        host, port = node.raft.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            s.sendall(_handshake() + MALFORMED["entry of an invalid type"])
            self.assertTrue(_closed(s, 5))
        finally:
            s.close()
        wait_for(lambda: self.c.logs_contain(": TLS handshake failed: "), 5, "the refusal")
        self.assertTrue(self.c.logs_contain("raft connection refused from 127.0.0.1:"))
        self.assertTrue(self.c.logs_contain("(has the peer tls.raft on, and a certificate "
                                            "signed by tls.ca_file?)"))
        self.assertEqual(_metric(node.http, "idem_raft_connections_refused_total"), before + 1)
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 0)
        # Once per 10 s per peer: a second one is counted, not logged again.
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(_handshake())
        self.assertTrue(_closed(s, 5))
        s.close()
        wait_for(lambda: _metric(node.http, "idem_raft_connections_refused_total") == before + 2,
                 5, "the second refusal counted")
        with open(node.log, "rb") as f:
            self.assertEqual(f.read().count(b": TLS handshake failed: "), 1)
        # Unfinished TLS handshakes hold the handshake slots (64) and time: a 65th connection
        # closes the oldest, and one that never speaks is closed after 10 s.
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(64)]
        try:
            time.sleep(0.2)  # every one accepted, in order
            newest = socket.create_connection((host, int(port)), timeout=10)
            silent.append(newest)
            self.assertTrue(_closed(silent[0], 5))
            self.assertFalse(_closed(silent[1], 0.2))
            start = time.monotonic()
            self.assertTrue(_closed(newest, 20))
            self.assertLess(time.monotonic() - start, 12)
        finally:
            for x in silent:
                x.close()
        self.assertIsNone(node.proc.poll(), self.c.logs())
        self.assertEqual(self.c.leader(), lid)
        rc, out = self.c.ctl("claim", "after-plaintext", "--fingerprint", "c" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)

    def test_a_certificate_the_ca_did_not_sign_gets_nothing(self):
        lid = self.c.leader()
        node = self.c.nodes[lid]
        before = _metric(node.http, "idem_raft_connections_refused_total")
        # Self-signed by another CA; and none at all.
        self.assertTrue(_tls_refused(self.c.tls_client(cert="other-ca"), node.raft))
        self.assertTrue(_tls_refused(self.c.tls_client(cert=None), node.raft))
        wait_for(lambda: _metric(node.http, "idem_raft_connections_refused_total") == before + 2,
                 5, "both refusals counted")
        self.assertTrue(self.c.logs_contain(": TLS handshake failed: "))
        self.assertTrue(self.c.logs_contain("certificate"))
        # A member's certificate gets through TLS, and then the authentication (inside TLS)
        # still decides: the node greets and answers with the secret's MAC, and without
        # the secret it answers nothing.
        ctx = self.c.tls_client()
        s, theirs = _connect(node.raft, self.c.raft_secret, lid, tls=ctx)
        s.close()
        self.assertEqual(len(theirs), 32)
        s, theirs = _connect(node.raft, self.c.raft_secret, lid, tls=ctx,
                             mac_secrets=["another-" + "x" * 30])
        s.close()
        self.assertEqual(theirs, b"")
        # The connector checks the node's certificate too: a client trusting another CA
        # refuses it.
        host, port = node.raft.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        try:
            with self.assertRaises(ssl.SSLCertVerificationError):
                self.c.tls_client(ca="other-ca").wrap_socket(raw, server_hostname=host)
        finally:
            raw.close()
        self.assertIsNone(node.proc.poll(), self.c.logs())
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 0)
        rc, out = self.c.ctl("claim", "after-untrusted", "--fingerprint", "d" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)


class TestRaftTlsWithoutSecret(RaftTlsTestCase):
    """tls.raft without raft.secret_file: TLS alone decides who gets in (any certificate the
    CA signed; the nodes warn at start), and what reaches raft is still checked."""
    cluster_opts = dict(raft_secret=None)
    malformed_raft_expected = True

    def test_tls_alone(self):
        rc, out = self.c.ctl("claim", "tls-only", "--fingerprint", "f" * 64)
        self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        self.c.wait_converged(3)
        self.assertTrue(self.c.logs_contain("raft.secret_file is not set: the Raft port (%s) "
                                            "takes connections from anyone with a certificate "
                                            "signed by tls.ca_file" % self.c.nodes[1].raft))
        lid = self.c.leader()
        node = self.c.nodes[lid]
        # No greeting: inside TLS the node waits for raft_uv's handshake, and the malformed
        # message gets as far as the check in front of libraft's decoder.
        host, port = node.raft.rsplit(":", 1)
        s = self.c.tls_client().wrap_socket(socket.create_connection((host, int(port)),
                                                                     timeout=10),
                                            server_hostname=host)
        try:
            s.sendall(_handshake() + MALFORMED["entry of an invalid type"])
            self.assertTrue(_closed(s, 5))
        finally:
            s.close()
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 1)
        # Without a certificate of the CA, nothing.
        self.assertTrue(_tls_refused(self.c.tls_client(cert="other-ca"), node.raft))
        self.assertEqual(_metric(node.http, "idem_raft_messages_refused_total"), 1)
        self.assertIsNone(node.proc.poll())
        self.assertEqual(self.c.leader(), lid)


class TestRaftTlsMismatch(RaftTlsTestCase):
    """Node 3 without tls.raft (nodes 1 and 2 with it): each side refuses the other's
    connections, and says why; with tls.raft node 3 catches up."""
    cluster_opts = dict(plain=[3])

    def cluster_ready(self):
        self.c.wait_leader(timeout=self.leader_timeout, ids=[1, 2])

    def test_all_members_or_none(self):
        for i in range(3):
            rc, out = self.c.ctl("claim", "mismatch-%d" % i, "--fingerprint", "e" * 64,
                                 ids=[1, 2])
            self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
        # Nodes 1 and 2 refuse node 3's plaintext handshakes; node 3 refuses their
        # ClientHellos as a handshake of an unknown protocol, and their TLS clients refuse
        # its plaintext greeting (the authentication's, in the clear); each says so.
        wait_for(lambda: self.c.logs_contain("refused from 127.0.0.1:"), 20,
                 "nodes 1 and 2 refusing node 3")
        wait_for(lambda: self.c.logs_contain(": unknown handshake protocol"), 20,
                 "node 3 refusing the others")
        wait_for(lambda: self.c.logs_contain("raft connection to node 3 failed: TLS handshake "
                                             "failed: "), 20,
                 "the others' connections to node 3 failing")
        self.assertTrue(self.c.logs_contain("(has node 3 tls.raft on, and a certificate signed "
                                            "by tls.ca_file for the host of its raft address?)"))
        self.assertTrue(self.c.logs_contain(": TLS handshake failed: "))
        st = self.c.status(ids=[3])
        n3 = [x for x in (st or {}).get("nodes", []) if x.get("id") == 3]
        self.assertEqual(len(n3), 1, st)
        self.assertLessEqual(n3[0]["applied_index"], 1, st)
        # With tls.raft, node 3 catches up.
        self.c.stop(3)
        self.c.plain.discard(3)
        self.c._write_config(self.c.nodes[3], self.c.bootstrap)
        self.c.start(3)
        self.c.wait_converged(3)


class _Relay:
    """A TCP relay: listens on addr and pipes each connection to target both ways, keeping a
    copy of every byte it carries (seen)."""

    def __init__(self, addr, target):
        host, port = addr.rsplit(":", 1)
        thost, tport = target.rsplit(":", 1)
        self.target = (thost, int(tport))
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind((host, int(port)))
        self.srv.listen(16)
        self.seen = bytearray()
        self.lock = threading.Lock()
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.srv.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.target, timeout=5)
                b.settimeout(None)
            except OSError:
                a.close()
                continue
            with self.lock:
                self.socks += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    def _pipe(self, x, y):
        try:
            while True:
                data = x.recv(65536)
                if not data:
                    break
                with self.lock:
                    self.seen += data
                y.sendall(data)
        except OSError:
            pass
        for z in (x, y):
            try:
                z.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def bytes_seen(self):
        with self.lock:
            return bytes(self.seen)

    def close(self):
        self.srv.close()
        with self.lock:
            for z in self.socks:
                z.close()


class RaftWireCases:
    """A follower restarted on another port, the others still dialling its old one, where a
    relay now forwards to it: the leader's entries to it pass through the relay."""
    tls = True

    def make_cluster(self):
        return RaftTlsCluster(plain=[] if self.tls else [1, 2, 3], **self.cluster_opts)

    def test_what_a_relay_between_two_members_sees(self):
        lid = self.c.leader()
        fid = [n for n in sorted(self.c.nodes) if n != lid][0]
        node = self.c.nodes[fid]
        old = node.raft
        self.assertEqual(self.c.stop(fid), 0)
        node.raft = "127.0.0.1:%d" % free_port()
        self.c._write_config(node, self.c.bootstrap)  # its data dir has the configuration
        relay = _Relay(old, node.raft)
        try:
            self.c.start(fid)
            key = "wire-key-" + secrets.token_hex(12)
            for i in range(3):
                rc, out = self.c.ctl("claim", "%s-%d" % (key, i), "--fingerprint", "9" * 64)
                self.assertEqual((rc, out["outcome"]), (0, "acquired"), out)
            self.c.wait_converged(3)
            self.assertEqual(self.c.leader(), lid, "the entries went from the leader")
            seen = relay.bytes_seen()
        finally:
            relay.close()
        # Each claim's entry passed through the relay: the follower has no other way in.
        # Without TLS that is seen in its key; with TLS, in more than a handshake's bytes.
        if self.tls:
            self.assertGreater(len(seen), 1000)
            self.assertNotIn(key.encode(), seen)
            self.assertNotIn(b"alpha", seen)  # the tenant of every claim
            # Not raft_uv's handshake either: a TLS record (handshake, type 22) comes first.
            self.assertEqual(seen[0], 22)
        else:
            for i in range(3):
                self.assertIn(("%s-%d" % (key, i)).encode(), seen)


class TestRaftTlsWire(RaftWireCases, ClusterTestCase):
    tls = True


class TestRaftPlainWire(RaftWireCases, ClusterTestCase):
    """The same relay without tls.raft sees the claims' keys: what the TLS case checks is
    there to be seen."""
    tls = False


if __name__ == "__main__":
    unittest.main()
