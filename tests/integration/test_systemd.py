"""systemd's view of a node (server/notify.c) and its log (server/log.c): a node started with
NOTIFY_SOCKET naming a Unix datagram socket of the test's, as systemd would for Type=notify,
and WATCHDOG_USEC, alone of its three members: it says it is waiting for a leader and pings
the watchdog, and sends READY=1 only once a second member lets a leader be elected; STOPPING=1
at SIGTERM. Its `log:` asks for JSON lines at debug level: every line parses, and the lines
about a gateway request and an RPC request carry their request ids.
Run: IDEM_BIN_DIR=build/bin python3 -m unittest -v test_systemd
"""
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ClusterTestCase, fp, http_request, wait_for  # noqa: E402

WATCHDOG_USEC = 200000  # a ping every 100 ms


class Notifications:
    """A Unix datagram socket as systemd's notify socket: each datagram with its sender's
    PID (SCM_CREDENTIALS), as systemd checks it for NotifyAccess=main."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="idem-notify-")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(self.path)
        self.got = []  # (monotonic time, pid, {field: value} in order, raw text)

    def close(self):
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def receive(self, seconds):
        """Takes what arrives within `seconds`."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                return
            pid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            text = data.decode()
            fields = [tuple(line.split("=", 1)) for line in text.split("\n") if line]
            self.got.append((time.monotonic(), pid, fields, text))

    def wait(self, cond, seconds, what):
        """Receives until cond(fields) holds for a datagram; returns that datagram's index."""
        end = time.monotonic() + seconds
        seen = 0
        while time.monotonic() < end:
            self.receive(min(0.2, max(end - time.monotonic(), 0.01)))
            for i in range(seen, len(self.got)):
                if cond(dict(self.got[i][2])):
                    return i
            seen = len(self.got)
        raise AssertionError("no %s within %s s; got %r" % (what, seconds,
                                                             [g[3] for g in self.got]))


class TestSystemd(ClusterTestCase):
    def setUp(self):
        super().setUp()
        self.n = Notifications()

    def tearDown(self):
        self.n.close()
        super().tearDown()

    def start_notified(self, nid):
        """Starts node nid with the notify socket and a watchdog in its environment only."""
        env = {"NOTIFY_SOCKET": self.n.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.c.start(nid)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_notify_and_log(self):
        c = self.c
        for nid in (1, 2, 3):
            self.assertEqual(c.stop(nid), 0)
        node = c.nodes[1]
        with open(node.cfg, "a") as f:
            f.write("log:\n  level: debug\n  format: json\n")
        log_start = os.path.getsize(node.log)

        # Alone of three members: no leader can be elected, so no READY=1, whatever the wait.
        self.start_notified(1)
        pid = node.proc.pid
        self.n.receive(3.0)
        texts = [g[3] for g in self.n.got]
        self.assertTrue(self.n.got, "nothing arrived on the notify socket")
        self.assertEqual({g[1] for g in self.n.got}, {pid}, "a sender other than the node")
        self.assertFalse([t for t in texts if "READY=1" in t], texts)
        statuses = [dict(g[2])["STATUS"] for g in self.n.got if "STATUS" in dict(g[2])]
        self.assertEqual(statuses[0], "starting")
        self.assertRegex(statuses[-1], r"^waiting for a leader \(term \d+\)$")
        pings = [g[0] for g in self.n.got if g[2] == [("WATCHDOG", "1")]]
        # 3 s at one ping per 100 ms: at least half of them, however loaded the machine.
        self.assertGreaterEqual(len(pings), 15, texts)
        self.assertLess(max(b - a for a, b in zip(pings, pings[1:])), 1.0)

        # A second member: a leader is elected, and READY=1 comes with its STATUS.
        before = len(self.n.got)
        c.start(2)
        i = self.n.wait(lambda f: f.get("READY") == "1", 30, "READY=1")
        self.assertGreaterEqual(i, before)
        ready = dict(self.n.got[i][2])
        self.assertRegex(ready["STATUS"], r"^leader [12]( \(this node\))?, term \d+$")
        leader = int(ready["STATUS"].split()[1].rstrip(","))
        self.assertEqual("(this node)" in ready["STATUS"], leader == 1)
        self.assertEqual(c.wait_leader(ids=[1, 2]), leader)

        # A claim through node 1's gateway with our request id, and one over its RPC.
        rid = "systemd-it-7f3a"
        r = http_request(node.http, "POST", "/v1/claims", {"fingerprint": fp(1)},
                         headers={"Authorization": "Bearer " + c.token,
                                  "Idempotency-Key": "k-systemd-1", "X-Request-Id": rid})
        self.assertIn(r[0], (200, 201), r)
        rc, out = c.ctl("claim", "k-systemd-2", "--fingerprint", fp(2), ids=[1])
        self.assertEqual(rc, 0, out)

        # SIGTERM: STOPPING=1, and the node exits 0.
        before = len(self.n.got)
        self.assertEqual(c.stop(1), 0)
        i = self.n.wait(lambda f: f.get("STOPPING") == "1", 10, "STOPPING=1")
        self.assertGreaterEqual(i, before)
        self.assertEqual(dict(self.n.got[i][2]).get("STATUS"), "shutting down")
        self.n.receive(0.2)
        self.assertFalse([g for g in self.n.got[i + 1:] if "STATUS" in dict(g[2])])

        # Node 1's log since the restart: JSON lines only, with the request ids.
        with open(node.log, "rb") as f:
            f.seek(log_start)
            lines = f.read().decode().splitlines()
        objs = [json.loads(line) for line in lines]
        self.assertTrue(objs)
        for o in objs:
            self.assertEqual(o["node"], 1)
            self.assertIn(o["level"], ("debug", "info", "warn", "error"))
            self.assertRegex(o["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertTrue([o for o in objs if o["msg"] == "systemd watchdog: a ping every 100 ms"])
        http = [o for o in objs if o.get("request_id") == rid]
        self.assertTrue(http, "no line with the gateway's request id")
        self.assertTrue([o for o in http if o["level"] == "debug"
                         and o["msg"].startswith("http: claim answered 20")], http)
        rpc = [o for o in objs if o["msg"].startswith("rpc: claim answered ")]
        self.assertTrue(rpc, "no debug line of the RPC claim")
        self.assertRegex(rpc[-1].get("request_id", ""), r"^rpc-\d+-\d+$")
        # Never a key: neither the gateway's nor the RPC's.
        self.assertNotIn("k-systemd-", "\n".join(lines))


if __name__ == "__main__":
    unittest.main()
