"""Integration tests of idemd's HTTP proxy mode (docs/contract.md): real three-node clusters
on 127.0.0.1 (harness.Cluster with a `proxy:` section appended to each node's YAML) in front of
a real HTTP/1.1 business service (order_service.py, a subprocess killed by PID). Each class can
run as its own ctest:

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_proxy.TestProxyBasics

Classes: TestProxyBasics (replay, mismatch, canonical JSON, fingerprint_ignore and
fingerprint_fields routes, pass-through, key errors, route statuses 422/425, followers without
a cluster secret answer 503), TestProxyGuards (with the
defaults: paths normalised or refused, prefixes matched at a '/' boundary, unlisted unsafe
methods refused, method overrides not forwarded, callers' records kept apart),
TestProxyGuardOptions (other_methods, method_override, caller_identity, replay_set_cookie),
TestProxyConcurrency (50
identical requests: one execution), TestProxyFailures (upstream killed / hanging / closing /
refusing, 4xx, 5xx, too large, no quorum, lease renewal during a slow upstream, lease expiry
of a stalled holder with takeover and conflict), TestProxyFollowers (followers' proxies forward
to the leader with the cluster secret; RPC as_tenant needs the secret), TestProxyWrongSecret
(a follower with another secret answers 503), TestProxyFailover (kill -9 of the leader under
load through every node's proxy), TestProxyExpiry (ttl into tombstone: 410).

Most traffic goes to the leader's proxy listener; the follower classes use every node's.
Executions are counted from the order service's own log file (flushed before it answers),
which survives a kill and a restart of the service. Waits poll a condition with a generous
bound; nothing sleeps for a fixed time.
"""
import email.utils
import http.client
import json
import os
import secrets
import select
import shutil
import signal
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
# RFC 9110 section 5.6.7: the preferred (and only generated) HTTP date format
IMF_FIXDATE = (r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} "
               r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [0-9]{4} "
               r"[0-9]{2}:[0-9]{2}:[0-9]{2} GMT$")


def _read_resp(sock):
    """One HTTP answer read from sock: a harness.Resp with its JSON body parsed."""
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    text = resp.read().decode()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    return harness.Resp(resp.status, headers, json.loads(text), text)


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
        out = harness.read_jsonl(self.logfile)
        if key is not None:
            out = [e for e in out if e.get("key") == key]
        return out

    def count(self, key=None):
        return len(self.executions(key))

    def fences(self, key):
        return [e.get("fence") for e in self.executions(key)]

    def stats(self):
        return request(self.addr, "GET", "/stats")[2]

    def seen(self):
        """Every request that reached the service, as it arrived: method, raw target,
        headers (lower-case names, lists of values)."""
        return request(self.addr, "GET", "/_admin/seen")[2]["seen"]

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
    if isinstance(v, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, _yaml_value(x)) for k, x in v.items())
    return str(v)


class ProxyCluster(harness.Cluster):
    """harness.Cluster plus a `proxy:` section (one listener per node, on node.proxy) and,
    with secret, an `rpc.cluster_secret_file` (node_secrets: per-node overrides, None for no
    secret on that node) so that followers' proxies forward to the leader. Without tls.rpc
    the secret goes in clear, which a node allows only with rpc.insecure_cluster_secret on
    loopback addresses (insecure_secret: these nodes'; a subclass with TLS sets it False)."""
    insecure_secret = True

    def __init__(self, routes, secret=None, node_secrets=None, **kw):
        self.routes = routes
        self.secret = secret
        self.node_secrets = node_secrets or {}
        super().__init__(**kw)

    def _write_config(self, node, bootstrap):
        super()._write_config(node, bootstrap)
        if not getattr(node, "proxy", None):
            node.proxy = "127.0.0.1:%d" % free_port()
        lines = []
        sec = self.node_secrets.get(node.id, self.secret)
        if sec is not None:
            lines += ["rpc:", "  cluster_secret_file: %s" % self.secret_file(node, "secret", sec)]
            if self.insecure_secret:
                lines.append("  insecure_cluster_secret: true")
        lines += ["proxy:", "  - address: %s" % node.proxy, "    routes:"]
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
    probe_path = "/ready-probe"  # a GET a route passes through

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
                                             cls.probe_path) == 200, 30,
                     "the leader's proxy to pass a GET through")
        except BaseException:
            print(cls.c.logs())
            cls.c.close()
            cls.svc.close()
            raise

    @classmethod
    def tearDownClass(cls):
        problems = cls.c.close()
        cls.svc.close()
        # After the last test's check(): a node that died or reported since.
        if problems:
            raise AssertionError("\n\n".join(problems))

    def setUp(self):
        self.svc.ensure_running()

    def tearDown(self):
        result = self._outcome.result
        # A failed subTest is recorded under a _SubTest whose test_case is self.
        if any(getattr(t, "test_case", t) is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        # A node that died by itself during the test (not killed by it), or a sanitizer
        # report or failed assertion in a node's log, fails the test (harness: check()).
        problems = self.c.check()
        self.assertFalse(problems, "\n\n".join(problems))

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

    def order_via(self, nid, key, body=None, path="/orders", timeout=TIMEOUT, retry_503=True):
        """POST through node nid's proxy; a 503 (election on a loaded machine) is retried."""
        deadline = time.monotonic() + 30
        while True:
            r = request(self.c.nodes[nid].proxy, "POST", path,
                        body=ORDER if body is None else body,
                        headers={"Idempotency-Key": key}, timeout=timeout)
            if not (retry_503 and r[0] == 503 and time.monotonic() < deadline):
                return r
            self.assertRetryAfter(r)
            time.sleep(0.2)

    def paused(self, nid):
        """A context manager: node nid is stopped (SIGSTOP) inside, continued after."""
        node = self.c.nodes[nid]

        class Paused:
            def __enter__(s):
                os.kill(node.proc.pid, signal.SIGSTOP)

            def __exit__(s, *exc):
                os.kill(node.proc.pid, signal.SIGCONT)
        return Paused()

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

    def assertCommonHeaders(self, resp, claimed=None, ttl_s=60):
        """X-Request-Id and Idempotency-Expires, an RFC 9110 IMF-fixdate in the future; with
        claimed=(t0, t1), the wall-clock times around the record's claim, the date is the
        claim's time plus the route's ttl (ttl_s), to the second. Returns the date (s)."""
        st, h, b = resp
        self.assertTrue(h.get("x-request-id"), "X-Request-Id missing: %r" % (resp,))
        exp = h.get("idempotency-expires")
        self.assertTrue(exp, "Idempotency-Expires missing: %r" % (resp,))
        self.assertRegex(exp, IMF_FIXDATE, "Idempotency-Expires is not an IMF-fixdate")
        when = email.utils.parsedate_to_datetime(exp).timestamp()
        self.assertEqual(email.utils.formatdate(when, usegmt=True), exp,
                         "Idempotency-Expires: a weekday that is not the date's")
        # The record expires in the future (generous slack for clock granularity).
        self.assertGreater(when, time.time() - 5, resp)
        if claimed is not None:
            # whole seconds, truncated: one second of slack each side
            lo, hi = claimed[0] + ttl_s - 1, claimed[1] + ttl_s + 1
            self.assertTrue(lo <= when <= hi, "Idempotency-Expires %s (%.0f) is not the claim's "
                            "time plus %d s (%.1f .. %.1f): %r" % (exp, when, ttl_s, lo, hi, resp))
        return when

    def assertNoExpires(self, resp):
        """An answer before (or without) a claim that named a record: no Idempotency-Expires."""
        self.assertNotIn("idempotency-expires", resp[1], resp)

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
        harness.assert_problem(self, resp, status, code)  # the proxy's own refusals too
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
    # tenant beta answers a reused key with 422 (tenants[].mismatch_status), and so do its
    # routes that set no mismatch_status of their own
    cluster_opts = {"beta_settings": {"mismatch_status": 422}}

    @classmethod
    def routes(cls, upstream):
        # Specific prefixes first, so that first-match and longest-match agree.
        beta = route(upstream, path_prefix="/beta/", tenant="beta")
        dflt = route(upstream, path_prefix="/dflt/")
        del beta["mismatch_status"], dflt["response_headers"]  # the defaults
        # /fpi/: a timestamp left out of the fingerprint, callers sharing records (so that
        # the JSON API can address the proxy's record by its key)
        fpi = route(upstream, path_prefix="/fpi/", fingerprint_ignore=["/ts", "/meta/id"],
                    caller_identity="none")
        # /fpf/: only the amount, the currency and meta.ref make the request
        fpf = route(upstream, path_prefix="/fpf/",
                    fingerprint_fields=["/amount", "/currency", "/meta/ref"])
        return [route(upstream, path_prefix="/alt/", mismatch_status=422, in_progress_status=425),
                route(upstream, path_prefix="/s4/", store_4xx=True),
                beta, dflt, fpi, fpf, route(upstream)]

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
        self.assertCommonHeaders(r)  # Idempotency-Expires: the record's
        self.assertEqual(r[1]["idempotency-expires"], first[1]["idempotency-expires"], r)
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
        busy = self.order(key)
        self.assertInProgress(busy, 409)
        self.assertCommonHeaders(busy)  # Idempotency-Expires on the 409 too
        t.join(30)
        self.assertIn("resp", box, box)
        first = self.assertFresh(box["resp"])
        self.assertReplayOf(self.order(key), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_refusals_before_a_claim_have_no_expiry(self):
        for r, status, code in (
                (self.send("POST", "/a/../orders", key=self.key("p"), body=ORDER), 400,
                 "invalid_path"),
                (self.send("POST", "/orders", key="bad key!", body=ORDER), 400,
                 "idempotency_key_invalid"),
                (self.send("POST", "/orders", key='"unterminated', body=ORDER), 400,
                 "idempotency_key_invalid")):
            self.assertError(r, status, code)
            self.assertNoExpires(r)
        self.assertIn("sf-string", r[2]["detail"], r)

    def test_sf_string_key(self):
        """An Idempotency-Key sent as an RFC 8941 sf-string is the key inside the quotes:
        the bare key is the same request, and the upstream sees the bare key."""
        key = self.key("sf")
        first = self.assertFresh(self.send("POST", "/orders", body=ORDER,
                                           headers={"Idempotency-Key": '"%s"' % key}))
        self.assertReplayOf(self.order(key), first)
        self.assertEqual(self.svc.count(key), 1)
        seen = [s for s in self.svc.seen() if s["headers"].get("idempotency-key") == [key]]
        self.assertEqual(len(seen), 1, seen)

    def test_default_stored_headers(self):
        """A route without response_headers replays Content-Type, Location, Content-Location,
        ETag and Link, and no other header of the upstream's."""
        key = self.key("loc")
        first = self.assertFresh(self.order(key, path="/dflt/located"))
        names = ("location", "content-location", "etag", "link")
        for n in names + ("x-other",):
            self.assertTrue(first[1].get(n), (n, first))  # the first caller gets them all
        again = self.order(key, path="/dflt/located")
        self.assertTrue(_replayed(again), again)
        for n in names + ("content-type",):
            self.assertEqual(again[1].get(n), first[1][n], (n, again))
        self.assertNotIn("x-other", again[1], again)
        self.assertNotIn("x-order-id", again[1], again)

    def test_reused_key_status_of_the_routes_tenant(self):
        key = self.key("beta")
        self.assertFresh(self.order(key, path="/beta/orders"))
        r = self.order(key, path="/beta/orders", body={"amount": 1, "currency": "EUR"})
        self.assertError(r, 422, "idempotency_key_reused")
        self.assertCommonHeaders(r)

    def test_reordered_json_is_the_same_request(self):
        key = self.key("canon")
        first = self.assertFresh(self.send("POST", "/orders", key=key,
                                           raw=b'{"amount": 7, "currency": "USD"}'))
        again = self.send("POST", "/orders", key=key, raw=b'{ "currency":"USD","amount":7 }')
        self.assertReplayOf(again, first)
        self.assertEqual(self.svc.count(key), 1)

    def test_numbers_are_canonical_as_rfc_8785(self):
        """10, 10.0 and 1e1 are one request; 10.5 is another."""
        key = self.key("num")
        first = self.assertFresh(self.send("POST", "/orders", key=key,
                                           raw=b'{"amount": 10, "currency": "EUR"}'))
        for raw in (b'{"currency":"EUR","amount":10.0}', b'{"amount":1e1,"currency":"EUR"}',
                    b'{"amount":1.0E+1,"currency":"EUR"}'):
            self.assertReplayOf(self.send("POST", "/orders", key=key, raw=raw), first)
        self.assertError(self.send("POST", "/orders", key=key,
                                   raw=b'{"amount": 10.5, "currency": "EUR"}'), 409,
                         "idempotency_key_reused")
        self.assertEqual(self.svc.count(key), 1)

    def test_fingerprint_ignore_route(self):
        """A route with fingerprint_ignore: [/ts, /meta/id]: a retry whose ts (or meta.id)
        changed replays, one whose amount changed is a mismatch; the JSON API's claim of the
        same request (same pointers) gets the proxy's record, without them a mismatch."""
        key = self.key("fpi")
        body = {"amount": 100, "currency": "EUR", "ts": 1, "meta": {"id": "r1", "src": "web"}}
        first = self.assertFresh(self.order(key, body=body, path="/fpi/orders"))
        again = dict(body, ts=2, meta={"id": "r2", "src": "web"})
        self.assertReplayOf(self.order(key, body=again, path="/fpi/orders"), first)
        self.assertError(self.order(key, body=dict(again, amount=999), path="/fpi/orders"), 409,
                         "idempotency_key_reused")
        self.assertError(self.order(key, body=dict(body, meta={"id": "r1"}), path="/fpi/orders"),
                         409, "idempotency_key_reused")
        self.assertEqual(self.svc.count(key), 1)
        # The JSON API (tenant alpha, the route's) computes the same fingerprint for the same
        # request: its claim is a replay of what the proxy stored.
        gw = self.c.nodes[self.c.wait_leader(timeout=30)].http
        req = {"method": "POST", "path": "/fpi/orders", "fingerprint_ignore": ["/meta/id", "/ts"],
               "body": dict(body, amount=100.0, ts=3)}
        r = harness.request_past_503(gw, "POST", "/v1/claims", body={"request": req},
                                     token=self.c.token, headers={"Idempotency-Key": key})
        self.assertEqual(r[0], first[0], r)
        self.assertEqual(r[1].get("idempotency-replayed", "").lower(), "true", r)
        self.assertEqual(r.raw, first.raw, r)
        del req["fingerprint_ignore"]
        r = harness.request_past_503(gw, "POST", "/v1/claims", body={"request": req},
                                     token=self.c.token, headers={"Idempotency-Key": key})
        self.assertEqual((r[0], r[2].get("code")), (409, "idempotency_key_reused"), r)
        self.assertEqual(self.svc.count(key), 1)

    def test_fingerprint_fields_route(self):
        """A route with fingerprint_fields: [/amount, /currency, /meta/ref]: a retry whose
        body differs only outside those values (another member, a changed or added one, a
        sibling of meta.ref) replays; a change inside one (a value, an absent field, null
        for a value) is a reused key."""
        key = self.key("fpf")
        body = {"amount": 100, "currency": "EUR", "note": "first", "ts": 1,
                "meta": {"ref": "r1", "src": "web"}}
        t0 = time.time()
        first = self.assertFresh(self.order(key, body=body, path="/fpf/orders"))
        exp = self.assertCommonHeaders(first, claimed=(t0, time.time()))
        self.assertEqual(json.loads(self.svc.executions(key)[0]["body"]), body)  # all sent
        for other in (dict(body, note="second", ts=2),
                      dict(body, meta={"ref": "r1", "src": "app"}, extra=[1, 2]),
                      {"meta": {"ref": "r1"}, "currency": "EUR", "amount": 100.0}):
            with self.subTest(body=other):
                again = self.order(key, body=other, path="/fpf/orders")
                self.assertReplayOf(again, first)
                self.assertEqual(self.assertCommonHeaders(again), exp, again)
        for other in (dict(body, amount=101), dict(body, currency="USD"),
                      dict(body, meta={"ref": "r2", "src": "web"}),
                      {k: v for k, v in body.items() if k != "currency"},
                      dict(body, meta={"ref": None, "src": "web"})):
            with self.subTest(body=other):
                r = self.order(key, body=other, path="/fpf/orders")
                self.assertError(r, 409, "idempotency_key_reused")
                self.assertEqual(self.assertCommonHeaders(r), exp, r)
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))

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

    def test_head_passes_through_with_the_upstreams_length(self):
        # HEAD has no body, but its Content-Length is the upstream's (what a GET would
        # carry), or none when the upstream gives none; the keep-alive connection carries on
        # after it.
        host, port = self.paddr().rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            conn.request("HEAD", "/orders/7")
            resp = conn.getresponse()
            body = resp.read()
            self.assertEqual(resp.status, 200)
            self.assertEqual(body, b"")
            want = len(b'{"method":"GET","path":"/orders/7"}')
            self.assertEqual(resp.getheader("content-length"), str(want), resp.getheaders())
            self.assertEqual(resp.getheader("x-echo"), "head", resp.getheaders())
            r = exchange(conn, "GET", "/orders/8")
            self.assertEqual(r[0], 200, r)
            self.assertEqual(r[2].get("path"), "/orders/8", r)
            # An upstream that gives no length: none is made up (h2o does not chunk a HEAD).
            conn.request("HEAD", "/nolen/1")
            resp = conn.getresponse()
            self.assertEqual((resp.status, resp.read()), (200, b""))
            self.assertIsNone(resp.getheader("content-length"), resp.getheaders())
            self.assertIsNone(resp.getheader("transfer-encoding"), resp.getheaders())
            self.assertEqual(resp.getheader("x-echo"), "head", resp.getheaders())
        finally:
            conn.close()

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

    def test_repeated_key_is_refused(self):
        # Two Idempotency-Key headers: refused, nothing reaches the upstream (the first one
        # was taken silently, and the upstream never sees which).
        host, port = self.paddr().rsplit(":", 1)
        a, b = self.key("dupA"), self.key("dupB")
        body = ORDER if isinstance(ORDER, bytes) else json.dumps(ORDER).encode()
        head = ("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Idempotency-Key: %s\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n"
                % (a, b, len(body)))
        before = self.svc.count()
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
            sock.sendall(head.encode() + body)
            r = _read_resp(sock)
        self.assertError(r, 400, "idempotency_key_invalid")
        self.assertEqual(self.svc.count(), before, "nothing may reach the upstream")
        self.assertFresh(self.order(a))  # one key is served as before

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

    def test_upstream_connections_are_reused(self):
        """Keep-alive to the upstream: sequential requests share pooled connections."""
        keys = [self.key("pool%d" % i) for i in range(6)]
        for k in keys:
            self.assertFresh(self.order(k))
        ports = [self.svc.executions(k)[0]["peer_port"] for k in keys]
        self.assertLess(len(set(ports)), len(ports), "no upstream connection was reused: %r"
                        % ports)

    def _too_large(self, chunked):
        """A 3 MiB body (above h2o's own 2 MiB cap) through the proxy: h2o refuses it before
        any handler runs; the answer is still the problem+json error body with X-Request-Id."""
        host, port = self.paddr().rsplit(":", 1)
        key = self.key("huge")
        head = ("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Idempotency-Key: %s\r\n" % key)
        head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else \
            "Content-Length: %d\r\n\r\n" % (3 * MiB)
        chunk = b"x" * (64 * 1024)
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
            try:
                sock.sendall(head.encode())
                for _ in range(48):
                    sock.sendall(b"10000\r\n" + chunk + b"\r\n" if chunked else chunk)
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before reading everything
            r = _read_resp(sock)
        self.assertError(r, 413, "payload_too_large")  # problem+json, h2o's own answer too
        self.assertNoExpires(r)
        self.assertEqual(self.svc.count(key), 0)

    def test_body_above_h2o_cap_is_json_413(self):
        self._too_large(chunked=False)

    def test_chunked_body_above_h2o_cap_is_json_413(self):
        self._too_large(chunked=True)

    def test_key_is_never_logged(self):
        """docs/contract.md: the key is a secret; logs carry key_digest only."""
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
        """Without a cluster secret only the leader's proxy serves claims."""
        before = self.svc.count()
        for nid in self.follower_ids():
            with self.subTest(follower=nid):
                r = request(self.c.nodes[nid].proxy, "POST", "/orders", body=ORDER,
                            headers={"Idempotency-Key": self.key("fol")})
                b = self.assertError(r, 503, "idempotency_unavailable")
                self.assertIn("cluster secret", b["message"], r)
                self.assertRetryAfter(r)
                self.assertNoExpires(r)  # a claim with no answer names no record
        self.assertEqual(self.svc.count(), before, "a follower must not call the upstream")


# ---- guards: paths, methods, callers (a security review's findings) -------------------------

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


class GuardTest(ProxyTest):
    def seen_after(self, before):
        """The requests that reached the upstream since len(seen) was `before`."""
        return self.svc.seen()[before:]

    def assertNothingReached(self, before, what):
        self.assertEqual(self.seen_after(before), [], "%s reached the upstream" % what)

    def last_seen(self, before):
        got = self.seen_after(before)
        self.assertEqual(len(got), 1, got)
        return got[0]

    def req(self, method, path, key=None, body=None, headers=None):
        h = dict(headers or {})
        if key is not None:
            h["Idempotency-Key"] = key
        return self.send(method, path, body=body, headers=h)


class TestProxyGuards(GuardTest):
    """One route with the defaults (old configuration keys only): /api/pay for POST and
    DELETE."""
    probe_path = "/api/pay/ready-probe"

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, path_prefix="/api/pay", methods=["POST", "DELETE"])]

    def test_json_body_with_too_many_values_is_refused_unparsed(self):
        # A caller needs no token: the values a body may have to be fingerprinted are bounded
        # (16384), so a body of many tiny values costs a count, not a parse.
        before = len(self.svc.seen())
        many = {"items": [0] * 20000}
        r = self.req("POST", "/api/pay/orders", key=self.key("many"), body=many)
        b = self.assertError(r, 413, "payload_too_large")
        self.assertIn("more values", b["message"], r)
        self.assertNoExpires(r)
        self.assertNothingReached(before, "a body past the values bound")
        # Within the bound the body reaches the upstream (which judges it as it likes).
        r = self.req("POST", "/api/pay/orders", key=self.key("fine"), body={"items": [0] * 1000})
        self.assertNotEqual(r[0], 413, r)
        self.last_seen(before)

    def test_dot_segments_encoded_slashes_and_backslashes_are_refused(self):
        paths = ["/api/pay/../../internal/admin", "/api/pay/./x",
                 "/api/pay/%2e%2e/%2E%2E/internal/admin", "/api/pay/..;/internal",
                 "/api/pay%2f..%2finternal", "/api/pay%2F..%2Finternal",
                 "/api/pay\\..\\internal", "/api/pay/%5c..%5cinternal", "/api/pay/%zz",
                 "/api/pay/x%2", "/api/pay/%00", "/api//pay", "/api/pay//x"]
        before = len(self.svc.seen())
        for path in paths:
            for method in ("POST", "GET"):
                with self.subTest(path=path, method=method):
                    r = self.req(method, path, key=self.key("dot"),
                                 body=ORDER if method == "POST" else None)
                    b = self.assertError(r, 400, "invalid_path")
                    self.assertIn("path", b["message"], r)
        self.assertNothingReached(before, "a refused path")

    def test_prefix_matches_at_a_segment_boundary(self):
        before = len(self.svc.seen())
        for path in ("/api/payroll", "/api/payroll/x", "/api/pa", "/apix/pay", "/internal"):
            for method in ("POST", "GET"):
                with self.subTest(path=path, method=method):
                    r = self.req(method, path, key=self.key("b"),
                                 body=ORDER if method == "POST" else None)
                    self.assertError(r, 404, "not_found")
                    self.assertNoExpires(r)
        self.assertNothingReached(before, "a path outside the prefix")
        for path in ("/api/pay", "/api/pay/", "/api/pay/orders"):
            with self.subTest(path=path):
                key = self.key("in")
                self.assertFresh(self.req("POST", path, key=key, body=ORDER),
                                 201 if path.endswith("orders") else 200)
                e = self.svc.executions(key)
                self.assertEqual(len(e), 1, e)
                self.assertIsInstance(e[0]["fence"], int, e)
                self.assertEqual(e[0]["path"], path, e)

    def test_path_is_normalised_for_the_upstream_and_the_fingerprint(self):
        key = self.key("norm")
        before = len(self.svc.seen())
        first = self.assertFresh(self.req("POST", "/api/%70ay/ord%65rs?b=2&a=%2f..", key=key,
                                          body=ORDER))
        self.assertEqual(self.last_seen(before)["path"], "/api/pay/orders?b=2&a=%2f..",
                         "the normalised path, the query unchanged")
        # The normalised form is the same request (fingerprint): a replay.
        self.assertReplayOf(self.req("POST", "/api/pay/orders?b=2&a=%2f..", key=key,
                                     body=ORDER), first)
        self.assertEqual(self.svc.count(key), 1)
        before = len(self.svc.seen())
        r = self.req("GET", "/api/pay/%7eitem/%c3%a9")
        self.assertEqual(r[0], 200, r)
        self.assertEqual(self.last_seen(before)["path"], "/api/pay/~item/%C3%A9")

    def test_unlisted_unsafe_methods_are_refused(self):
        before = len(self.svc.seen())
        for method in ("PUT", "PATCH", "PURGE"):
            with self.subTest(method=method):
                r = self.req(method, "/api/pay/x", key=self.key("m"), body=ORDER)
                self.assertError(r, 405, "method_not_allowed")
                self.assertEqual(r[1].get("allow"), "GET, HEAD, POST, DELETE, OPTIONS", r)
                self.assertNoExpires(r)
        self.assertNothingReached(before, "an unlisted unsafe method")
        # Reads still pass through, unfenced.
        for method in ("GET", "HEAD", "OPTIONS"):
            with self.subTest(method=method):
                before = len(self.svc.seen())
                r = self.req(method, "/api/pay/x")
                self.assertEqual(r[0], 200, r)
                got = self.last_seen(before)
                self.assertEqual(got["method"], method, got)
                self.assertNotIn("idempotency-fence", got["headers"], got)

    def test_method_override_headers_are_not_forwarded(self):
        over = {"X-HTTP-Method-Override": "PUT", "X-HTTP-Method": "PATCH",
                "X-Method-Override": "PUT"}
        key = self.key("ovr")
        before = len(self.svc.seen())
        self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER, headers=over))
        got = self.last_seen(before)
        for name in over:
            self.assertNotIn(name.lower(), got["headers"], got)
        before = len(self.svc.seen())
        self.assertEqual(self.req("GET", "/api/pay/x", headers=over)[0], 200)
        got = self.last_seen(before)
        for name in over:
            self.assertNotIn(name.lower(), got["headers"], got)

    def test_headers_the_caller_names_in_connection_are_not_forwarded(self):
        # RFC 9110 7.6.1: a header the caller's Connection names is hop-by-hop, as on the
        # answer's side (test_headers_named_by_connection_are_not_passed_on).
        hop = {"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "X-Kept": "1"}
        # The protocol's requests, and a method the route passes through.
        for method, key, body, status in (("POST", self.key("hop"), ORDER, 201),
                                          ("GET", None, None, 200)):
            before = len(self.svc.seen())
            r = self.req(method, "/api/pay/orders", key=key, body=body, headers=hop)
            self.assertEqual(r[0], status, r)
            got = self.last_seen(before)
            self.assertNotIn("x-hop", got["headers"], got)
            self.assertEqual(got["headers"].get("x-kept"), ["1"], got)

    def test_callers_do_not_share_records(self):
        key = self.key("who")
        n = len(self.svc.executions())
        a1 = self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                       headers=ALICE))
        b1 = self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                       headers=BOB))
        self.assertNotEqual(a1[2]["id"], b1[2]["id"], "Bob got Alice's answer")
        self.assertReplayOf(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                     headers=ALICE), a1)
        self.assertReplayOf(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                     headers=BOB), b1)
        # The upstream saw each caller's record key (43 characters), never the bare key.
        ex = self.svc.executions()[n:]
        self.assertEqual(len(ex), 2, ex)
        self.assertNotEqual(ex[0]["key"], ex[1]["key"], ex)
        for e in ex:
            self.assertEqual(len(e["key"]), 43, e)
        self.assertEqual(self.svc.count(key), 0)
        # A cookie is an identity too; a caller with none shares the bare key's record.
        c1 = self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                       headers={"Cookie": "session=c1"}))
        self.assertNotEqual(c1[2]["id"], a1[2]["id"])
        anon = self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER))
        self.assertEqual(self.svc.count(key), 1, "the anonymous caller's key is the bare key")
        self.assertReplayOf(self.req("POST", "/api/pay/orders", key=key, body=ORDER), anon)

    def test_a_caller_without_identity_cannot_name_an_identified_callers_record(self):
        """The key an identified caller's record is kept under reaches the upstream (as its
        Idempotency-Key), so it is no secret. Sent as the key of a request without identity
        headers, whose record would be kept under that bare key, it is refused (400): that
        caller gets neither the identified caller's stored answer nor a run."""
        key = self.key("named")
        n = len(self.svc.executions())
        self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER, headers=ALICE))
        named = self.svc.executions()[n]["key"]
        self.assertRegex(named, r"^~[A-Za-z0-9_-]{42}$")
        r = self.req("POST", "/api/pay/orders", key=named, body=ORDER)
        self.assertError(r, 400, "idempotency_key_invalid")
        self.assertNotIn("idempotency-replayed", r[1])
        self.assertIn("identified caller", r[2]["detail"])
        self.assertEqual(len(self.svc.executions()), n + 1, "nothing more reached the upstream")
        # Keys of other forms stay the caller's own: 43 base64url characters (as from 32
        # random bytes) run as the caller's bare key.
        own = named[1:] + "A"
        self.assertFresh(self.req("POST", "/api/pay/orders", key=own, body=ORDER))
        self.assertEqual(self.svc.count(own), 1)

    def test_another_caller_cannot_squat_a_key(self):
        # Bob runs first with another body: Alice's request is not a mismatch.
        key = self.key("squat")
        self.assertFresh(self.req("POST", "/api/pay/orders", key=key,
                                  body={"amount": 1, "currency": "EUR"}, headers=BOB))
        self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER,
                                  headers=ALICE))
        # Bob holds a key (a slow upstream): Alice is not told it is in progress.
        key = self.key("hold")
        self.svc.next_action("delay", ms=1500)
        t, box = self.in_thread(lambda: self.req("POST", "/api/pay/orders", key=key,
                                                 body=ORDER, headers=BOB))
        n = len(self.svc.executions())
        wait_for(lambda: len(self.svc.executions()) > n, 20, "Bob's request to reach the upstream")
        self.assertFresh(self.req("POST", "/api/pay/orders", key=key, body=ORDER, headers=ALICE))
        t.join(30)
        self.assertIn("resp", box, box)
        self.assertFresh(box["resp"])

    def test_namespaced_keys_are_judged_as_keys(self):
        before = self.svc.count()
        for bad in ("has space", "x" * 256, "slash/inside"):
            with self.subTest(key=bad[:20]):
                self.assertError(self.req("POST", "/api/pay/orders", key=bad, body=ORDER,
                                          headers=ALICE), 400, "idempotency_key_invalid")
        self.assertError(self.req("POST", "/api/pay/orders", body=ORDER, headers=ALICE), 400,
                         "idempotency_key_missing")
        self.assertEqual(self.svc.count(), before, "nothing may reach the upstream")
        longest = "k" * 250 + secrets.token_hex(3)[:5]
        first = self.assertFresh(self.req("POST", "/api/pay/orders", key=longest, body=ORDER,
                                          headers=ALICE))
        self.assertReplayOf(self.req("POST", "/api/pay/orders", key=longest, body=ORDER,
                                     headers=ALICE), first)


class TestProxyGuardOptions(GuardTest):
    """The per-route options: other_methods, method_override, caller_identity,
    replay_set_cookie."""
    probe_path = "/loose/ready-probe"

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, path_prefix="/strict/", methods=["POST"], other_methods="refuse",
                      method_override="refuse"),
                route(upstream, path_prefix="/loose/", methods=["POST"], other_methods="pass"),
                route(upstream, path_prefix="/shared/", caller_identity="none"),
                route(upstream, path_prefix="/apikey/", caller_identity={"headers": ["X-Api-Key"]}),
                route(upstream, path_prefix="/cookie/", replay_set_cookie=True,
                      response_headers=["content-type", "x-order-id", "set-cookie"]),
                route(upstream, path_prefix="/nocookie/")]

    def test_refuse_and_pass_routes(self):
        before = len(self.svc.seen())
        for method in ("GET", "PUT", "PURGE"):
            with self.subTest(method=method):
                r = self.req(method, "/strict/x")
                self.assertError(r, 405, "method_not_allowed")
                self.assertEqual(r[1].get("allow"), "POST", r)
        r = self.req("POST", "/strict/orders", key=self.key("o"), body=ORDER,
                     headers={"X-HTTP-Method-Override": "DELETE"})
        b = self.assertError(r, 400, "invalid_request")
        self.assertIn("method-override", b["message"], r)
        self.assertNothingReached(before, "a refused method")
        self.assertFresh(self.req("POST", "/strict/orders", key=self.key("s"), body=ORDER))
        for method in ("PUT", "PURGE", "GET"):
            with self.subTest(method=method):
                before = len(self.svc.seen())
                r = self.req(method, "/loose/x", key=self.key("l"),
                             body=ORDER if method == "PUT" else None)
                self.assertEqual(r[0], 200, r)
                got = self.last_seen(before)
                self.assertEqual(got["method"], method, got)
                self.assertNotIn("idempotency-fence", got["headers"], got)

    def test_no_route_takes_an_identified_callers_record_key_as_a_bare_key(self):
        """The Set-Cookie route's record key of an identified caller, sent back bare: by a
        caller without identity headers on that route, and by any caller on a route whose
        callers share their keys (caller_identity: none); both refused, the stored answer
        and its Set-Cookie replayed to neither."""
        key = self.key("ck-named")
        n = len(self.svc.executions())
        a1 = self.assertFresh(self.req("POST", "/cookie/cookie", key=key, body=ORDER,
                                       headers=ALICE))
        self.assertTrue(a1[1].get("set-cookie"), a1)
        named = self.svc.executions()[n]["key"]
        for path, headers in (("/cookie/cookie", None), ("/shared/cookie", None),
                              ("/shared/cookie", BOB)):
            with self.subTest(path=path, identified=headers is not None):
                r = self.req("POST", path, key=named, body=ORDER, headers=headers)
                self.assertError(r, 400, "idempotency_key_invalid")
                self.assertNotIn("set-cookie", r[1])
        self.assertEqual(len(self.svc.executions()), n + 1, "nothing more reached the upstream")

    def test_shared_route_shares_records(self):
        key = self.key("sh")
        a1 = self.assertFresh(self.req("POST", "/shared/orders", key=key, body=ORDER,
                                       headers=ALICE))
        self.assertReplayOf(self.req("POST", "/shared/orders", key=key, body=ORDER,
                                     headers=BOB), a1)
        self.assertEqual(self.svc.count(key), 1, "the bare key goes upstream")

    def test_identity_headers_of_the_route(self):
        key = self.key("ak")
        a1 = self.assertFresh(self.req("POST", "/apikey/orders", key=key, body=ORDER,
                                       headers={"X-Api-Key": "a", **ALICE}))
        b1 = self.assertFresh(self.req("POST", "/apikey/orders", key=key, body=ORDER,
                                       headers={"X-Api-Key": "b", **ALICE}))
        self.assertNotEqual(a1[2]["id"], b1[2]["id"])
        # Authorization is not this route's identity: the same X-Api-Key is the same caller.
        self.assertReplayOf(self.req("POST", "/apikey/orders", key=key, body=ORDER,
                                     headers={"X-Api-Key": "a", **BOB}), a1)

    def test_set_cookie_is_replayed_only_where_the_route_says(self):
        key = self.key("ck")
        a1 = self.assertFresh(self.req("POST", "/cookie/cookie", key=key, body=ORDER,
                                       headers=ALICE))
        self.assertEqual(a1[1].get("set-cookie"), "session=%s" % a1[2]["id"], a1)
        a2 = self.req("POST", "/cookie/cookie", key=key, body=ORDER, headers=ALICE)
        self.assertReplayOf(a2, a1)
        self.assertEqual(a2[1].get("set-cookie"), a1[1]["set-cookie"], a2)
        b1 = self.assertFresh(self.req("POST", "/cookie/cookie", key=key, body=ORDER,
                                       headers=BOB))
        self.assertNotEqual(b1[1].get("set-cookie"), a1[1]["set-cookie"], b1)
        # A caller without identity headers has the bare key, which any other anonymous
        # caller can send too: its replays carry no cookie (the first answer does).
        key = self.key("anon")
        c1 = self.assertFresh(self.req("POST", "/cookie/cookie", key=key, body=ORDER))
        self.assertEqual(c1[1].get("set-cookie"), "session=%s" % c1[2]["id"], c1)
        c2 = self.req("POST", "/cookie/cookie", key=key, body=ORDER)
        self.assertReplayOf(c2, c1)
        self.assertNotIn("set-cookie", c2[1], c2)
        # By default the caller gets its own cookie, and no replay carries one.
        key = self.key("nc")
        n1 = self.assertFresh(self.req("POST", "/nocookie/cookie", key=key, body=ORDER,
                                       headers=ALICE))
        self.assertEqual(n1[1].get("set-cookie"), "session=%s" % n1[2]["id"], n1)
        n2 = self.req("POST", "/nocookie/cookie", key=key, body=ORDER, headers=ALICE)
        self.assertReplayOf(n2, n1)
        self.assertNotIn("set-cookie", n2[1], n2)


# ---- concurrency ----------------------------------------------------------------------------

class TestProxyQuotas(ProxyTest):
    """A tenant that a proxy route serves with an unlimited quota (0): its callers choose
    how many keys there are, so the node warns at start; a bounded one draws no warning."""
    cluster_opts = {"alpha_quota": {"max_records": 0}}
    WARNING = "tenant alpha is served by a proxy route and has no max_records quota"

    def test_unlimited_quota_is_warned_about(self):
        self.assertTrue(self.c.logs_contain(self.WARNING), self.c.logs())
        self.assertFalse(self.c.logs_contain("tenant beta is served"), self.c.logs())

    def test_default_quota_is_bounded(self):
        c = ProxyCluster([route(self.svc.url)])
        try:
            c.wait_leader(timeout=30)
            self.assertFalse(c.logs_contain("is served by a proxy route and has no"), c.logs())
        finally:
            problems = c.close()
            self.assertFalse(problems, problems)


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
    cluster_opts = dict(secret="failures-" + secrets.token_hex(16))

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, path_prefix="/tk/", lease_ms=1500, lease_policy="takeover",
                      upstream_timeout_ms=15000),
                route(upstream, path_prefix="/cf/", lease_ms=1500, lease_policy="conflict",
                      upstream_timeout_ms=15000),
                route(upstream, path_prefix="/rl/", on_timeout="release"),
                route(upstream, path_prefix="/inline32/", max_inline_body=32 << 20),
                route(upstream, path_prefix="/long/", upstream_timeout_ms=120000),
                route(upstream)]

    def _assert_quarantined(self, key, path="/orders"):
        r = self.order(key, path=path)
        self.assertError(r, 409, "idempotency_outcome_unknown")
        self.assertNotIn("idempotency-expires", r[1], r)  # a quarantined record never expires
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
        self.assertNoExpires(box["resp"])  # quarantined: never expires
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
        self.assertError(r, 504, "upstream_timeout")
        self.assertNoExpires(r)  # the record is quarantined: it never expires
        self._assert_quarantined(key)
        self.assertEqual(self.svc.count(key), 1)

    def test_upstream_closes_without_answer_quarantines(self):
        key = self.key("close")
        self.svc.next_action("close")
        r = self.order(key)
        self.assertError(r, 502, "upstream_unavailable")
        self.assertNoExpires(r)  # quarantined, as above
        self._assert_quarantined(key)
        self.assertEqual(self.svc.count(key), 1)

    def test_timeout_with_release_policy_runs_again(self):
        key = self.key("rel")
        self.svc.next_action("hang", ms=30000)
        t0 = time.time()
        r = self.order(key, path="/rl/orders", timeout=30)
        self.assertError(r, 504, "upstream_timeout")
        self.assertCommonHeaders(r, claimed=(t0, time.time()))
        second = self.assertFresh(self.order(key, path="/rl/orders"))
        self.assertEqual(self.svc.count(key), 2, "on_timeout release: the retry runs again")
        self.assertReplayOf(self.order(key, path="/rl/orders"), second)

    def test_connect_refused_releases_the_key(self):
        key = self.key("refused")
        self.svc.kill()
        t0 = time.time()
        r = self.order(key)
        self.assertError(r, 502, "upstream_unavailable")
        self.assertCommonHeaders(r, claimed=(t0, time.time()))  # released after the claim
        t0 = time.time()
        r = self.order(key)  # released: claimed again (a new record), still refused
        self.assertError(r, 502, "upstream_unavailable")
        self.assertCommonHeaders(r, claimed=(t0, time.time()))
        self.svc.start()
        first = self.assertFresh(self.order(key))
        self.assertEqual(self.svc.count(key), 1)
        self.assertReplayOf(self.order(key), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_no_quorum_claim_answers_503_without_expiry(self):
        """Both followers stopped: the leader's claim finds no quorum, is retried for
        rpc.default_deadline_ms and answered 503, without Idempotency-Expires (the claim
        named no record); the upstream is not called."""
        lid = self.c.wait_leader(timeout=30)
        fols = [n for n in sorted(self.c.nodes) if n != lid]
        key = self.key("nq")
        with self.paused(fols[0]), self.paused(fols[1]):
            r = request(self.c.nodes[lid].proxy, "POST", "/orders", body=ORDER,
                        headers={"Idempotency-Key": key}, timeout=30)
        self.assertError(r, 503, "idempotency_unavailable")
        self.assertRetryAfter(r)
        self.assertNoExpires(r)
        self.assertEqual(self.svc.count(key), 0, self.svc.executions(key))

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
        t0 = time.time()
        r = self.order(key, path="/big", timeout=30)
        self.assertError(r, 502, "upstream_response_too_large")
        exp = self.assertCommonHeaders(r, claimed=(t0, time.time()))
        again = self.order(key, path="/big", timeout=30)
        self.assertNotEqual(again[0], 201, again)
        self.assertIn(again[0], (409, 502), again)
        if again[0] == 409:
            self.assertError(again, 409, "idempotency_outcome_unknown")
        else:  # the digest-only record's replay
            self.assertEqual(self.assertCommonHeaders(again), exp, again)
        self.assertEqual(self.svc.count(key), 1, "a too-large answer must not re-execute")

    def test_headers_named_by_connection_are_not_passed_on(self):
        # The upstream's "Connection: keep-alive, X-Secret" makes X-Secret hop-by-hop: the
        # proxy's answer carries X-Order-Id but neither Connection's token nor X-Secret.
        r = self.order(self.key("conn"), path="/conn")
        self.assertEqual(r[0], 201, r)
        self.assertIn("x-order-id", r[1])
        self.assertNotIn("x-secret", r[1], r)

    def test_answer_that_cannot_be_stored_records_its_digest(self):
        # 1 MiB: not over max_inline_body (1 MiB), but the completion with it does not fit a
        # log entry (batch.max_bytes, 1 MiB), so complete answers invalid. The caller gets
        # the upstream's answer, and the record takes the digest-only marker: a retry
        # replays 502 instead of finding the record still processing (and, once the lease
        # passed, running the upstream a second time under takeover).
        key = self.key("mib")
        r = self.order(key, path="/mib", timeout=30)
        self.assertEqual(r[0], 201, r)
        self.assertEqual(len(r.raw), 1 << 20)
        # Not the key's recorded result (its retries get 502): marked so.
        self.assertEqual(r[1].get("idempotency-recorded"), "false", r[1])
        again = self.order(key, path="/mib", timeout=30)
        self.assertError(again, 502, "upstream_response_too_large")
        self.assertEqual(self.svc.count(key), 1, "the upstream ran again")

    def test_answer_past_an_rpc_frame_through_a_follower_records_its_digest(self):
        # Within the route's max_inline_body (32 MiB) but past what an RPC frame to the
        # leader carries (16 MiB): a follower's complete cannot be forwarded, for good. It
        # must take the digest-only marker at once, as the leader's own proxy does, not be
        # retried as if no leader answered and then leave the record processing.
        fid = self.follower_ids()[0]
        key = self.key("huge")
        r = self.order_via(fid, key, path="/inline32/huge", timeout=60)
        self.assertEqual(r[0], 201, r)
        self.assertEqual(len(r.raw), 20000000)
        self.assertEqual(r[1].get("idempotency-recorded"), "false", r[1])
        again = self.order_via(fid, key, path="/inline32/huge", timeout=60)
        self.assertError(again, 502, "upstream_response_too_large")
        self.assertEqual(self.svc.count(key), 1, "the upstream ran again")

    def test_a_stop_cuts_off_a_long_upstream_call(self):
        # SIGTERM of a node whose proxy waits on a slow upstream (90 s, within the route's
        # upstream_timeout_ms of 120 s): the call is cut off when the stop's grace ends, so
        # the node exits cleanly well before the upstream would answer.
        fid = self.follower_ids()[0]
        key = self.key("stop")
        t, box = self.in_thread(lambda: self.order_via(fid, key, path="/long/slow?ms=90000",
                                                       timeout=100, retry_503=False))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the request to reach the upstream")
        with open(self.c.nodes[fid].log, "rb") as f:
            seen = len(f.read())
        self.c.nodes[fid].proc.terminate()
        self.assertEqual(self.c.wait_exit(fid, timeout=30), 0)
        t.join(30)
        self.assertFalse(t.is_alive())
        # The caller got the 503, or its connection closed first.
        if "resp" in box:
            self.assertError(box["resp"], 503, "idempotency_unavailable")
        with open(self.c.nodes[fid].log, "rb") as f:
            text = f.read()[seen:].decode(errors="replace")
        self.assertIn("the upstream call is cut off by the node's stop", text)
        self.assertNotIn(key, text)  # the key's digest, never the key
        self.c.start(fid)  # back for the class's next tests, listening
        wait_for(lambda: _status_or_none(self.c.nodes[fid].proxy, self.probe_path) == 200, 30,
                 "node %d's proxy to pass a GET through again" % fid)

    def test_answer_with_too_many_headers_records_its_digest(self):
        # 65 stored headers (x-order-id is a stored header of the route): more than a stored
        # response holds (64), so complete answers invalid; the digest-only marker must
        # not carry them either, or it is refused as well and the record stays processing.
        key = self.key("hdrs")
        r = self.order(key, path="/manyhdrs")
        self.assertEqual(r[0], 201, r)
        self.assertEqual(r[1].get("idempotency-recorded"), "false", r[1])
        again = self.order(key, path="/manyhdrs")
        self.assertError(again, 502, "upstream_response_too_large")
        self.assertEqual(self.svc.count(key), 1, "the upstream ran again")

    # The proxy renews the lease while the upstream call runs, so a lease only passes when
    # its holder stalls: the first attempt goes through a follower's proxy, which is stopped
    # (SIGSTOP) while the upstream works on it, and continued after the lease passed.

    def _stalled_first_attempt(self, key, path):
        fid = self.follower_ids()[0]
        others = [n for n in sorted(self.c.nodes) if n != fid]
        self.svc.next_action("delay", ms=5000)
        t, box = self.in_thread(lambda: self.order_via(fid, key, path=path, timeout=40))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the first attempt to reach the upstream")
        return fid, others, t, box

    def _second_attempt(self, nids, key, path):
        """Retries through the other nodes until the answer is not in-progress."""
        def done():
            for nid in nids:
                r = self.order_via(nid, key, path=path)
                if r[0] == 409 and isinstance(r[2], dict) and \
                        r[2].get("code") == "idempotency_request_in_progress":
                    continue
                return r
            return None
        return wait_for(done, 30, "the lease to pass", interval=0.1)

    def test_lease_expiry_takeover_gets_higher_fence(self):
        key = self.key("tk")
        path = "/tk/orders"
        fid, others, t, box = self._stalled_first_attempt(key, path)
        f1 = self.svc.fences(key)[0]
        with self.paused(fid):
            second = self.assertFresh(self._second_attempt(others, key, path))
        fences = self.svc.fences(key)
        self.assertEqual(len(fences), 2, self.svc.executions(key))
        self.assertIsInstance(f1, int)
        self.assertGreater(fences[1], f1, "the taker must carry a higher Idempotency-Fence")
        t.join(40)
        self.assertIn("resp", box, box)
        # The stale holder's answer is passed on, but not recorded: its lease was lost.
        first = box["resp"]
        self.assertEqual(first[0], 201, first)
        self.assertFalse(_replayed(first), first)
        self.assertEqual(first[1].get("idempotency-recorded"), "false",
                         "an answer passed on unrecorded says so: %r" % (first,))
        self.assertNotIn("idempotency-recorded", second[1], second)
        self.assertNotEqual(first[2].get("id"), second[2].get("id"), (first, second))
        for nid in sorted(self.c.nodes):
            self.assertReplayOf(self.order_via(nid, key, path=path), second)
        self.assertEqual(self.svc.count(key), 2)

    def test_lease_expiry_conflict(self):
        key = self.key("cf")
        path = "/cf/orders"
        t0 = time.time()
        fid, others, t, box = self._stalled_first_attempt(key, path)
        claimed = (t0, time.time())  # the first attempt's claim, before it reached upstream
        with self.paused(fid):
            r = self._second_attempt(others, key, path)
            self.assertError(r, 409, "idempotency_lease_expired")
            # the record's ttl deadline, set by the stalled holder's claim
            self.assertCommonHeaders(r, claimed=claimed)
            self.assertEqual(self.svc.count(key), 1, "policy conflict: nothing runs again")
        t.join(40)
        self.assertIn("resp", box, box)
        first = self.assertFresh(box["resp"])
        self.assertNotIn("idempotency-recorded", first[1], "recorded: %r" % (first,))
        # Nobody took the key over: the continued holder renews and records its answer.
        self.assertReplayOf(self.order_via(others[0], key, path=path), first)
        self.assertEqual(self.svc.count(key), 1)

    def test_slow_upstream_keeps_its_lease(self):
        """A slow upstream within the route's timeout keeps its lease (lease 1.5 s, takeover
        policy, 4 s call): every retry meanwhile is in-progress, never a takeover."""
        key = self.key("slow")
        path = "/tk/slow?ms=4000"
        fid = self.follower_ids()[0]
        t, box = self.in_thread(lambda: self.order_via(fid, key, path=path, timeout=40))
        wait_for(lambda: self.svc.count(key) >= 1, 20, "the request to reach the upstream")
        seen = 0
        while "resp" not in box and "exc" not in box:
            for nid in sorted(self.c.nodes):
                r = self.order_via(nid, key, path=path)
                if r[0] == 201 and _replayed(r):
                    break  # the first attempt finished meanwhile
                self.assertInProgress(r)
                seen += 1
            if seen > 200:
                break
            time.sleep(0.1)
        t.join(40)
        self.assertIn("resp", box, box)
        first = self.assertFresh(box["resp"])
        self.assertGreater(seen, 3, "retries must have run while the upstream worked")
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))
        self.assertReplayOf(self.order_via(fid, key, path=path), first)


# ---- followers (cluster secret) ---------------------------------------------------------------

SECRET = "cluster-" + secrets.token_hex(20)


def _rpc_call(addr, payload, timeout=10):
    """One raw RPC frame to addr; returns (outcome, error text) of the answer."""
    import test_cluster  # the frame helpers; its test classes are not run from here
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(test_cluster._frame(payload))
        hdr = b""
        while len(hdr) < 4:
            chunk = s.recv(4 - len(hdr))
            if not chunk:
                raise AssertionError("the node closed the connection")
            hdr += chunk
        n = int.from_bytes(hdr, "big")
        body = b""
        while len(body) < n:
            chunk = s.recv(n - len(body))
            if not chunk:
                raise AssertionError("the node closed the connection")
            body += chunk
    fields = test_cluster._fields(body)
    result = test_cluster._fields(fields.get(2, b""))
    return result.get(1, 0), fields.get(4, b"").decode(errors="replace")


def _claim_as(tenant, auth, key, fingerprint):
    """A Request {request_id 7, auth_token, as_tenant, claim {key, fingerprint}}."""
    import test_cluster
    f = test_cluster._field
    claim = f(1, key.encode()) + f(2, bytes.fromhex(fingerprint))
    return (b"\x08\x07" + f(3, auth.encode()) + f(5, tenant.encode()) + f(10, claim))


OUTCOME_ACQUIRED, OUTCOME_NOT_LEADER = 1, 14
OUTCOME_UNAUTHENTICATED, OUTCOME_FORBIDDEN = 15, 16


class TestProxyFollowers(ProxyTest):
    cluster_opts = dict(secret=SECRET)

    def test_follower_runs_once_and_every_node_replays(self):
        from test_gateway import data_plane, delta, node_metrics
        f1, f2 = self.follower_ids()[:2]
        lid = self.c.wait_leader(timeout=30)
        key = self.key("fol")
        before = {n: data_plane(node_metrics(self.c.nodes[n].http)) for n in (f1, lid)}
        first = self.assertFresh(self.order_via(f1, key))
        self.assertCommonHeaders(first)
        # /metrics: the claim is counted once, by the follower's gateway (transport http); the
        # leader counts its claim and complete forwarded with the cluster secret apart, not
        # as RPC clients' requests.
        d = {n: delta(before[n], data_plane(node_metrics(self.c.nodes[n].http)))
             for n in (f1, lid)}
        self.assertEqual(d[f1].get(("requests", "http", "acquired")), 1, d[f1])
        self.assertEqual(d[lid].get(("forwarded", "acquired")), 1, d[lid])
        self.assertGreaterEqual(d[lid].get(("forwarded", "ok"), 0), 1, d[lid])
        self.assertEqual({k: v for k, v in d[lid].items() if k[0] != "forwarded"}, {}, d[lid])
        self.assertEqual(self.svc.count(key), 1)
        fence = self.svc.fences(key)[0]
        self.assertIsInstance(fence, int, "the follower must send Idempotency-Fence")
        again = self.order_via(f2, key)
        self.assertReplayOf(again, first)
        self.assertCommonHeaders(again)
        self.assertReplayOf(self.order_via(lid, key), first)
        self.assertReplayOf(self.order_via(f1, key), first)
        changed = self.order_via(f2, key, body={"amount": 5, "currency": "EUR"})
        self.assertError(changed, 409, "idempotency_key_reused")
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))

    def test_follower_released_and_quarantined_outcomes(self):
        """release (4xx) and complete-unknown (upstream closes) are forwarded too."""
        fid = self.follower_ids()[0]
        key = self.key("fbad")
        self.assertFresh(self.order_via(fid, key, path="/bad"), 400)
        self.assertFresh(self.order_via(fid, key, path="/bad"), 400)
        self.assertEqual(self.svc.count(key), 2, "released: the retry runs again")
        key2 = self.key("fclose")
        self.svc.next_action("close")
        r = self.order_via(fid, key2)
        self.assertIn(r[0], (502, 504), r)
        for nid in sorted(self.c.nodes):
            self.assertError(self.order_via(nid, key2), 409, "idempotency_outcome_unknown")
        self.assertEqual(self.svc.count(key2), 1)

    def test_concurrent_identical_requests_across_nodes_run_once(self):
        key = self.key("xnode")
        nids = sorted(self.c.nodes)
        results = [None] * 12
        barrier = threading.Barrier(len(results))

        def worker(i):
            try:
                barrier.wait(30)
                results[i] = request(self.c.nodes[nids[i % len(nids)]].proxy, "POST",
                                     "/slow?ms=300", body=ORDER,
                                     headers={"Idempotency-Key": key}, timeout=60)
            except BaseException as e:  # noqa: BLE001
                results[i] = e
        threads = [threading.Thread(target=worker, args=(i,), daemon=True)
                   for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        fresh = [r for r in results if isinstance(r, tuple) and r[0] == 201 and not _replayed(r)]
        for r in results:
            self.assertIsInstance(r, tuple, r)
            if r[0] == 409:
                self.assertInProgress(r)
            elif r[0] == 503:
                self.assertError(r, 503, "idempotency_unavailable")
            else:
                self.assertEqual(r[0], 201, r)
        self.assertLessEqual(len(fresh), 1, fresh)
        self.assertEqual(self.svc.count(key), 1, self.svc.executions(key))

    def test_rpc_as_tenant_needs_the_cluster_secret(self):
        lid = self.c.wait_leader(timeout=30)
        addr = self.c.nodes[lid].rpc
        key = self.key("astenant")
        fp = harness.fp(key)
        # A tenant's token (beta's, asking to act as the route's tenant alpha or as itself),
        # the admin token, an unknown token: refused, and nothing is proposed.
        from test_gateway import data_plane, delta, node_metrics
        before = data_plane(node_metrics(self.c.nodes[lid].http))
        for auth, tenant, want in ((self.c.token2, "alpha", OUTCOME_FORBIDDEN),
                                   (self.c.token, "alpha", OUTCOME_FORBIDDEN),
                                   (self.c.admin, "alpha", OUTCOME_FORBIDDEN),
                                   ("not-a-token-" + secrets.token_hex(8), "alpha",
                                    OUTCOME_UNAUTHENTICATED),
                                   ("", "alpha", OUTCOME_UNAUTHENTICATED)):
            with self.subTest(tenant=tenant, want=want):
                oc, err = _rpc_call(addr, _claim_as(tenant, auth, key, fp))
                self.assertEqual(oc, want, err)
                self.assertIn("cluster secret", err)
        # /metrics: requests with as_tenant are a follower proxy's forwarded ones, counted
        # apart (the proxy counts its client's request), but only once the secret passed:
        # refused ones are this node's own RPC clients' (nobody hides refusals as forwards).
        d = delta(before, data_plane(node_metrics(self.c.nodes[lid].http)))
        self.assertEqual(d, {("requests", "rpc", "forbidden"): 3,
                             ("requests", "rpc", "unauthenticated"): 2}, d)
        for tok in (self.c.token, self.c.token2):
            rc, out = self.c.ctl("get", key, token=tok)
            self.assertEqual(rc, 0, out)
            self.assertEqual(out.get("outcome"), "not_found", out)
        # The cluster secret is accepted (the control: the refusals above were for the token).
        oc, err = _rpc_call(addr, _claim_as("alpha", SECRET, key, fp))
        self.assertEqual(oc, OUTCOME_ACQUIRED, err)
        rc, out = self.c.ctl("get", key, token=self.c.token)
        self.assertEqual(out.get("outcome"), "ok", out)
        self.assertEqual(out["record"]["state"], "processing", out)
        rc, out = self.c.ctl("get", key, token=self.c.token2)
        self.assertEqual(out.get("outcome"), "not_found", "the record is alpha's, not beta's")

    def test_rpc_as_tenant_only_for_a_route_tenant(self):
        """The cluster secret acts only for a tenant a proxy route names (alpha here): beta, a
        configured tenant no route names, and an unknown one are forbidden, counted, and
        nothing is proposed."""
        from test_gateway import data_plane, delta, mval, node_metrics
        lid = self.c.wait_leader(timeout=30)
        addr = self.c.nodes[lid].rpc
        key = self.key("notroute")
        m0 = node_metrics(self.c.nodes[lid].http)
        for tenant in ("beta", "nobody"):
            with self.subTest(tenant=tenant):
                oc, err = _rpc_call(addr, _claim_as(tenant, SECRET, key, harness.fp(key)))
                self.assertEqual(oc, OUTCOME_FORBIDDEN, err)
                self.assertIn("no proxy route of this node names that tenant", err)
        m1 = node_metrics(self.c.nodes[lid].http)
        refused = lambda m, r: mval(m, "idem_as_tenant_refused_total", reason=r)  # noqa: E731
        self.assertEqual(refused(m1, "tenant") - refused(m0, "tenant"), 2)
        self.assertEqual(refused(m1, "secret") - refused(m0, "secret"), 0)
        self.assertEqual(delta(data_plane(m0), data_plane(m1)),
                         {("requests", "rpc", "forbidden"): 2})
        rc, out = self.c.ctl("get", key, token=self.c.token2)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.get("outcome"), "not_found", out)

    def test_secret_is_never_logged(self):
        self.assertFresh(self.order_via(self.follower_ids()[0], self.key("log")))
        for node in self.c.nodes.values():
            with open(node.log, "rb") as f:
                self.assertNotIn(SECRET.encode(), f.read(), "node %d logged the secret" % node.id)


class TestProxyWrongSecret(ProxyTest):
    """Nodes 1 and 2 share the secret, node 3 has another one; node 1 leads. Node 3's
    forwarded claims are refused by the leader (a node without any secret does not forward
    at all: TestProxyBasics.test_follower_proxy_answers_503)."""
    cluster_opts = dict(secret=SECRET, node_secrets={3: "wrong-" + secrets.token_hex(20)})

    def setUp(self):
        super().setUp()
        if self.c.wait_leader(timeout=30) != 1:
            rc, out = self.c.ctl("transfer", 1)
            self.assertEqual(rc, 0, out)
            wait_for(lambda: self.c.leader() == 1, 20, "leadership to move to node 1")
        type(self).lid = 1

    def test_wrong_secret_follower_answers_503(self):
        before = self.svc.count()
        key = self.key("wrong")
        for _ in range(3):
            r = request(self.c.nodes[3].proxy, "POST", "/orders", body=ORDER,
                        headers={"Idempotency-Key": key})
            b = self.assertError(r, 503, "idempotency_unavailable")
            self.assertIn("cluster secret", b["message"], r)
            self.assertRetryAfter(r)
            self.assertNoExpires(r)
        self.assertEqual(self.svc.count(), before, "nothing may reach the upstream")
        rc, out = self.c.ctl("get", key)
        self.assertEqual(out.get("outcome"), "not_found", out)
        with open(self.c.nodes[3].log, "rb") as f:
            self.assertIn(b"refused this node's cluster secret", f.read())
        # The same key through node 2 (the right secret) runs once.
        first = self.assertFresh(self.order_via(2, key))
        self.assertReplayOf(self.order_via(1, key), first)
        self.assertEqual(self.svc.count(key), 1)


class TestProxyFailover(ProxyTest):
    """kill -9 of the leader while clients load every node's proxy."""
    cluster_opts = dict(secret=SECRET)
    CLIENTS = 8
    KEYS_PER_CLIENT = 8
    KEY_BOUND_S = 12.0  # each key is retried for at most this long (< the lease)

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, lease_ms=20000, lease_policy="conflict",
                      upstream_timeout_ms=8000)]

    def test_leader_killed_mid_load(self):
        lid = self.c.wait_leader(timeout=30)
        dead = set()
        lock = threading.Lock()
        answers = []           # (key, status, code or None, replayed)
        first_2xx = {}         # key -> Resp
        errors = []
        rnd = __import__("random").Random(7)

        def targets():
            with lock:
                ids = [n for n in sorted(self.c.nodes) if n not in dead]
            rnd_ids = ids[:]
            rnd.shuffle(rnd_ids)
            return rnd_ids

        def run_key(key, path):
            end = time.monotonic() + self.KEY_BOUND_S
            while time.monotonic() < end:
                for nid in targets():
                    try:
                        r = request(self.c.nodes[nid].proxy, "POST", path, body=ORDER,
                                    headers={"Idempotency-Key": key}, timeout=15)
                    except (OSError, http.client.HTTPException):
                        continue  # the node died under us: the next one
                    code = r[2].get("code") if isinstance(r[2], dict) else None
                    with lock:
                        answers.append((key, r[0], code, _replayed(r)))
                    if 200 <= r[0] < 300:
                        with lock:
                            first_2xx.setdefault(key, r)
                        return
                    if r[0] not in (409, 503):
                        return  # recorded; checked below
                    break
                time.sleep(0.1)

        def client(ci):
            try:
                for k in range(self.KEYS_PER_CLIENT):
                    path = "/slow?ms=150" if k % 2 else "/orders"
                    run_key("fo-%d-%d-%s" % (ci, k, secrets.token_hex(4)), path)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        base = self.svc.count()
        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(self.CLIENTS)]
        for t in threads:
            t.start()
        wait_for(lambda: self.svc.count() - base >= self.CLIENTS, 30, "load to reach the upstream")
        with lock:
            dead.add(lid)
        self.c.kill(lid)
        for t in threads:
            t.join(self.KEYS_PER_CLIENT * self.KEY_BOUND_S + 60)
        self.assertFalse(any(t.is_alive() for t in threads), "clients did not finish")
        self.assertEqual(errors, [])
        summary = {}
        for _, st, code, rep in answers:
            k = "%d%s" % (st, " replay" if rep else "") if st < 300 else "%d %s" % (st, code)
            summary[k] = summary.get(k, 0) + 1
        print("\nfailover: %d keys, %d with a 2xx; answers %r" % (
            len({a[0] for a in answers}), len(first_2xx), summary), file=sys.stderr)
        # Answers: only 2xx (fresh or replayed), 409 in-progress, or 503 unavailable.
        for key, st, code, rep in answers:
            ok = (200 <= st < 300) or (st == 409 and code == "idempotency_request_in_progress") \
                or (st == 503 and code == "idempotency_unavailable")
            self.assertTrue(ok, "unexpected answer for %s: %d %s" % (key, st, code))
        # At most once per key.
        by_key = self.svc.stats()["by_key"]
        keys = {a[0] for a in answers}
        for key in keys:
            self.assertLessEqual(by_key.get(key, 0), 1, (key, self.svc.executions(key)))
        self.assertGreater(len(first_2xx), len(keys) // 2, "most keys must have succeeded")
        # Every key that got a 2xx replays the same answer through every surviving node.
        survivors = [n for n in sorted(self.c.nodes) if n != lid]
        for key, first in sorted(first_2xx.items()):
            path = "/slow?ms=150" if first[2].get("slept") is not None else "/orders"
            for nid in survivors:
                r = self.order_via(nid, key, path=path)
                self.assertEqual(r[0], first[0], (key, r, first))
                self.assertEqual(r.raw, first.raw, (key, r, first))
                self.assertTrue(_replayed(r), (key, r))
            self.assertEqual(by_key.get(key, 0), 1, (key, self.svc.executions(key)))


class TestProxyShutdown(ProxyTest):
    """SIGTERM after proxy traffic (forwarded claims, renewals, pooled upstream connections,
    h2o's own 413): every node exits 0, and a sanitizer build reports nothing."""
    cluster_opts = dict(secret=SECRET)

    @classmethod
    def routes(cls, upstream):
        return [route(upstream, lease_ms=600, lease_policy="takeover")]

    def test_clean_exit_after_traffic(self):
        fid = self.follower_ids()[0]
        lid = self.c.wait_leader(timeout=30)
        for nid in (fid, lid):
            key = self.key("sd")
            first = self.assertFresh(self.order_via(nid, key, path="/slow?ms=700"))  # renewed
            self.assertReplayOf(self.order_via(nid, key, path="/slow?ms=700"), first)
            r = request(self.c.nodes[nid].proxy, "GET", "/orders/1")
            self.assertEqual(r[0], 200, r)
        self.assertEqual(request(self.c.nodes[fid].proxy, "POST", "/orders", raw=b"x" * (3 * MiB),
                                 headers={"Idempotency-Key": self.key("big")})[0], 413)
        for nid in sorted(self.c.nodes):
            self.assertEqual(self.c.stop(nid), 0, "node %d did not exit cleanly" % nid)
        for node in self.c.nodes.values():
            with open(node.log, "rb") as f:
                text = f.read()
            self.assertNotIn(b"Sanitizer", text, "node %d: %s" % (node.id, text[-3000:]))
            self.assertNotIn(b"runtime error", text, "node %d: %s" % (node.id, text[-3000:]))


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
        # Idempotency-Expires: when the tombstone is dropped (the tenant's tombstone time,
        # 24 h by default), no longer the 2 s ttl the answers before it had
        self.assertCommonHeaders(r)
        tomb = email.utils.parsedate_to_datetime(r[1]["idempotency-expires"]).timestamp()
        self.assertGreater(tomb, time.time() + 3600, r)
        self.assertFalse(_replayed(r), r)
        self.assertEqual(self.svc.count(key), 1, "an expired key must not run again")
        k2 = self.key("fresh")
        self.assertFresh(self.order(k2))
        self.assertEqual(self.svc.count(k2), 1)


if __name__ == "__main__":
    unittest.main()
