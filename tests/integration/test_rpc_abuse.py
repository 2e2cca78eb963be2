"""Hostile peers of the RPC listener (server/rpc.c, rpc_scan.c, rpc_admit.c).

Decoding: a frame is checked by a walk over its wire format before protobuf-c decodes it
(fields per frame capped, unknown field numbers refused) and its token before the decode;
until a connection has sent a known token, its frames are limited to
rpc.unauthenticated_max_frame_bytes. Before, every frame up to max_frame_bytes was decoded
first: frames of millions of tiny or unknown fields took the leader's loop for most of a
second each, and a flood of them from a client without a token cost the leader its
leadership (TestDecodeFlood).

Slots: a connection sends its first frame within rpc.first_frame_timeout_ms; one address
holds at most rpc.max_connections_per_address; a new connection past the cap takes the slot
of the oldest connection that has not authenticated; and members (the cluster's addresses,
or the cluster secret) have slots of their own. Before, idle sockets held every slot until
the idle timeout (300 s) and locked out clients and the followers' forwards
(TestConnectionSlots, TestConnectionsPerAddress).

The cluster's nodes listen on 127.0.0.1, which is so a member address; the hostile peers
connect from other loopback addresses (127.0.0.2 and up).

Run: IDEM_BIN_DIR=build/bin python3 -m unittest -v test_rpc_abuse
"""
import hashlib
import json
import os
import secrets
import select
import signal
import socket
import struct
import threading
import time

from harness import Cluster, ClusterTestCase, fp, http_request, wait_for
from test_cluster import _read_frame
from test_rpc_limits import (LimitCluster, _claim_frame, _closed, _get_frame, _pb,
                             _read_answer, _varint)

OUTCOME_ACQUIRED = 1
OUTCOME_OK = 8
OUTCOME_NOT_FOUND = 10
OUTCOME_INVALID = 12
OUTCOME_UNAUTHENTICATED = 15
OUTCOME_FORBIDDEN = 16
FLOOD_S = 8  # how long the hostile frames are sent
BIG = 4 << 20  # a hostile frame's size: under the default max_frame_bytes


def _connect_from(src, addr, timeout=15):
    """A TCP connection to addr ("host:port") from the loopback address src."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect((host, int(port)))
    return s


def _frame(body):
    return struct.pack(">I", len(body)) + body


def _unknown_fields_frame(size, request_id=7):
    """A get without a token, then unknown fields (number 100, varint 0, 3 bytes each) up to
    `size` bytes: protobuf-c keeps a copy of every unknown field."""
    head = b"\x08" + _varint(request_id) + _pb(14, _pb(1, b"k"))
    return _frame(head + b"\xa0\x06\x00" * ((size - len(head)) // 3))


def _tiny_fields_frame(size, request_id=9):
    """A get without a token whose deadline_ms (a varint, 2 bytes) comes again and again up
    to `size` bytes: protobuf-c scans every occurrence before it keeps the last."""
    head = b"\x08" + _varint(request_id) + _pb(14, _pb(1, b"k"))
    return _frame(head + b"\x10\x01" * ((size - len(head)) // 2))


def _metrics(http):
    """Every sample of a node's /metrics: {"name{labels}": value}."""
    out = {}
    for line in http_request(http, "GET", "/metrics").raw.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _claim_json(http, token, key):
    return http_request(http, "POST", "/v1/claims", {"fingerprint": fp(key)},
                        headers={"Authorization": "Bearer " + token, "Idempotency-Key": key},
                        timeout=15)


class _Flooder(threading.Thread):
    """Sends copies of `frame` from `src` to addr for `seconds`, pipelined, reading (and
    counting) the answers on a thread of its own; reconnects when the server closes the
    connection."""

    def __init__(self, src, addr, frame, seconds):
        super().__init__(daemon=True)
        self.src, self.addr, self.frame, self.seconds = src, addr, frame, seconds
        self.sent = 0
        self.answers = {}
        self.connections = 0

    def _reader(self, s):
        while True:
            try:
                r = _read_frame(s)
            except OSError:
                return
            if r is None:
                return
            oc = r[1].get(1, 0)
            self.answers[oc] = self.answers.get(oc, 0) + 1

    def run(self):
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            try:
                s = _connect_from(self.src, self.addr, timeout=1)
            except OSError:
                time.sleep(0.05)
                continue
            self.connections += 1
            reader = threading.Thread(target=self._reader, args=(s,), daemon=True)
            reader.start()
            view = memoryview(self.frame)
            try:
                while time.monotonic() < end:
                    off = 0
                    while off < len(view) and time.monotonic() < end:
                        try:
                            off += s.send(view[off:off + (1 << 20)])
                        except socket.timeout:
                            continue
                    self.sent += off
            except OSError:
                pass
            finally:
                s.close()
                reader.join(timeout=5)


class TestDecodeFlood(ClusterTestCase):
    """Three nodes; hostile frames from peers without a token go to the leader while a
    tenant keeps claiming there."""

    def test_hostile_frames_do_not_cost_the_leader_its_leadership(self):
        lid = self.c.wait_leader(timeout=20)
        leader = self.c.nodes[lid]

        def leader_changes():
            return {nid: _metrics(n.http)["idem_raft_leader_changes_total"]
                    for nid, n in self.c.nodes.items()}
        # Every node has learned the leader (which counts as a change) before the baseline.
        changes = wait_for(lambda: (lambda ch: ch if min(ch.values()) >= 1 else None)(
            leader_changes()), 20, "every node to know the leader")
        terms = {n["id"]: n["term"] for n in self.c.status()["nodes"]}
        flooders = [_Flooder("127.0.0.2", leader.rpc, _unknown_fields_frame(BIG), FLOOD_S),
                    _Flooder("127.0.0.3", leader.rpc, _tiny_fields_frame(BIG), FLOOD_S),
                    _Flooder("127.0.0.4", leader.rpc, _tiny_fields_frame(60000), FLOOD_S)]
        for f in flooders:
            f.start()
        # A tenant claims on its own connection meanwhile, one claim at a time.
        host, port = leader.rpc.split(":")
        s = socket.create_connection((host, int(port)), timeout=15)
        latencies, outcomes = [], []
        end = time.monotonic() + FLOOD_S
        i = 0
        while time.monotonic() < end:
            i += 1
            t0 = time.monotonic()
            s.sendall(_claim_frame(i, self.c.token, "during-flood-%d" % i, deadline_ms=5000))
            a = _read_answer(s)
            latencies.append(time.monotonic() - t0)
            outcomes.append(a and a[1])
            if a is None:
                break
        s.close()
        for f in flooders:
            f.join(timeout=30)
        sent = sum(f.sent for f in flooders)
        # The flood was sent (at least 10 of the large frames' worth).
        self.assertGreater(sent, 10 * BIG, [f.sent for f in flooders])
        # Every claim was answered, acquired, none after long.
        self.assertGreaterEqual(len(outcomes), 20, (outcomes, latencies))
        self.assertEqual(set(outcomes), {OUTCOME_ACQUIRED}, outcomes)
        self.assertLess(max(latencies), 1.5, latencies)
        # The leader still leads, in the same term; nobody saw a leader change.
        st = self.c.status()
        self.assertEqual(st["leader_id"], lid, st)
        self.assertEqual({n["id"]: n["term"] for n in st["nodes"]}, terms, st)
        self.assertEqual(leader_changes(), changes)
        # The hostile frames were refused before they were decoded: answered unauthenticated
        # (the large ones, past rpc.unauthenticated_max_frame_bytes without a token) or
        # invalid (too many fields).
        m = _metrics(leader.http)
        self.assertGreater(m['idem_rpc_frames_rejected_total{reason="unauthenticated"}'], 0, m)
        self.assertGreater(m['idem_rpc_frames_rejected_total{reason="fields"}'], 0, m)
        self.assertGreater(flooders[0].answers.get(OUTCOME_UNAUTHENTICATED, 0), 0,
                           flooders[0].answers)


class SlotsTest(ClusterTestCase):
    rpc_lines = []
    n = 3

    def make_cluster(self):
        return LimitCluster(self.rpc_lines, n=self.n)

    def leader_and_follower(self):
        lid = self.c.wait_leader(timeout=20)
        follower = [n for n in self.c.nodes.values() if n.id != lid][0]
        return self.c.nodes[lid], follower

    def claim_from(self, src, rpc, key, rid=1):
        """A claim on a new connection from src: its answer, None when it was closed."""
        try:
            s = _connect_from(src, rpc)
        except OSError:
            return None
        try:
            s.sendall(_claim_frame(rid, self.c.token, key))
            return _read_answer(s)
        except OSError:
            return None
        finally:
            s.close()


class TestConnectionSlots(SlotsTest):
    # 64 slots; members (127.0.0.1 here) keep 32 of them (the default 32, at most half).
    rpc_lines = ["max_connections: 64"]

    def test_idle_sockets_leave_room_for_clients_and_members(self):
        leader, follower = self.leader_and_follower()
        t0 = time.monotonic()
        idle = [_connect_from("127.0.0.2", leader.rpc) for _ in range(64)]
        try:
            # A client from another address is served at once: its connection takes the slot
            # of the oldest idle one.
            a = self.claim_from("127.0.0.3", leader.rpc, "slots-client")
            self.assertEqual(a and a[:2], (1, OUTCOME_ACQUIRED), a)
            # A follower forwards its client's claim (JSON API) to the leader.
            r = _claim_json(follower.http, self.c.token, "slots-forwarded")
            self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)
            # Every idle socket is closed: the oldest ones to admit the newer, the others once
            # rpc.first_frame_timeout_ms (5 s) passed without a frame, not after the idle
            # timeout (300 s).
            for i, s in enumerate(idle):
                self.assertTrue(_closed(s, timeout=max(0.1, t0 + 12 - time.monotonic())),
                                "idle socket %d still open %.1f s after it connected"
                                % (i, time.monotonic() - t0))
        finally:
            for s in idle:
                s.close()
        m = _metrics(leader.http)
        self.assertGreaterEqual(m['idem_rpc_connections_dropped_total{reason="evicted"}'], 32, m)
        self.assertGreater(m['idem_rpc_connections_dropped_total{reason="first_frame_timeout"}'],
                           0, m)

    def test_authenticated_connections_leave_room_for_members(self):
        leader, follower = self.leader_and_follower()
        held, refused = [], 0
        try:
            # Clients that authenticate and then hold their connections: they get the 32 slots
            # that are not kept for members, and the others are closed at once.
            for i in range(64):
                s = _connect_from("127.0.0.2", leader.rpc)
                try:
                    s.sendall(_get_frame(i + 1, self.c.token, "held-%d" % i))
                    a = _read_answer(s)
                except OSError:
                    a = None
                if a is None:
                    refused += 1
                    s.close()
                else:
                    self.assertEqual(a[:2], (i + 1, OUTCOME_NOT_FOUND), a)
                    held.append(s)
            # A member's forward still gets in, through the slots kept for members.
            r = _claim_json(follower.http, self.c.token, "member-slot")
            self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)
            self.assertEqual((len(held), refused), (32, 32))
            m = _metrics(leader.http)
            self.assertEqual(m['idem_rpc_connections_refused_total{limit="connections"}'], 32, m)
        finally:
            for s in held:
                s.close()


class TestConnectionsPerAddress(SlotsTest):
    n = 1

    def test_one_address_holds_at_most_its_share(self):
        node = self.c.nodes[1]
        wait_for(lambda: self.c.status(), 20, "the node to answer")
        socks = [_connect_from("127.0.0.2", node.rpc) for _ in range(300)]
        try:
            # rpc.max_connections_per_address (256 by default): the other 44 are closed at
            # once. Counted before the first-frame timeout (5 s) closes the rest.
            time.sleep(1)
            readable, _, _ = select.select(socks, [], [], 0)
            closed = 0
            for s in readable:
                try:
                    closed += s.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
            self.assertEqual(closed, 44)
            # Another address is served.
            a = self.claim_from("127.0.0.3", node.rpc, "per-address")
            self.assertEqual(a and a[:2], (1, OUTCOME_ACQUIRED), a)
            m = _metrics(node.http)
            self.assertEqual(m['idem_rpc_connections_refused_total{limit="address"}'], 44, m)
        finally:
            for s in socks:
                s.close()


class _ManyTenantsCluster(Cluster):
    """A harness cluster with 20,000 more tenants, each with a token of its own."""
    EXTRA = 20000

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        with open(node.cfg, "a") as f:  # the tenants: list ends the file
            f.write("".join("  - name: extra-%d\n    token_sha256: %s\n"
                            % (i, hashlib.sha256(b"extra-token-%d" % i).hexdigest())
                            for i in range(self.EXTRA)))


class TestManyTenants(ClusterTestCase):
    """A client without a token sends small frames with an unknown one to a leader with
    20,000 tenants. The tenant was looked up by comparing the frame's token hash with every
    tenant's: 0.6 ms a frame, and one 64 KiB read of 14-byte frames held the leader's loop
    for seconds, past the election timeout (its leadership moved at 2,000 tenants already)."""

    def make_cluster(self):
        return _ManyTenantsCluster()

    def test_unknown_tokens_cost_a_lookup_not_a_pass_over_the_tenants(self):
        lid = self.c.wait_leader(timeout=30)
        leader = self.c.nodes[lid]
        # A get of "k" with the token "x", request id 1: 14 bytes, 4,681 to 64 KiB.
        frame = _frame(b"\x08\x01\x1a\x01x" + _pb(14, _pb(1, b"k")))
        terms = {n["id"]: n["term"] for n in self.c.status()["nodes"]}
        flooder = _Flooder("127.0.0.2", leader.rpc, frame * 4681, 4)
        flooder.start()
        host, port = leader.rpc.split(":")
        s = socket.create_connection((host, int(port)), timeout=15)
        outcomes = []
        end = time.monotonic() + 4
        i = 0
        while time.monotonic() < end:
            i += 1
            s.sendall(_claim_frame(i, self.c.token, "many-tenants-%d" % i, deadline_ms=5000))
            a = _read_answer(s)
            outcomes.append(a and a[1])
            if a is None:
                break
        s.close()
        flooder.join(timeout=30)
        self.assertGreater(flooder.sent, 10 * len(frame) * 4681, flooder.sent)
        self.assertGreater(flooder.answers.get(OUTCOME_UNAUTHENTICATED, 0), 0, flooder.answers)
        self.assertGreaterEqual(len(outcomes), 10, outcomes)
        self.assertEqual(set(outcomes), {OUTCOME_ACQUIRED}, outcomes)
        # The leader still leads, in the same term.
        st = self.c.status()
        self.assertEqual(st["leader_id"], lid, st)
        self.assertEqual({n["id"]: n["term"] for n in st["nodes"]}, terms, st)

    def test_a_reload_keeps_the_leader(self):
        """A reload gives each tenant the account of its name (service_set_config). Found by
        a pass over the accounts for each tenant, 20,000 tenants held the loop for 1.2 s,
        and the leader lost its leadership at every reload."""
        lid = self.c.wait_leader(timeout=30)
        terms = {n["id"]: n["term"] for n in self.c.status()["nodes"]}
        for _ in range(3):
            rc, out = self.c.ctl("reload", "--node", self.c.nodes[lid].rpc)
            self.assertEqual((rc, out["outcome"]), (0, "ok"), out)
        time.sleep(1.5)  # an election the reloads caused would have begun by now
        st = self.c.status()
        self.assertEqual(st["leader_id"], lid, st)
        self.assertEqual({n["id"]: n["term"] for n in st["nodes"]}, terms, st)
        # And the tenants still claim, each under its own account.
        rc, out = self.c.ctl("claim", "after-reloads", "--fingerprint", fp("after-reloads"))
        self.assertEqual(out["outcome"], "acquired", out)

    def test_reloads_asked_for_at_once_are_each_answered(self):
        """The file is read off the loop (server/reload.c): reloads asked for while one reads
        it wait for it, then the file is read once more for them; each gets its answer."""
        lid = self.c.wait_leader(timeout=30)
        node = self.c.nodes[lid]
        results = []

        def one():
            results.append(self.c.ctl("reload", "--node", node.rpc))
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        os.kill(node.proc.pid, signal.SIGHUP)
        for t in threads:
            t.join(timeout=90)
        self.assertEqual(len(results), 4, results)
        for rc, out in results:
            self.assertEqual((rc, out["outcome"]), (0, "ok"), out)
        # SIGHUP's reload and the four asked for: at least two reads of the file (one under
        # way, one for those that came meanwhile), each logged as reloaded.
        wait_for(lambda: open(node.log).read().count("configuration reloaded from") >= 2, 10,
                 "the reloads logged")

    def test_a_stop_during_a_reload_answers_it(self):
        """SIGTERM while the file is read: the reload is answered (done, or refused because
        the node stops) and the node exits cleanly (close() checks its log)."""
        lid = self.c.wait_leader(timeout=30)
        node = self.c.nodes[lid]
        results = []
        t = threading.Thread(
            target=lambda: results.append(self.c.ctl("reload", "--node", node.rpc)))
        t.start()
        wait_for(lambda: "reload (admin RPC): reading" in open(node.log).read(), 10,
                 "the reload to begin")
        os.kill(node.proc.pid, signal.SIGTERM)
        t.join(timeout=90)
        self.assertEqual(len(results), 1)
        rc, out = results[0]
        self.assertIsNotNone(out, "idemctl printed nothing")
        if rc != 0:
            self.assertIn("shutting down", json.dumps(out), out)
        self.assertEqual(self.c.wait_exit(lid, timeout=60), 0)


class _LongTokenCluster(Cluster):
    """A harness cluster with a third tenant, gamma, whose token is 5,000 bytes."""

    def __init__(self, **kw):
        self.long_token = secrets.token_hex(2500)
        super().__init__(**kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        with open(node.cfg, "a") as f:  # the tenants: list ends the file
            f.write("  - name: gamma\n    token_sha256: %s\n"
                    % hashlib.sha256(self.long_token.encode()).hexdigest())


class TestTokensOnOneConnection(ClusterTestCase):
    def make_cluster(self):
        return _LongTokenCluster(n=1)

    def test_each_request_answers_to_its_own_token(self):
        # A connection keeps its last known token with its digest (rpc_frames.c), so the same
        # token again is not hashed again; a request with another token is authorised as that
        # one, whatever the connection sent before. gamma's token is longer than a connection
        # keeps (TOKEN_KEEP_MAX, 4 KiB): after it, none is kept.
        node = self.c.nodes[1]
        wait_for(lambda: self.c.status(), 20, "the node to answer")
        host, port = node.rpc.split(":")
        s = socket.create_connection((host, int(port)), timeout=15)
        alpha, beta, gamma, admin = self.c.token, self.c.token2, self.c.long_token, self.c.admin
        steps = [  # (token, op, key, the outcome), request ids 1, 2, ...
            (alpha, _claim_frame, "mix", OUTCOME_ACQUIRED),
            (beta, _get_frame, "mix", OUTCOME_NOT_FOUND),  # alpha's record: not beta's
            (alpha, _get_frame, "mix", OUTCOME_OK),
            ("not-a-token", _get_frame, "mix", OUTCOME_UNAUTHENTICATED),
            (admin, _get_frame, "mix", OUTCOME_FORBIDDEN),  # the admin owns no records
            (alpha, _get_frame, "mix", OUTCOME_OK),
            (alpha + "x", _get_frame, "mix", OUTCOME_UNAUTHENTICATED),  # one byte longer
            (alpha[:-1], _get_frame, "mix", OUTCOME_UNAUTHENTICATED),  # and one shorter
            (gamma, _get_frame, "mix", OUTCOME_NOT_FOUND),  # not kept: alpha's is
            (gamma, _claim_frame, "mix-g", OUTCOME_ACQUIRED),
            (alpha, _get_frame, "mix-g", OUTCOME_NOT_FOUND),
            (gamma, _get_frame, "mix-g", OUTCOME_OK),
            (beta, _claim_frame, "mix", OUTCOME_ACQUIRED),  # beta's own record
            (beta, _get_frame, "mix", OUTCOME_OK),
            (gamma, _get_frame, "mix", OUTCOME_NOT_FOUND),  # beta's kept now
            (alpha, _get_frame, "mix", OUTCOME_OK),
        ]
        for rid, (token, op, key, want) in enumerate(steps, 1):
            s.sendall(op(rid, token, key))
            got = _read_answer(s)
            self.assertEqual(got[:2], (rid, want), (rid, got))
        s.close()

    def test_a_token_removed_by_a_reload_is_refused_after_a_long_one(self):
        # alpha's token is kept by the connection, then a reload removes it. gamma's token,
        # known but too long to keep, came next: the connection marked its kept token as
        # checked since the reload, though the kept one was still alpha's, and alpha's next
        # frame was taken and decoded instead of refused before its decode.
        node = self.c.nodes[1]
        wait_for(lambda: self.c.status(), 20, "the node to answer")
        host, port = node.rpc.split(":")
        s = socket.create_connection((host, int(port)), timeout=15)
        alpha, gamma = self.c.token, self.c.long_token
        s.sendall(_claim_frame(1, alpha, "before-reload"))
        self.assertEqual(_read_answer(s)[:2], (1, OUTCOME_ACQUIRED))
        with open(node.cfg) as f:
            text = f.read()
        old = hashlib.sha256(alpha.encode()).hexdigest()
        self.assertIn(old, text)
        with open(node.cfg, "w") as f:
            f.write(text.replace(old, hashlib.sha256(b"alpha-rotated").hexdigest()))
        rc, out = self.c.ctl("reload", "--node", node.rpc)
        self.assertEqual((rc, out["outcome"]), (0, "ok"), out)
        s.sendall(_get_frame(2, gamma, "before-reload"))
        self.assertEqual(_read_answer(s)[:2], (2, OUTCOME_NOT_FOUND))  # gamma's: known
        name = 'idem_rpc_frames_rejected_total{reason="unauthenticated"}'
        before = _metrics(node.http).get(name, 0)
        s.sendall(_get_frame(3, alpha, "before-reload"))
        got = _read_answer(s)
        self.assertTrue(got is None or got[:2] == (3, OUTCOME_UNAUTHENTICATED), got)
        self.assertEqual(_metrics(node.http).get(name, 0), before + 1)
        s.close()


class TestUnauthenticatedFrames(SlotsTest):
    n = 1

    def test_large_frames_need_a_known_token_first(self):
        node = self.c.nodes[1]
        wait_for(lambda: self.c.status(), 20, "the node to answer")
        host, port = node.rpc.split(":")
        pad = b"x" * 100000  # a 100 KB key: past the default 64 KiB before a known token
        # Without a token: answered unauthenticated under its id, skipped unread, and the
        # connection carries on.
        s = socket.create_connection((host, int(port)), timeout=15)
        body = b"\x08\x05" + _pb(14, _pb(1, pad))
        s.sendall(_frame(body) + _get_frame(6, "", "small"))
        self.assertEqual(_read_answer(s)[:2], (5, OUTCOME_UNAUTHENTICATED))
        self.assertEqual(_read_answer(s)[:2], (6, OUTCOME_UNAUTHENTICATED))
        s.close()
        # With a known token before the op (as protobuf-c lays a request out), the same
        # frame is read and decoded (a key that long is invalid).
        s = socket.create_connection((host, int(port)), timeout=15)
        body = b"\x08\x05" + _pb(3, self.c.token.encode()) + _pb(14, _pb(1, pad))
        s.sendall(_frame(body))
        self.assertEqual(_read_answer(s)[:2], (5, OUTCOME_INVALID))
        s.close()
        # A frame of tiny fields is refused before protobuf-c decodes it: invalid, under
        # its id, and the connection closes.
        s = socket.create_connection((host, int(port)), timeout=15)
        s.sendall(_tiny_fields_frame(60000, request_id=8))
        self.assertEqual(_read_answer(s)[:2], (8, OUTCOME_INVALID))
        self.assertTrue(_closed(s))
        s.close()
        m = _metrics(node.http)
        self.assertEqual(m['idem_rpc_frames_rejected_total{reason="unauthenticated"}'], 2, m)
        self.assertEqual(m['idem_rpc_frames_rejected_total{reason="fields"}'], 1, m)
