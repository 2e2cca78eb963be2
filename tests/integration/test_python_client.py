"""The Python client (client/python, package idem) against real idemd clusters.

    TestPyRun        32 threads run one key (the function runs once, every caller gets its
                     answer); a 2 s lease kept alive through a 5 s function by the renewals
                     (and, as the control, lost without them); Retryable releases, any other
                     exception quarantines
    TestPyFailover   the leader SIGKILLed while 32 callers are in run (see its docstring)
    TestPyWsgi       a plain WSGI app behind idem.wsgi.IdempotencyMiddleware, served by
                     wsgiref on 127.0.0.1: one execution per key, replays, 409s (problem
                     details, as the gateway writes them), pass-through, 4xx released, the
                     fence, a body idemd cannot keep, 503 without idemd
    TestPyAsgi       a minimal ASGI app behind idem.asgi.IdempotencyMiddleware, called with
                     scope/receive/send directly; the event loop keeps turning while the
                     client waits on a node that never answers
    TestPyTls        HTTPS with a required client certificate (tls.http_client_certs)
    TestPyFingerprintOptions
                     fingerprint_fields / fingerprint_ignore through run and both
                     middlewares: needs a gateway that applies them (a retry whose ignored
                     value changed replays; one whose hashed value changed is refused)

The package is imported from the source tree (no install, no network).

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_python_client
"""
import asyncio
import io
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
import unittest
import wsgiref.simple_server
import wsgiref.util

import harness
from harness import ClusterTestCase, free_port, wait_for
from test_tls_bench import TlsCluster

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "client", "python"))
EXAMPLES = os.path.join(SRC, "examples", "python")
import idem  # noqa: E402
import idem.asgi  # noqa: E402
import idem.wsgi  # noqa: E402

ORDER = {"method": "POST", "path": "/orders", "body": {"amount": 10, "currency": "EUR"}}


def urls(c, ids=None):
    return ["http://" + c.nodes[i].http for i in (ids or sorted(c.nodes))]


def order_response(token, n=1):
    return idem.Response(201, {"content-type": "application/json"},
                         json.dumps({"order": n, "fence": token}))


class PyTest(ClusterTestCase):
    def client(self, *args, **kw):
        """An idem.Client closed (its kept-alive connections) after the test."""
        c = idem.Client(*args, **kw)
        self.addCleanup(c.close)
        return c

    def assert_problem(self, status, headers, raw, want_status, code, key, gateway=True):
        """A middleware's refusal: RFC 9457 problem details with the gateway's members;
        with gateway, the request id of idemd's answer (the 16 hex digits this client
        sends as X-Request-Id, which the gateway keeps) in request_id and instance; never
        the key."""
        h = {k.lower(): v for k, v in headers.items()}
        raw = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        self.assertEqual((status, h.get("content-type")), (want_status,
                                                           "application/problem+json"), raw)
        self.assertNotIn(key, raw)
        p = json.loads(raw)
        members = {"type", "title", "status", "detail", "code", "message"}
        if gateway:
            members |= {"instance", "request_id"}
        self.assertEqual(set(p), members, raw)
        self.assertEqual((p["type"], p["code"], p["status"], p["title"]),
                         ("urn:idemd:problem:" + code, code, want_status,
                          idem._middleware.TITLES[code]))
        self.assertTrue(p["detail"])
        self.assertEqual(p["message"], p["detail"])
        if gateway:
            self.assertRegex(p["request_id"], r"^[0-9a-f]{16}$")
            self.assertEqual(p["instance"], "urn:idemd:request:" + p["request_id"])
        return p


class TestPyRun(PyTest):
    def test_32_callers_one_key(self):
        """32 threads run one key at once (half on a shared client, half on clients of their
        own that start at another node, so followers forward): the function runs exactly
        once, one caller ran it, 31 got its response replayed."""
        shared = self.client(urls(self.c), self.c.token)
        runs, lock = [], threading.Lock()
        barrier = threading.Barrier(32)

        def fn(token):
            with lock:
                runs.append(token)
            time.sleep(0.5)
            return order_response(token)

        out = [None] * 32

        def caller(i):
            cl = shared if i % 2 else self.client(list(reversed(urls(self.c))), self.c.token)
            barrier.wait()
            try:
                out[i] = cl.run("one-key", fn, request=ORDER, wait=30)
            except Exception as e:  # kept and asserted on below
                out[i] = e
        threads = [threading.Thread(target=caller, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(len(runs), 1, "the function ran %d times" % len(runs))
        bad = [o for o in out if not isinstance(o, idem.Result)]
        self.assertFalse(bad, "callers without a result: %r" % bad[:3])
        want = order_response(runs[0])
        for o in out:
            self.assertEqual((o.response.status, o.response.body,
                              o.response.headers.get("content-type")),
                             (want.status, want.body, "application/json"))
        self.assertEqual(sum(o.ran for o in out), 1)
        self.assertEqual(sum(o.replayed for o in out), 31)
        ran = next(o for o in out if o.ran)
        self.assertEqual((ran.token, ran.completion), (runs[0], "succeeded"))
        rec = shared.get("one-key")
        self.assertEqual((rec.state, rec.token, rec.response.body), ("completed", runs[0],
                                                                     want.body))

    def _probe(self, client, key, at, results, t0):
        """At each time in `at` (seconds after t0), a claim of key by another attempt with
        policy takeover: in_progress while the holder's lease runs, acquired once it passed."""
        for t in at:
            time.sleep(max(0.0, t0 + t - time.monotonic()))
            try:
                c = client.claim(key, request=ORDER, policy="takeover", deadline=5)
                results.append(("acquired", c.token) if not c.replayed else ("replay",))
            except idem.InProgress:
                results.append(("in_progress",))
            except idem.IdemError as e:
                results.append(("error", e))

    def test_renew_keeps_a_short_lease(self):
        """A 2 s lease through a 5 s function: renewed every third of it, so another attempt
        with policy takeover finds the key in progress at 2.5 s and 4.5 s (past the lease the
        claim granted), and the response is recorded with the run's token. The control: the
        same claim without renewals is taken over after 2 s, so the probe does see a lapse."""
        client = self.client(urls(self.c), self.c.token)
        seen = []
        t0 = time.monotonic()
        probe = threading.Thread(target=self._probe,
                                 args=(client, "renewed", (2.5, 4.5), seen, t0))
        probe.start()
        res = client.run("renewed", lambda tok: (time.sleep(5), order_response(tok))[1],
                         request=ORDER, lease_ms=2000)
        probe.join()
        self.assertGreaterEqual(time.monotonic() - t0, 5)
        self.assertEqual(seen, [("in_progress",), ("in_progress",)])
        self.assertTrue(res.ran and not res.replayed, res)
        self.assertEqual(res.note, "")
        self.assertGreaterEqual(res.renewals, 5, res)  # every ~667 ms for 5 s
        rec = client.get("renewed")
        self.assertEqual((rec.state, rec.token), ("completed", res.token))

        # Control: claimed with the same 2 s lease and never renewed.
        c = client.claim("lapsed", request=ORDER, lease_ms=2000)
        seen = []
        self._probe(client, "lapsed", (1.0, 2.6), seen, time.monotonic())
        self.assertEqual(seen[0], ("in_progress",))
        self.assertEqual(seen[1][0], "acquired", seen)
        self.assertGreater(seen[1][1], c.token)
        with self.assertRaises(idem.LeaseLost):
            client.complete("lapsed", c.token, order_response(c.token))

    def test_retryable_releases_other_errors_quarantine(self):
        client = self.client(urls(self.c), self.c.token)
        calls = []

        def flaky(token):
            calls.append(token)
            if len(calls) == 1:
                raise idem.Retryable("the payment service refused the connection")
            return order_response(token)
        with self.assertRaises(idem.Retryable):
            client.run("retry-me", flaky, request=ORDER)
        res = client.run("retry-me", flaky, request=ORDER)  # released: runs again
        self.assertTrue(res.ran)
        self.assertEqual(len(calls), 2)
        # retry_on: the caller's own exception types mean "nothing happened" as well.
        with self.assertRaises(ConnectionRefusedError):
            client.run("retry-on", lambda t: (_ for _ in ()).throw(ConnectionRefusedError()),
                       request=ORDER, retry_on=(ConnectionRefusedError,))
        self.assertTrue(client.run("retry-on", lambda t: b"ok", request=ORDER).ran)

        def timeout(token):
            raise TimeoutError("sent the charge, no answer")
        with self.assertRaises(TimeoutError):
            client.run("ambiguous", timeout, request=ORDER)
        self.assertEqual(client.get("ambiguous").state, "quarantined")
        with self.assertRaises(idem.UnknownOutcome):
            client.run("ambiguous", lambda t: self.fail("ran again"), request=ORDER)
        with self.assertRaises(idem.Mismatch):
            client.run("retry-me", lambda t: self.fail("ran"), request=dict(ORDER, path="/x"))
        with self.assertRaises(idem.Unauthorized):
            client.with_token("nope").run("k", lambda t: self.fail("ran"), request=ORDER)
        with self.assertRaises(idem.InvalidRequest) as e:
            client.run("a key with spaces", lambda t: self.fail("ran"), request=ORDER)
        self.assertEqual(e.exception.code, "idempotency_key_invalid")


class TestPyFailover(PyTest):
    def test_leader_killed_while_callers_run(self):
        """32 callers run one key; the function takes 1 s, and the leader is SIGKILLed once
        it started. Every client lists the leader first, so each one's next request meets a
        dead node, then followers without a leader until one is elected.

        What idem_run (and Client.run) guarantees, and so what is asserted:
        - At most once: the function runs only after an `acquired`, and a key in processing
          is acquired again only by a takeover (not asked for here) or by the same attempt
          id, which is one caller's own; the acquired record was committed on a majority
          before its answer, so the new leader has it. Here it started, so exactly once.
        - One outcome: every caller ends with the function's response (the runner's own
          Result, or a replay of what it recorded) or a typed error saying that nothing
          could be known in time -- Unavailable, InProgressTimeout, or, for the runner only,
          NotRecorded (its complete did not land; it carries the same response). No caller
          gets another response, and none runs the function.
        - The record then holds the runner's token: completed with its response, or (after
          NotRecorded) still processing.
        Liveness, which the contract alone does not promise: the cluster elects a leader in
        about a second here, far inside each call's 15 s deadline and the 40 s wait, so
        every caller must end with the response; an error means the client gave up early.
        """
        lid = self.c.wait_leader()
        order = [lid] + [i for i in sorted(self.c.nodes) if i != lid]
        client = self.client(urls(self.c, order), self.c.token, deadline=15)
        runs, lock, started = [], threading.Lock(), threading.Event()

        def fn(token):
            with lock:
                runs.append(token)
            started.set()
            time.sleep(1.0)
            return order_response(token, 7)

        out = [None] * 32

        def caller(i):
            cl = client if i % 2 else self.client(urls(self.c, order), self.c.token,
                                                  deadline=15)
            try:
                out[i] = cl.run("order-7", fn, request=ORDER, wait=40)
            except Exception as e:  # asserted on below
                out[i] = e
        threads = [threading.Thread(target=caller, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        self.assertTrue(started.wait(15), "the function never started")
        time.sleep(0.2)
        self.c.kill(lid)
        killed_at = time.monotonic()
        for t in threads:
            t.join(90)
        self.assertFalse([t for t in threads if t.is_alive()], "callers still running")
        took = time.monotonic() - killed_at

        self.assertEqual(len(runs), 1, "the function ran %d times" % len(runs))
        want = order_response(runs[0], 7)
        allowed = (idem.Unavailable, idem.InProgressTimeout, idem.NotRecorded)
        results = [o for o in out if isinstance(o, idem.Result)]
        errors = [o for o in out if not isinstance(o, idem.Result)]
        self.assertFalse([e for e in errors if not isinstance(e, allowed)], errors)
        for o in results:
            self.assertEqual((o.response.status, o.response.body), (want.status, want.body))
        not_recorded = [e for e in errors if isinstance(e, idem.NotRecorded)]
        self.assertLessEqual(sum(o.ran for o in results) + len(not_recorded), 1)
        for e in not_recorded:
            self.assertEqual((e.token, e.response.body), (runs[0], want.body))
        survivors = [i for i in order if i != lid]
        rec = self.client(urls(self.c, survivors), self.c.token).get("order-7")
        self.assertEqual(rec.token, runs[0])
        if not_recorded:
            self.assertEqual(rec.state, "processing")
        else:
            self.assertEqual((rec.state, rec.response.body), ("completed", want.body))
        # Liveness (see above).
        self.assertFalse(errors, "callers that gave up: %r" % errors[:3])
        self.assertEqual(sum(o.ran for o in results), 1)
        print("failover: 32 callers done %.1f s after the kill" % took)


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *a):
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    daemon_threads = True


class OrderApp:
    """A plain WSGI app: POST /orders makes an order (400 for a negative amount), POST
    /slow takes a second, POST /blob answers bytes that are not UTF-8; GET /orders lists.
    Counts its executions."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        fence = environ.get("HTTP_IDEMPOTENCY_FENCE")
        with self.lock:
            self.calls.append((method, path, fence))
            n = len(self.calls)
        if method == "GET":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [b"[]"]
        if path == "/slow":
            time.sleep(1.0)
        if path == "/blob":
            start_response("200 OK", [("Content-Type", "application/octet-stream")])
            return [bytes(range(256))]
        order = json.loads(body or b"{}")
        if order.get("amount", 0) < 0:
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"error": "negative amount"}']
        start_response("201 Created", [("Content-Type", "application/json"),
                                       ("Set-Cookie", "session=1"), ("X-Fence", fence or "")])
        return [json.dumps({"order": n, "fence": fence}).encode()]


def http(addr, method, path, body=None, key=None, headers=None):
    h = dict(headers or {})
    if key:
        h["Idempotency-Key"] = key
    raw = body.encode() if isinstance(body, str) else body
    if raw is not None:
        h.setdefault("Content-Type", "application/json")
    return harness.http_request(addr, method, path, headers=h, raw=raw)


class TestPyWsgi(PyTest):
    def setUp(self):
        super().setUp()
        self.app = OrderApp()
        client = self.client(urls(self.c), self.c.token)
        mw = idem.wsgi.IdempotencyMiddleware(self.app, client, [("POST", "/orders"),
                                                                ("POST", "/slow"),
                                                                ("POST", "/blob")])
        self.srv = wsgiref.simple_server.make_server("127.0.0.1", 0, mw,
                                                     server_class=_ThreadingServer,
                                                     handler_class=_QuietHandler)
        self.addr = "127.0.0.1:%d" % self.srv.server_address[1]
        self.th = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.th.start()

    def tearDown(self):
        self.srv.shutdown()
        self.srv.server_close()
        super().tearDown()

    def test_one_execution_per_key(self):
        a = http(self.addr, "POST", "/orders", '{"amount": 10, "currency": "EUR"}', "w-1")
        self.assertEqual(a[0], 201, a)
        self.assertNotIn("idempotency-replayed", a[1])
        self.assertEqual(a[1].get("set-cookie"), "session=1")  # the first caller gets all
        # The same request (canonical JSON: other spacing and order) replays.
        b = http(self.addr, "POST", "/orders", '{"currency":"EUR","amount":10}', "w-1")
        self.assertEqual((b[0], b.raw, b[1].get("content-type")),
                         (201, a.raw, "application/json"))
        self.assertEqual(b[1].get("idempotency-replayed"), "true")
        self.assertNotIn("set-cookie", b[1])  # not recorded: response_headers
        self.assertEqual(len(self.app.calls), 1)
        # The app got the fencing token, not the one the caller sent.
        c = http(self.addr, "POST", "/orders", '{"amount": 5}', "w-2",
                 headers={"Idempotency-Fence": "1"})
        self.assertEqual(c[0], 201, c)
        fence = c[2]["fence"]
        self.assertTrue(fence and fence != "1" and int(fence) > 65536, fence)
        # Same key, another body: 409 as problem details, the app does not run.
        d = http(self.addr, "POST", "/orders", '{"amount": 99}', "w-1")
        self.assert_problem(d[0], d[1], d.raw, 409, "idempotency_key_reused", "w-1")
        self.assertEqual(len(self.app.calls), 2)
        # Without a key, and on other routes (GET is not in the route), the app just runs.
        self.assertEqual(http(self.addr, "POST", "/orders", '{"amount": 1}')[0], 201)
        self.assertEqual(http(self.addr, "GET", "/orders", key="w-1")[0], 200)
        self.assertEqual(len(self.app.calls), 4)
        self.assertEqual(self.app.calls[-1][2], None)  # no fence on a pass-through

    def test_4xx_released_in_progress_and_unstorable(self):
        for _ in range(2):  # a 400 is released: the next try runs again
            r = http(self.addr, "POST", "/orders", '{"amount": -1}', "w-neg")
            self.assertEqual(r[0], 400, r)
            self.assertNotIn("idempotency-replayed", r[1])
        self.assertEqual(len(self.app.calls), 2)
        # While one request holds the key, the same one gets 409 with Retry-After.
        first = []
        t = threading.Thread(target=lambda: first.append(
            http(self.addr, "POST", "/slow", '{"n": 1}', "w-slow")))
        t.start()
        wait_for(lambda: any(p == "/slow" for _, p, _f in self.app.calls), 10, "slow to run")
        r = http(self.addr, "POST", "/slow", '{"n": 1}', "w-slow")
        t.join()
        self.assertEqual((r[0], r[2]["code"]), (409, "idempotency_request_in_progress"), r)
        self.assertGreaterEqual(int(r[1]["retry-after"]), 1)
        self.assertEqual(first[0][0], 201)
        # A body idemd cannot keep (not UTF-8): this caller gets it, retries get 502 (as
        # proxy mode records an answer it cannot keep).
        r = http(self.addr, "POST", "/blob", "{}", "w-blob")
        self.assertEqual((r[0], r[1].get("content-type")), (200, "application/octet-stream"))
        r = http(self.addr, "POST", "/blob", "{}", "w-blob")
        self.assertEqual((r[0], r[2]["code"]), (502, "upstream_response_too_large"), r)
        self.assertEqual(sum(p == "/blob" for _, p, _f in self.app.calls), 1)
        with self.assertRaises(idem.ResponseTooLarge):  # the client sees the same
            self.client(urls(self.c), self.c.token).claim("w-blob", request={
                "method": "POST", "path": "/blob", "body": {}})

    def test_fails_closed_without_idemd(self):
        dead = self.client(["http://127.0.0.1:%d" % free_port()], self.c.token, deadline=1)
        mw = idem.wsgi.IdempotencyMiddleware(self.app, dead, [("POST", "/orders")],
                                             mismatch_status=422)
        env = {}
        wsgiref.util.setup_testing_defaults(env)
        body = b'{"amount": 3}'
        env.update(REQUEST_METHOD="POST", PATH_INFO="/orders", CONTENT_TYPE="application/json",
                   CONTENT_LENGTH=str(len(body)), HTTP_IDEMPOTENCY_KEY="w-dead")
        env["wsgi.input"] = io.BytesIO(body)
        got = {}
        out = b"".join(mw(env, lambda s, h: got.update(status=s, headers=dict(h))))
        self.assertTrue(got["status"].startswith("503"), got)
        self.assert_problem(503, got["headers"], out, 503, "idempotency_unavailable", "w-dead",
                            gateway=False)  # no node answered: no request id
        self.assertEqual(got["headers"]["Retry-After"], "1")
        self.assertEqual(self.app.calls, [])

    def test_examples(self):
        """examples/python: the WSGI order service, and run_charge.py (exit statuses)."""
        nodes = ",".join(urls(self.c))
        p = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "wsgi_orders.py"),
                              "--idem", nodes, "--token", self.c.token, "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = p.stdout.readline()
            self.assertIn("serving on http://", line)
            addr = line.strip().rsplit("//", 1)[1]
            a = http(addr, "POST", "/orders", '{"amount": 10, "currency": "EUR"}', "ex-1")
            b = http(addr, "POST", "/orders", '{"currency": "EUR", "amount": 10}', "ex-1")
            self.assertEqual((a[0], b[0], b[1].get("idempotency-replayed")), (201, 201, "true"))
            self.assertEqual((b.raw, b[1].get("location")), (a.raw, "/orders/1"))
            self.assertTrue(a[2]["fence"])
            self.assertEqual(http(addr, "GET", "/orders/1")[2], a[2])
            bad = http(addr, "POST", "/orders", '{"amount": 10, "currency": "USD"}', "ex-1")
            self.assertEqual(bad[0], 409)
        finally:
            p.terminate()
            p.wait(10)
            p.stdout.close()

        def charge(*args):
            return subprocess.run([sys.executable, os.path.join(EXAMPLES, "run_charge.py"),
                                   "--idem", nodes, "--token", self.c.token] + list(args),
                                  capture_output=True, text=True, timeout=60)
        r1, r2, r3 = charge("ex-7", "10 EUR"), charge("ex-7", "10 EUR"), charge("ex-7", "9 EUR")
        self.assertEqual((r1.returncode, r2.returncode, r3.returncode), (0, 0, 1),
                         (r1, r2, r3))
        self.assertIn("outcome: charged", r1.stdout)
        self.assertIn("charging 10 EUR", r1.stderr)
        self.assertEqual(r2.stdout.replace("replay", "charged"), r1.stdout)
        self.assertNotIn("charging", r2.stderr)
        self.assertIn("idempotency_key_reused", r3.stdout)


async def _asgi_request(app, method, path, body, key):
    """Calls an ASGI app with one HTTP request; returns (status, {header: value}, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"),
                         (b"idempotency-key", key.encode())]}
    chunks = [body[:3], body[3:]]  # in two parts, as a server may deliver it

    async def receive():
        if chunks:
            part = chunks.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(chunks)}
        await asyncio.sleep(3600)

    sent = []

    async def send(msg):
        sent.append(msg)
    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


class TestPyAsgi(PyTest):
    def test_asgi(self):
        calls = []

        async def app(scope, receive, send):
            msg = await receive()
            calls.append(msg["body"])
            await asyncio.sleep(0.05)
            body = json.dumps({"order": len(calls), "fence": scope["idem"]["token"]}).encode()
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})

        # The first node accepts connections and never answers: the client's first attempt
        # waits for a third of its deadline there, in a worker thread.
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        nodes = ["http://127.0.0.1:%d" % hole.getsockname()[1]] + urls(self.c)
        mw = idem.asgi.IdempotencyMiddleware(app, self.client(nodes, self.c.token, deadline=3),
                                             [("POST", "/orders")])

        async def main():
            gaps, stop = [], asyncio.Event()

            async def ticker():
                last = time.monotonic()
                while not stop.is_set():
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
            tick = asyncio.create_task(ticker())
            t0 = time.monotonic()
            a = await _asgi_request(mw, "POST", "/orders", b'{"amount": 10}', "a-1")
            took = time.monotonic() - t0
            b = await _asgi_request(mw, "POST", "/orders", b'{ "amount" : 10 }', "a-1")
            c = await _asgi_request(mw, "POST", "/orders", b'{"amount": 11}', "a-1")
            stop.set()
            await tick
            return a, b, c, took, max(gaps)
        try:
            a, b, c, took, gap = asyncio.run(main())
        finally:
            hole.close()
        self.assertEqual(a[0], 201, a)
        self.assertNotIn("idempotency-replayed", a[1])
        self.assertEqual((b[0], b[2], b[1].get("idempotency-replayed")), (201, a[2], "true"))
        self.assertEqual(b[1].get("content-type"), "application/json")
        self.assert_problem(c[0], c[1], c[2], 409, "idempotency_key_reused", "a-1")
        self.assertEqual(calls, [b'{"amount": 10}'])
        self.assertGreater(took, 0.9)  # the silent node was tried first
        self.assertLess(gap, 0.5, "the event loop stalled for %.2f s" % gap)


class TestPyTls(PyTest):
    def make_cluster(self):
        return TlsCluster(lambda pki: ["cert_file: %s/server.crt" % pki,
                                       "key_file: %s/server.key" % pki, "http: true",
                                       "ca_file: %s/ca.crt" % pki,
                                       "http_client_certs: require"], n=1)

    def test_https_with_client_certificate(self):
        pki = self.c.pki
        node = "https://" + self.c.nodes[1].http
        client = self.client([node], self.c.token, cafile=pki + "/ca.crt",
                             certfile=pki + "/client.crt", keyfile=pki + "/client.key")
        res = client.run("tls-1", lambda tok: order_response(tok), request=ORDER)
        self.assertTrue(res.ran)
        self.assertTrue(client.run("tls-1", lambda tok: self.fail("ran"), request=ORDER).replayed)
        anon = self.client([node], self.c.token, cafile=pki + "/ca.crt", deadline=1)
        with self.assertRaises(idem.Unavailable) as e:  # the node ends the handshake
            anon.get("tls-1")
        self.assertIn(node, str(e.exception))
        other = self.client([node], self.c.token, cafile=pki + "/other-ca.crt",
                            certfile=pki + "/client.crt", keyfile=pki + "/client.key",
                            deadline=1)
        with self.assertRaises(idem.Unavailable) as e:
            other.get("tls-1")
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(e.exception))

    def test_example_with_the_tls_environment(self):
        """examples/python/run_charge.py with the TLS variables that tools/quickstart.sh
        --tls writes to .idem/env: it trusts the CA and presents the client certificate
        the node requires."""
        pki = self.c.pki
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}
        env.update(IDEM_HTTP="https://" + self.c.nodes[1].http, IDEM_TOKEN=self.c.token,
                   IDEM_TLS_CA=pki + "/ca.crt", IDEM_TLS_CERT=pki + "/client.crt",
                   IDEM_TLS_KEY=pki + "/client.key")

        def charge():
            return subprocess.run([sys.executable, os.path.join(EXAMPLES, "run_charge.py"),
                                   "tls-ex", "10 EUR"], env=env, capture_output=True,
                                  text=True, timeout=60)
        r1, r2 = charge(), charge()
        self.assertEqual((r1.returncode, r2.returncode), (0, 0), (r1, r2))
        self.assertIn("outcome: charged", r1.stdout)
        self.assertIn("charging 10 EUR", r1.stderr)
        self.assertIn("outcome: replay", r2.stdout)
        self.assertNotIn("charging", r2.stderr)



class TestPyFingerprintOptions(PyTest):
    """fingerprint_fields / fingerprint_ignore as the gateway applies them: a retry whose
    ignored (or unselected) values changed is the same request and replays; one whose
    hashed values changed is refused as a reused key. Needs a gateway that knows them."""

    def test_run(self):
        client = self.client(urls(self.c), self.c.token)
        runs = []

        def fn(token):
            runs.append(token)
            return order_response(token, len(runs))
        ignore = ["/ts", "/meta/trace~1id"]

        def order(amount, ts, trace, **opts):
            return dict({"method": "POST", "path": "/orders", "body": {
                "amount": amount, "ts": ts, "meta": {"trace/id": trace}}}, **opts)
        first = client.run("fp-ignore", fn, request=order(10, 1, "a", fingerprint_ignore=ignore))
        self.assertTrue(first.ran)
        again = client.run("fp-ignore", fn, request=order(10, 2, "b", fingerprint_ignore=ignore))
        self.assertTrue(again.replayed)
        self.assertEqual(again.response.body, first.response.body)
        with self.assertRaises(idem.Mismatch):
            client.run("fp-ignore", fn, request=order(11, 1, "a", fingerprint_ignore=ignore))
        fields = ["/amount"]
        self.assertTrue(client.run("fp-fields", fn, request=order(
            5, 1, "a", fingerprint_fields=fields)).ran)
        self.assertTrue(client.run("fp-fields", fn, request=order(
            5, 9, "z", fingerprint_fields=fields)).replayed)
        with self.assertRaises(idem.Mismatch):
            client.claim("fp-fields", request=order(6, 1, "a", fingerprint_fields=fields))
        self.assertEqual(len(runs), 2)

    def test_middlewares(self):
        app = OrderApp()
        client = self.client(urls(self.c), self.c.token)
        w = idem.wsgi.IdempotencyMiddleware(app, client, [idem.wsgi.route(
            "POST", "/orders", fingerprint_ignore=["/ts"])])
        srv = wsgiref.simple_server.make_server("127.0.0.1", 0, w, server_class=_ThreadingServer,
                                                handler_class=_QuietHandler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        addr = "127.0.0.1:%d" % srv.server_address[1]
        a = http(addr, "POST", "/orders", '{"amount": 10, "ts": 1}', "fpw-1")
        b = http(addr, "POST", "/orders", '{"amount": 10, "ts": 2}', "fpw-1")
        self.assertEqual((a[0], b[0], b[1].get("idempotency-replayed"), b.raw),
                         (201, 201, "true", a.raw))
        c = http(addr, "POST", "/orders", '{"amount": 12, "ts": 1}', "fpw-1")
        self.assert_problem(c[0], c[1], c.raw, 409, "idempotency_key_reused", "fpw-1")
        self.assertEqual(len(app.calls), 1)

        calls = []

        async def aapp(scope, receive, send):
            calls.append((await receive())["body"])
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"order": 1}'})
        s = idem.asgi.IdempotencyMiddleware(aapp, client, [{
            "method": "POST", "path_prefix": "/orders", "fingerprint_fields": ["/amount"]}])

        async def main():
            return [await _asgi_request(s, "POST", "/orders", body, "fpa-1") for body in (
                b'{"amount": 10, "note": "a"}', b'{"amount": 10, "note": "b"}',
                b'{"amount": 11, "note": "a"}')]
        x, y, z = asyncio.run(main())
        self.assertEqual((x[0], y[0], y[1].get("idempotency-replayed")), (201, 201, "true"))
        self.assert_problem(z[0], z[1], z[2], 409, "idempotency_key_reused", "fpa-1")
        self.assertEqual(len(calls), 1)


if __name__ == "__main__":
    unittest.main()
