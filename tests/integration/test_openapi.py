"""docs/openapi.yaml against a real three-node cluster (harness.Cluster): every documented
(route, method, status) produced at least once and validated (tests/integration/openapi_check.py),
every error code a response lists given too, the spec's paths and route names compared with the
gateway's route table, and the checker shown to fail on answers the spec does not describe.

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_openapi

TestOpenapi drives the cluster; TestOpenapiChecker needs none (the spec as such, and mutated
answers). Answers that come through harness.http_request are validated there already; the ones
this test writes by hand on a socket (a folded header, a Content-Length over the server's limit,
a request finished while the node stops) are validated here.

The gateway's routes are read from server/gateway.c: the route names (gateway_route_names, the
`route` label of idem_http_requests_total) and the path literals of routeOf() and
headerKeyRoute(). A parse of those two functions' literals is simple and fails loudly when
they change shape; probing alone cannot find a route nobody documented. Each documented
operation is then probed once, and the node's idem_http_requests_total must count it under
the route name its x-idemd-route says.
"""
import collections
import copy
import hashlib
import http.client
import json
import os
import re
import secrets
import signal
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import openapi_check  # noqa: E402
from harness import ClusterTestCase, fp, http_request, wait_for  # noqa: E402

GATEWAY_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server",
                         "gateway.c")
MiB = 1024 * 1024
OVER_SERVER_LIMIT = 3 * MiB  # above the HTTP server's own 2 MiB (server/gateway.c)
ACTIONS = ("complete", "release", "renew")


def gateway_route_table():
    """(route names, paths) of server/gateway.c: gateway_route_names, and the paths routeOf()
    and headerKeyRoute() take, in the spec's template form (/v1/claims/{key}...)."""
    with open(GATEWAY_C) as f:
        src = f.read()
    m = re.search(r"gateway_route_names\[R_N\]\s*=\s*\{(.*?)\};", src, re.S)
    assert m, "gateway_route_names not found in server/gateway.c"
    names = re.findall(r'"([a-z0-9_]+)"', m.group(1))

    def body(fn):
        m = re.search(r"\nstatic enum route %s\([^)]*\)\n\{\n(.*?)\n\}\n" % fn, src, re.S)
        assert m, "%s() not found in server/gateway.c" % fn
        return m.group(1)
    route_of, header_key = body("routeOf"), body("headerKeyRoute")
    exact = re.findall(r'IS\("(/[^"]*)"\)', route_of)
    prefix = re.findall(r'pre\[\] = "(/[^"]*)"', route_of)
    actions = re.findall(r'memcmp\(a, "([a-z]+)", \d+\)', route_of)
    header_actions = re.findall(r'H2O_STRLIT\("([a-z]+)"\)', header_key)
    assert exact and len(prefix) == 1 and actions and header_actions, (
        "server/gateway.c's routeOf()/headerKeyRoute() changed shape: update this parse",
        exact, prefix, actions, header_actions)
    p = prefix[0]
    paths = set(exact) | {p + "{key}"} | {p + "{key}/" + a for a in actions}
    paths |= {p + a for a in header_actions}
    return names, paths


def raw_exchange(addr, method, head, body=b""):
    """Writes the request line + header lines `head` (bytes, without the blank line) and
    body on a new connection; returns (status, headers, body bytes). A server that answers
    before the body was all sent is read all the same."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(head + b"\r\n" + body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = http.client.HTTPResponse(s, method=method)
        resp.begin()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def _walk_codes(node, out):
    """Every error code a (resolved) schema allows: properties.code.const."""
    if isinstance(node, dict):
        code = node.get("properties", {}).get("code")
        if isinstance(code, dict) and "const" in code:
            out.add(code["const"])
        for v in node.values():
            _walk_codes(v, out)
    elif isinstance(node, list):
        for v in node:
            _walk_codes(v, out)
    return out


def documented_codes(spec):
    """{(template, method, status, code)} of every error code each operation's responses
    list (x-idemd-untested ones left out)."""
    out = set()
    for t, m, op in spec.operations():
        for st, r in op.get("responses", {}).items():
            if r.get("x-idemd-untested"):
                continue
            for mt in r.get("content", {}).values():
                out.update((t, m, st, c) for c in _walk_codes(mt.get("schema", {}), set()))
    return out


class TestOpenapiChecker(unittest.TestCase):
    """The spec as such, and the checker on answers it must refuse (no cluster)."""

    def setUp(self):
        self.chk = openapi_check.Checker(harness.openapi_checker().spec)

    def test_the_spec_is_well_formed(self):
        self.assertEqual(openapi_check.spec_problems(self.chk.spec), [])

    def acquired(self):
        body = {"outcome": "acquired", "token": 65536, "token_str": "65536",
                "lease_expires_at": 1, "expires_at": 2, "takeover": False,
                "previous_token": 0, "previous_token_str": "0", "attempt_id": "a-1"}
        return {"content-type": "application/json", "x-request-id": "abc"}, body

    def problem(self, status, code, rid="abc"):
        return ({"content-type": "application/problem+json", "x-request-id": rid},
                {"type": "urn:idemd:problem:" + code, "title": "t", "status": status,
                 "detail": "d", "instance": "urn:idemd:request:" + rid, "code": code,
                 "message": "d", "request_id": rid})

    def refused(self, method, path, status, headers, body, what):
        with self.assertRaises(openapi_check.SpecMismatch) as cm:
            self.chk.check(method, path, status, headers, json.dumps(body))
        self.assertIn(what, str(cm.exception))
        return str(cm.exception)

    def test_synthetic_answers(self):
        h, b = self.acquired()
        self.assertEqual(self.chk.check("POST", "/v1/claims", 200, h, json.dumps(b)),
                         ("/v1/claims", "POST", "200"))
        h, b = self.problem(405, "method_not_allowed")
        self.assertEqual(self.chk.check("PUT", "/livez", 405, dict(h, allow="GET"),
                                        json.dumps(b)), ("/livez", "OTHER", "405"))
        self.refused("PUT", "/livez", 405, dict(h, allow="GET, POST"), b, "Allow")
        h, b = self.problem(404, "not_found")
        self.assertEqual(self.chk.check("GET", "/nope", 404, h, json.dumps(b)), ("*", "*", "404"))
        # A key in a path no route matches is not quoted, only its digest.
        msg = self.refused("GET", "/nope/secret-key-123", 200, h, b, "no route")
        self.assertNotIn("secret-key-123", msg)
        msg = self.refused("POST", "/v1/claims/secret-key-123/complete", 418, h, b,
                           "not documented")
        self.assertNotIn("secret-key-123", msg)
        h, b = self.problem(409, "idempotency_key_reused")
        self.refused("POST", "/v1/claims", 409, h, dict(b, status=422), "status")
        self.refused("POST", "/v1/claims", 409, h, dict(b, request_id="other"), "request_id")
        h, b = self.problem(401, "unauthenticated")
        self.refused("GET", "/v1/claims/k", 401, h, b, "WWW-Authenticate")


class TestOpenapi(ClusterTestCase):
    # alpha: quotas to reach (429), the default mismatch status (409); beta: 422 for a reused
    # key and every other request. Expiry every 100 ms for a tombstone (410).
    cluster_opts = dict(expiry_ms=100, alpha_quota={"max_records": 12, "max_bytes": 8192},
                        beta_settings={"mismatch_status": 422})

    def setUp(self):
        super().setUp()
        self.chk = harness.openapi_checker()
        self.spec = self.chk.spec
        self.chk.produced.clear()
        self.chk.produced_codes.clear()
        for node in self.c.nodes.values():
            wait_for(lambda: http_request(node.http, "GET", "/readyz")[0] == 200, 30,
                     "node %d to be ready" % node.id)

    # ---- requests ---------------------------------------------------------------------------

    def key(self):
        return "oa-" + secrets.token_hex(6)

    def addr(self, nid=None):
        return self.c.nodes[nid or self.c.wait_leader(timeout=20)].http

    def api(self, addr, method, path, body=None, token="beta", headers=None, raw=None,
            template=None):
        """A JSON API request (validated by the harness); token: "alpha", "beta", "admin",
        a literal token, or None. A body the server took (not a 400) must validate against
        the operation's request schema too."""
        tok = {"alpha": self.c.token, "beta": self.c.token2, "admin": self.c.admin}.get(
            token, token)
        h = dict(headers or {})
        if tok is not None:
            h["Authorization"] = "Bearer %s" % tok
        r = http_request(addr, method, path, body, h, timeout=20, raw=raw)
        if body is not None and r[0] != 400 and r[0] < 500:
            errs = self.body_errors(template or self.spec.match(path)[0], method, body)
            self.assertEqual(errs, [], "%s %s took a body its schema refuses" % (method, path))
        return r

    def body_errors(self, template, method, body):
        op = self.spec.doc["paths"][template][method.lower()]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        return self.chk.schema_errors(schema, body)

    def raw(self, addr, method, path, head=b"", body=b"", check=True):
        """raw_exchange() of `method path` with header lines head; validated."""
        line = ("%s %s HTTP/1.1\r\nHost: x\r\n" % (method, path)).encode() + head
        st, h, b = raw_exchange(addr, method, line, body)
        if check:
            self.chk.check(method, path, st, h, b)
        return st, h, b

    def folded(self, addr, method, path):
        st, h, b = self.raw(addr, method, path, b"X-Folded: a\r\n b\r\n")
        self.assertEqual((st, json.loads(b)["code"]), (400, "invalid_request"), b)

    def over_limit(self, addr, method, path):
        st, h, b = self.raw(addr, method, path, b"Content-Length: %d\r\n" % OVER_SERVER_LIMIT)
        self.assertEqual((st, json.loads(b)["code"]), (413, "payload_too_large"), b)

    def claim(self, addr, key, token="beta", **fields):
        body = dict({"fingerprint": fp(key)}, **fields)
        return self.api(addr, "POST", "/v1/claims", body, token,
                        headers={"Idempotency-Key": key})

    def acquired(self, addr, key, token="beta", **fields):
        st, _, b = self.claim(addr, key, token, **fields)
        self.assertEqual(st, 200, b)
        return b["token"]

    # ---- the JSON API's operations ------------------------------------------------------

    def ops(self):
        """[(template, method, path for key k, headers for key k)] of every JSON API
        operation that takes any key (the GETs of /v1/claims/complete... read one key)."""
        out = [("/v1/claims", "POST", lambda k: "/v1/claims", lambda k: {"Idempotency-Key": k}),
               ("/v1/claims", "GET", lambda k: "/v1/claims", lambda k: {"Idempotency-Key": k}),
               ("/v1/claims/{key}", "GET", lambda k: "/v1/claims/" + k, lambda k: {})]
        for a in ACTIONS:
            out.append(("/v1/claims/{key}/" + a, "POST",
                        lambda k, a=a: "/v1/claims/%s/%s" % (k, a), lambda k: {}))
            out.append(("/v1/claims/" + a, "POST", lambda k, a=a: "/v1/claims/" + a,
                        lambda k: {"Idempotency-Key": k}))
        return out

    def op_body(self, template, token=1):
        if template == "/v1/claims":
            return {"fingerprint": fp("x")}
        if template.endswith("complete"):
            return {"token": token, "response": {"status": 201, "body": "done"}}
        if template.endswith("renew"):
            return {"token": token, "lease_ms": 30000}
        return {"token": token}

    def each_op(self, addr, key_of, expect, token="beta", token_of=None, body_of=None):
        """Every JSON API op once (key key_of(template)); asserts each answers expect
        (status, code or None)."""
        for template, method, path, hdrs in self.ops():
            k = key_of(template)
            body = None
            if method == "POST":
                body = body_of(template) if body_of else self.op_body(
                    template, token_of(k) if token_of else 1)
            r = self.api(addr, method, path(k), body, token, headers=hdrs(k), template=template)
            got = (r[0], r[2].get("code") if isinstance(r[2], dict) else None)
            self.assertEqual(got, expect, "%s %s: %r" % (method, template, r))

    def named_gets(self):
        return [("/v1/claims/" + a, a) for a in ACTIONS]

    # ---- the test ------------------------------------------------------------------------

    def test_every_documented_answer(self):
        lid = self.c.wait_leader(timeout=20)
        followers = [n for n in sorted(self.c.nodes) if n != lid]
        lead, fol = self.addr(lid), self.addr(followers[0])
        self.claims(lead, fol)
        self.each_op_statuses(fol)
        self.probes_and_unrouted(fol)
        self.mutations(lead)
        self.refused_bodies(fol)
        # A node that stops: its in-flight /metrics and /readyz answer 503.
        self.stopping(followers[1])
        # No quorum: every JSON API op answers 503, /readyz 503.
        self.c.kill(followers[0])
        wait_for(lambda: http_request(lead, "GET", "/readyz")[0] == 503, 30,
                 "the lone node to be not ready")
        self.each_op(lead, lambda t: self.key(), (503, "idempotency_unavailable"))
        for path, _ in self.named_gets():
            r = self.api(lead, "GET", path)
            self.assertEqual(r[0], 503, r)
        self.coverage()

    def claims(self, lead, fol):
        """The claim's own answers: acquired, replay, 409 x4, 410, 422, 429, 502."""
        k = self.key()
        tok = self.acquired(fol, k, attempt_id="first")
        self.assertEqual(self.claim(fol, k, attempt_id="second")[2]["code"],
                         "idempotency_request_in_progress")
        self.assertEqual(self.claim(fol, k, fingerprint=fp("other"))[0], 422)
        self.assertEqual(self.api(fol, "POST", "/v1/claims/%s/complete" % k,
                                  {"token": str(tok), "outcome": "succeeded",
                                   "response": {"status": 201, "headers": {
                                       "content-type": "application/json", "location": "/o/1"},
                                       "body": '{"id": 1}'}})[0], 200)
        r = self.claim(fol, k)
        self.assertEqual((r[0], r[1].get("idempotency-replayed")), (201, "true"), r)
        # A replay without a stored Content-Type, and one of a body stored by reference.
        k2 = self.key()
        tok = self.acquired(lead, k2)
        self.api(lead, "POST", "/v1/claims/complete", {"token": tok, "response": {
            "status": 200, "body_ref": "s3://b/1", "body_sha256": "ab" * 32}},
            headers={"Idempotency-Key": k2})
        r = self.claim(lead, k2)
        self.assertEqual(r[1].get("idempotency-body-ref"), "s3://b/1", r)
        # A claim fingerprinted by the gateway with field and ignore lists: the body the
        # server takes passes the request schema (api() checks it), and a retry whose
        # ignored member changed is a replay of the same request.
        k5 = self.key()
        rq = {"method": "POST", "path": "/pay", "body": {"amount": 10, "ts": 1},
              "fingerprint_fields": ["/amount", "/ts"], "fingerprint_ignore": ["/ts"]}
        self.assertEqual(self.api(fol, "POST", "/v1/claims", {"request": rq},
                                  headers={"Idempotency-Key": k5})[0], 200)
        rq["body"] = {"amount": 10.0, "ts": 2}
        r = self.api(fol, "POST", "/v1/claims", {"request": rq}, headers={"Idempotency-Key": k5})
        self.assertEqual((r[0], r[2].get("code")), (409, "idempotency_request_in_progress"), r)
        # 409 idempotency_key_reused with alpha's default mismatch status.
        k3 = self.key()
        self.acquired(fol, k3, token="alpha")
        r = self.claim(fol, k3, token="alpha", fingerprint=fp("other"))
        self.assertEqual((r[0], r[2]["code"]), (409, "idempotency_key_reused"), r)
        # 409 idempotency_lease_expired: a lease of 200 ms, the conflict policy.
        k4 = self.key()
        self.acquired(fol, k4, lease_ms=200, attempt_id="a", policy="conflict")

        def code():
            return self.claim(fol, k4, attempt_id="b", policy="conflict")[2].get("code")
        wait_for(lambda: code() == "idempotency_lease_expired", 20, "the lease to pass")
        # 409 idempotency_outcome_unknown: completed with outcome unknown (quarantined).
        k5 = self.key()
        tok = self.acquired(fol, k5)
        self.assertEqual(self.api(fol, "POST", "/v1/claims/%s/complete" % k5,
                                  {"token": tok, "outcome": "unknown"})[0], 200)
        self.assertEqual(self.claim(fol, k5)[2]["code"], "idempotency_outcome_unknown")
        # 502: the stored answer is the marker of one too large to keep.
        k6 = self.key()
        tok = self.acquired(fol, k6)
        self.api(fol, "POST", "/v1/claims/%s/complete" % k6, {"token": tok, "response": {
            "status": 200, "body": "", "body_sha256": hashlib.sha256(b"x").hexdigest()}})
        self.assertEqual(self.claim(fol, k6)[0], 502)
        # 410: a record past its ttl is a tombstone.
        k7 = self.key()
        tok = self.acquired(fol, k7, ttl_ms=300)
        self.api(fol, "POST", "/v1/claims/%s/complete" % k7,
                 {"token": tok, "response": {"status": 200, "body": ""}})
        wait_for(lambda: self.claim(fol, k7)[0] == 410, 20, "a tombstone (410)")
        r = self.api(fol, "GET", "/v1/claims/" + k7)
        self.assertEqual(r[0], 200, r)  # the tombstone's record
        # 429: alpha's bytes quota for a complete, then its records quota for claims.
        for path, hdrs in (("/v1/claims/%s/complete", {}),
                           ("/v1/claims/complete", {"Idempotency-Key": "%s"})):
            k8 = self.key()
            tok = self.acquired(fol, k8, token="alpha")
            r = self.api(fol, "POST", path.replace("%s", k8),
                         {"token": tok, "response": {"status": 200, "body": "x" * 9000}},
                         token="alpha", headers={h: v % k8 for h, v in hdrs.items()})
            self.assertEqual((r[0], r[2]["code"]), (429, "idempotency_quota_exceeded"), r)

        def full():
            return self.claim(fol, self.key(), token="alpha")[0] == 429
        wait_for(full, 20, "alpha's records quota")

    def each_op_statuses(self, addr):
        """Every JSON API op: 200, 400 (each code it lists), 401, 403, 404, 409, 413."""
        # 401 and 403.
        self.each_op(addr, lambda t: self.key(), (401, "unauthenticated"), token=None)
        self.each_op(addr, lambda t: self.key(), (403, "forbidden"), token="admin")
        # 400: a bad key; no key; a folded header line; a bad body.
        self.each_op(addr, lambda t: "bad!key", (400, "idempotency_key_invalid"))
        self.each_op(addr, lambda t: "", (400, "idempotency_key_missing"))
        for template, method, path, hdrs in self.ops():
            self.folded(addr, method, path(self.key()))
            if method == "POST":
                r = self.api(addr, method, path("k"), raw=b"[1]", headers=hdrs("k"))
                self.assertEqual((r[0], r[2]["code"]), (400, "invalid_request"), r)
        # 413: a body over the JSON API's 1 MiB.
        big = b'{"pad": "' + b"x" * MiB + b'"}'
        for template, method, path, hdrs in self.ops():
            r = self.api(addr, method, path(self.key()), raw=big, headers=hdrs("k"))
            self.assertEqual(r[0], 413, (method, template, r[0]))
        # 404: no record.
        for template, method, path, hdrs in self.ops():
            if template == "/v1/claims" and method == "POST":
                continue
            k = self.key()
            body = self.op_body(template) if method == "POST" else None
            r = self.api(addr, method, path(k), body, headers=hdrs(k), template=template)
            self.assertEqual((r[0], r[2]["code"]), (404, "not_found"), (method, template, r))
        # 200 and 409 idempotency_lease_lost: a claimed key, then each op.
        for template, method, path, hdrs in self.ops():
            if template == "/v1/claims" and method == "POST":
                continue
            k = self.key()
            tok = self.acquired(addr, k)
            if method == "POST":
                r = self.api(addr, method, path(k), self.op_body(template, tok + 1),
                             headers=hdrs(k), template=template)
                self.assertEqual((r[0], r[2]["code"]), (409, "idempotency_lease_lost"), r)
                body = self.op_body(template, str(tok))
            else:
                body = None
            r = self.api(addr, method, path(k), body, headers=hdrs(k), template=template)
            self.assertEqual(r[0], 200, (method, template, r))
        # The GETs of the keys named complete, release, renew: 404, 400, 200.
        for path, name in self.named_gets():
            self.folded(addr, "GET", path)
            for token, want in ((None, 401), ("admin", 403)):
                self.assertEqual(self.api(addr, "GET", path, token=token)[0], want)
            r = self.api(addr, "GET", path, headers={"Idempotency-Key": "other"})
            self.assertEqual((r[0], r[2]["code"]), (400, "idempotency_key_invalid"), r)
            r = self.api(addr, "GET", path, raw=big)
            self.assertEqual(r[0], 413)
            self.assertEqual(self.api(addr, "GET", path)[0], 404)
            self.acquired(addr, name)
            self.assertEqual(self.api(addr, "GET", path)[2]["record"]["state"], "processing")

    def probes_and_unrouted(self, addr):
        admin = {"Authorization": "Bearer %s" % self.c.admin}
        for path in ("/livez", "/healthz", "/readyz", "/metrics"):
            self.assertEqual(http_request(addr, "GET", path, headers=admin)[0], 200, path)
            self.folded(addr, "GET", path)
            self.over_limit(addr, "GET", path)
        r = http_request(addr, "GET", "/metrics", headers={"Authorization": "Bearer nope"})
        self.assertEqual(r[0], 401)
        r = http_request(addr, "GET", "/metrics",
                         headers={"Authorization": "Bearer %s" % self.c.token})
        self.assertEqual(r[0], 403)
        # No route: 404 (and 400, 413 before routing).
        for path in ("/v1/nope", "/livez/", "/v1/claims/k/cancel", "/"):
            self.assertEqual(http_request(addr, "GET", path)[0], 404, path)
        self.folded(addr, "POST", "/v1/nope")
        self.over_limit(addr, "POST", "/v1/nope")
        # Another method: 405 with Allow (and 400, 413 before routing).
        for template, _, _ in self.spec.routes:
            path = template.replace("{key}", self.key())
            for method in ("PUT", "HEAD"):
                r = http_request(addr, method, path)
                self.assertEqual(r[0], 405, (method, template))
        self.folded(addr, "DELETE", "/livez")
        self.over_limit(addr, "PATCH", "/v1/claims")

    def stopping(self, nid):
        """A request whose headers the node has read, finished once it stops: /metrics and
        /readyz answer 503 (node shutting down, and role stopping)."""
        node = self.c.nodes[nid]
        host, port = node.http.rsplit(":", 1)
        open_ = []
        for path, auth in (("/metrics", b"Authorization: Bearer " + self.c.admin.encode()),
                           ("/readyz", b"X-A: b")):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth
                      + b"\r\nContent-Length: 2\r\n\r\nx")
            open_.append((path, s))
        try:
            # Two answered requests on other connections: the loop has read the heads.
            for _ in range(2):
                http_request(node.http, "GET", "/livez")
            node.proc.send_signal(signal.SIGTERM)
            with open(node.log, errors="replace") as f:
                wait_for(lambda: "SIGTERM: shutting down" in f.read() or f.seek(0), 15,
                         "node %d to begin its shutdown" % nid)
            for path, s in open_:
                s.sendall(b"y")
                resp = http.client.HTTPResponse(s, method="GET")
                resp.begin()
                body = resp.read()
                h = {k.lower(): v for k, v in resp.getheaders()}
                self.chk.check("GET", path, resp.status, h, body)
                self.assertEqual(resp.status, 503, (path, body))
        finally:
            for _, s in open_:
                s.close()
        self.assertEqual(self.c.wait_exit(nid), 0)

    def mutations(self, addr):
        """Real answers, changed as a server that drifted from the spec would change them:
        each change is reported."""
        k = self.key()
        r = self.claim(addr, k)
        self.assertEqual(r[0], 200)
        h, body = r[1], r[2]

        def refused(status, headers, value, what, method="POST", path="/v1/claims"):
            text = value if isinstance(value, str) else json.dumps(value)
            with self.assertRaises(openapi_check.SpecMismatch) as cm:
                self.chk.check(method, path, status, headers, text)
            msg = str(cm.exception)
            self.assertIn(what, msg)
            self.assertNotIn(k, msg)
        self.chk.check("POST", "/v1/claims", 200, h, r.raw)  # as it came: fine
        b = copy.deepcopy(body)
        del b["token_str"]
        refused(200, h, b, "'token_str' is a required property")
        refused(200, h, dict(body, token_text="1"), "Additional properties")
        refused(200, h, dict(body, token=-1), "at token")
        refused(404, h, body, "status 404 is not documented")
        refused(200, dict(h, **{"content-type": "text/plain"}), body, "Content-Type")
        hh = dict(h)
        del hh["x-request-id"]
        refused(200, hh, body, "X-Request-Id")
        r = self.api(addr, "GET", "/v1/claims/" + k, token=None)
        self.assertEqual(r[0], 401)
        hh = dict(r[1])
        del hh["www-authenticate"]
        refused(401, hh, r.raw, "WWW-Authenticate", "GET", "/v1/claims/" + k)
        refused(401, r[1], dict(r[2], code="forbidden"), "code", "GET", "/v1/claims/" + k)
        refused(401, r[1], dict(r[2], status=403), "status", "GET", "/v1/claims/" + k)
        r = http_request(addr, "PUT", "/v1/claims")
        refused(405, dict(r[1], allow="GET"), r.raw, "Allow", "PUT", "/v1/claims")
        r = http_request(addr, "GET", "/readyz")
        refused(200, r[1], dict(r[2], reason="x"), "Additional properties", "GET", "/readyz")

    def refused_bodies(self, addr):
        """Bodies the server refuses (400 invalid_request) are refused by their request
        schema too: the schemas are as strict as the server, not stricter (api() checks
        the other way round)."""
        k = self.key()
        tok = self.acquired(addr, k)
        cases = [
            ("/v1/claims", {"fingerprint": fp(1), "attempt": "a"}),
            ("/v1/claims", {"request": {"method": "POST", "path": "/", "bdy": {}}}),
            ("/v1/claims", {"fingerprint": fp(1), "request": {"method": "GET", "path": "/"}}),
            ("/v1/claims", {}),
            ("/v1/claims", {"fingerprint": "abc"}),
            ("/v1/claims", {"fingerprint": fp(1), "lease_ms": 86400001}),
            ("/v1/claims", {"fingerprint": fp(1), "ttl_ms": -1}),
            ("/v1/claims", {"fingerprint": fp(1), "policy": "steal"}),
            ("/v1/claims", {"fingerprint": fp(1), "attempt_id": "a" * 65}),
            ("/v1/claims", {"request": {"method": "", "path": "/"}}),
            ("/v1/claims/{key}/complete", {"token": tok, "status": 201}),
            ("/v1/claims/{key}/complete", {"token": tok}),
            ("/v1/claims/{key}/complete", {"token": tok, "response": {"status": 99}}),
            ("/v1/claims/{key}/complete", {"token": "1 2", "response": {"status": 200}}),
            ("/v1/claims/{key}/complete", {"token": tok, "outcome": "done",
                                           "response": {"status": 200}}),
            ("/v1/claims/{key}/complete", {"token": tok, "response": {
                "status": 200, "headers": {"bad name": "x"}}}),
            ("/v1/claims/{key}/complete", {"token": tok, "response": {
                "status": 200, "headers": {"x-a": "a\nb"}}}),
            ("/v1/claims/{key}/complete", {"token": tok, "response": {
                "status": 200, "body_ref": "r"}}),
            ("/v1/claims/{key}/complete", {"token": tok, "response": {
                "status": 200, "body": "x", "body_ref": "r", "body_sha256": "ab" * 32}}),
            ("/v1/claims/{key}/release", {"token": tok, "reason": "x"}),
            ("/v1/claims/{key}/release", {"token": -1}),
            ("/v1/claims/{key}/renew", {"token": tok, "lease": 5}),
            ("/v1/claims/{key}/renew", {"token": tok, "lease_ms": 86400001}),
        ]
        for template, body in cases:
            path = template.replace("{key}", k)
            headers = {"Idempotency-Key": k} if template == "/v1/claims" else {}
            r = self.api(addr, "POST", path, body, headers=headers)
            self.assertEqual((r[0], r[2].get("code")), (400, "invalid_request"), (body, r))
            self.assertNotEqual(self.body_errors(template, "POST", body), [],
                                "the schema of POST %s takes %r" % (template, body))

    def coverage(self):
        documented = self.spec.documented()
        untested = self.spec.untested()
        missing = documented - untested - self.chk.produced
        self.assertEqual(sorted(missing), [], "documented but never produced")
        codes = documented_codes(self.spec)
        missing = codes - self.chk.produced_codes
        self.assertEqual(sorted(missing), [], "error codes documented but never produced")
        print("openapi: %d documented (route, method, status) triples, %d produced, "
              "%d untested (%s); %d (triple, code) pairs produced"
              % (len(documented), len(self.chk.produced & documented), len(untested),
                 ", ".join("%s %s %s" % t for t in sorted(untested)),
                 len(self.chk.produced_codes)))

    # ---- routes ---------------------------------------------------------------------------

    def test_spec_paths_are_the_gateways_routes(self):
        names, paths = gateway_route_table()
        self.assertEqual(set(self.spec.doc["paths"]), paths)
        routes = {op["x-idemd-route"] for _, _, op in self.spec.operations()}
        self.assertEqual(routes, set(names) - {"proxy", "other"})
        # Each operation, probed once, is counted under the route its x-idemd-route names.
        nid = self.c.wait_leader(timeout=20)
        addr = self.addr(nid)

        def counts():
            text = http_request(addr, "GET", "/metrics").raw
            out = collections.Counter()
            for m in re.finditer(r'^idem_http_requests_total\{route="([a-z_]+)",'
                                 r'status="(\d+)"\} (\d+)$', text, re.M):
                out[(m.group(1), m.group(2))] = int(m.group(3))
            return out
        before = counts()
        want = collections.Counter({("metrics", "200"): 1})  # the scrape before this one
        for template, method, op in self.spec.operations():
            path = template.replace("{key}", self.key())
            r = http_request(addr, method, path)
            want[(op["x-idemd-route"], str(r[0]))] += 1
        after = counts()
        self.assertEqual(+(after - before), want)


if __name__ == "__main__":
    unittest.main()
