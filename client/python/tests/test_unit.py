"""Unit tests of the idem package without idemd: the renewal rule against proto/renew_plan.h
(compiled here with cc, skipped without one), the error mapping, the transport's retry
rules against scripted HTTP nodes on 127.0.0.1 (the backoff between tries, the same attempt
id after an answer lost, Retry-After honoured, a replayed 503 taken as the stored answer,
the deadline), run's wait on in_progress, and the middlewares' pure parts (routes, the
request object a claim sends).

    cd client/python/tests && python3 -m unittest -v test_unit
"""
import asyncio
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import random
import time
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

import idem  # noqa: E402
import idem.asgi  # noqa: E402
import idem.wsgi  # noqa: E402
from idem import _middleware as mw  # noqa: E402
from idem._renew import renew_plan  # noqa: E402
from idem.client import _lease_estimate  # noqa: E402
from idem.errors import error_from_answer  # noqa: E402

GRID_C = r"""
#include <stdio.h>
#include "renew_plan.h"
int main(void)
{
    static const uint64_t leases[] = {0, 1, 30, 59, 60, 61, 100, 999, 2000, 3000, 30000, 86400000};
    static const uint64_t offs[] = {0, 1, 5, 19, 20, 21, 100, 700, 1500, 2999, 40000};
    for (size_t a = 0; a < sizeof leases / sizeof *leases; a++)
        for (size_t b = 0; b < sizeof offs / sizeof *offs; b++)
            for (size_t c = 0; c < sizeof offs / sizeof *offs; c++)
                for (int f = 0; f < 4; f++) {
                    uint64_t now = 50000, last_ok = now - offs[b], end = now + offs[c] - 10;
                    uint64_t at; uint32_t dl;
                    renew_plan(now, leases[a], end, last_ok, f & 1, f >> 1, &at, &dl);
                    printf("%llu %llu %llu %llu %d %d %llu %u\n", (unsigned long long)now,
                           (unsigned long long)leases[a], (unsigned long long)end,
                           (unsigned long long)last_ok, f & 1, f >> 1,
                           (unsigned long long)at, dl);
                }
    return 0;
}
"""


class RenewPlan(unittest.TestCase):
    def test_cases(self):
        # (now, lease, lease_end, last_ok, failed, first) -> (at, deadline_ms)
        self.assertEqual(renew_plan(0, 3000, 3000, 0, False, True), (1000, 1000))
        self.assertEqual(renew_plan(1500, 3000, 3000, 0, True, False), (1625, 1000))
        self.assertEqual(renew_plan(100, 3000, 110, 0, False, True), (100, 100))
        self.assertEqual(renew_plan(0, 60000, 60000, 0, False, False), (20000, 2000))

    def test_same_as_the_c_header(self):
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        header = os.path.join(ROOT, "proto", "renew_plan.h")
        if cc is None or not os.path.exists(header):
            self.skipTest("no C compiler or no proto/renew_plan.h")
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "grid.c"), os.path.join(d, "grid")
            with open(src, "w") as f:
                f.write(GRID_C)
            subprocess.run([cc, "-std=c11", "-I", os.path.dirname(header), src, "-o", exe],
                           check=True)
            lines = subprocess.run([exe], check=True, capture_output=True,
                                   text=True).stdout.splitlines()
        self.assertGreater(len(lines), 1000)
        for ln in lines:
            now, lease, end, last, failed, first, at, dl = (int(x) for x in ln.split())
            self.assertEqual(renew_plan(now, lease, end, last, bool(failed), bool(first)),
                             (at, dl), ln)


class Errors(unittest.TestCase):
    def test_by_code(self):
        cases = {
            "idempotency_key_reused": idem.Mismatch,
            "idempotency_request_in_progress": idem.InProgress,
            "idempotency_lease_expired": idem.LeaseExpired,
            "idempotency_outcome_unknown": idem.UnknownOutcome,
            "idempotency_lease_lost": idem.LeaseLost,
            "idempotency_key_expired": idem.Expired,
            "idempotency_quota_exceeded": idem.QuotaExceeded,
            "idempotency_key_invalid": idem.InvalidRequest,
            "payload_too_large": idem.PayloadTooLarge,
            "unauthenticated": idem.Unauthorized,
            "forbidden": idem.Forbidden,
            "not_found": idem.NotFound,
            "idempotency_unavailable": idem.Unavailable,
            "upstream_response_too_large": idem.ResponseTooLarge,
        }
        for code, cls in cases.items():
            e = error_from_answer(409, {"retry-after": "3"}, {"code": code, "message": "m",
                                                              "request_id": "r1"})
            self.assertIs(type(e), cls, code)
            self.assertEqual((e.code, e.request_id, e.message), (code, "r1", "m"))
        self.assertTrue(issubclass(idem.Mismatch, idem.Conflict))
        self.assertTrue(issubclass(idem.InProgressTimeout, idem.InProgress))
        e = error_from_answer(409, {"retry-after": "3"},
                              {"code": "idempotency_request_in_progress"})
        self.assertEqual(e.retry_after, 3.0)

    def test_problem_details_and_unknown_codes(self):
        # RFC 9457 members beside code are tolerated; an unknown code falls back on status.
        e = error_from_answer(409, {}, {"type": "about:blank", "title": "Conflict",
                                        "status": 409, "code": "idempotency_key_reused",
                                        "detail": "x", "request_id": "r"})
        self.assertIs(type(e), idem.Mismatch)
        self.assertIs(type(error_from_answer(429, {}, {"code": "something_new"})),
                      idem.QuotaExceeded)
        self.assertIs(type(error_from_answer(418, {}, None)), idem.IdemError)
        self.assertIs(type(error_from_answer(503, {}, "not json")), idem.Unavailable)


class LeaseEstimate(unittest.TestCase):
    def test_estimate(self):
        self.assertEqual(_lease_estimate(5000, None, None), 5000)
        date = "Sun, 06 Dec 2026 17:19:20 GMT"
        base = 1796577560000  # that date, in Unix ms
        self.assertEqual(_lease_estimate(None, base + 30000, date), 29000)
        self.assertEqual(_lease_estimate(None, base + 500, date), 0)
        self.assertEqual(_lease_estimate(None, base + 30000, None), 1000)
        self.assertEqual(_lease_estimate(None, base + 30000, "garbage"), 1000)
        # Asked for: that, unless the answer's lease is certainly shorter (a repeated
        # claim's): then the least that may be left of it.
        self.assertEqual(_lease_estimate(5000, base + 30000, date), 5000)
        self.assertEqual(_lease_estimate(5000, base + 1500, date), 500)
        self.assertEqual(_lease_estimate(5000, base + 1500, "garbage"), 5000)
        self.assertEqual(_lease_estimate(300, base + 300, date), 300)  # a fresh short lease
        self.assertEqual(_lease_estimate(300, base + 299, date), 0)


# ---- scripted nodes ------------------------------------------------------------------------

class Trickle(bytes):
    """A FakeNode answer body sent a byte at a time, `every` seconds apart."""

    def __new__(cls, data, every):
        b = super().__new__(cls, data)
        b.every = every
        return b


class FakeNode:
    """An HTTP node on 127.0.0.1 whose answers come from script(request) in turn: each entry
    a function of the request ({"path", "headers", "body"}) returning (status, headers,
    body) or None (close the connection without an answer). Keeps every request seen."""

    def __init__(self, script):
        self.script = list(script)
        self.seen = []
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                req = {"path": self.path, "headers": dict(self.headers), "body": body,
                       "at": time.monotonic()}
                node.seen.append(req)
                step = node.script.pop(0) if node.script else (lambda r: (500, {}, b""))
                out = step(req)
                if out is None:
                    self.close_connection = True
                    return
                status, headers, data = out
                if isinstance(data, (dict, list)):
                    data = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if isinstance(data, Trickle):
                        for b in data:
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(data.every)
                        return
                    self.wfile.write(data)
                except OSError:  # the client gave up on this node (a timeout test)
                    self.close_connection = True

            do_GET = do_POST = _serve

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


ACQ = lambda r: (200, {"Content-Type": "application/json"},  # noqa: E731
                 {"outcome": "acquired", "token": 131072,
                  "lease_expires_at": int(time.time() * 1000) + 30000,
                  "expires_at": int(time.time() * 1000) + 86400000, "takeover": False,
                  "previous_token": 0})
OK = lambda r: (200, {"Content-Type": "application/json"}, {"outcome": "ok"})  # noqa: E731
DROP = lambda r: None  # noqa: E731


def unavailable(r):
    return (503, {"Retry-After": "1", "Content-Type": "application/json"},
            {"code": "idempotency_unavailable", "message": "no leader"})


def in_progress(r):
    return (409, {"Retry-After": "5", "Content-Type": "application/json"},
            {"code": "idempotency_request_in_progress", "message": "held"})


class Scripted(unittest.TestCase):
    def nodes(self, *scripts):
        out = [FakeNode(s) for s in scripts]
        for n in out:
            self.addCleanup(n.close)
        return out

    def client(self, nodes, **kw):
        c = idem.Client([n.url for n in nodes], "tok", **kw)
        self.addCleanup(c.close)
        return c


class Transport(Scripted):
    def test_same_attempt_id_after_a_lost_answer(self):
        a, b = self.nodes([DROP], [ACQ])
        c = self.client([a, b]).claim("k", fingerprint="ab" * 32)
        self.assertEqual((c.outcome, c.token), ("acquired", 131072))
        self.assertEqual(len(a.seen) + len(b.seen), 2)
        ra, rb = a.seen[0], b.seen[0]
        self.assertEqual(ra["body"], rb["body"])  # same key, fingerprint, attempt id
        self.assertEqual(ra["body"]["attempt_id"], c.attempt_id)
        self.assertEqual(ra["headers"]["X-Request-Id"], rb["headers"]["X-Request-Id"])
        self.assertEqual(rb["headers"]["Idempotency-Key"], "k")
        self.assertEqual(rb["headers"]["Authorization"], "Bearer tok")

    def test_same_attempt_id_after_a_timeout(self):
        slow = lambda r: (time.sleep(1.5), ACQ(r))[1]  # noqa: E731
        a, b = self.nodes([slow], [ACQ])
        t0 = time.monotonic()
        c = self.client([a, b], deadline=3).claim("k", fingerprint="ab" * 32)
        self.assertLess(time.monotonic() - t0, 1.45)  # a third of the deadline on a
        self.assertEqual(a.seen[0]["body"]["attempt_id"], b.seen[0]["body"]["attempt_id"])
        self.assertEqual(c.attempt_id, b.seen[0]["body"]["attempt_id"])

    def test_503_moves_on_and_honours_retry_after(self):
        a, b = self.nodes([unavailable], [OK])
        cl = self.client([a, b])
        cl.release("k", 7)
        self.assertGreaterEqual(b.seen[0]["at"] - a.seen[0]["at"], 0.95)
        # The client now starts at b, for every thread.
        b.script.append(OK)
        cl.release("k", 7)
        self.assertEqual((len(a.seen), len(b.seen)), (1, 2))

    def test_a_replayed_503_is_the_stored_answer(self):
        def replay(r):
            return (503, {"Idempotency-Replayed": "true", "Content-Type": "text/plain",
                          "X-Content-Type-Options": "nosniff", "X-Request-Id": "x",
                          "Idempotency-Attempt": "the-replaying-claims-own"},
                    b"down for maintenance")
        (a,) = self.nodes([replay])
        c = self.client([a]).claim("k", request={"method": "POST", "path": "/x"})
        self.assertTrue(c.replayed)
        self.assertEqual((c.response.status, c.response.body, c.response.headers),
                         (503, b"down for maintenance", {"content-type": "text/plain"}))
        self.assertEqual(len(a.seen), 1)

    def test_deadline(self):
        (a,) = self.nodes([unavailable] * 10)
        t0 = time.monotonic()
        with self.assertRaises(idem.Unavailable) as e:
            self.client([a], deadline=1.5).get("k")
        self.assertLess(time.monotonic() - t0, 1.6)
        self.assertIn(a.url, str(e.exception))
        self.assertIn("no leader", str(e.exception))
        self.assertEqual(e.exception.code, "idempotency_unavailable")

    def test_a_trickled_answer_is_cut_off_at_the_deadline(self):
        # Each byte of the answer comes well within a socket timeout, the whole of it long
        # after the call's deadline: the attempts are cut off as wholes, and the call ends
        # at its deadline.
        body = json.dumps({"outcome": "ok", "record": {"state": "completed", "token": 1,
                                                        "note": "x" * 40}}).encode()
        slow = lambda r: (200, {"Content-Type": "application/json"},  # noqa: E731
                          Trickle(body, 0.1))
        (a,) = self.nodes([slow] * 10)
        t0 = time.monotonic()
        with self.assertRaises(idem.Unavailable) as e:
            self.client([a], deadline=1.0).get("k")
        self.assertLess(time.monotonic() - t0, 2.0)  # the whole answer takes 9 s
        self.assertIn("no answer in time", str(e.exception))

    def test_connection_refused_everywhere(self):
        (a,) = self.nodes([])
        url = a.url
        a.close()
        with self.assertRaises(idem.Unavailable) as e:
            idem.Client([url], "tok", deadline=0.5).get("k")
        self.assertEqual(e.exception.code, "connection_failed")

    def test_backoff_doubles_to_a_second_with_jitter(self):
        # Every node refuses connections; the transport's clock moves only when it sleeps,
        # so the waits are the backoff's alone: 25 ms doubling to 1 s, each shortened by up
        # to a quarter at random, and none that would pass the deadline.
        (a,) = self.nodes([])
        url = a.url
        a.close()
        c = idem.Client([url], "tok", deadline=10)
        self.addCleanup(c.close)
        c._t._rng = random.Random(7)
        clock = [time.monotonic()]
        slept = []

        def sleep(s):
            slept.append(s)
            clock[0] += s

        fake = types.SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep)
        with mock.patch.object(idem._http, "time", fake):
            with self.assertRaises(idem.Unavailable) as e:
                c.get("k")
        self.assertEqual(e.exception.code, "connection_failed")
        nominal = [min(0.025 * 2 ** i, 1.0) for i in range(len(slept))]
        self.assertGreaterEqual(len(slept), 10)  # 1.6 s to reach the cap, then 1 s each
        for got, want in zip(slept, nominal):
            self.assertTrue(0.75 * want <= got <= want, (got, want, slept))
        self.assertGreater(len({round(g / w, 6) for g, w in zip(slept, nominal)}), 1)
        self.assertLess(sum(slept), 10)
        self.assertGreater(sum(slept), 10 - 1.0)  # it stopped at the wait that would pass

    def test_a_reset_while_connecting_is_a_connection_failure(self):
        # A node killed as it accepted: connect() itself is reset, and no socket is left.
        # The client moves on to the next node (it used to call getresponse() on no socket
        # and raise AttributeError to the caller).
        (a,) = self.nodes([ACQ])
        c = self.client([a, a])
        resets = []

        def connect(node, timeout, real=c._t._connect):
            conn = real(node, timeout)
            if not resets:
                resets.append(node)

                def reset():
                    raise ConnectionResetError(104, "Connection reset by peer")
                conn.connect = reset
            return conn
        c._t._connect = connect
        self.assertEqual(c.claim("k", fingerprint="ab" * 32).outcome, "acquired")
        self.assertEqual(len(resets), 1)
        self.assertEqual(len(a.seen), 1)

    def test_run_waits_on_in_progress_with_one_attempt_id(self):
        replay = lambda r: (201, {"Idempotency-Replayed": "true",  # noqa: E731
                                  "Content-Type": "application/json"}, b'{"id": 1}')
        (a,) = self.nodes([in_progress, in_progress, replay])
        res = self.client([a]).run("k", lambda t: self.fail("ran"), fingerprint=b"\x01" * 32)
        self.assertTrue(res.replayed and not res.ran)
        self.assertEqual(res.response.json(), {"id": 1})
        ids = {r["body"]["attempt_id"] for r in a.seen}
        self.assertEqual(len(a.seen), 3)
        self.assertEqual(ids, {res.attempt_id})

    def test_run_wait_runs_out(self):
        (a,) = self.nodes([in_progress] * 100)
        with self.assertRaises(idem.InProgressTimeout):
            self.client([a]).run("k", lambda t: self.fail("ran"), fingerprint="cd" * 32,
                                 wait=0.4)
        with self.assertRaises(idem.InProgress) as e:
            self.client([a]).claim("k", fingerprint="cd" * 32)
        self.assertEqual(e.exception.retry_after, 5.0)

    def test_run_completes_releases_quarantines(self):
        (a,) = self.nodes([ACQ, OK, ACQ, OK, ACQ, OK])
        cl = self.client([a])
        res = cl.run("k", lambda t: idem.Response(402, {"Content-Type": "text/plain"}, "no",
                                                   failed_final=True), fingerprint="ab" * 32)
        self.assertEqual((res.ran, res.token, res.completion), (True, 131072, "failed_final"))
        done = a.seen[1]
        self.assertEqual(done["path"], "/v1/claims/complete")
        self.assertEqual(done["body"], {"token": 131072, "outcome": "failed_final", "response": {
            "status": 402, "headers": {"content-type": "text/plain"}, "body": "no"}})
        with self.assertRaises(idem.Retryable):
            cl.run("k", lambda t: (_ for _ in ()).throw(idem.Retryable()), fingerprint="ab" * 32)
        self.assertEqual((a.seen[3]["path"], a.seen[3]["body"]),
                         ("/v1/claims/release", {"token": 131072}))
        with self.assertRaises(TypeError):
            cl.run("k", lambda t: 42, fingerprint="ab" * 32)  # nothing idemd can store
        self.assertEqual(a.seen[5]["body"], {"token": 131072, "outcome": "unknown"})

    def test_a_token_that_cannot_be_sent_is_refused_without_being_said(self):
        for token in ("s3cr3t-token\n", "s3cr3t token", "s3cr3t\x00", "s3cr3t-\u00e9"):
            with self.assertRaises(ValueError) as e:
                idem.Client(["http://127.0.0.1:9"], token)
            self.assertNotIn("s3cr3t", str(e.exception))

    def test_an_answer_past_the_cap_is_a_failure_of_its_node(self):
        # A node's answer larger than the client reads (its Content-Length, or read by
        # pieces when it has none) is not read: that node failed, the next one answers.
        self.addCleanup(setattr, idem._http, "MAX_ANSWER_BYTES", idem._http.MAX_ANSWER_BYTES)
        idem._http.MAX_ANSWER_BYTES = 4096
        big = lambda r: (200, {"Content-Type": "application/json"}, b" " * 5000)  # noqa: E731
        a, b = self.nodes([big], [ACQ])
        self.assertEqual(self.client([a, b]).claim("k", fingerprint="ab" * 32).token, 131072)
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        self.addCleanup(srv.close)

        def no_length():  # an answer without Content-Length: until the node closes
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b" " * 70000)
        t = threading.Thread(target=no_length, daemon=True)
        t.start()
        (c,) = self.nodes([ACQ])
        url = "http://127.0.0.1:%d" % srv.getsockname()[1]
        cl = idem.Client([url, c.url], "tok")
        self.addCleanup(cl.close)
        self.assertEqual(cl.claim("k", fingerprint="ab" * 32).token, 131072)
        t.join(5)
        self.assertEqual(len(c.seen), 1)

    def test_not_recorded(self):
        lost = lambda r: (409, {}, {"code": "idempotency_lease_lost"})  # noqa: E731
        (a,) = self.nodes([ACQ, lost])
        with self.assertRaises(idem.NotRecorded) as e:
            self.client([a]).run("k", lambda t: b"done", fingerprint="ab" * 32)
        self.assertIsInstance(e.exception.cause, idem.LeaseLost)
        self.assertEqual((e.exception.token, e.exception.response.body), (131072, b"done"))


class Middleware(unittest.TestCase):
    def test_routes(self):
        r = mw.route("POST", "/api/pay")
        self.assertTrue(r.matches("POST", "/api/pay"))
        self.assertTrue(r.matches("POST", "/api/pay/x"))
        self.assertFalse(r.matches("POST", "/api/payroll"))
        self.assertFalse(r.matches("GET", "/api/pay"))
        r = mw.route(["post", "put"], "/a/")
        self.assertTrue(r.matches("PUT", "/a/b") and r.matches("POST", "/a"))
        self.assertTrue(mw.route("*", "/").matches("DELETE", "/anything"))
        with self.assertRaises(ValueError):
            mw.route("POST", "relative")

    def test_claim_args(self):
        a = mw.claim_args("POST", "/o", "b=2&a=1", "application/json; charset=utf-8",
                          b'{"b": 1, "a": [1.10, 2]}')
        self.assertEqual(a, {"request": {"method": "POST", "path": "/o?b=2&a=1",
                                         "body": {"b": 1, "a": [1.1, 2]}}})
        self.assertEqual(mw.claim_args("POST", "/o", "", "text/plain", b"hi"),
                         {"request": {"method": "POST", "path": "/o", "body": "hi"}})
        self.assertEqual(mw.claim_args("POST", "/o", "", None, b""),
                         {"request": {"method": "POST", "path": "/o"}})
        fp1 = mw.claim_args("POST", "/o", "", None, b"\xff\x00")
        fp2 = mw.claim_args("POST", "/o", "", None, b"\xff\x01")
        self.assertEqual(len(fp1["fingerprint"]), 64)
        self.assertNotEqual(fp1, fp2)
        for bad in (b'{"a": 1, "a": 2}', b"{nope", b'{"a": NaN}'):
            with self.assertRaises(idem.InvalidRequest):
                mw.claim_args("POST", "/o", "", "application/problem+json", bad)

    def test_config(self):
        c = idem.Client(["http://127.0.0.1:1"], "t")
        with self.assertRaises(ValueError):
            mw.Config(c, [("POST", "/o")], mismatch_status=400)
        cfg = mw.Config(c, [("POST", "/o"), ("POST", "/p", "other")])
        self.assertIs(cfg.client_for(cfg.match("POST", "/o/1")), c)
        self.assertIsNot(cfg.client_for(cfg.match("POST", "/p")), c)
        self.assertIsNone(cfg.match("POST", "/q"))

    def test_response_checks(self):
        with self.assertRaises(ValueError):
            idem.Response(200, {"bad name": "x"}).to_json()
        with self.assertRaises(ValueError):
            idem.Response(200, {"x": "a\r\nb"}).to_json()
        with self.assertRaises(ValueError):
            idem.Response(200, body=b"\xff").to_json()
        with self.assertRaises(ValueError):
            idem.Response(99).to_json()
        self.assertEqual(idem.Response(204, {"ETag": '"1"'}, "é").to_json(),
                         {"status": 204, "headers": {"etag": '"1"'}, "body": "é"})


def refused(status, code, retry_after=None):
    h = {"Content-Type": "application/json"}
    if retry_after:
        h["Retry-After"] = str(retry_after)
    return lambda r: (status, h, {"code": code, "message": "m", "request_id": "rid"})


def wsgi_call(app, key="k", body=b'{"a": 1}', path="/o", method="POST", extra=None):
    env = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
           "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
           "wsgi.input": io.BytesIO(body), "SERVER_NAME": "x", "SERVER_PORT": "80",
           "wsgi.url_scheme": "http"}
    if key is not None:
        env["HTTP_IDEMPOTENCY_KEY"] = key
    env.update(extra or {})
    got = {}
    out = b"".join(app(env, lambda s, h, e=None: got.update(status=s, headers=dict(h))))
    return int(got["status"].split()[0]), got["headers"], out


class Middlewares(Scripted):
    """The middlewares against scripted nodes: idemd's refusals mapped, the app's answers
    recorded by their status."""

    def app(self):
        calls = []

        def app(environ, start_response):
            calls.append(environ.get("HTTP_IDEMPOTENCY_FENCE"))
            status = environ["PATH_INFO"].rsplit("/", 1)[1]
            start_response(status + " X", [("Content-Type", "text/plain"), ("X-Other", "1")])
            return [b"answer"]
        return app, calls

    def test_refusals(self):
        cases = [
            (refused(409, "idempotency_key_reused"), {"mismatch_status": 422}, 422,
             "idempotency_key_reused"),
            (refused(409, "idempotency_request_in_progress", 5), {"in_progress_status": 425},
             425, "idempotency_request_in_progress"),
            (refused(409, "idempotency_outcome_unknown"), {}, 409,
             "idempotency_outcome_unknown"),
            (refused(410, "idempotency_key_expired"), {}, 410, "idempotency_key_expired"),
            (refused(429, "idempotency_quota_exceeded"), {}, 429, "idempotency_quota_exceeded"),
            (refused(400, "idempotency_key_invalid"), {}, 400, "idempotency_key_invalid"),
            (refused(401, "unauthenticated"), {}, 500, "internal"),
        ]
        app, calls = self.app()
        for step, opts, status, code in cases:
            (a,) = self.nodes([step])
            m = idem.wsgi.IdempotencyMiddleware(app, self.client([a]), [("POST", "/o")], **opts)
            st, h, out = wsgi_call(m, path="/o/201")
            self.assertEqual((st, json.loads(out)["code"]), (status, code), code)
            if status == 425:
                self.assertEqual(h["Retry-After"], "5")
        self.assertEqual(calls, [])

    def test_answers_recorded_by_status(self):
        app, calls = self.app()
        (a,) = self.nodes([ACQ, OK, ACQ, OK, ACQ, OK])
        m = idem.wsgi.IdempotencyMiddleware(app, self.client([a]), [("POST", "/o")])
        self.assertEqual(wsgi_call(m, path="/o/201")[0], 201)
        done = a.seen[1]
        self.assertEqual((done["path"], done["body"]), ("/v1/claims/complete", {
            "token": 131072, "outcome": "succeeded",
            "response": {"status": 201, "headers": {"content-type": "text/plain"},
                         "body": "answer"}}))
        self.assertEqual(a.seen[0]["body"]["request"],
                         {"method": "POST", "path": "/o/201", "body": {"a": 1}})
        self.assertEqual(wsgi_call(m, path="/o/503")[0], 503)
        self.assertEqual(a.seen[3]["body"]["outcome"], "failed_final")
        self.assertEqual(wsgi_call(m, path="/o/404")[0], 404)
        self.assertEqual(a.seen[5]["path"], "/v1/claims/release")
        self.assertEqual(calls, ["131072"] * 3)
        # No key: the app runs, no claim; an empty key: 400.
        self.assertEqual(wsgi_call(m, key=None, path="/o/200")[0], 200)
        self.assertEqual(wsgi_call(m, key="", path="/o/200")[0], 400)
        self.assertEqual(len(a.seen), 6)

    def test_not_recorded_is_marked(self):
        app, _ = self.app()
        (a,) = self.nodes([ACQ] + [unavailable] * 20)
        m = idem.wsgi.IdempotencyMiddleware(app, self.client([a], deadline=0.5),
                                            [("POST", "/o")])
        st, h, out = wsgi_call(m, path="/o/201")
        self.assertEqual((st, out, h.get("Idempotency-Recorded")), (201, b"answer", "false"))

    def test_an_answer_past_the_bytes_quota_records_its_digest(self):
        # The complete refused for the tenant's bytes quota (429): left processing, the
        # record would let the app run again once its lease ended (takeover). Its digest is
        # recorded instead, as proxy mode does, and the answer says it is not the key's.
        app, calls = self.app()
        (a,) = self.nodes([ACQ, refused(429, "idempotency_quota_exceeded"), OK])
        m = idem.wsgi.IdempotencyMiddleware(app, self.client([a]), [("POST", "/o")])
        st, h, out = wsgi_call(m, path="/o/201")
        self.assertEqual((st, out, h.get("Idempotency-Recorded")), (201, b"answer", "false"))
        marker = a.seen[2]
        self.assertEqual(marker["path"], "/v1/claims/complete")
        self.assertEqual(marker["body"]["outcome"], "failed_final")
        self.assertEqual(marker["body"]["response"]["body_sha256"],
                         hashlib.sha256(b"answer").hexdigest())
        self.assertEqual(marker["body"]["response"].get("body", ""), "")
        self.assertEqual(len(calls), 1)

    def test_asgi_replay_and_fence(self):
        replay = lambda r: (201, {"Idempotency-Replayed": "true",  # noqa: E731
                                  "Content-Type": "text/plain"}, b"stored")
        (a,) = self.nodes([ACQ, OK, replay])
        seen = []

        async def app(scope, receive, send):
            msg = await receive()
            seen.append((msg["body"], dict(scope["headers"]).get(b"idempotency-fence")))
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"fresh"})
        m = idem.asgi.IdempotencyMiddleware(app, self.client([a]), [("POST", "/o")])

        async def call():
            scope = {"type": "http", "method": "POST", "path": "/o", "query_string": b"",
                     "headers": [(b"idempotency-key", b"k"), (b"idempotency-fence", b"1"),
                                 (b"content-type", b"text/plain")]}
            msgs = [{"type": "http.request", "body": b"hello", "more_body": False}]
            sent = []

            async def receive():
                return msgs.pop(0) if msgs else {"type": "http.disconnect"}

            async def send(msg):
                sent.append(msg)
            await m(scope, receive, send)
            return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]
        first = asyncio.run(call())
        second = asyncio.run(call())
        self.assertEqual(first[::2], (201, b"fresh"))
        self.assertEqual(second[::2], (201, b"stored"))
        self.assertEqual(second[1].get(b"idempotency-replayed"), b"true")
        self.assertEqual(seen, [(b"hello", b"131072")])
        self.assertEqual(a.seen[0]["body"]["request"]["body"], "hello")

    def test_asgi_cancelled_during_the_claim_gives_the_key_back(self):
        # The request is cancelled (a timeout around it) while its claim is on its way; the
        # claim then acquires: the app does not run, and the key is released, not renewed
        # until the process ends.
        slow = lambda r: (time.sleep(0.4), ACQ(r))[1]  # noqa: E731
        (a,) = self.nodes([slow] + [OK] * 20)
        ran = []

        async def app(scope, receive, send):
            ran.append(1)
        m = idem.asgi.IdempotencyMiddleware(app, self.client([a]), [("POST", "/o")],
                                            lease_ms=600)

        async def call():
            scope = {"type": "http", "method": "POST", "path": "/o", "query_string": b"",
                     "headers": [(b"idempotency-key", b"k"), (b"content-type", b"text/plain")]}
            msgs = [{"type": "http.request", "body": b"hello", "more_body": False}]

            async def receive():
                return msgs.pop(0) if msgs else {"type": "http.disconnect"}

            async def send(msg):
                pass
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(m(scope, receive, send), 0.1)
            await asyncio.sleep(1.5)  # the claim answers, then a lease and more pass
        asyncio.run(call())
        paths = [r["path"] for r in a.seen]
        self.assertEqual(ran, [])
        self.assertEqual(paths.count("/v1/claims/release"), 1, paths)
        after = paths[paths.index("/v1/claims/release") + 1:]
        self.assertNotIn("/v1/claims/renew", after, paths)



# ---- the middlewares' refusals as problem details, fingerprint options ---------------------

KEY = "secret-key-4f2a9c"  # must never appear in a refusal's body


def asgi_call(app, keys=(KEY,), body=b'{"a": 1}', path="/o", ctype=b"application/json"):
    """Calls an ASGI app once; returns (status, {header: value}, body)."""
    headers = [(b"idempotency-key", k.encode()) for k in keys]
    if ctype:
        headers.append((b"content-type", ctype))
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
             "headers": headers}
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
    asyncio.run(app(scope, receive, send))
    return (sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def gateway_titles():
    """The title of each code in server/http_conv.c's table, or None without the file."""
    src = os.path.join(ROOT, "server", "http_conv.c")
    if not os.path.exists(src):
        return None
    import re
    with open(src, encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("http_problem_title("):]
    table = table[:table.index("};")]
    return dict(re.findall(r'\{"([a-z_]+)", "([^"]*)"\}', table))


def echo_503(r):
    return (503, {"Retry-After": "1", "Content-Type": "application/problem+json",
                  "X-Request-Id": r["headers"]["X-Request-Id"]},
            {"code": "idempotency_unavailable", "message": "no quorum",
             "request_id": r["headers"]["X-Request-Id"]})


class Problems(Scripted):
    """Every refusal of both middlewares is RFC 9457 problem details, as the gateway's."""

    def check(self, got, status, code, rid=None, retry_after=None, what=""):
        st, headers, raw = got
        h = {k.lower(): v for k, v in headers.items()}
        what = "%s (%s)" % (what or code, raw[:200])
        self.assertEqual(st, status, what)
        self.assertEqual(h.get("content-type"), "application/problem+json", what)
        self.assertEqual(h.get("retry-after"), None if retry_after is None else
                         str(retry_after), what)
        self.assertNotIn(KEY.encode(), raw, what)
        p = json.loads(raw)
        want = {"type", "title", "status", "detail", "code", "message"}
        if rid is not None:
            want |= {"instance", "request_id"}
        self.assertEqual(set(p), want, what)
        self.assertEqual(p["type"], "urn:idemd:problem:" + code, what)
        self.assertEqual(p["code"], code, what)
        self.assertEqual(p["status"], status, what)
        self.assertEqual(p["title"], mw.TITLES[code], what)
        self.assertTrue(isinstance(p["detail"], str) and p["detail"], what)
        self.assertEqual(p["message"], p["detail"], what)
        if rid is not None:
            self.assertEqual(p["request_id"], rid, what)
            self.assertEqual(p["instance"], "urn:idemd:request:" + rid, what)
        return p

    def test_titles_are_the_gateways(self):
        titles = gateway_titles()
        if titles is None:
            self.skipTest("no server/http_conv.c")
        self.assertGreaterEqual(len(titles), 20)
        self.assertEqual(mw.TITLES, titles)

    def gateway_cases(self):
        """(what, script, options, status, code, request id, Retry-After): idemd's
        answers to the claim and the refusal each one comes to ("sent": the request id the
        client sent, under which the node answered)."""
        r = refused
        return [
            ("reused", [r(409, "idempotency_key_reused")], {}, 409, "idempotency_key_reused",
             "rid", None),
            ("reused 422", [r(409, "idempotency_key_reused")], {"mismatch_status": 422}, 422,
             "idempotency_key_reused", "rid", None),
            ("in progress", [r(409, "idempotency_request_in_progress", 5)], {}, 409,
             "idempotency_request_in_progress", "rid", 5),
            ("in progress 425", [r(409, "idempotency_request_in_progress", 3)],
             {"in_progress_status": 425}, 425, "idempotency_request_in_progress", "rid", 3),
            ("lease expired", [r(409, "idempotency_lease_expired")], {}, 409,
             "idempotency_lease_expired", "rid", None),
            ("quarantined", [r(409, "idempotency_outcome_unknown")], {}, 409,
             "idempotency_outcome_unknown", "rid", None),
            ("expired", [r(410, "idempotency_key_expired")], {}, 410,
             "idempotency_key_expired", "rid", None),
            ("quota", [r(429, "idempotency_quota_exceeded")], {}, 429,
             "idempotency_quota_exceeded", "rid", None),
            ("bad key", [r(400, "idempotency_key_invalid")], {}, 400,
             "idempotency_key_invalid", "rid", None),
            ("bad request", [r(400, "invalid_request")], {}, 400, "invalid_request", "rid",
             None),
            ("claim too large", [r(413, "payload_too_large")], {}, 413, "payload_too_large",
             "rid", None),
            ("digest only", [r(502, "upstream_response_too_large")], {}, 502,
             "upstream_response_too_large", "rid", None),
            ("token refused", [r(401, "unauthenticated")], {}, 500, "internal", "rid", None),
            ("admin token", [r(403, "forbidden")], {}, 500, "internal", "rid", None),
            ("node fault", [r(500, "internal")], {}, 503, "idempotency_unavailable", "rid", 1),
            ("unreadable", [lambda q: (200, {}, b"garbage")], {}, 503,
             "idempotency_unavailable", "sent", 1),
            ("no quorum", [echo_503] * 50, {}, 503, "idempotency_unavailable", "sent", 1),
        ]

    def test_gateway_refusals(self):
        for what, script, opts, status, code, rid, ra in self.gateway_cases():
            for kind in ("wsgi", "asgi"):
                ran = []
                (a,) = self.nodes(list(script))
                cl = self.client([a], deadline=0.6)
                if kind == "wsgi":
                    def app(environ, start_response):
                        ran.append(1)
                        start_response("200 OK", [])
                        return [b""]
                    m = idem.wsgi.IdempotencyMiddleware(app, cl, [("POST", "/o")], **opts)
                    got = wsgi_call(m, key=KEY)
                else:
                    async def app(scope, receive, send):
                        ran.append(1)
                    m = idem.asgi.IdempotencyMiddleware(app, cl, [("POST", "/o")], **opts)
                    got = asgi_call(m)
                # "sent": the X-Request-Id the client sent, which the node answered under.
                want_rid = a.seen[-1]["headers"]["X-Request-Id"] if rid == "sent" else rid
                p = self.check(got, status, code, want_rid, ra, "%s %s" % (kind, what))
                self.assertEqual(ran, [], what)
                if code == "idempotency_key_reused":
                    self.assertEqual(p["detail"], "the key was used with a different request")

    def test_no_node_answers(self):
        (a,) = self.nodes([])
        url = a.url
        a.close()
        dead = idem.Client([url], "tok", deadline=0.3)
        app = lambda e, s: self.fail("ran")  # noqa: E731
        got = wsgi_call(idem.wsgi.IdempotencyMiddleware(app, dead, [("POST", "/o")]), key=KEY)
        self.check(got, 503, "idempotency_unavailable", None, 1)  # no gateway, no id

    def test_local_refusals(self):
        """Refusals made before idemd is asked: no request id, no instance."""
        (a,) = self.nodes([])
        cl = self.client([a])

        def wsgi_app(environ, start_response):
            self.fail("ran")

        async def asgi_app(scope, receive, send):
            self.fail("ran")
        opts = {"key_required": True, "max_body": 16}
        w = idem.wsgi.IdempotencyMiddleware(wsgi_app, cl, [("POST", "/o")], **opts)
        s = idem.asgi.IdempotencyMiddleware(asgi_app, cl, [("POST", "/o")], **opts)
        cases = [
            ("no key", wsgi_call(w, key=None), asgi_call(s, keys=()), 400,
             "idempotency_key_missing"),
            ("empty key", wsgi_call(w, key=""), asgi_call(s, keys=("",)), 400,
             "idempotency_key_missing"),
            ("over max_body", wsgi_call(w, key=KEY, body=b"x" * 17),
             asgi_call(s, body=b"x" * 17), 413, "payload_too_large"),
            ("not JSON", wsgi_call(w, key=KEY, body=b'{"a": 1, "a": 2}'),
             asgi_call(s, body=b'{"a": 1, "a": 2}'), 400, "invalid_request"),
        ]
        for what, gw, ga, status, code in cases:
            self.check(gw, status, code, None, None, "wsgi " + what)
            self.check(ga, status, code, None, None, "asgi " + what)
        self.check(asgi_call(s, keys=(KEY, KEY)), 400, "idempotency_key_invalid")
        self.assertEqual(a.seen, [])

    def test_transport_keeps_the_request_id_of_a_503(self):
        (a,) = self.nodes([echo_503] * 50)
        with self.assertRaises(idem.Unavailable) as e:
            self.client([a], deadline=0.3).claim("k", fingerprint="ab" * 32)
        self.assertEqual(e.exception.request_id, a.seen[0]["headers"]["X-Request-Id"])

    def test_problem_details_read_by_the_client(self):
        e = error_from_answer(409, {}, {"type": "urn:idemd:problem:idempotency_key_reused",
                                        "title": "T", "status": 409, "detail": "D",
                                        "code": "idempotency_key_reused"})
        self.assertEqual((type(e), e.message), (idem.Mismatch, "D"))


class FingerprintOptions(Scripted):
    def test_check_pointers(self):
        ok = ["/a", "/", "//", "/a~0b/c~1d", "/é", "/" + "x" * 255, "/0/-"]
        self.assertEqual(idem.check_pointers("fingerprint_ignore", ok), ok)
        self.assertEqual(idem.check_pointers("fingerprint_ignore", None), [])
        self.assertEqual(idem.check_pointers("fingerprint_fields", ("/a",)), ["/a"])
        self.assertEqual(idem.check_pointers("fingerprint_fields", ["/p"] * 32), ["/p"] * 32)
        bad = [
            ("/a", None, "a list of JSON Pointers"),  # a bare str: not a list
            (["/a"] * 33, None, "33 pointers"),
            ([""], 0, 'starts with "/"'),
            (["/a", "a/b"], 1, 'starts with "/"'),
            (["/" + "x" * 256], 0, "257 bytes"),
            (["/" + "é" * 128], 0, "257 bytes"),
            (["/a~"], 0, 'offset 2 is not "~0" or "~1"'),
            (["/a~2"], 0, "offset 2"),
            (["/~01", "/x~~0"], 1, "offset 2"),
            ([7], 0, "a pointer is a str"),
            (["/\ud800"], 0, "not UTF-8"),
        ]
        for ptrs, index, reason in bad:
            with self.assertRaises(idem.InvalidFingerprintOption) as e:
                idem.check_pointers("fingerprint_ignore", ptrs)
            self.assertIsInstance(e.exception, ValueError)
            self.assertEqual((e.exception.option, e.exception.index),
                             ("fingerprint_ignore", index), ptrs)
            self.assertIn(reason, str(e.exception))

    def test_claim_passes_them_through(self):
        replay = lambda r: (200, {"Idempotency-Replayed": "true"}, b"x")  # noqa: E731
        (a,) = self.nodes([ACQ, replay, replay])
        cl = self.client([a])
        req = {"method": "POST", "path": "/o", "body": {"amount": 1, "ts": 2},
               "fingerprint_fields": ["/amount", "/meta/a~1b"], "fingerprint_ignore": ("/ts",)}
        cl.claim("k", request=req)
        self.assertEqual(a.seen[0]["body"]["request"], {
            "method": "POST", "path": "/o", "body": {"amount": 1, "ts": 2},
            "fingerprint_fields": ["/amount", "/meta/a~1b"], "fingerprint_ignore": ["/ts"]})
        # Empty lists (and None) are no option: the members are left out.
        cl.run("k", lambda t: self.fail("ran"), request=dict(
            req, fingerprint_fields=[], fingerprint_ignore=None))
        self.assertEqual(set(a.seen[1]["body"]["request"]), {"method", "path", "body"})
        cl.acquire("k", request=dict(req, fingerprint_fields=None))
        self.assertEqual(a.seen[2]["body"]["request"]["fingerprint_ignore"], ["/ts"])
        # Refused before anything is sent: a bad pointer, a member idemd does not take.
        for bad in (dict(req, fingerprint_ignore=["ts"]), dict(req, fingerprint_fields="/a")):
            for call in (cl.claim, cl.acquire):
                with self.assertRaises(idem.InvalidFingerprintOption):
                    call("k", request=bad)
            with self.assertRaises(idem.InvalidFingerprintOption):
                cl.run("k", lambda t: self.fail("ran"), request=bad)
        with self.assertRaises(ValueError) as e:
            cl.claim("k", request=dict(req, fingerprint_ignored=["/ts"]))
        self.assertIn("fingerprint_ignored", str(e.exception))
        self.assertEqual(len(a.seen), 3)

    def test_routes_check_and_pass_them(self):
        c = idem.Client(["http://127.0.0.1:1"], "t")
        with self.assertRaises(idem.InvalidFingerprintOption):
            mw.route("POST", "/o", fingerprint_ignore=["/a~3"])
        with self.assertRaises(idem.InvalidFingerprintOption):
            mw.Config(c, [{"path_prefix": "/o", "fingerprint_fields": ["nope"]}])
        with self.assertRaises(idem.InvalidFingerprintOption):
            idem.wsgi.IdempotencyMiddleware(None, c, [mw.Route(frozenset(["POST"]), "/o",
                                                               fingerprint_ignore=["x"])])
        cfg = mw.Config(c, [{"method": "POST", "path_prefix": "/o",
                             "fingerprint_ignore": ["/ts"]}])
        self.assertEqual(cfg.routes[0].fingerprint_ignore, ("/ts",))

        (a,) = self.nodes([ACQ, OK, ACQ, OK, ACQ, OK])
        r = idem.wsgi.route("POST", "/o", fingerprint_fields=["/amount"],
                            fingerprint_ignore=["/meta/trace~1id"])

        def app(environ, start_response):
            start_response("201 Created", [("Content-Type", "text/plain")])
            return [b"ok"]
        m = idem.wsgi.IdempotencyMiddleware(app, self.client([a]), [r])
        self.assertEqual(wsgi_call(m, body=b'{"amount": 3}')[0], 201)
        self.assertEqual(a.seen[0]["body"]["request"], {
            "method": "POST", "path": "/o", "body": {"amount": 3},
            "fingerprint_fields": ["/amount"], "fingerprint_ignore": ["/meta/trace~1id"]})
        # They apply to a JSON body only: a text body goes without them.
        self.assertEqual(wsgi_call(m, body=b"text", extra={"CONTENT_TYPE": "text/plain"})[0],
                         201)
        self.assertEqual(a.seen[2]["body"]["request"],
                         {"method": "POST", "path": "/o", "body": "text"})

        async def aapp(scope, receive, send):
            await receive()
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        s = idem.asgi.IdempotencyMiddleware(aapp, self.client([a]), [r])
        self.assertEqual(asgi_call(s, body=b'{"amount": 4}')[0], 201)
        self.assertEqual(a.seen[4]["body"]["request"]["fingerprint_fields"], ["/amount"])
        self.assertEqual(a.seen[4]["body"]["request"]["fingerprint_ignore"],
                         ["/meta/trace~1id"])


if __name__ == "__main__":
    unittest.main()
