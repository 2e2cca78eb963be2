"""Integration tests of idemd's HTTP proxy mode (CONTRACT.md §3-§4): real three-node clusters
on 127.0.0.1 (harness.Cluster with a `proxy:` section appended to each node's YAML) in front of
a real HTTP/1.1 business service (order_service.py, a subprocess killed by PID). Each class can
run as its own ctest:

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_proxy.TestProxyBasics

Classes: TestProxyBasics (replay, mismatch, canonical JSON, pass-through, key errors, route
statuses 422/425, followers answer 503), TestProxyConcurrency (50 identical requests: one
execution), TestProxyFailures (upstream killed / hanging / closing / refusing, 4xx, 5xx, too
large, lease expiry with takeover and conflict), TestProxyExpiry (ttl into tombstone: 410).

Proxy traffic goes to the leader's proxy listener: in this first version a follower's proxy
answers 503 idempotency_unavailable. Executions are counted from the order service's own
log file (flushed before it answers), which survives a kill and a restart of the service.
Waits poll a condition with a generous bound; nothing sleeps for a fixed time.
"""
import email.utils
import http.client
import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import free_port, wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 20.0
MiB = 1024 * 1024
ORDER = {"amount": 100, "currency": "EUR"}


# ---- the upstream business service -----------------------------------------------------------

class OrderService:
    """order_service.py as a subprocess on a fixed port (kept across restarts), tracked by PID."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="idem-orders-")
        self.logfile = os.path.join(self.root, "executions.jsonl")
        self.port = 0
        self.proc = None
        self.start()

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        assert self.proc is None
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "order_service.py"), "--port", str(self.port),
             "--log", self.logfile], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL)
        r, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if r else b""
        if not line.strip():
            self.kill()
            raise AssertionError("order_service.py did not print its port")
        self.port = int(line)
        wait_for(lambda: _status_or_none(self.addr, "/ping") == 200, 20, "the order service")

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.proc = None

    def ensure_running(self):
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self.start()
        r = request(self.addr, "POST", "/_admin/clear")
        assert r[0] == 200, r

    def close(self):
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def executions(self, key=None):
        """Every business execution so far (from the log file), optionally only those for key."""
        out = []
        try:
            with open(self.logfile) as f:
                for line in f:
                    line = line.strip()
                    if line:
                        try:
                            out.append(json.loads(line))
                        except ValueError:
                            pass
        except FileNotFoundError:
            pass
        if key is not None:
            out = [e for e in out if e.get("key") == key]
        return out

    def count(self, key=None):
        return len(self.executions(key))

    def fences(self, key):
        return [e.get("fence") for e in self.executions(key)]

    def stats(self):
        return request(self.addr, "GET", "/stats")[2]

    def next_action(self, action, ms=None):
        """The next business request hangs, closes the connection or is delayed."""
        body = {"action": action}
        if ms is not None:
            body["ms"] = ms
        r = request(self.addr, "POST", "/_admin/next", body=body)
        assert r[0] == 200, r


# ---- a cluster whose nodes run a proxy listener -----------------------------------------------

DEFAULT_ROUTE = dict(methods=["POST", "PUT", "PATCH", "DELETE"], path_prefix="/",
                     tenant="alpha", lease_ms=3000, ttl_ms=60000, lease_policy="conflict",
                     mismatch_status=409, in_progress_status=409, store_4xx=False,
                     on_timeout="unknown", upstream_timeout_ms=2000,
                     response_headers=["content-type", "x-order-id"])


def route(upstream, **over):
    r = dict(DEFAULT_ROUTE)
    r.update(over)
    r["upstream"] = upstream
    return r


def _yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[%s]" % ", ".join(str(x) for x in v)
    return str(v)


class ProxyCluster(harness.Cluster):
    """harness.Cluster plus a `proxy:` section (one listener per node, on node.proxy)."""

    def __init__(self, routes, **kw):
        self.routes = routes
        super().__init__(**kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if not getattr(node, "proxy", None):
            node.proxy = "127.0.0.1:%d" % free_port()
        lines = ["proxy:", "  - address: %s" % node.proxy, "    routes:"]
        order = ["methods", "path_prefix", "upstream", "tenant"]
        for r in self.routes:
            keys = order + sorted(k for k in r if k not in order)
            first = True
            for k in keys:
                if k not in r:
                    continue
                lines.append("%s%s: %s" % ("      - " if first else "        ", k,
                                           _yaml_value(r[k])))
                first = False
        with open(node.cfg, "a") as f:
            f.write("\n".join(lines) + "\n")


# ---- HTTP helper ---------------------------------------------------------------------------

def request(addr, method, path, body=None, headers=None, timeout=TIMEOUT, raw=None):
    return harness.http_request(addr, method, path, body, headers, timeout, raw)


exchange = harness.http_exchange


def _status_or_none(addr, path):
    try:
        return request(addr, "GET", path, timeout=5)[0]
    except (OSError, http.client.HTTPException):
        return None


def _listening(addr):
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _replayed(resp):
    return resp[1].get("idempotency-replayed", "").lower() == "true"


# ---- base class -----------------------------------------------------------------------------

class ProxyTest(unittest.TestCase):
    """A shared order service and a shared proxy cluster per class."""
    cluster_opts = {}
    lid = None

    @classmethod
    def routes(cls, upstream):
        return [route(upstream)]

    @classmethod
    def setUpClass(cls):
        cls.svc = OrderService()
        try:
            cls.c = ProxyCluster(cls.routes(cls.svc.url), **cls.cluster_opts)
        except BaseException:
            cls.svc.close()
            raise
        try:
            cls.lid = cls.c.wait_leader(timeout=30)
            for node in cls.c.nodes.values():
                wait_for(lambda: _listening(node.proxy), 30,
                         "the proxy listener of node %d (%s)" % (node.id, node.proxy))
            # The leader's proxy is ready when a pass-through GET reaches the upstream.
            wait_for(lambda: _status_or_none(cls.c.nodes[cls.c.leader() or cls.lid].proxy,
                                             "/ready-probe") == 200, 30,
                     "the leader's proxy to pass a GET through")
        except BaseException:
            print(cls.c.logs())
            cls.c.close()
            cls.svc.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.svc.close()

    def setUp(self):
        self.svc.ensure_running()

    def tearDown(self):
        result = self._outcome.result
        # A failed subTest is recorded under a _SubTest whose test_case is self.
        if any(getattr(t, "test_case", t) is self for t, _ in result.failures + result.errors):
            print(self.c.logs())

    # ---- helpers ----------------------------------------------------------------------------

    def key(self, prefix="k"):
        return "%s-%s" % (prefix, secrets.token_hex(6))

    def paddr(self, refresh=False):
        """The proxy address of the leader (cached; refresh asks the cluster again)."""
        if refresh or not type(self).lid:
            type(self).lid = self.c.wait_leader(timeout=30)
        return self.c.nodes[type(self).lid].proxy

    def follower_ids(self):
        lid = self.c.wait_leader(timeout=30)
        return [n for n in sorted(self.c.nodes) if n != lid and self.c.nodes[n].proc is not None]

    def send(self, method, path, key=None, body=None, raw=None, headers=None, timeout=TIMEOUT,
             retry_503=True):
        """One request through the leader's proxy. A 503 idempotency_unavailable (a leader
        change on a loaded machine) is retried with the same key (fail closed: nothing ran)."""
        h = dict(headers or {})
        if key is not None:
            h["Idempotency-Key"] = key
        deadline = time.monotonic() + 30
        refresh = False
        while True:
            resp = request(self.paddr(refresh), method, path, body=body, raw=raw, headers=h,
                           timeout=timeout)
            refresh = True
            if not (retry_503 and resp[0] == 503 and isinstance(resp[2], dict)
                    and resp[2].get("code") == "idempotency_unavailable"
                    and time.monotonic() < deadline):
                return resp
            self.assertRetryAfter(resp)
            time.sleep(0.2)

    def order(self, key, body=None, path="/orders", **kw):
        return self.send("POST", path, key=key, body=ORDER if body is None else body, **kw)

    def in_thread(self, fn):
        """Runs fn() in a thread; returns (thread, box) where box gets 'resp' or 'exc'."""
        box = {}

        def run():
            try:
                box["resp"] = fn()
            except BaseException as e:  # noqa: BLE001
                box["exc"] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, box

    # ---- assertions -------------------------------------------------------------------------

    def assertCommonHeaders(self, resp):
        st, h, b = resp
        self.assertTrue(h.get("x-request-id"), "X-Request-Id missing: %r" % (resp,))
        exp = h.get("idempotency-expires")
        self.assertTrue(exp, "Idempotency-Expires missing: %r" % (resp,))
        when = email.utils.parsedate_to_datetime(exp)
        self.assertIsNotNone(when, "Idempotency-Expires is not an RFC 9110 date: %r" % exp)
        # The record expires in the future (60 s ttl; generous slack for clock granularity).
        self.assertGreater(when.timestamp(), time.time() - 5, resp)

    def assertFresh(self, resp, status=201):
        """An answer that came from the upstream (not a replay)."""
        self.assertEqual(resp[0], status, resp)
        self.assertFalse(_replayed(resp), "unexpected Idempotency-Replayed: %r" % (resp,))
        self.assertTrue(resp[1].get("x-request-id"), resp)
        return resp

    def assertReplayOf(self, resp, first):
        """resp replays first: same status, body byte for byte, the stored headers."""
        st, h, b = resp
        self.assertEqual(st, first[0], (resp, first))
        self.assertTrue(_replayed(resp), "Idempotency-Replayed: true missing: %r" % (resp,))
        self.assertEqual(resp.raw, first.raw, (resp, first))
        if "x-order-id" in first[1]:
            self.assertEqual(h.get("x-order-id"), first[1]["x-order-id"], (resp, first))
        self.assertIn("application/json", h.get("content-type", ""), resp)
        self.assertTrue(h.get("x-request-id"), resp)

    def assertError(self, resp, status, code):
        st, h, b = resp
        self.assertEqual(st, status, resp)
        self.assertIsInstance(b, dict, "error body must be JSON: %r" % (resp,))
        self.assertEqual(b.get("code"), code, resp)
        self.assertIsInstance(b.get("message"), str, resp)
        self.assertIn("request_id", b, resp)
        self.assertTrue(h.get("x-request-id"), "X-Request-Id missing: %r" % (resp,))
        self.assertEqual(str(b["request_id"]), h["x-request-id"], resp)
        return b

    def assertRetryAfter(self, resp):
        h = resp[1]
        self.assertIn("retry-after", h, resp)
        self.assertGreaterEqual(int(h["retry-after"]), 1, resp)

    def assertInProgress(self, resp, status=409):
        self.assertError(resp, status, "idempotency_request_in_progress")
        self.assertRetryAfter(resp)


# ---- basics ---------------------------------------------------------------------------------

class TestProxyBasics(ProxyTest):
    @classmethod
    def routes(cls, upstream):
        # Specific prefixes first, so that first-match and longest-match agree.
        return [route(upstream, path_prefix="/alt/", mismatch_status=422, in_progress_status=425),
                route(upstream, path_prefix="/s4/", store_4xx=True),
                route(upstream)]

    def test_replay_is_identical_and_runs_once(self):
        key = self.key("order")
        first = self.assertFresh(self.order(key))
        self.assertCommonHeaders(first)
        self.assertIsInstance(first[2], dict, first)
        self.assertEqual(first[2].get("amount"), 100, first)
        self.assertTrue(first[1].get("x-order-id"), first)
        self.assertEqual(first[1]["x-order-id"], first[2]["id"], first)
        second = self.order(key)
        self.assertReplayOf(second, first)
        self.assertCommonHeaders(second)
        self.assertNotEqual(first[1]["x-request-id"], second[1]["x-request-id"])
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))
        # The service's own counter agrees (GET /stats, straight to the service).
        self.assertEqual(self.svc.stats()["by_key"].get(key), 1)

    def test_upstream_gets_fence_and_body(self):
        k1, k2 = self.key("f1"), self.key("f2")
        self.assertFresh(self.order(k1))
        self.assertFresh(self.order(k2))
        e1, e2 = self.svc.executions(k1), self.svc.executions(k2)
        self.assertEqual(len(e1), 1)
        self.assertEqual(len(e2), 1)
        f1, f2 = e1[0]["fence"], e2[0]["fence"]
        self.assertIsInstance(f1, int, "Idempotency-Fence missing or not a number: %r" % e1)
        self.assertIsInstance(f2, int, e2)
        self.assertGreater(f1, 0)
        self.assertGreater(f2, f1, "fencing tokens must strictly increase")
        self.assertEqual(json.loads(e1[0]["body"]), ORDER)

    def test_changed_body_is_a_mismatch(self):
        key = self.key("mm")
        first = self.assertFresh(self.order(key))
        r = self.order(key, body={"amount": 999, "currency": "EUR"})
        self.assertError(r, 409, "idempotency_key_reused")
        self.assertFalse(_replayed(r), r)
        self.assertReplayOf(self.order(key), first)  # the stored answer is untouched
        self.assertEqual(self.svc.count(key), 1)

    def test_mismatch_and_in_progress_statuses_per_route(self):
        key = self.key("alt")
        self.svc.next_action("delay", ms=1500)
        t, box = self.in_thread(lambda: self.order(key, path="/alt/orders"))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the first request to reach the upstream")
        self.assertInProgress(self.order(key, path="/alt/orders"), 425)
        t.join(30)
        self.assertIn("resp", box, box)
        first = self.assertFresh(box["resp"])
        self.assertError(self.order(key, path="/alt/orders", body={"amount": 1, "currency": "EUR"}),
                         422, "idempotency_key_reused")
        self.assertReplayOf(self.order(key, path="/alt/orders"), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_in_progress_default_409(self):
        key = self.key("busy")
        self.svc.next_action("delay", ms=1500)
        t, box = self.in_thread(lambda: self.order(key))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the first request to reach the upstream")
        self.assertInProgress(self.order(key), 409)
        t.join(30)
        self.assertIn("resp", box, box)
        first = self.assertFresh(box["resp"])
        self.assertReplayOf(self.order(key), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_reordered_json_is_the_same_request(self):
        key = self.key("canon")
        first = self.assertFresh(self.send("POST", "/orders", key=key,
                                           raw=b'{"amount": 7, "currency": "USD"}'))
        again = self.send("POST", "/orders", key=key, raw=b'{ "currency":"USD","amount":7 }')
        self.assertReplayOf(again, first)
        self.assertEqual(self.svc.count(key), 1)

    def test_get_passes_through_without_protocol(self):
        before = self.svc.stats()["gets"]
        r = self.send("GET", "/orders/123")
        self.assertEqual(r[0], 200, r)
        self.assertFalse(_replayed(r), r)
        self.assertEqual(r[2].get("method"), "GET", r)
        self.assertIsNone(r[2].get("saw_fence"), "a GET must not be fenced: %r" % (r,))
        self.assertEqual(r[1].get("x-echo"), "get", r)
        r2 = self.send("GET", "/orders/123")
        self.assertEqual(r2[0], 200, r2)
        self.assertFalse(_replayed(r2), r2)
        self.assertEqual(self.svc.stats()["gets"], before + 2, "each GET reaches the upstream")

    def test_other_methods_use_the_protocol(self):
        key = self.key("del")
        first = self.assertFresh(self.send("DELETE", "/orders/55", key=key), 200)
        self.assertReplayOf(self.send("DELETE", "/orders/55", key=key), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_key_missing_or_invalid(self):
        before = self.svc.count()
        self.assertError(self.order(None), 400, "idempotency_key_missing")
        for bad in ("has space", "semi;colon", "x" * 256, "slash/inside", "quote\"d"):
            with self.subTest(key=bad[:20]):
                self.assertError(self.order(bad), 400, "idempotency_key_invalid")
        # An empty key: missing or invalid (1-255 bytes), either way a 400 and no execution.
        r = self.send("POST", "/orders", body=ORDER, headers={"Idempotency-Key": ""})
        self.assertIn(r[2].get("code") if isinstance(r[2], dict) else r,
                      ("idempotency_key_missing", "idempotency_key_invalid"), r)
        self.assertError(r, 400, r[2]["code"])
        self.assertEqual(self.svc.count(), before, "nothing may reach the upstream")
        # The longest valid key works.
        longest = "k" * 255
        self.assertFresh(self.order(longest))
        self.assertEqual(self.svc.count(longest), 1)

    def test_store_4xx_route_replays_4xx(self):
        key = self.key("s4")
        first = self.assertFresh(self.order(key, path="/s4/bad"), 400)
        self.assertReplayOf(self.order(key, path="/s4/bad"), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_keep_alive_connection(self):
        host, port = self.paddr().rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            key = self.key("ka")
            h = {"Idempotency-Key": key}
            first = exchange(conn, "POST", "/orders", body=ORDER, headers=h)
            self.assertFresh(first)
            self.assertReplayOf(exchange(conn, "POST", "/orders", body=ORDER, headers=h), first)
            r = exchange(conn, "GET", "/orders/1")
            self.assertEqual(r[0], 200, r)
        finally:
            conn.close()
        self.assertEqual(self.svc.count(key), 1)

    def test_key_is_never_logged(self):
        """CONTRACT.md §1: the key is a secret; logs carry key_digest only."""
        key = "secret-%s" % secrets.token_hex(12)
        self.assertFresh(self.order(key))
        self.order(key)
        self.order(key, body={"amount": 1, "currency": "EUR"})  # mismatch
        self.order(key, path="/boom")                            # another fingerprint
        k2 = "secret-%s" % secrets.token_hex(12)
        self.order(k2, path="/bad")                              # released 4xx
        for node in self.c.nodes.values():
            with open(node.log, "rb") as f:
                text = f.read().decode(errors="replace")
            self.assertNotIn(key, text, "node %d logged the key" % node.id)
            self.assertNotIn(k2, text, "node %d logged the key" % node.id)

    def test_follower_proxy_answers_503(self):
        """Current behaviour of the first version: only the leader's proxy serves."""
        before = self.svc.count()
        for nid in self.follower_ids():
            with self.subTest(follower=nid):
                r = request(self.c.nodes[nid].proxy, "POST", "/orders", body=ORDER,
                            headers={"Idempotency-Key": self.key("fol")})
                self.assertError(r, 503, "idempotency_unavailable")
                self.assertRetryAfter(r)
        self.assertEqual(self.svc.count(), before, "a follower must not call the upstream")


# ---- concurrency ----------------------------------------------------------------------------

class TestProxyConcurrency(ProxyTest):
    @classmethod
    def routes(cls, upstream):
        return [route(upstream, lease_ms=10000, upstream_timeout_ms=8000)]

    def _burst(self, n, key_of, path):
        addr = self.paddr()
        barrier = threading.Barrier(n)
        results = [None] * n

        def worker(i):
            try:
                barrier.wait(30)
                results[i] = request(addr, "POST", path, body=ORDER,
                                     headers={"Idempotency-Key": key_of(i)}, timeout=60)
            except BaseException as e:  # noqa: BLE001
                results[i] = e
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for r in results:
            if isinstance(r, BaseException) or r is None:
                self.fail("a request failed: %r" % (r,))
        return results

    def test_fifty_identical_requests_execute_once(self):
        key = self.key("burst")
        results = self._burst(50, lambda i: key, "/slow?ms=500")
        fresh, replays, busy = [], [], []
        for r in results:
            if r[0] == 201 and not _replayed(r):
                fresh.append(r)
            elif r[0] == 201 and _replayed(r):
                replays.append(r)
            elif r[0] == 409:
                self.assertInProgress(r, 409)
                busy.append(r)
            else:
                self.fail("unexpected answer: %r" % (r,))
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))
        self.assertEqual(len(fresh), 1, "exactly one answer comes from the upstream")
        for r in replays:
            self.assertReplayOf(r, fresh[0])
        self.assertReplayOf(self.send("POST", "/slow?ms=500", key=key, body=ORDER), fresh[0])
        self.assertEqual(self.svc.count(key), 1)

    def test_distinct_keys_in_parallel_each_run_once(self):
        keys = [self.key("par%d" % i) for i in range(20)]
        results = self._burst(20, lambda i: keys[i], "/orders")
        ids = set()
        for r in results:
            self.assertFresh(r)
            ids.add(r[1].get("x-order-id"))
        self.assertEqual(len(ids), 20)
        for k in keys:
            self.assertEqual(self.svc.count(k), 1, k)
        fences = [self.svc.fences(k)[0] for k in keys]
        self.assertEqual(len(set(fences)), 20, "every claim gets its own fencing token")


# ---- failures -------------------------------------------------------------------------------

class TestProxyFailures(ProxyTest):
    @classmethod
    def routes(cls, upstream):
        return [route(upstream, path_prefix="/tk/", lease_ms=1000, lease_policy="takeover",
                      upstream_timeout_ms=15000),
                route(upstream, path_prefix="/cf/", lease_ms=1000, lease_policy="conflict",
                      upstream_timeout_ms=15000),
                route(upstream, path_prefix="/rl/", on_timeout="release"),
                route(upstream)]

    def _assert_quarantined(self, key, path="/orders"):
        r = self.order(key, path=path)
        self.assertError(r, 409, "idempotency_outcome_unknown")
        return r

    def test_upstream_killed_mid_request_quarantines(self):
        key = self.key("kill")
        t, box = self.in_thread(lambda: self.order(key, path="/slow?ms=15000", timeout=40))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the request to reach the upstream")
        self.svc.kill()
        t.join(40)
        self.assertIn("resp", box, box)
        self.assertGreaterEqual(box["resp"][0], 500, box)
        self.assertFalse(_replayed(box["resp"]), box)
        self._assert_quarantined(key, "/slow?ms=15000")
        self.svc.start()
        self._assert_quarantined(key, "/slow?ms=15000")
        self._assert_quarantined(key, "/slow?ms=15000")
        self.assertEqual(self.svc.count(key), 1, "nothing may run twice: %r"
                         % self.svc.executions(key))

    def test_upstream_hangs_past_timeout_quarantines(self):
        key = self.key("hang")
        self.svc.next_action("hang", ms=30000)
        r = self.order(key, timeout=30)
        self.assertGreaterEqual(r[0], 500, r)
        self.assertIn(r[0], (502, 504), r)
        self._assert_quarantined(key)
        self.assertEqual(self.svc.count(key), 1)

    def test_upstream_closes_without_answer_quarantines(self):
        key = self.key("close")
        self.svc.next_action("close")
        r = self.order(key)
        self.assertIn(r[0], (502, 504), r)
        self._assert_quarantined(key)
        self.assertEqual(self.svc.count(key), 1)

    def test_timeout_with_release_policy_runs_again(self):
        key = self.key("rel")
        self.svc.next_action("hang", ms=30000)
        r = self.order(key, path="/rl/orders", timeout=30)
        self.assertIn(r[0], (502, 504), r)
        second = self.assertFresh(self.order(key, path="/rl/orders"))
        self.assertEqual(self.svc.count(key), 2, "on_timeout release: the retry runs again")
        self.assertReplayOf(self.order(key, path="/rl/orders"), second)

    def test_connect_refused_releases_the_key(self):
        key = self.key("refused")
        self.svc.kill()
        r = self.order(key)
        self.assertEqual(r[0], 502, r)
        self.assertIsInstance(r[2], dict, r)
        self.assertIsInstance(r[2].get("code"), str, r)
        self.assertEqual(self.order(key)[0], 502)  # released: tried again, still refused
        self.svc.start()
        first = self.assertFresh(self.order(key))
        self.assertEqual(self.svc.count(key), 1)
        self.assertReplayOf(self.order(key), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_4xx_is_released_by_default(self):
        key = self.key("bad")
        r1 = self.assertFresh(self.order(key, path="/bad"), 400)
        self.assertIsInstance(r1[2], dict, r1)
        self.assertEqual(r1[2].get("error"), "bad request", r1)  # the upstream's body
        r2 = self.assertFresh(self.order(key, path="/bad"), 400)
        self.assertNotEqual(r1[2].get("id"), r2[2].get("id"), "the retry reached the upstream")
        self.assertEqual(self.svc.count(key), 2)

    def test_5xx_is_stored_as_failed_final(self):
        key = self.key("boom")
        first = self.assertFresh(self.order(key, path="/boom"), 500)
        self.assertEqual(first[2].get("error"), "boom", first)
        self.assertReplayOf(self.order(key, path="/boom"), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_response_too_large(self):
        key = self.key("big")
        r = self.order(key, path="/big", timeout=30)
        self.assertError(r, 502, "upstream_response_too_large")
        again = self.order(key, path="/big", timeout=30)
        self.assertNotEqual(again[0], 201, again)
        self.assertIn(again[0], (409, 502), again)
        if again[0] == 409:
            self.assertError(again, 409, "idempotency_outcome_unknown")
        self.assertEqual(self.svc.count(key), 1, "a too-large answer must not re-execute")

    def test_lease_expiry_takeover_gets_higher_fence(self):
        key = self.key("tk")
        self.svc.next_action("delay", ms=6000)
        t, box = self.in_thread(lambda: self.order(key, path="/tk/orders", timeout=40))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the first attempt to reach the upstream")
        f1 = self.svc.fences(key)[0]

        def taken_over():
            r = self.order(key, path="/tk/orders")
            if r[0] == 409 and isinstance(r[2], dict) and \
                    r[2].get("code") == "idempotency_request_in_progress":
                return None
            return r
        second = wait_for(taken_over, 30, "the lease to pass and the takeover", interval=0.1)
        second = self.assertFresh(second)
        fences = self.svc.fences(key)
        self.assertEqual(len(fences), 2, self.svc.executions(key))
        self.assertIsInstance(f1, int)
        self.assertGreater(fences[1], f1, "the taker must carry a higher Idempotency-Fence")
        t.join(40)
        self.assertIn("resp", box, box)
        # The stale holder cannot overwrite the taker's stored answer.
        self.assertReplayOf(self.order(key, path="/tk/orders"), second)
        self.assertEqual(self.svc.count(key), 2)

    def test_lease_expiry_conflict(self):
        key = self.key("cf")
        self.svc.next_action("delay", ms=6000)
        t, box = self.in_thread(lambda: self.order(key, path="/cf/orders", timeout=40))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the first attempt to reach the upstream")

        def expired():
            r = self.order(key, path="/cf/orders")
            if r[0] == 409 and isinstance(r[2], dict) and \
                    r[2].get("code") == "idempotency_request_in_progress":
                return None
            return r
        r = wait_for(expired, 30, "the lease to pass", interval=0.1)
        self.assertError(r, 409, "idempotency_lease_expired")
        self.assertEqual(self.svc.count(key), 1, "policy conflict: nothing runs again")
        t.join(40)
        self.assertIn("resp", box, box)
        self.assertEqual(self.svc.count(key), 1)


# ---- expiry ---------------------------------------------------------------------------------

class TestProxyExpiry(ProxyTest):
    cluster_opts = dict(expiry_ms=100)

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, ttl_ms=2000)]

    def test_ttl_expiry_gives_410(self):
        key = self.key("short")
        first = self.assertFresh(self.order(key))
        second = self.order(key)
        if second[0] != 410:  # on a slow machine the ttl may already have passed
            self.assertReplayOf(second, first)

        def gone():
            r = self.order(key)
            return r if r[0] == 410 else None
        r = wait_for(gone, 20, "the record to become a tombstone (410)")
        self.assertError(r, 410, "idempotency_key_expired")
        self.assertFalse(_replayed(r), r)
        self.assertEqual(self.svc.count(key), 1, "an expired key must not run again")
        k2 = self.key("fresh")
        self.assertFresh(self.order(k2))
        self.assertEqual(self.svc.count(k2), 1)


if __name__ == "__main__":
    unittest.main()
