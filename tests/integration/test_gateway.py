"""Integration tests of the HTTP gateway (JSON API, health, metrics): real three-node clusters on
127.0.0.1 (harness.Cluster), driven over HTTP/1.1 with http.client; idemctl only finds the
leader. Each class can run as its own ctest:

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_gateway.TestGatewayBasics

Classes: TestGatewayBasics (claim/complete/replay/release/renew/get, fingerprints, tenants,
forwarding from followers), TestGatewayErrors (every error code of docs/contract.md that a
healthy cluster can produce), TestGatewayOps (healthz, readyz, metrics), TestGatewayFailover
(leader killed under load, no quorum), TestGatewayExpiry (ttl into tombstone: 410).
Waits poll a condition with a generous bound; nothing sleeps for a fixed time.
"""
import hashlib
import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BIN, PROBLEM_TYPE_BASE, Cluster, assert_problem, fp,  # noqa: E402
                     http_exchange, http_request, wait_for)
from test_cluster import _claim_body, _frame, _read_response  # noqa: E402

ACQ = "acquired"
TIMEOUT = 10.0
MiB = 1024 * 1024
_NO_AUTH = object()


# ---- HTTP helper ---------------------------------------------------------------------------

def _auth(token, headers):
    hdrs = {}
    if token is not _NO_AUTH and token is not None:
        hdrs["Authorization"] = "Bearer %s" % token
    if headers:
        hdrs.update(headers)
    return hdrs


def request(addr, method, path, body=None, token=_NO_AUTH, headers=None, timeout=TIMEOUT,
            raw=None):
    """harness.http_request() with an optional bearer token."""
    return http_request(addr, method, path, body, _auth(token, headers), timeout, raw)


def _exchange(conn, method, path, body=None, token=_NO_AUTH, headers=None, raw=None):
    return http_exchange(conn, method, path, body, _auth(token, headers), raw)


class GatewayTest(unittest.TestCase):
    """Base: a cluster per test (setUp) unless shared_cluster is set (one per class)."""
    cluster_opts = {}
    shared_cluster = False
    # A leader change on a loaded machine may answer 503 to a test that does not expect one:
    # call() retries it (same request: safe, complete/release/renew are idempotent) unless
    # the test is about 503 itself.
    retry_503 = True

    # ---- cluster lifecycle ----------------------------------------------------------------

    @classmethod
    def _start_cluster(cls):
        c = Cluster(**cls.cluster_opts)
        try:
            c.wait_leader(timeout=30)
            for node in c.nodes.values():
                wait_for(lambda: _status_or_none(node.http, "/healthz") == 200, 30,
                         "the gateway of node %d to answer /healthz" % node.id)
            for node in c.nodes.values():
                wait_for(lambda: _status_or_none(node.http, "/readyz") == 200, 30,
                         "node %d to be ready (knows a leader)" % node.id)
        except BaseException:
            print(c.logs())
            c.close()
            raise
        return c

    @classmethod
    def setUpClass(cls):
        cls.shared = cls._start_cluster() if cls.shared_cluster else None

    @classmethod
    def tearDownClass(cls):
        if cls.shared is not None:
            problems = cls.shared.close()
            cls.shared = None
            # After the last test's check(): a node that died or reported since.
            if problems:
                raise AssertionError("\n\n".join(problems))

    def setUp(self):
        self.c = self.shared if self.shared_cluster else self._start_cluster()

    def tearDown(self):
        result = self._outcome.result
        failed = any(t is self for t, _ in result.failures + result.errors)
        if failed:
            print(self.c.logs())
        # A node that died by itself during the test (not killed by it), or a sanitizer
        # report or failed assertion in a node's log, fails the test (harness: check()).
        problems = self.c.check() if self.shared_cluster else self.c.close()
        self.assertFalse(problems, "\n\n".join(problems))

    # ---- helpers ----------------------------------------------------------------------------

    def key(self, prefix="k"):
        """A fresh key, unique per call (shared clusters see many tests)."""
        return "%s-%s" % (prefix, secrets.token_hex(6))

    def addr(self, nid=None):
        """The http address of node nid, default the leader."""
        if nid is None:
            nid = self.c.wait_leader(timeout=20)
        return self.c.nodes[nid].http

    def follower_ids(self):
        lid = self.c.wait_leader(timeout=20)
        return [n for n in sorted(self.c.nodes) if n != lid and self.c.nodes[n].proc is not None]

    def call(self, addr, method, path, body=None, token=None, **kw):
        """request() with the tenant alpha's token unless told otherwise (token=_NO_AUTH:
        no Authorization header)."""
        if token is None:
            token = self.c.token
        resp = request(addr, method, path, body=body, token=token, **kw)
        deadline = time.monotonic() + 30
        while self.retry_503 and resp[0] == 503 and time.monotonic() < deadline:
            self.assertRetryAfter(resp)
            time.sleep(0.2)
            resp = request(addr, method, path, body=body, token=token, **kw)
        return resp

    def claim(self, addr, key, fingerprint=None, req=None, token=None, headers=None,
              timeout=TIMEOUT, **opts):
        body = {}
        if fingerprint is not None:
            body["fingerprint"] = fingerprint
        if req is not None:
            body["request"] = req
        body.update(opts)
        h = {"Idempotency-Key": key}
        if headers:
            h.update(headers)
        return self.call(addr, "POST", "/v1/claims", body, token=token, headers=h,
                         timeout=timeout)

    def complete(self, addr, key, tok, body_text='{"ok":true}', status=201, outcome="succeeded",
                 token=None, response=True):
        body = {"token": tok, "outcome": outcome}
        if response:
            body["response"] = {"status": status,
                                "headers": {"content-type": "application/json"},
                                "body": body_text}
        return self.call(addr, "POST", "/v1/claims/%s/complete" % key, body, token=token)

    def release(self, addr, key, tok, token=None):
        return self.call(addr, "POST", "/v1/claims/%s/release" % key, {"token": tok}, token=token)

    def renew(self, addr, key, tok, lease_ms, token=None):
        return self.call(addr, "POST", "/v1/claims/%s/renew" % key,
                         {"token": tok, "lease_ms": lease_ms}, token=token)

    def get(self, addr, key, token=None):
        return self.call(addr, "GET", "/v1/claims/%s" % key, token=token)

    def non503(self, fn, timeout=30):
        """Calls fn() until it answers something other than 503 (bounded)."""
        def cond():
            r = fn()
            return r if r[0] != 503 else None
        return wait_for(cond, timeout, "an answer other than 503")

    def assertAcquired(self, resp):
        st, h, b = resp
        self.assertEqual(st, 200, resp)
        self.assertIsInstance(b, dict, resp)
        self.assertEqual(b.get("outcome"), ACQ, resp)
        for f in ("token", "lease_expires_at", "expires_at", "takeover"):
            self.assertIn(f, b, resp)
        self.assertIsInstance(b["token"], int, resp)
        self.assertGreater(b["token"], 0, resp)
        self.assertIn("x-request-id", h, resp)
        self.assertTrue(h["x-request-id"], resp)
        return b["token"]

    def assertOk(self, resp):
        st, h, b = resp
        self.assertEqual(st, 200, resp)
        self.assertIsInstance(b, dict, resp)
        self.assertEqual(b.get("outcome"), "ok", resp)
        self.assertTrue(h.get("x-request-id"), resp)
        return b

    def assertError(self, resp, status, code):
        """An error answer: the status, the code, and RFC 9457 problem details
        (application/problem+json: type, title, status, detail) with code, message and
        request_id, the request id equal to the X-Request-Id header."""
        st, h, b = resp
        self.assertEqual(st, status, resp)
        self.assertIsInstance(b, dict, "error body must be JSON: %r" % (resp,))
        self.assertEqual(b.get("code"), code, resp)
        self.assertIn("message", b, resp)
        self.assertIsInstance(b["message"], str, resp)
        self.assertIn("request_id", b, resp)
        self.assertTrue(h.get("x-request-id"), "X-Request-Id missing: %r" % (resp,))
        self.assertEqual(str(b["request_id"]), h["x-request-id"], resp)
        assert_problem(self, resp, status, code)
        return b

    def assertRetryAfter(self, resp):
        st, h, b = resp
        self.assertIn("retry-after", h, resp)
        self.assertGreaterEqual(int(h["retry-after"]), 1, resp)

    def assertReplay(self, resp, body_text, status=201):
        st, h, b = resp
        self.assertEqual(st, status, resp)
        self.assertEqual(h.get("idempotency-replayed", "").lower(), "true", resp)
        self.assertTrue(h.get("x-request-id"), resp)
        self.assertIn("application/json", h.get("content-type", ""), resp)
        # The stored body comes back byte for byte.
        raw = getattr(resp, "raw", None)
        if raw is not None:
            self.assertEqual(raw, body_text, resp)
        elif isinstance(b, str):
            self.assertEqual(b, body_text, resp)
        else:
            self.assertEqual(b, json.loads(body_text), resp)


def _status_or_none(addr, path):
    try:
        return request(addr, "GET", path, timeout=5)[0]
    except (OSError, http.client.HTTPException):
        return None


# ---- basics ---------------------------------------------------------------------------------

class TestGatewayBasics(GatewayTest):
    shared_cluster = True

    def _basic_flow(self, addr, other):
        key = self.key("order")
        f1, f2 = fp("b1-" + key), fp("b2-" + key)
        tok = self.assertAcquired(self.claim(addr, key, f1))
        st, h, b = self.claim(addr, key, f1)  # a retry while processing
        self.assertError((st, h, b), 409, "idempotency_request_in_progress")
        self.assertRetryAfter((st, h, b))
        self.assertOk(self.complete(addr, key, tok, '{"id":42}'))
        # Replays, from this node and another one, with the stored status, headers and body.
        self.assertReplay(self.claim(addr, key, f1), '{"id":42}')
        self.assertReplay(self.claim(other, key, f1), '{"id":42}')
        # Another fingerprint: mismatch, and the stored record is untouched.
        self.assertError(self.claim(addr, key, f2), 409, "idempotency_key_reused")
        self.assertReplay(self.claim(addr, key, f1), '{"id":42}')
        st, h, b = self.get(addr, key)
        self.assertEqual(st, 200, (st, h, b))
        self.assertEqual(b.get("outcome"), "ok", b)
        rec = b["record"]
        self.assertEqual(rec.get("token"), tok, b)
        self.assertEqual(rec.get("fingerprint_prefix"), f1[:12], b)
        self.assertIn("state", rec)
        self.assertTrue(h.get("x-request-id"))
        # complete is idempotent for the same token; release after complete is refused and
        # keeps the stored response (docs/contract.md, release).
        self.assertOk(self.complete(addr, key, tok, '{"id":42}'))
        self.assertError(self.release(addr, key, tok), 409, "idempotency_lease_lost")
        self.assertReplay(self.claim(addr, key, f1), '{"id":42}')

    def test_basic_flow_via_leader(self):
        lid = self.c.wait_leader(timeout=20)
        other = self.c.nodes[self.follower_ids()[0]].http
        self._basic_flow(self.c.nodes[lid].http, other)

    def test_basic_flow_via_each_follower(self):
        lid = self.c.wait_leader(timeout=20)
        for nid in self.follower_ids():
            with self.subTest(follower=nid):
                self._basic_flow(self.c.nodes[nid].http, self.c.nodes[lid].http)

    def test_burst_through_a_follower_each_answered_once(self):
        # A follower gathers the frames it forwards and writes them once per loop turn
        # (server/forward.c on libidem's asynchronous client): many claims arriving together must still each reach the
        # leader once, as their own command, and get their own answer back.
        lid = self.c.wait_leader(timeout=20)
        addr = self.addr(self.follower_ids()[0])
        solo = [self.key("burst") for _ in range(48)]
        shared = [self.key("burst-shared") for _ in range(8)]
        jobs = [(k, 0) for k in solo] + [(k, i) for k in shared for i in range(4)]
        results = {}
        lock = threading.Lock()
        gate = threading.Barrier(len(jobs))

        def one(job):
            key, i = job
            gate.wait(timeout=30)
            r = self.claim(addr, key, fp(key))
            with lock:
                results[(key, i)] = r

        threads = [threading.Thread(target=one, args=(j,), daemon=True) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(len(results), len(jobs))
        tokens = {}
        for key in solo:
            tokens[key] = self.assertAcquired(results[(key, 0)])
        for key in shared:
            answers = [results[(key, i)] for i in range(4)]
            won = [a for a in answers if a[0] == 200]
            self.assertEqual(len(won), 1, answers)
            tokens[key] = self.assertAcquired(won[0])
            for a in answers:
                if a[0] != 200:
                    self.assertError(a, 409, "idempotency_request_in_progress")
        self.assertEqual(len(set(tokens.values())), len(tokens), "a token answered twice")
        # The leader holds each key as its own claim: its fingerprint and its token.
        leader = self.c.nodes[lid].http
        for key, tok in tokens.items():
            st, h, b = self.get(leader, key)
            self.assertEqual(st, 200, (key, st, b))
            self.assertEqual(b["record"]["token"], tok, key)
            self.assertEqual(b["record"]["fingerprint_prefix"], fp(key)[:12], key)

    def _header_key_flow(self, addr):
        """Every route takes the key from the Idempotency-Key header (no key in the URL)."""
        key = self.key("hdr")
        hk = {"Idempotency-Key": key}
        tok = self.assertAcquired(self.claim(addr, key, fp("h-" + key)))
        st, h, b = self.call(addr, "GET", "/v1/claims", headers=hk)
        self.assertEqual(st, 200, (st, h, b))
        self.assertEqual(b["record"].get("token"), tok, b)
        st, h, b = self.call(addr, "POST", "/v1/claims/renew", {"token": tok, "lease_ms": 20000},
                             headers=hk)
        self.assertEqual(st, 200, (st, h, b))
        self.assertOk(self.call(addr, "POST", "/v1/claims/release", {"token": tok}, headers=hk))
        tok2 = self.assertAcquired(self.claim(addr, key, fp("h-" + key)))
        body = {"token": tok2, "outcome": "succeeded",
                "response": {"status": 201, "headers": {"content-type": "application/json"},
                             "body": '{"h":1}'}}
        self.assertOk(self.call(addr, "POST", "/v1/claims/complete", body, headers=hk))
        self.assertReplay(self.claim(addr, key, fp("h-" + key)), '{"h":1}')
        # The path form with the same key in the header is fine; another key is refused.
        self.assertOk(self.call(addr, "POST", "/v1/claims/%s/complete" % key, body, headers=hk))
        st, h, b = self.call(addr, "POST", "/v1/claims/%s/complete" % key, body,
                             headers={"Idempotency-Key": key + "x"})
        self.assertError((st, h, b), 400, "idempotency_key_invalid")
        self.assertIn("different keys", b.get("message", ""), b)
        # Without a key anywhere: the key is missing.
        st, h, b = self.call(addr, "GET", "/v1/claims")
        self.assertError((st, h, b), 400, "idempotency_key_missing")
        st, h, b = self.call(addr, "POST", "/v1/claims/release", {"token": tok2})
        self.assertError((st, h, b), 400, "idempotency_key_missing")
        # A key named like an action keeps its path form for GET.
        st, h, b = self.call(addr, "GET", "/v1/claims/complete")
        self.assertEqual(st, 404, (st, h, b))

    def test_key_in_header_on_every_route(self):
        lid = self.c.wait_leader(timeout=20)
        self._header_key_flow(self.c.nodes[lid].http)
        self._header_key_flow(self.c.nodes[self.follower_ids()[0]].http)

    def test_get_record_states(self):
        for nid in sorted(self.c.nodes):
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("get")
                self.assertError(self.get(addr, key), 404, "not_found")
                tok = self.assertAcquired(self.claim(addr, key, fp(key)))
                st, h, b = self.get(addr, key)
                self.assertEqual(st, 200, (st, h, b))
                processing_state = b["record"]["state"]
                self.assertEqual(b["record"]["token"], tok)
                self.assertEqual(b["record"]["fingerprint_prefix"], fp(key)[:12])
                self.assertOk(self.complete(addr, key, tok, "done"))
                st, h, b = self.get(addr, key)
                self.assertEqual(st, 200, (st, h, b))
                self.assertNotEqual(b["record"]["state"], processing_state,
                                    "state must change on complete: %r" % (b,))

    def test_request_fingerprint_is_canonical(self):
        for nid in [self.c.wait_leader(timeout=20)] + self.follower_ids():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("canon")
                req1 = {"method": "POST", "path": "/orders?b=2&a=1",
                        "body": {"amount": 10, "currency": "EUR"}}
                req2 = {"method": "POST", "path": "/orders?a=1&b=2",
                        "body": {"currency": "EUR", "amount": 10}}
                req3 = {"method": "POST", "path": "/orders?a=1&b=2",
                        "body": {"currency": "EUR", "amount": 11}}
                tok = self.assertAcquired(self.claim(addr, key, req=req1))
                self.assertOk(self.complete(addr, key, tok, '{"order":7}'))
                self.assertReplay(self.claim(addr, key, req=req2), '{"order":7}')
                self.assertError(self.claim(addr, key, req=req3), 409, "idempotency_key_reused")
                self.assertReplay(self.claim(addr, key, req=req1), '{"order":7}')
                st, h, b = self.get(addr, key)
                self.assertEqual(st, 200)
                self.assertRegex(b["record"]["fingerprint_prefix"], r"^[0-9a-f]{12}$")

    def test_release_then_claim_again(self):
        for nid in sorted(self.c.nodes):
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("rel")
                tok = self.assertAcquired(self.claim(addr, key, fp(key)))
                self.assertOk(self.release(addr, key, tok))
                self.assertOk(self.release(addr, key, tok))  # idempotent for the same token
                tok2 = self.assertAcquired(self.claim(addr, key, fp(key)))
                self.assertGreater(tok2, tok)

    def test_renew_extends_lease(self):
        for nid in sorted(self.c.nodes):
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("renew")
                st, h, b = self.claim(addr, key, fp(key), lease_ms=5000)
                tok = self.assertAcquired((st, h, b))
                before = b["lease_expires_at"]
                st, h, r = self.renew(addr, key, tok, 120000)
                self.assertEqual(st, 200, (st, h, r))
                self.assertEqual(r.get("outcome"), "ok", r)
                self.assertIn("lease_expires_at", r)
                self.assertGreater(r["lease_expires_at"], before, r)
                self.assertTrue(h.get("x-request-id"))

    def test_attempt_id_retry_gets_same_token(self):
        addr = self.addr(self.follower_ids()[0])
        key = self.key("att")
        t1 = self.assertAcquired(self.claim(addr, key, fp(key), attempt_id="try-1"))
        t2 = self.assertAcquired(self.claim(addr, key, fp(key), attempt_id="try-1"))
        self.assertEqual(t1, t2)
        resp = self.claim(addr, key, fp(key), attempt_id="try-2")
        self.assertError(resp, 409, "idempotency_request_in_progress")
        self.assertRetryAfter(resp)

    def test_failed_final_replays(self):
        addr = self.addr()
        key = self.key("ff")
        tok = self.assertAcquired(self.claim(addr, key, fp(key)))
        self.assertOk(self.complete(addr, key, tok, '{"error":"card declined"}', status=402,
                                    outcome="failed_final"))
        self.assertReplay(self.claim(addr, key, fp(key)), '{"error":"card declined"}', status=402)

    def test_tenants_are_separate(self):
        addr = self.addr(self.follower_ids()[0])
        key = self.key("shared")
        ta = self.assertAcquired(self.claim(addr, key, fp("alpha-" + key)))
        self.assertOk(self.complete(addr, key, ta, '{"tenant":"alpha"}'))
        # beta, same key, other fingerprint: its own record, not a mismatch nor a replay.
        tb = self.assertAcquired(self.claim(addr, key, fp("beta-" + key), token=self.c.token2))
        self.assertNotEqual(ta, tb)
        st, h, b = self.get(addr, key, token=self.c.token2)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["record"]["token"], tb)
        self.assertEqual(b["record"]["fingerprint_prefix"], fp("beta-" + key)[:12])
        st, h, b = self.get(addr, key)
        self.assertEqual(b["record"]["token"], ta)
        self.assertReplay(self.claim(addr, key, fp("alpha-" + key)), '{"tenant":"alpha"}')
        # beta's complete with alpha's token is a stale token for beta's record.
        self.assertError(self.complete(addr, key, ta, "x", token=self.c.token2), 409,
                         "idempotency_lease_lost")
        # a key only beta has is not found for alpha
        key2 = self.key("beta-only")
        self.assertAcquired(self.claim(addr, key2, fp(key2), token=self.c.token2))
        self.assertError(self.get(addr, key2), 404, "not_found")

    def test_request_ids_are_unique(self):
        addr = self.addr(self.follower_ids()[0])
        ids = set()
        for i in range(10):
            key = self.key("rid")
            for resp in (self.claim(addr, key, fp(key)), self.get(addr, key),
                         self.claim(addr, "bad key!", fp(1)),
                         request(addr, "GET", "/healthz")):
                rid = resp[1].get("x-request-id")
                self.assertTrue(rid, resp)
                self.assertNotIn(rid, ids, "X-Request-Id repeated")
                ids.add(rid)

    def test_keep_alive_connection(self):
        host, port = self.addr().rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            key = self.key("ka")
            st, h, b = _exchange(conn, "GET", "/healthz")
            self.assertEqual(st, 200)
            resp = _exchange(conn, "POST", "/v1/claims", {"fingerprint": fp(key)},
                             token=self.c.token, headers={"Idempotency-Key": key})
            tok = self.assertAcquired(resp)
            self.assertOk(_exchange(conn, "POST", "/v1/claims/%s/complete" % key,
                                    {"token": tok, "outcome": "succeeded",
                                     "response": {"status": 200, "headers": {
                                         "content-type": "application/json"}, "body": "{}"}},
                                    token=self.c.token))
            st, h, b = _exchange(conn, "GET", "/v1/claims/%s" % key, token=self.c.token)
            self.assertEqual(st, 200, b)
        finally:
            conn.close()


# ---- errors ---------------------------------------------------------------------------------
    # ---- HTTP conventions (docs/http-api.md) ------------------------------------------------

    def test_tokens_also_as_strings(self):
        """Every answer with a token has its decimal string too, and complete, release and
        renew take the token as a string."""
        addr = self.addr(self.follower_ids()[0])
        key = self.key("tokstr")
        st, h, b = self.claim(addr, key, fp(key))
        tok = self.assertAcquired((st, h, b))
        self.assertEqual(b.get("token_str"), str(tok), b)
        self.assertEqual(b.get("previous_token_str"), "0", b)
        st, h, r = self.call(addr, "POST", "/v1/claims/%s/renew" % key,
                             {"token": str(tok), "lease_ms": 60000})
        self.assertEqual((st, r.get("outcome")), (200, "ok"), r)
        rec = self.get(addr, key)[2]["record"]
        self.assertEqual((rec["token"], rec["token_str"]), (tok, str(tok)), rec)
        self.assertOk(self.complete(addr, key, str(tok), "s"))
        self.assertReplay(self.claim(addr, key, fp(key)), "s")
        # a string that is not decimal digits is refused
        key2 = self.key("tokstr")
        tok2 = self.assertAcquired(self.claim(addr, key2, fp(key2)))
        for bad in ("%d " % tok2, "0x%x" % tok2, "-%d" % tok2, ""):
            self.assertError(self.release(addr, key2, bad), 400, "invalid_request")
        self.assertOk(self.release(addr, key2, str(tok2)))
        # a takeover's previous token, as a string too
        key3 = self.key("tokstr")
        t3 = self.assertAcquired(self.claim(addr, key3, fp(key3), lease_ms=1))
        time.sleep(0.05)
        st, h, b = self.claim(addr, key3, fp(key3), policy="takeover")
        self.assertAcquired((st, h, b))
        self.assertTrue(b["takeover"], b)
        self.assertEqual((b["previous_token"], b["previous_token_str"]), (t3, str(t3)), b)

    def test_attempt_header_and_answer(self):
        """Idempotency-Attempt names a claim's attempt; the attempt in use comes back in the
        body (attempt_id) and in Idempotency-Attempt, so that a retry can send it again."""
        for nid in [self.c.wait_leader(timeout=20)] + self.follower_ids():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("att")
                st, h, b = self.claim(addr, key, fp(key), headers={"Idempotency-Attempt": "a-1"})
                tok = self.assertAcquired((st, h, b))
                self.assertEqual((b.get("attempt_id"), h.get("idempotency-attempt")),
                                 ("a-1", "a-1"), (st, h, b))
                # the same attempt, as an sf-string, or in the body beside the same header
                for kw in ({"headers": {"Idempotency-Attempt": '"a-1"'}},
                           {"attempt_id": "a-1", "headers": {"Idempotency-Attempt": "a-1"}},
                           {"attempt_id": "a-1"}):
                    st, h, b = self.claim(addr, key, fp(key), **kw)
                    self.assertEqual(self.assertAcquired((st, h, b)), tok, (kw, b))
                    self.assertEqual(h.get("idempotency-attempt"), "a-1", (kw, h))
                # another attempt: in progress, and the 409 names the attempt it was
                r = self.claim(addr, key, fp(key), headers={"Idempotency-Attempt": "a-2"})
                self.assertError(r, 409, "idempotency_request_in_progress")
                self.assertEqual(r[1].get("idempotency-attempt"), "a-2", r)
                # body and header naming different attempts, or a bad header: 400
                for kw in ({"attempt_id": "a-1", "headers": {"Idempotency-Attempt": "a-2"}},
                           {"headers": {"Idempotency-Attempt": '"a-1'}},
                           {"headers": {"Idempotency-Attempt": '""'}},
                           {"headers": {"Idempotency-Attempt": "x" * 65}},
                           # an empty one in the body too (it passed for none, and the
                           # claim got a random attempt id its retry could not send)
                           {"attempt_id": ""},
                           {"attempt_id": "x" * 65}):
                    self.assertError(self.claim(addr, key, fp(key), **kw), 400,
                                     "invalid_request")
                # none given: the gateway draws one; sent back, it is the same attempt
                key2 = self.key("att")
                st, h, b = self.claim(addr, key2, fp(key2))
                tok2 = self.assertAcquired((st, h, b))
                drawn = h.get("idempotency-attempt")
                self.assertRegex(drawn or "", r"^[0-9a-f]{16}$", h)
                self.assertEqual(b.get("attempt_id"), drawn, b)
                st, h, b = self.claim(addr, key2, fp(key2), headers={"Idempotency-Attempt": drawn})
                self.assertEqual(self.assertAcquired((st, h, b)), tok2, b)
                # drawn ones differ, across the blocks of random bytes the gateway draws ahead
                # (64 attempt ids each)
                seen = {drawn}
                for _ in range(150):
                    k = self.key("att")
                    st, h, b = self.claim(addr, k, fp(k))
                    self.assertAcquired((st, h, b))
                    a = h.get("idempotency-attempt") or ""
                    self.assertRegex(a, r"^[0-9a-f]{16}$", h)
                    self.assertNotIn(a, seen)
                    seen.add(a)
                # an attempt id that is no token goes back as an sf-string
                key3 = self.key("att")
                st, h, b = self.claim(addr, key3, fp(key3), attempt_id='say "hi"')
                self.assertAcquired((st, h, b))
                self.assertEqual(h.get("idempotency-attempt"), '"say \\"hi\\""', h)
                self.assertEqual(b.get("attempt_id"), 'say "hi"', b)

    def test_acquired_answers_carry_only_their_own_values(self):
        """The gateway refills one kept object for each acquired answer: every answer has its
        own token, token_str and attempt, and an attempt id that JSON cannot hold (not UTF-8)
        is left out of the body rather than showing the previous answer's."""
        addr = self.addr(self.c.wait_leader(timeout=20))
        seen = set()
        for attempt, in_body in (("a-1", True), ("b-\xe9", False), ("c-3", True),
                                 ("d-\xff", False), (None, True)):
            key = self.key("own")
            st, h, b = self.claim(addr, key, fp(key),
                                  headers={"Idempotency-Attempt": attempt} if attempt else None)
            tok = self.assertAcquired((st, h, b))
            self.assertNotIn(tok, seen, b)
            seen.add(tok)
            self.assertEqual(b.get("token_str"), str(tok), b)
            self.assertEqual(b.get("previous_token_str"), str(b.get("previous_token")), b)
            if not in_body:
                self.assertNotIn("attempt_id", b, (attempt, b))
            elif attempt is not None:
                self.assertEqual(b.get("attempt_id"), attempt, b)
            else:
                self.assertRegex(b.get("attempt_id") or "", r"^[0-9a-f]{16}$", b)

    def test_sf_string_keys(self):
        """An Idempotency-Key sent as an RFC 8941 sf-string names the key inside the quotes."""
        for nid in [self.c.wait_leader(timeout=20)] + self.follower_ids():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("sf")
                tok = self.assertAcquired(self.claim(addr, key, fp(key),
                                                     headers={"Idempotency-Key": '"%s"' % key}))
                # the bare key is the same record
                self.assertError(self.claim(addr, key, fp(key)), 409,
                                 "idempotency_request_in_progress")
                # the header (an sf-string) beside the path names the same key
                stored = {"status": 201, "headers": {"content-type": "application/json"},
                          "body": "sf"}
                self.assertOk(self.call(addr, "POST", "/v1/claims/%s/complete" % key,
                                        {"token": tok, "response": stored},
                                        headers={"Idempotency-Key": ' "%s" ' % key}))
                self.assertReplay(self.claim(addr, key, fp(key),
                                             headers={"Idempotency-Key": '"%s"' % key}), "sf")
                st, h, b = self.call(addr, "GET", "/v1/claims",
                                     headers={"Idempotency-Key": '"%s"' % key})
                self.assertEqual((st, b["record"]["token"]), (200, tok), b)

    def test_idemctl_computes_the_gateways_fingerprint(self):
        """idemctl claim --request-body fingerprints a request as the gateway's `request`
        form does: a retry through idemctl replays, a changed one is a mismatch."""
        addr = self.addr()
        tmp = self.c.root
        cases = [
            # (the JSON API's request, idemctl's options, the file's bytes)
            ({"method": "POST", "path": "/orders?b=2&a=1",
              "body": {"amount": 10, "currency": "EUR", "items": [1, 2.5, None, "x"]}},
             ["--path", "/orders?a=1&b=2"],
             b'{ "items": [1, 2.5, null, "x"],\n  "currency": "EUR", "amount": 10 }'),
            ({"method": "PUT", "path": "/notes/7", "body": "plain text \u00e9\n"},
             ["--method", "PUT", "--path", "/notes/7", "--content-type", "text/plain"],
             "plain text \u00e9\n".encode()),
            ({"method": "POST", "path": "/"}, ["--path", "/"], None),  # no body
            ({"method": "POST", "path": "/"}, [], None),  # --tenant alone: every default
        ]
        for i, (req, opts, data) in enumerate(cases):
            with self.subTest(case=i):
                key = self.key("ctl")
                tok = self.assertAcquired(self.claim(addr, key, req=req))
                self.assertOk(self.complete(addr, key, tok, "done-%d" % i))
                args = ["claim", key, "--tenant", "alpha"] + opts
                if data is not None:
                    path = os.path.join(tmp, "body-%d" % i)
                    with open(path, "wb") as f:
                        f.write(data)
                    args += ["--request-body", path]
                rc, out = self.c.ctl(*args)
                self.assertEqual(out and out.get("outcome"), "replay", (rc, out))
                self.assertRegex(out.get("fingerprint", ""), r"^[0-9a-f]{64}$", out)
                # read from standard input too
                if data is not None:
                    p = subprocess.run(
                        [os.path.join(BIN, "idemctl"), "--cluster", self.c.addrs(), "--token",
                         self.c.token, "--json", "claim", key, "--tenant", "alpha",
                         "--request-body", "-"] + opts,
                        input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
                    self.assertEqual(json.loads(p.stdout).get("outcome"), "replay", p)
                # another body, or another tenant's name: another request
                rc, out = self.c.ctl("claim", key, "--tenant", "beta", *args[4:])
                self.assertEqual(out and out.get("outcome"), "mismatch", (rc, out))
        rc, out = self.c.ctl("claim", self.key("ctl"), "--request-body", "/dev/null")
        self.assertEqual(rc, 2, out)  # no --tenant: a usage error


    def test_request_numbers_and_fingerprint_pointers(self):
        """The JSON API's `request` form: 10 and 10.0 are one request (RFC 8785 numbers);
        fingerprint_fields hashes only the values named, fingerprint_ignore leaves out what
        it names; a bad pointer is a 400 that names the rule, not the pointer; idemctl's
        --fingerprint-field / --fingerprint-ignore compute the same fingerprint."""
        addr = self.addr()
        # 10 and 10.0
        key = self.key("num")
        req = {"method": "POST", "path": "/orders", "body": {"amount": 10, "n": [1, -0.0]}}
        tok = self.assertAcquired(self.claim(addr, key, req=req))
        self.assertOk(self.complete(addr, key, tok, "num"))
        self.assertReplay(self.claim(addr, key, req=dict(
            req, body={"n": [1.0, 0.0], "amount": 10.0})), "num")
        self.assertError(self.claim(addr, key, req=dict(req, body={"amount": 10.5, "n": [1, 0]})),
                         409, "idempotency_key_reused")
        # fingerprint_fields: only /amount and /cur count; absent and null differ
        key = self.key("fields")
        req = {"method": "POST", "path": "/orders", "body": {"amount": 10, "ts": 1, "note": "a"},
               "fingerprint_fields": ["/amount", "/cur"]}
        tok = self.assertAcquired(self.claim(addr, key, req=req))
        self.assertOk(self.complete(addr, key, tok, "fields"))
        self.assertReplay(self.claim(addr, key, req=dict(
            req, body={"amount": 1e1, "ts": 2, "note": "b"},
            fingerprint_fields=["/cur", "/amount", "/cur"])), "fields")
        for other in ({"amount": 11, "ts": 1, "note": "a"},
                      {"amount": 10, "cur": None, "ts": 1, "note": "a"}):
            self.assertError(self.claim(addr, key, req=dict(req, body=other)), 409,
                             "idempotency_key_reused")
        without = dict(req)
        del without["fingerprint_fields"]
        self.assertError(self.claim(addr, key, req=without), 409, "idempotency_key_reused")
        # fingerprint_ignore, and idemctl with the same pointers replays the HTTP claim
        key = self.key("ignore")
        req = {"method": "POST", "path": "/orders", "fingerprint_ignore": ["/ts", "/items/1"],
               "body": {"amount": 10, "ts": 1, "items": [{"sku": "a"}, {"seen": 1}]}}
        tok = self.assertAcquired(self.claim(addr, key, req=req))
        self.assertOk(self.complete(addr, key, tok, "ignore"))
        self.assertReplay(self.claim(addr, key, req=dict(
            req, body={"ts": 99, "amount": 10.0, "items": [{"sku": "a"}, {"seen": 2}]})),
            "ignore")
        self.assertError(self.claim(addr, key, req=dict(
            req, body={"amount": 10, "ts": 1, "items": [{"sku": "b"}, {"seen": 1}]})), 409,
            "idempotency_key_reused")
        path = os.path.join(self.c.root, "body-ignore.json")
        with open(path, "wb") as f:
            f.write(b'{"items": [{"sku": "a"}, 7], "amount": 1.0E+1, "ts": 12345}')
        base = ["claim", key, "--tenant", "alpha", "--path", "/orders", "--request-body", path]
        rc, out = self.c.ctl(*base, "--fingerprint-ignore", "/items/1",
                             "--fingerprint-ignore=/ts")
        self.assertEqual(out and out.get("outcome"), "replay", (rc, out))
        rc, out = self.c.ctl(*base, "--fingerprint-ignore", "/ts")  # /items/1 counts again
        self.assertEqual(out and out.get("outcome"), "mismatch", (rc, out))
        rc, out = self.c.ctl(*base, "--fingerprint-field", "/amount")
        self.assertEqual(out and out.get("outcome"), "mismatch", (rc, out))
        # refusals: 400 naming the member, the index and the rule; never the pointer
        for lists, member in (({"fingerprint_ignore": ["/ok", ""]}, "fingerprint_ignore[1]"),
                              ({"fingerprint_fields": ["/secret~2"]}, "fingerprint_fields[0]"),
                              ({"fingerprint_fields": ["/x"] * 33}, "fingerprint_fields"),
                              ({"fingerprint_fields": ["/" + "x" * 256]},
                               "fingerprint_fields[0]")):
            r = self.claim(addr, self.key("bad"), req=dict(
                {"method": "POST", "path": "/orders", "body": {}}, **lists))
            b = self.assertError(r, 400, "invalid_request")
            self.assertIn("request." + member, b["detail"], r)
            self.assertNotIn("secret", b["detail"], r)
        rc, out = self.c.ctl("claim", self.key("bad"), "--tenant", "alpha",
                             "--fingerprint-ignore", "")
        self.assertEqual(rc, 2, out)
        rc, out = self.c.ctl("claim", self.key("bad"), "--fingerprint", "0" * 64,
                             "--fingerprint-field", "/a")
        self.assertEqual(rc, 2, out)


class TestGatewayErrors(GatewayTest):
    shared_cluster = True
    # tenant beta answers a reused key with 422 (tenants[].mismatch_status)
    cluster_opts = {"beta_settings": {"mismatch_status": 422}}

    def targets(self):
        lid = self.c.wait_leader(timeout=20)
        return [lid] + self.follower_ids()

    def test_unauthenticated(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("auth")
                self.assertError(self.claim(addr, key, fp(1), token=_NO_AUTH), 401,
                                 "unauthenticated")
                self.assertError(self.claim(addr, key, fp(1), token="not-a-token"), 401,
                                 "unauthenticated")
                self.assertError(self.claim(addr, key, fp(1), token=""), 401,
                                 "unauthenticated")
                self.assertError(self.call(addr, "POST", "/v1/claims", {"fingerprint": fp(1)},
                                           token=_NO_AUTH,
                                           headers={"Idempotency-Key": key,
                                                    "Authorization": "Basic Zm9vOmJhcg=="}),
                                 401, "unauthenticated")
                self.assertError(self.get(addr, key, token="nope"), 401, "unauthenticated")
                self.assertError(self.complete(addr, key, 1, token=_NO_AUTH), 401,
                                 "unauthenticated")
                self.assertError(self.release(addr, key, 1, token=_NO_AUTH), 401,
                                 "unauthenticated")
                self.assertError(self.renew(addr, key, 1, 1000, token=_NO_AUTH), 401,
                                 "unauthenticated")
                # Nothing was created by the refused claims.
                self.assertError(self.get(addr, key), 404, "not_found")

    def test_key_missing_and_invalid(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                self.assertError(self.call(addr, "POST", "/v1/claims", {"fingerprint": fp(1)}),
                                 400, "idempotency_key_missing")
                self.assertError(self.claim(addr, "bad key!", fp(1)), 400,
                                 "idempotency_key_invalid")
                self.assertError(self.claim(addr, "x" * 256, fp(1)), 400,
                                 "idempotency_key_invalid")
                self.assertError(self.claim(addr, "a/b", fp(1)), 400, "idempotency_key_invalid")
                # An empty key is either missing or malformed: a 400 with one of the two codes.
                r = self.claim(addr, "", fp(1))
                self.assertEqual(r[0], 400, r)
                self.assertIn(r[2].get("code"), ("idempotency_key_missing",
                                                 "idempotency_key_invalid"), r)
                self.assertError(r, 400, r[2].get("code"))
                # The bounds are valid: 255 bytes and every allowed character.
                long_key = ("L%s" % secrets.token_hex(8)).ljust(255, "x")
                self.assertAcquired(self.claim(addr, long_key, fp(1)))
                odd = "Az09._:~-" + secrets.token_hex(4)
                tok = self.assertAcquired(self.claim(addr, odd, fp(1)))
                self.assertOk(self.complete(addr, odd, tok, "odd"))
                self.assertReplay(self.claim(addr, odd, fp(1)), "odd")

    def test_malformed_json_body(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("json")
                h = {"Idempotency-Key": key}
                for raw in (b'{"fingerprint": ', b"not json", b'["a"]'):
                    self.assertError(self.call(addr, "POST", "/v1/claims", raw=raw, headers=h),
                                     400, "invalid_request")
                # Nothing was created.
                self.assertError(self.get(addr, key), 404, "not_found")
                # Well-formed JSON that is not a valid claim is an invalid request too: a bad
                # fingerprint, neither fingerprint nor request, an unknown policy.
                self.assertError(self.claim(addr, key, "zz"), 400, "invalid_request")
                self.assertError(self.claim(addr, key), 400, "invalid_request")
                self.assertError(self.claim(addr, key, fp(key), policy="sometimes"), 400,
                                 "invalid_request")
                self.assertError(self.get(addr, key), 404, "not_found")
                tok = self.assertAcquired(self.claim(addr, key, fp(key)))
                self.assertError(self.call(addr, "POST", "/v1/claims/%s/complete" % key,
                                           raw=b'{"token": '), 400, "invalid_request")
                self.assertError(self.call(addr, "POST", "/v1/claims/%s/complete" % key,
                                           {"outcome": "succeeded"}), 400, "invalid_request")
                self.assertOk(self.complete(addr, key, tok, "fine"))

    def test_replay_sends_only_allow_listed_headers(self):
        # The JSON API replays the stored response from idemd's own origin: headers that
        # describe it go out, others (cookies, refresh, CORS, custom ones) do not, and
        # X-Content-Type-Options: nosniff always does.
        addr = self.addr()
        key = self.key("allow")
        tok = self.assertAcquired(self.claim(addr, key, fp(key)))
        stored = {"content-type": "text/html", "etag": '"v1"', "location": "/orders/7",
                  "cache-control": "no-store", "set-cookie": "session=abc",
                  "refresh": "0; url=https://elsewhere.example",
                  "access-control-allow-origin": "*", "x-custom": "1",
                  "x-content-type-options": "whatever"}
        body = {"token": tok, "outcome": "succeeded",
                "response": {"status": 201, "headers": stored, "body": "<b>hi</b>"}}
        self.assertOk(self.call(addr, "POST", "/v1/claims/%s/complete" % key, body))
        st, h, b = self.claim(addr, key, fp(key))
        self.assertEqual(st, 201, (st, h, b))
        self.assertEqual(h.get("idempotency-replayed"), "true", h)
        for name in ("content-type", "etag", "location", "cache-control"):
            self.assertEqual(h.get(name), stored[name], (name, h))
        for name in ("set-cookie", "refresh", "access-control-allow-origin", "x-custom"):
            self.assertNotIn(name, h, (name, h))
        self.assertEqual(h.get("x-content-type-options"), "nosniff", h)

    def test_stored_header_values_have_no_control_characters(self):
        # RFC 9110's field-value: tab, space, visible characters and obs-text. A control
        # character (an escape sequence, say) is refused before the log.
        addr = self.addr()
        key = self.key("hdrval")
        tok = self.assertAcquired(self.claim(addr, key, fp(key)))
        for bad in ("red\x1b[31m", "a\x7fb", "bell\x07"):
            body = {"token": tok, "outcome": "succeeded",
                    "response": {"status": 200, "headers": {"x-a": bad}, "body": "x"}}
            st, h, b = self.call(addr, "POST", "/v1/claims/%s/complete" % key, body)
            self.assertError((st, h, b), 400, "invalid_request")
        # A name twice in two cases (JSON itself refuses only the same spelling twice): both
        # would be stored lower-cased and replayed twice.
        body = {"token": tok, "outcome": "succeeded",
                "response": {"status": 200, "body": "x",
                             "headers": {"Content-Type": "text/html",
                                         "content-type": "application/json"}}}
        st, h, b = self.call(addr, "POST", "/v1/claims/%s/complete" % key, body)
        self.assertError((st, h, b), 400, "invalid_request")
        self.assertIn("each header name once", b.get("detail", ""), b)
        body = {"token": tok, "outcome": "succeeded",
                "response": {"status": 200, "headers": {"content-disposition": "tab\there \u00e9"},
                             "body": "x"}}
        self.assertOk(self.call(addr, "POST", "/v1/claims/%s/complete" % key, body))
        st, h, b = self.claim(addr, key, fp(key))
        self.assertEqual((st, h.get("content-disposition")), (200, "tab\there \u00c3\u00a9"),
                         (st, h, b))

    def test_payload_too_large(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("big")
                pad = "x" * (MiB + 16)
                raw = json.dumps({"fingerprint": fp(1), "pad": pad}).encode()
                self.assertGreater(len(raw), MiB)
                self.assertError(self.call(addr, "POST", "/v1/claims", raw=raw,
                                           headers={"Idempotency-Key": key}, timeout=30),
                                 413, "payload_too_large")
                # The node still serves afterwards.
                self.assertAcquired(self.claim(addr, key, fp(key)))

    def test_payload_too_large_chunked(self):
        # Without Content-Length (chunked transfer encoding) the 1 MiB cap still holds.
        addr = self.addr(self.follower_ids()[0])
        key = self.key("bigc")
        host, port = addr.rsplit(":", 1)
        head = json.dumps({"fingerprint": fp(1), "pad": ""})[:-2].encode()

        def chunks():
            yield head
            for _ in range(20):
                yield b"y" * 65536
            yield b'"}'
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            try:
                conn.request("POST", "/v1/claims", body=chunks(), encode_chunked=True,
                             headers={"Authorization": "Bearer %s" % self.c.token,
                                      "Idempotency-Key": key,
                                      "Content-Type": "application/json"})
            except (BrokenPipeError, ConnectionResetError):
                pass
            resp = conn.getresponse()
            payload = resp.read()
            rh = {k.lower(): v for k, v in resp.getheaders()}
            try:
                b = json.loads(payload)
            except ValueError:
                b = payload.decode(errors="replace")
        finally:
            conn.close()
        self.assertError((resp.status, rh, b), 413, "payload_too_large")
        self.assertError(self.get(addr, key), 404, "not_found")

    def test_folded_header_is_refused_and_the_connection_closed(self):
        # h2o 2.2.5 takes a line that begins with a space (obs-fold) as a header without a
        # name: "Idempotency-Key: ab" folded with " cd" was claimed as the key "ab". Now 400,
        # the connection closed (a front proxy may have framed what follows differently),
        # and nothing claimed.
        addr = self.addr(self.follower_ids()[0])
        key = self.key("fold")
        host, port = addr.rsplit(":", 1)
        body = json.dumps({"fingerprint": fp(1)}).encode()
        raw = (b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + self.c.token.encode() + b"\r\nIdempotency-Key: " + key.encode()
               + b"\r\n more\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            s.sendall(raw)
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break  # closed by the node
                got += chunk
        finally:
            s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 400"), got)
        self.assertIn(b"folded header lines", got)
        self.assertError(self.get(addr, key), 404, "not_found")

    def _raw(self, addr, head, body):
        """One request written as given; returns (status, headers, parsed JSON body)."""
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                      + body)
            resp = http.client.HTTPResponse(s)
            resp.begin()
            text = resp.read().decode()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(text)

    def test_repeated_key_or_authorization_is_refused(self):
        # Two Idempotency-Key headers took the first one silently, while a hop in front that
        # joins repeated headers (RFC 9110) would have seen "a, b" (refused as malformed):
        # the two could disagree on the key. Two Authorization headers the same way.
        addr = self.addr(self.targets()[0])
        a, b = self.key("dupA"), self.key("dupB")
        body = json.dumps({"fingerprint": fp(1)}).encode()
        auth = b"Authorization: Bearer " + self.c.token.encode() + b"\r\n"
        head = (b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        r = self._raw(addr, head + auth + b"Idempotency-Key: " + a.encode()
                      + b"\r\nIdempotency-Key: " + b.encode() + b"\r\n", body)
        self.assertError(r, 400, "idempotency_key_invalid")
        self.assertIn("more than one Idempotency-Key", r[2]["message"])
        r = self._raw(addr, head + auth + auth + b"Idempotency-Key: " + a.encode() + b"\r\n",
                      body)
        self.assertError(r, 401, "unauthenticated")
        self.assertIn("more than one Authorization", r[2]["message"])
        for k in (a, b):
            self.assertError(self.get(addr, k), 404, "not_found")
        # One of each is served as before.
        self.assertAcquired(self._raw(addr, head + auth + b"Idempotency-Key: " + a.encode()
                                      + b"\r\n", body))

    def test_body_stored_by_reference(self):
        # docs/contract.md: a response's body inline or a reference + SHA-256. The JSON API
        # took only the inline body and ignored body_ref (and any unknown field) with "ok":
        # every replay was then the status with an empty body, as if that were the answer.
        addr = self.addr(self.targets()[0])
        key = self.key("byref")
        tok = self.assertAcquired(self.claim(addr, key, fp(key)))
        sha = "ab" * 32
        path = "/v1/claims/%s/complete" % key
        for bad in ({"status": 201, "bdy": "typo"},
                    {"status": 201, "body_ref": "s3://b/o"},  # no SHA-256
                    {"status": 201, "body_ref": "s3://b/o", "body_sha256": "zz" * 32},
                    {"status": 201, "body_ref": "s3://b/o", "body_sha256": sha[:62]},
                    {"status": 201, "body": "x", "body_ref": "s3://b/o", "body_sha256": sha},
                    # replayed as a header value: a control character would drop it
                    {"status": 201, "body_ref": "s3://b/o\nv2", "body_sha256": sha}):
            with self.subTest(response=bad):
                r = self.call(addr, "POST", path, {"token": tok, "outcome": "succeeded",
                                                   "response": bad})
                self.assertError(r, 400, "invalid_request")
        self.assertOk(self.call(addr, "POST", path, {
            "token": tok, "outcome": "succeeded",
            "response": {"status": 201, "body_ref": "s3://b/o", "body_sha256": sha}}))
        st, h, b = self.claim(addr, key, fp(key))
        self.assertEqual((st, h.get("idempotency-replayed")), (201, "true"), (st, h, b))
        self.assertEqual(h.get("idempotency-body-ref"), "s3://b/o", h)
        self.assertEqual(h.get("idempotency-body-sha256"), sha, h)
        st, h, b = self.get(addr, key)
        self.assertEqual(st, 200, b)
        rec = b["record"]
        self.assertEqual((rec["response"]["body_ref"], rec["response"]["body_sha256"]),
                         ("s3://b/o", sha), b)

    def test_stale_token_lease_lost(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("stale")
                tok = self.assertAcquired(self.claim(addr, key, fp(key)))
                self.assertError(self.complete(addr, key, tok + 1, "x"), 409,
                                 "idempotency_lease_lost")
                self.assertError(self.renew(addr, key, tok - 1, 1000), 409,
                                 "idempotency_lease_lost")
                self.assertOk(self.complete(addr, key, tok, "real"))
                self.assertError(self.complete(addr, key, tok + 7, "x"), 409,
                                 "idempotency_lease_lost")
                self.assertReplay(self.claim(addr, key, fp(key)), "real")

    def test_unknown_key_not_found(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("nf")
                self.assertError(self.complete(addr, key, 12345, "x"), 404, "not_found")
                self.assertError(self.release(addr, key, 12345), 404, "not_found")
                self.assertError(self.renew(addr, key, 12345, 1000), 404, "not_found")
                self.assertError(self.get(addr, key), 404, "not_found")

    def test_mismatch_keeps_record(self):
        addr = self.addr(self.follower_ids()[0])
        key = self.key("mm")
        tok = self.assertAcquired(self.claim(addr, key, fp("one")))
        # A mismatch while processing, and after completion: the record does not move.
        self.assertError(self.claim(addr, key, fp("two")), 409, "idempotency_key_reused")
        self.assertOk(self.complete(addr, key, tok, '{"v":1}'))
        for _ in range(3):
            self.assertError(self.claim(addr, key, fp("two")), 409, "idempotency_key_reused")
        st, h, b = self.get(addr, key)
        self.assertEqual(b["record"]["fingerprint_prefix"], fp("one")[:12])
        self.assertEqual(b["record"]["token"], tok)
        self.assertReplay(self.claim(addr, key, fp("one")), '{"v":1}')

    def test_outcome_unknown_quarantines(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("unk")
                tok = self.assertAcquired(self.claim(addr, key, fp(key)))
                self.assertOk(self.complete(addr, key, tok, outcome="unknown", response=False))
                for _ in range(2):
                    self.assertError(self.claim(addr, key, fp(key)), 409,
                                     "idempotency_outcome_unknown")
                # takeover policy does not re-run a quarantined record either
                self.assertError(self.claim(addr, key, fp(key), policy="takeover"), 409,
                                 "idempotency_outcome_unknown")

    def test_lease_expired_conflict_then_takeover(self):
        for nid in self.targets():
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("lease")
                tok = self.assertAcquired(self.claim(addr, key, fp(key), lease_ms=300))
                # Until the lease passes: in_progress; then, with policy conflict (default and
                # explicit): lease_expired.
                def lease_expired():
                    r = self.claim(addr, key, fp(key))
                    if r[0] == 409 and isinstance(r[2], dict) and \
                            r[2].get("code") == "idempotency_request_in_progress":
                        return None
                    return r
                resp = wait_for(lease_expired, 20, "the lease to pass")
                self.assertError(resp, 409, "idempotency_lease_expired")
                self.assertError(self.claim(addr, key, fp(key), policy="conflict"), 409,
                                 "idempotency_lease_expired")
                st, h, b = self.claim(addr, key, fp(key), policy="takeover")
                tok2 = self.assertAcquired((st, h, b))
                self.assertIs(b["takeover"], True, b)
                self.assertEqual(b.get("previous_token"), tok, b)
                self.assertGreater(tok2, tok)
                # The old holder is fenced off.
                self.assertError(self.complete(addr, key, tok, "old"), 409,
                                 "idempotency_lease_lost")
                self.assertOk(self.complete(addr, key, tok2, "new"))
                self.assertReplay(self.claim(addr, key, fp(key)), "new")

    # ---- HTTP conventions (docs/http-api.md) ------------------------------------------------

    def test_errors_are_problem_details(self):
        """Every error is RFC 9457 problem details (application/problem+json) with code,
        message and request_id; instance names the request by its id, never by its path
        (which may hold the key)."""
        addr = self.addr(self.follower_ids()[0])
        key = self.key("pd")
        st, h, b = self.call(addr, "GET", "/v1/claims/%s?x=1" % key)
        self.assertError((st, h, b), 404, "not_found")
        self.assertEqual(b.get("instance"), "urn:idemd:request:" + b["request_id"], b)
        self.assertNotIn(key, json.dumps(b))
        self.assertEqual(b.get("title"), "Not found", b)
        st, h, b = self.claim(addr, key, fp(1), token="nope")
        self.assertError((st, h, b), 401, "unauthenticated")
        self.assertEqual(h.get("www-authenticate"), "Bearer", h)
        r = self.call(addr, "PUT", "/v1/claims")
        self.assertError(r, 405, "method_not_allowed")
        self.assertEqual(r[1].get("allow"), "GET, POST", r)
        # The header-key forms' paths take GET (a key of that name) and POST; a key path GET.
        for path, allow in (("/v1/claims/complete", "GET, POST"),
                            ("/v1/claims/release", "GET, POST"),
                            ("/v1/claims/renew", "GET, POST"),
                            ("/v1/claims/%s" % key, "GET"),
                            ("/v1/claims/%s/complete" % key, "POST")):
            r = self.call(addr, "DELETE", path)
            self.assertError(r, 405, "method_not_allowed")
            self.assertEqual(r[1].get("allow"), allow, (path, r))
        # a success is plain JSON
        self.assertEqual(self.claim(addr, key, fp(key))[1].get("content-type"), "application/json")

    def test_sf_string_key_refusals_say_which_rule(self):
        """A refused key says which rule it broke: length, characters, empty, a bad
        sf-string (leader and followers alike)."""
        cases = [
            ('"abc', "idempotency_key_invalid", "no closing double quote"),
            ('"a\\nb"', "idempotency_key_invalid", "backslash"),
            ('"abc";p=1', "idempotency_key_invalid", "parameters"),
            ('"caf\u00e9"', "idempotency_key_invalid", "printable ASCII"),
            ('"a\\"b"', "idempotency_key_invalid", "outside [A-Za-z0-9._:~-] (at offset 1)"),
            ('"%s"' % ("x" * 256), "idempotency_key_invalid", "256 bytes, over the limit of 255"),
            ("x" * 256, "idempotency_key_invalid", "256 bytes, over the limit of 255"),
            ("bad key!", "idempotency_key_invalid", "outside [A-Za-z0-9._:~-] (at offset 3)"),
            ('""', "idempotency_key_missing", "missing or empty"),
        ]
        for nid in self.targets():
            for value, code, why in cases:
                with self.subTest(node=nid, value=value[:20]):
                    addr = self.addr(nid)
                    raw = json.dumps({"fingerprint": fp(1)}).encode()
                    # http.client sends a str header in latin-1: the é is byte 0xe9
                    r = self.call(addr, "POST", "/v1/claims", raw=raw,
                                  headers={"Idempotency-Key": value})
                    b = self.assertError(r, 400, code)
                    self.assertIn(why, b["detail"], r)

    def test_unknown_fields_are_refused_by_name(self):
        addr = self.addr(self.follower_ids()[0])
        key = self.key("unk")
        r = self.claim(addr, key, fp(key), attempt="a-1")
        self.assertIn('"attempt"', self.assertError(r, 400, "invalid_request")["detail"])
        r = self.claim(addr, key, req={"method": "POST", "path": "/", "bdy": {}})
        self.assertIn('"request.bdy"', self.assertError(r, 400, "invalid_request")["detail"])
        self.assertError(self.get(addr, key), 404, "not_found")  # nothing was claimed
        tok = self.assertAcquired(self.claim(addr, key, fp(key)))
        for route, body, name in (
                ("complete", {"token": tok, "outcome": "succeeded", "response": {"status": 201},
                              "status": 201}, '"status"'),
                ("complete", {"token": tok, "response": {"status": 201, "header": {}}},
                 '"response.header"'),
                ("release", {"token": tok, "reason": "x"}, '"reason"'),
                ("renew", {"token": tok, "lease": 5000}, '"lease"')):
            r = self.call(addr, "POST", "/v1/claims/%s/%s" % (key, route), body)
            self.assertIn(name, self.assertError(r, 400, "invalid_request")["detail"], r)
        self.assertEqual(self.get(addr, key)[2]["record"]["state"], "processing")

    def test_reused_key_status_per_tenant(self):
        """tenants[].mismatch_status: 422 for beta, the default 409 for alpha."""
        addr = self.addr(self.follower_ids()[0])
        for token, status in ((self.c.token, 409), (self.c.token2, 422)):
            key = self.key("reuse")
            self.assertAcquired(self.claim(addr, key, fp(1), token=token))
            self.assertError(self.claim(addr, key, fp(2), token=token), status,
                             "idempotency_key_reused")

    def test_unknown_route(self):
        addr = self.addr()
        st, h, b = self.call(addr, "GET", "/v1/no-such-route")
        self.assertEqual(st, 404, (st, h, b))
        self.assertTrue(h.get("x-request-id"), (st, h, b))
        if isinstance(b, dict):
            self.assertEqual(str(b.get("request_id")), h["x-request-id"])


# ---- ops: health, readiness, metrics --------------------------------------------------------

_METRICS = ("idem_http_requests_total", "idem_requests_total", "idem_claim_duration_seconds_bucket",
            "idem_claim_duration_seconds_sum", "idem_claim_duration_seconds_count",
            "idem_raft_term", "idem_raft_commit_index", "idem_raft_applied_index",
            "idem_raft_leader_changes_total", "idem_records", "idem_tombstones",
            "idem_quarantined", "idem_bytes", "idem_fail_closed_total",
            "idem_raft_append_duration_seconds_bucket", "idem_raft_append_duration_seconds_sum",
            "idem_raft_append_duration_seconds_count", "idem_raft_append_oldest_seconds",
            "idem_raft_snapshot_index", "idem_raft_snapshot_store_failures_total",
            "idem_rpc_connections",
            "idem_rpc_inflight_requests", "idem_rpc_frame_buffer_bytes", "idem_table_index_bytes",
            "idem_forwarded_requests_total")

OUTCOMES = ("acquired", "replay", "in_progress", "mismatch", "lease_expired", "outcome_unknown",
            "expired", "ok", "lease_lost", "not_found", "quota_exceeded", "invalid",
            "unavailable", "not_leader", "unauthenticated", "forbidden")
OUTCOME_UNAVAILABLE = 13


def parse_metrics(text):
    """Prometheus text → {name: [(labels text, float value)]}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            labels, rest = rest.rsplit("}", 1)
        else:
            name, rest = line.split(None, 1)
            labels = ""
        value = rest.split()[0]
        out.setdefault(name.strip(), []).append((labels, float(value)))
    return out


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_values(text):
    """Prometheus text → {(name, frozenset of (label, value)): float}, for exact look-ups."""
    out = {}
    for name, series in parse_metrics(text).items():
        for labels, v in series:
            out[(name, frozenset(_LABEL.findall(labels)))] = v
    return out


def node_metrics(addr):
    st, _, text = request(addr, "GET", "/metrics")
    assert st == 200, (st, text)
    return metric_values(text)


def mval(m, name, **labels):
    """The value of the series name{labels} (exactly those labels); KeyError if absent."""
    return m[(name, frozenset(labels.items()))]


def data_plane(m):
    """Every data-plane series of one node's metrics: {(name, labels): value}."""
    out = {}
    for t in ("http", "rpc"):
        for o in OUTCOMES:
            out[("requests", t, o)] = mval(m, "idem_requests_total", outcome=o, transport=t)
        out[("fail_closed", t)] = mval(m, "idem_fail_closed_total", transport=t)
        out[("claim_count", t)] = mval(m, "idem_claim_duration_seconds_count", transport=t)
    for o in OUTCOMES:
        out[("forwarded", o)] = mval(m, "idem_forwarded_requests_total", outcome=o)
    return out


def delta(before, after):
    """The data-plane series that changed between two data_plane() snapshots, by how much."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def rpc_call(addr, payload, timeout=30):
    """One raw RPC frame to addr (host:port); returns the answer's outcome."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(_frame(payload))
        r = _read_response(s)
    assert r is not None, "the node closed the connection"
    return r[1]


class TestGatewayOps(GatewayTest):
    def test_metrics_need_the_admin_token(self):
        """/metrics names tenants and their load: the admin token only (401 without a token or
        with an unknown one, with WWW-Authenticate; 403 with a tenant's), unless
        http.metrics_public."""
        addr = self.addr()
        host, port = addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            conn.request("GET", "/metrics")  # no Authorization header at all
            r = conn.getresponse()
            text = r.read().decode()
            self.assertEqual(r.status, 401, text)
            self.assertEqual(r.getheader("WWW-Authenticate"), "Bearer")
            self.assertNotIn("idem_", text)
        finally:
            conn.close()
        for tok, status in (("nope", 401), (self.c.token, 403), (self.c.token2, 403)):
            st, h, b = request(addr, "GET", "/metrics", token=tok)
            self.assertEqual(st, status, (tok, st, b))
            self.assertNotIn("idem_", str(b))
        st, h, text = request(addr, "GET", "/metrics", token=self.c.admin)
        self.assertEqual(st, 200, text)
        self.assertIn("idem_raft_term", text)
        # http.metrics_public: true opens it to any scraper.
        for nid in sorted(self.c.nodes):
            self.c.kill(nid)
        for node in self.c.nodes.values():
            with open(node.cfg, "a") as f:
                f.write("http:\n  metrics_public: true\n")
        for nid in sorted(self.c.nodes):
            self.c.start(nid)
        self.c.wait_leader(timeout=30)
        st, h, text = request(addr, "GET", "/metrics", token=self.c.token)
        self.assertEqual(st, 200, text)
        self.assertIn("idem_raft_term", text)

    def test_quota_exceeded_is_429(self):
        """A tenant past its quota (tenants[].max_records) is answered 429
        idempotency_quota_exceeded by the JSON API, on the leader's gateway and on a
        follower's (forwarded); its held keys still answer, and the other tenant's claims
        are not affected."""
        beta = "    token_sha256: %s\n" % hashlib.sha256(self.c.token2.encode()).hexdigest()
        for nid in sorted(self.c.nodes):
            self.c.kill(nid)
        for node in self.c.nodes.values():
            with open(node.cfg) as f:
                cfg = f.read()
            self.assertIn(beta, cfg)
            with open(node.cfg, "w") as f:
                f.write(cfg.replace(beta, beta + "    max_records: 2\n"))
        for nid in sorted(self.c.nodes):
            self.c.start(nid)
        lid = self.c.wait_leader(timeout=30)
        for node in self.c.nodes.values():
            wait_for(lambda: _status_or_none(node.http, "/readyz") == 200, 30,
                     "node %d to be ready (knows a leader)" % node.id)
        leader = self.c.nodes[lid].http
        follower = self.c.nodes[[n for n in sorted(self.c.nodes) if n != lid][0]].http
        held = [self.key("held") for _ in range(2)]
        toks = [self.assertAcquired(self.claim(leader, k, fp(k), token=self.c.token2))
                for k in held]
        for addr in (leader, follower):
            k = self.key("over")
            self.assertError(self.claim(addr, k, fp(k), token=self.c.token2), 429,
                             "idempotency_quota_exceeded")
        # Nothing was evicted: the held keys complete and answer.
        self.assertOk(self.complete(leader, held[0], toks[0], token=self.c.token2))
        r = self.get(follower, held[1], token=self.c.token2)
        self.assertEqual(r[0], 200, r)
        k = self.key("alpha")
        self.assertAcquired(self.claim(follower, k, fp(k)))

    def test_admin_token_on_data_routes_is_403(self):
        """The admin token is a known credential that owns no records: every data route
        answers 403 forbidden (not 401), on the leader and on a follower; an unknown token
        stays 401."""
        key = self.key("adm")
        for nid in sorted(self.c.nodes):
            addr = self.c.nodes[nid].http
            for resp in (self.claim(addr, key, fp(key), token=self.c.admin),
                         self.complete(addr, key, 1, token=self.c.admin),
                         self.release(addr, key, 1, token=self.c.admin),
                         self.renew(addr, key, 1, 1000, token=self.c.admin),
                         self.get(addr, key, token=self.c.admin)):
                self.assertError(resp, 403, "forbidden")
            self.assertError(self.claim(addr, key, fp(key), token="not-a-token"), 401,
                             "unauthenticated")
        # Nothing was claimed on the way.
        self.assertAcquired(self.claim(self.c.nodes[sorted(self.c.nodes)[0]].http, key, fp(key)))

    def test_healthz_every_node(self):
        for nid, node in sorted(self.c.nodes.items()):
            st, h, b = request(node.http, "GET", "/healthz")
            self.assertEqual(st, 200, (nid, st, b))
            self.assertEqual(b, {"status": "ok"}, (nid, b))
            self.assertTrue(h.get("x-request-id"), (nid, h))

    def test_readyz_then_not_ready_when_alone(self):
        for nid, node in sorted(self.c.nodes.items()):
            st, h, b = request(node.http, "GET", "/readyz")
            self.assertEqual(st, 200, (nid, st, b))
            self.assertIs(b.get("ready"), True, (nid, b))
            self.assertNotIn("reason", b)
            self.assertTrue(h.get("x-request-id"), (nid, h))
        lid = self.c.wait_leader(timeout=20)
        # The leader loses both peers: once it notices, it is not ready (503, ready false);
        # health stays ok: the process is alive.
        for n in [n for n in self.c.nodes if n != lid]:
            self.c.kill(n, 9)
        addr = self.c.nodes[lid].http

        def not_ready():
            r = request(addr, "GET", "/readyz")
            return r if r[0] == 503 else None
        st, h, b = wait_for(not_ready, 30, "the lone node to report not ready")
        self.assertIs(b.get("ready"), False, b)
        # Why, in the node's words (cluster_ready; its cases are unit-tested).
        self.assertRegex(b.get("reason", ""), r"^(no leader known|no word from leader \d+ for \d+ ms)$",
                         b)
        self.assertTrue(h.get("x-request-id"), h)
        st, h, b = request(addr, "GET", "/healthz")
        self.assertEqual((st, b), (200, {"status": "ok"}))

    def test_metrics(self):
        lid = self.c.wait_leader(timeout=20)
        fol = self.follower_ids()[0]
        keys = []
        for i, nid in enumerate((lid, fol)):
            addr = self.addr(nid)
            k = "metrics-secret-%s" % secrets.token_hex(8)
            keys.append(k)
            tok = self.assertAcquired(self.claim(addr, k, fp(k)))
            self.assertOk(self.complete(addr, k, tok, '{"m":%d}' % i))
            self.assertReplay(self.claim(addr, k, fp(k)), '{"m":%d}' % i)
            self.assertError(self.claim(addr, k, fp("other")), 409, "idempotency_key_reused")
            self.claim(addr, k, fp(k), token="wrong-token-%s" % secrets.token_hex(8))
            kq = "metrics-q-%s" % secrets.token_hex(8)
            keys.append(kq)
            tq = self.assertAcquired(self.claim(addr, kq, fp(kq)))
            self.assertOk(self.complete(addr, kq, tq, outcome="unknown", response=False))
            self.get(addr, k)
        secrets_used = keys + [self.c.token, self.c.token2, self.c.admin]
        for nid, node in sorted(self.c.nodes.items()):
            with self.subTest(node=nid):
                st, h, text = request(node.http, "GET", "/metrics")
                self.assertEqual(st, 200, (st, text))
                self.assertIsInstance(text, str)
                self.assertIn("text/plain", h.get("content-type", ""), h)
                self.assertTrue(h.get("x-request-id"), h)
                m = parse_metrics(text)
                for name in _METRICS:
                    self.assertIn(name, m, "metric %s missing on node %d" % (name, nid))
                for s in secrets_used:
                    self.assertNotIn(s, text, "a key or token appears in /metrics")
                self.assertTrue(any('le="+Inf"' in lb
                                    for lb, _ in m["idem_claim_duration_seconds_bucket"]))
                self.assertGreaterEqual(max(v for _, v in m["idem_raft_term"]), 1)
                self.assertGreaterEqual(max(v for _, v in m["idem_raft_commit_index"]), 1)
                self.assertGreater(sum(v for _, v in m["idem_http_requests_total"]), 0)
                # Every node wrote the claims to its log: the append histogram counts them,
                # cumulative buckets ending at +Inf == count.
                app = m["idem_raft_append_duration_seconds_bucket"]
                counts = [v for _, v in app]
                self.assertEqual(counts, sorted(counts), app)
                self.assertEqual(app[-1][0], 'le="+Inf"')
                total = m["idem_raft_append_duration_seconds_count"][0][1]
                self.assertEqual(app[-1][1], total)
                self.assertGreater(total, 0)
                self.assertGreater(m["idem_raft_append_duration_seconds_sum"][0][1], 0)
                # An appended claim ended long ago: nothing in flight for seconds (a disk
                # that stopped answering would show here).
                self.assertLess(m["idem_raft_append_oldest_seconds"][0][1], 1.0)
                self.assertEqual(m["idem_raft_snapshot_store_failures_total"][0][1], 0)
                # A small table: one slot array of the minimum size (1,024 slots of 8
                # bytes), no growth under way, nothing allocated ahead (only arrays that
                # are mapped, 1 MiB or more, are).
                index = dict(m["idem_table_index_bytes"])
                self.assertEqual(sorted(index), ['array="ahead"', 'array="migrating"',
                                                 'array="slots"', 'array="snapshot_spare"'])
                self.assertEqual((index['array="slots"'], index['array="migrating"'],
                                  index['array="ahead"']), (8192, 0, 0), index)
        # The leader's table: the records and the quarantined ones are counted.
        laddr = self.c.nodes[lid].http

        def counted():
            m = parse_metrics(request(laddr, "GET", "/metrics")[2])
            return (sum(v for _, v in m.get("idem_records", [])) >= 4 and
                    sum(v for _, v in m.get("idem_quarantined", [])) >= 2 and
                    sum(v for _, v in m.get("idem_bytes", [])) > 0)
        wait_for(counted, 15, "idem_records/idem_quarantined/idem_bytes on the leader")
        st, h, text = request(laddr, "GET", "/metrics")
        m = parse_metrics(text)
        self.assertGreater(sum(v for _, v in m["idem_claim_duration_seconds_count"]), 0)
        self.assertGreater(sum(v for _, v in m["idem_requests_total"]), 0)
        # The RPC listener's gauges, on a follower (the leader's count the other gateways'
        # forwarding connections, which an idle timeout can close at any time): two more
        # connections, that sent a byte each (which gives each its 64 KiB frame buffer),
        # then as before.
        host, port = self.c.nodes[fol].rpc.rsplit(":", 1)
        faddr = self.c.nodes[fol].http

        def rpc_gauges():
            g = parse_metrics(request(faddr, "GET", "/metrics")[2])
            return tuple(int(g[n][0][1]) for n in ("idem_rpc_connections",
                                                   "idem_rpc_frame_buffer_bytes",
                                                   "idem_rpc_inflight_requests"))
        base = rpc_gauges()
        self.assertEqual(base[2], 0, base)
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
        try:
            for s in socks:
                s.sendall(b"\x00")
            want = (base[0] + 2, base[1] + 2 * 65536, 0)
            wait_for(lambda: rpc_gauges() == want, 15, "RPC gauges %r (base %r)" % (want, base))
        finally:
            for s in socks:
                s.close()
        wait_for(lambda: rpc_gauges() == base, 15, "the RPC gauges back to %r" % (base,))

    def test_metrics_count_rpc_and_forwarded_requests(self):
        """The data-plane series count the binary RPC's clients (transport="rpc") beside the
        gateway's (transport="http"), each request once in the cluster: a claim a follower's
        gateway forwards is counted by that gateway, and by the leader only in
        idem_forwarded_requests_total. Admin ops count in none of them."""
        lid = self.c.wait_leader(timeout=20)
        fol = self.follower_ids()
        before = {nid: data_plane(node_metrics(n.http)) for nid, n in self.c.nodes.items()}
        # N claims of fresh keys over the binary RPC (libidem: idem-bench, then idemctl), to
        # the leader only (a follower would answer not_leader first, counted there).
        n_bench, n_ctl = 200, 3
        p = subprocess.run([os.path.join(BIN, "idem-bench"), "--cluster", self.c.nodes[lid].rpc,
                            "--token", self.c.token, "--json", "--workload", "fresh",
                            "--concurrency", "8", "--requests", str(n_bench)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual((out["ops"], out["errors"], out["outcomes"]),
                         (n_bench, 0, {"acquired": n_bench}), out)
        keys = [self.key("rpc-metrics-secret") for _ in range(n_ctl)]
        for k in keys:
            rc, res = self.c.ctl("claim", k, "--fingerprint", fp(k), ids=[lid])
            self.assertEqual((rc, res.get("outcome")), (0, "acquired"), res)
        # Admin ops, to every node: not data-plane requests.
        for _ in range(3):
            self.assertIsNotNone(self.c.status())
        after = {nid: data_plane(node_metrics(n.http)) for nid, n in self.c.nodes.items()}
        d = delta(before[lid], after[lid])
        n = n_bench + n_ctl
        # idem-bench's probe and warm-up calls are gets of a key that does not exist.
        self.assertGreaterEqual(d.pop(("requests", "rpc", "not_found"), 0), 1, d)
        self.assertEqual(d, {("requests", "rpc", "acquired"): n, ("claim_count", "rpc"): n}, d)
        for nid in fol:
            self.assertEqual(delta(before[nid], after[nid]), {}, "node %d" % nid)
        # One claim and its completion through a follower's gateway: counted there (http,
        # with the leader's answers); on the leader, as forwarded only.
        before = after
        k = self.key("fwd-metrics-secret")
        keys.append(k)
        faddr = self.c.nodes[fol[0]].http
        tok = self.assertAcquired(self.claim(faddr, k, fp(k)))
        self.assertOk(self.complete(faddr, k, tok, '{"fwd":1}'))
        after = {nid: data_plane(node_metrics(n.http)) for nid, n in self.c.nodes.items()}
        self.assertEqual(delta(before[fol[0]], after[fol[0]]),
                         {("requests", "http", "acquired"): 1, ("requests", "http", "ok"): 1,
                          ("claim_count", "http"): 1})
        self.assertEqual(delta(before[lid], after[lid]),
                         {("forwarded", "acquired"): 1, ("forwarded", "ok"): 1})
        self.assertEqual(delta(before[fol[1]], after[fol[1]]), {})
        # The gateway's own refusals of a token (401, 403) are answers to data ops too,
        # counted as the RPC counts its own: a client with a wrong token shows there.
        before = after
        laddr = self.c.nodes[lid].http
        for tok, status, code in (("wrong-token", 401, "unauthenticated"),
                                  (_NO_AUTH, 401, "unauthenticated"),
                                  (self.c.admin, 403, "forbidden")):
            k = self.key("refused")
            self.assertError(self.claim(laddr, k, fp(k), token=tok), status, code)
        d = delta(before[lid], data_plane(node_metrics(laddr)))
        self.assertEqual(d, {("requests", "http", "unauthenticated"): 2,
                             ("requests", "http", "forbidden"): 1}, d)
        # Neither keys nor tokens in any label.
        for node in self.c.nodes.values():
            text = request(node.http, "GET", "/metrics")[2]
            for secret in keys + [self.c.token, self.c.admin]:
                self.assertNotIn(secret, text)


# ---- failover and no quorum -----------------------------------------------------------------

ALLOWED = (200, 409, 503)


class TestGatewayFailover(GatewayTest):
    retry_503 = False  # these tests are about 503: they see every one of them

    def test_kill_leader_under_load_loses_nothing(self):
        lid = self.c.wait_leader(timeout=20)
        survivors = self.follower_ids()
        state = dict(killed_at=None, first_ack_after=None, acked_after=0)
        acked = {}          # key -> (fingerprint, body)
        granted = {}        # key -> set of tokens answered "acquired"
        answers = []        # every (phase, op, status, code)
        problems = []       # answers outside the contract, requests without an answer
        lock = threading.Lock()
        stop = threading.Event()

        def send(op, fn):
            try:
                r = fn()
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    problems.append((op, "no HTTP answer", repr(e)))
                return None
            code = r[2].get("code") if isinstance(r[2], dict) else None
            with lock:
                answers.append(("after" if state["killed_at"] else "before", op, r[0], code))
                if r[0] not in ALLOWED:
                    problems.append((op, r))
                elif r[0] == 503 and (code != "idempotency_unavailable"
                                      or int(r[1].get("retry-after", "0")) < 1):
                    problems.append((op, "503 without its code or Retry-After", r))
            if r[0] == 503:
                time.sleep(0.05)
            return r

        def one_key(addr, key, n):
            f = fp(key)
            body = '{"n":"%s"}' % key
            tok = None
            # A 503 is ambiguous: retry with the same key and attempt id (bounded).
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end:
                r = send("claim", lambda: self.claim(addr, key, f, attempt_id="a-" + key))
                if r is None or r[0] == 503:
                    continue
                if r[0] == 200:
                    if r[2].get("outcome") != ACQ:
                        with lock:
                            problems.append(("claim", "200 without acquired", r))
                        return
                    tok = r[2]["token"]
                    with lock:
                        granted.setdefault(key, set()).add(tok)
                else:
                    # A brand-new key, retried with its attempt id: acquired, never 409 (a
                    # claim whose answer was lost gets its own lease back).
                    with lock:
                        problems.append(("claim", "a new key not acquired", key, r))
                break
            if tok is None:
                if r is None or r[0] == 503:
                    with lock:
                        problems.append(("claim", "503 for 30 s", key, r))
                return
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end:
                r = send("complete", lambda: self.complete(addr, key, tok, body))
                if r is None or r[0] == 503:
                    continue
                if r[0] == 200 and r[2].get("outcome") == "ok":  # (also on a retry)
                    with lock:
                        acked[key] = (f, body)
                        if state["killed_at"] is not None:
                            state["acked_after"] += 1
                            if state["first_ack_after"] is None:
                                state["first_ack_after"] = time.monotonic() - state["killed_at"]
                else:
                    with lock:
                        problems.append(("complete", "refused", key, r))
                return
            with lock:
                problems.append(("complete", "503 for 30 s", key, r))

        def worker(wid):
            addr = self.c.nodes[survivors[wid % len(survivors)]].http
            n = 0
            while not stop.is_set():
                one_key(addr, "fo-%d-%d-%s" % (wid, n, secrets.token_hex(3)), n)
                n += 1

        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(3)]
        for t in threads:
            t.start()
        try:
            # Kill the leader while requests are in flight, once the load is established.
            wait_for(lambda: len(acked) >= 30 or problems, 60, "30 acknowledged keys")
            self.c.kill(lid, 9)
            with lock:
                state["killed_at"] = time.monotonic()
            wait_for(lambda: state["acked_after"] >= 30 or problems, 90,
                     "30 keys acknowledged after the leader was killed")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        self.assertEqual(problems, [], "answers outside the contract")
        for key, toks in granted.items():
            self.assertEqual(len(toks), 1, "key %s granted twice: %r" % (key, toks))
        # (How soon is not asserted: the 30 acknowledgements after the kill were awaited.)
        print("\nfailover: %d keys granted, %d acknowledged (%d after the kill, first %.2fs "
              "after it), answers: %d x 503, %d x 409" % (
                  len(granted), len(acked), state["acked_after"], state["first_ack_after"],
                  len([a for a in answers if a[2] == 503]),
                  len([a for a in answers if a[2] == 409])))
        # Every acknowledged completion replays, with its body, from both survivors; none of
        # them is ever acquired again.
        for key, (f, body) in sorted(acked.items()):
            for nid in survivors:
                r = self.non503(lambda: self.claim(self.c.nodes[nid].http, key, f))
                self.assertReplay(r, body)
        # The survivors saw the leader change.
        for nid in survivors:
            m = parse_metrics(request(self.c.nodes[nid].http, "GET", "/metrics")[2])
            self.assertGreaterEqual(sum(v for _, v in m["idem_raft_leader_changes_total"]), 1,
                                    "node %d" % nid)
        # The killed node comes back and serves the same answers.
        self.c.start(lid)
        wait_for(lambda: _status_or_none(self.c.nodes[lid].http, "/readyz") == 200, 30,
                 "the restarted node to be ready")
        some = sorted(acked.items())[:: max(1, len(acked) // 10)]
        for key, (f, body) in some:
            r = self.non503(lambda: self.claim(self.c.nodes[lid].http, key, f))
            self.assertReplay(r, body)

    def test_no_quorum_on_follower_answers_503(self):
        # A follower left alone (leader and the other follower killed) answers 503 too,
        # within the request's deadline, and is not ready.
        lid = self.c.wait_leader(timeout=20)
        fol = self.follower_ids()
        addr = self.c.nodes[fol[0]].http
        key0 = self.key("pre")
        tok = self.assertAcquired(self.claim(addr, key0, fp(key0)))
        self.assertOk(self.complete(addr, key0, tok, '{"pre":2}'))
        self.c.kill(lid, 9)
        self.c.kill(fol[1], 9)
        # At once, while the follower still takes the dead node for its leader (its forward
        # fails): a bad or missing key is still a 400, not a 503, with the attempt id as
        # the leader's own refusal has it.
        r = self.claim(addr, "bad key!", fp(1), attempt_id="att-bad-key")
        self.assertError(r, 400, "idempotency_key_invalid")
        self.assertEqual(r[1].get("idempotency-attempt"), "att-bad-key", r)
        st, h, b = self.call(addr, "POST", "/v1/claims", {"fingerprint": fp(1)})
        self.assertError((st, h, b), 400, "idempotency_key_missing")
        for i in range(3):
            k = self.key("during")
            # Answered (503), not left hanging: the request's 60 s timeout bounds the wait.
            r = self.claim(addr, k, fp(k), attempt_id="att-" + k, timeout=60)
            self.assertError(r, 503, "idempotency_unavailable")
            self.assertRetryAfter(r)
        self.assertError(self.claim(addr, key0, fp(key0), timeout=60), 503,
                         "idempotency_unavailable")
        self.assertError(self.call(addr, "GET", "/v1/claims/%s" % key0, timeout=60), 503,
                         "idempotency_unavailable")
        self.assertError(self.complete(addr, key0, tok, '{"pre":2}'), 503,
                         "idempotency_unavailable")
        wait_for(lambda: request(addr, "GET", "/readyz")[0] == 503, 30,
                 "the lone follower to report not ready")
        # Errors that need no quorum are still answered as such.
        self.assertError(self.claim(addr, key0, fp(key0), token="nope"), 401, "unauthenticated")
        r = self.claim(addr, "bad key!", fp(1), attempt_id="att-bad-key")
        self.assertError(r, 400, "idempotency_key_invalid")
        self.assertEqual(r[1].get("idempotency-attempt"), "att-bad-key", r)

    def test_no_quorum_answers_503(self):
        lid = self.c.wait_leader(timeout=20)
        addr = self.c.nodes[lid].http
        key0 = self.key("pre")
        tok = self.assertAcquired(self.claim(addr, key0, fp(key0)))
        self.assertOk(self.complete(addr, key0, tok, '{"pre":1}'))
        others = [n for n in self.c.nodes if n != lid]
        for n in others:
            self.c.kill(n, 9)
        before = data_plane(node_metrics(addr))
        # Fail closed: no acquired, no replay, no get without a committed entry.
        for i in range(3):
            k = self.key("during")
            # Answered (503), not left hanging: the request's 60 s timeout bounds the wait.
            r = self.claim(addr, k, fp(k), attempt_id="att-" + k, timeout=60)
            self.assertError(r, 503, "idempotency_unavailable")
            self.assertRetryAfter(r)
        r = self.claim(addr, key0, fp(key0), timeout=60)
        self.assertError(r, 503, "idempotency_unavailable")
        r = self.call(addr, "GET", "/v1/claims/%s" % key0, timeout=60)
        self.assertError(r, 503, "idempotency_unavailable")
        # The same over the binary RPC: one claim, one unavailable answer.
        k = self.key("during-rpc")
        self.assertEqual(rpc_call(self.c.nodes[lid].rpc, _claim_body(self.c.token, k, 3000)),
                         OUTCOME_UNAVAILABLE)
        # The fail-closed answers are counted, each once, by the transport it went out on:
        # five 503s of the gateway (four claims, one get), one of the RPC.
        d = delta(before, data_plane(node_metrics(addr)))
        self.assertEqual(d, {("requests", "http", "unavailable"): 5, ("fail_closed", "http"): 5,
                             ("claim_count", "http"): 4, ("requests", "rpc", "unavailable"): 1,
                             ("fail_closed", "rpc"): 1, ("claim_count", "rpc"): 1}, d)
        # Quorum back: the stored answer again.
        for n in others:
            self.c.start(n)
        self.c.wait_leader(timeout=30)

        def replayed():
            r = self.claim(addr, key0, fp(key0))
            return r if r[0] != 503 else None
        self.assertReplay(wait_for(replayed, 30, "service after quorum is back"), '{"pre":1}')


# ---- expiry ---------------------------------------------------------------------------------

class TestGatewayFollow(GatewayTest):
    """A request a follower forwarded to a leader that then stops answering (paused, as a
    leader cut off from the others) goes to the new leader once the follower knows it,
    instead of waiting for the forward's deadline (rpc.default_deadline_ms, 2 s)."""
    cluster_opts = {"election_ms": 300, "heartbeat_ms": 50}  # the server's own defaults
    retry_503 = False  # a 503 here is the failure

    def test_forwarded_request_follows_the_new_leader(self):
        lid = self.c.wait_leader(timeout=20)
        fid = self.follower_ids()[0]
        key, attempt = self.key("follow"), "att-" + secrets.token_hex(4)
        before = mval(node_metrics(self.c.nodes[fid].http), "idem_http_forwards_moved_total")
        old = self.c.nodes[lid].proc
        os.kill(old.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            st, h, b = self.claim(self.addr(fid), key, fp(key), attempt_id=attempt, timeout=15)
            took = time.monotonic() - t0
            self.assertEqual((st, b.get("outcome") if isinstance(b, dict) else b), (200, ACQ),
                             "the forwarded claim, %.2f s after the leader stopped: %r"
                             % (took, (st, h, b)))
            tok = b["token"]
            survivors = [n for n in sorted(self.c.nodes) if n != lid]
            self.assertNotEqual(self.c.wait_leader(timeout=20, ids=survivors, exclude=lid), lid)
            after = mval(node_metrics(self.c.nodes[fid].http), "idem_http_forwards_moved_total")
            self.assertGreaterEqual(after - before, 1, "the follower did not send it again")
        finally:
            os.kill(old.pid, signal.SIGCONT)
        # The old leader back: the claim stands once, held by its attempt, on every node.
        for nid in sorted(self.c.nodes):
            wait_for(lambda: _status_or_none(self.c.nodes[nid].http, "/readyz") == 200, 30,
                     "node %d ready again" % nid)
            st, h, b = self.claim(self.addr(nid), key, fp(key), attempt_id=attempt)
            self.assertEqual((st, b.get("outcome"), b.get("token")), (200, ACQ, tok), (nid, b))
            r = self.claim(self.addr(nid), key, fp(key), attempt_id="another")
            self.assertError(r, 409, "idempotency_request_in_progress")


class TestGatewayExpiry(GatewayTest):
    cluster_opts = dict(expiry_ms=100)

    def test_ttl_expiry_gives_410(self):
        lid = self.c.wait_leader(timeout=20)
        for nid in [lid, self.follower_ids()[0]]:
            with self.subTest(node=nid):
                addr = self.addr(nid)
                key = self.key("short")
                tok = self.assertAcquired(self.claim(addr, key, fp(key), ttl_ms=800))
                self.assertOk(self.complete(addr, key, tok, '{"short":1}'))
                first = self.claim(addr, key, fp(key))
                if first[0] != 410:  # on a slow machine the ttl may already have passed
                    self.assertReplay(first, '{"short":1}')

                def expired():
                    r = self.claim(addr, key, fp(key))
                    return r if r[0] == 410 else None
                r = wait_for(expired, 20, "the record to become a tombstone (410)")
                self.assertError(r, 410, "idempotency_key_expired")
                # A new key is unaffected.
                k2 = self.key("fresh")
                self.assertAcquired(self.claim(addr, k2, fp(k2)))
                # A tombstone keeps no body: the record reads as a tombstone or is gone.
                st, h, b = self.get(addr, key)
                if st == 200:
                    self.assertEqual(b["record"].get("state"), "tombstone", b)
                    self.assertNotIn("body", json.dumps(b.get("record", {}).get("response") or {}))
                else:
                    self.assertError((st, h, b), 404, "not_found")
        laddr = self.c.nodes[self.c.wait_leader(timeout=20)].http
        wait_for(lambda: sum(v for _, v in parse_metrics(
            request(laddr, "GET", "/metrics")[2]).get("idem_tombstones", [])) >= 2, 15,
            "idem_tombstones to count the two tombstones")


if __name__ == "__main__":
    unittest.main()
