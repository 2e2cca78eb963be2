"""What idem.wsgi and idem.asgi share: routes, the request object a claim sends, the claim's
answer turned into an HTTP answer, and the app's response recorded the way proxy mode
records an upstream's (docs/http-api.md, *What is stored, answered and replayed*). Every
call here blocks (the ASGI middleware runs them in a thread)."""
import dataclasses
import hashlib
import http
import json
import logging
import re
import urllib.parse

from .client import Response, check_pointers
from .errors import (Expired, Forbidden, IdemError, InProgress, InvalidRequest, LeaseExpired,
                     Mismatch, NotRecorded, QuotaExceeded, ResponseTooLarge, Unauthorized,
                     UnknownOutcome)

log = logging.getLogger("idem")

MAX_BODY = 1 << 20  # idemd takes request bodies up to 1 MiB
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


@dataclasses.dataclass
class Route:
    """Requests whose method is in `methods` ("*": any) and whose path is path_prefix or
    continues it after a "/" (a prefix ending in "/" matches what follows it), as proxy
    routes match; token: the tenant's bearer token for them (None: the middleware's).
    fingerprint_fields / fingerprint_ignore: JSON Pointers (RFC 6901) sent in the claim's
    request object with a JSON body: the gateway hashes only those values / leaves those
    out (checked here: InvalidFingerprintOption)."""
    methods: frozenset
    path_prefix: str
    token: str = None
    fingerprint_fields: tuple = ()
    fingerprint_ignore: tuple = ()

    def __post_init__(self):
        self.fingerprint_fields = tuple(check_pointers("fingerprint_fields",
                                                       self.fingerprint_fields))
        self.fingerprint_ignore = tuple(check_pointers("fingerprint_ignore",
                                                       self.fingerprint_ignore))

    def matches(self, method, path):
        if "*" not in self.methods and method not in self.methods:
            return False
        p = self.path_prefix
        if p.endswith("/"):
            return path.startswith(p) or path == p[:-1]
        return path == p or path.startswith(p + "/")


def route(method, path_prefix, token=None, *, fingerprint_fields=None,
          fingerprint_ignore=None):
    """A Route; method: one method, "*", or a list of methods; fingerprint_fields and
    fingerprint_ignore: lists of JSON Pointers (see Route)."""
    ms = [method] if isinstance(method, str) else list(method)
    if not path_prefix.startswith("/"):
        raise ValueError("a path prefix starts with /: %r" % path_prefix)
    return Route(frozenset(m.upper() for m in ms), path_prefix, token,
                 fingerprint_fields or (), fingerprint_ignore or ())


def parse_routes(routes):
    out = []
    for r in routes:
        if isinstance(r, Route):
            out.append(r)
        elif isinstance(r, dict):
            out.append(route(r.get("method", r.get("methods", "POST")), r["path_prefix"],
                             r.get("token"), fingerprint_fields=r.get("fingerprint_fields"),
                             fingerprint_ignore=r.get("fingerprint_ignore")))
        else:
            out.append(route(*r))
    if not out:
        raise ValueError("no route given")
    return out


class Answer:
    """An HTTP answer the middleware sends itself: status, [(name, value)], body bytes."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body


PROBLEM_TYPE = "urn:idemd:problem:"
REQUEST_URN = "urn:idemd:request:"
# The titles of idemd's problem types (server/http_conv.c): the middlewares' own refusals
# read as the gateway's errors do.
TITLES = {
    "invalid_request": "The request is invalid",
    "invalid_path": "The path is refused",
    "idempotency_key_missing": "The Idempotency-Key is missing",
    "idempotency_key_invalid": "The Idempotency-Key is invalid",
    "unauthenticated": "Unauthenticated",
    "forbidden": "Forbidden",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "idempotency_request_in_progress": "A request with this key is in progress",
    "idempotency_key_reused": "The key was used with a different request",
    "idempotency_lease_expired": "The holder's lease expired",
    "idempotency_outcome_unknown": "The outcome of an earlier attempt is unknown",
    "idempotency_lease_lost": "The token is not the current holder's",
    "idempotency_key_expired": "The key expired",
    "payload_too_large": "The body is too large",
    "idempotency_quota_exceeded": "The tenant's quota is exhausted",
    "internal": "Internal error",
    "upstream_unavailable": "The upstream is unavailable",
    "upstream_response_too_large": "The upstream's answer is too large",
    "idempotency_unavailable": "The idempotency service is unavailable",
    "upstream_timeout": "The upstream did not answer in time",
}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _title(code, status):
    if code in TITLES:
        return TITLES[code]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_answer(status, code, detail, request_id=None, retry_after=None):
    """A refusal as RFC 9457 problem details (application/problem+json), with the members
    idemd's gateway writes (docs/http-api.md, Errors): type urn:idemd:problem:CODE, title,
    status, detail, code, message (= detail); request_id and instance
    (urn:idemd:request:ID) when the request id of the gateway's answer is known (never
    for a refusal made before idemd was asked). Retry-After (seconds, at least 1) when
    retry_after is given. The detail never holds the idempotency key."""
    body = {"type": PROBLEM_TYPE + code, "title": _title(code, status), "status": status,
            "detail": detail}
    rid = request_id if isinstance(request_id, str) and \
        _REQUEST_ID.fullmatch(request_id) else None
    if rid:
        body["instance"] = REQUEST_URN + rid
    body["code"] = code
    body["message"] = detail
    if rid:
        body["request_id"] = rid
    h = [("Content-Type", "application/problem+json")]
    if retry_after is not None:
        h.append(("Retry-After", str(max(1, int(retry_after)))))
    return Answer(status, h, json.dumps(body).encode())


class Config:
    """The middlewares' settings (see idem.wsgi.IdempotencyMiddleware)."""

    def __init__(self, client, routes, *, token=None, mismatch_status=409,
                 in_progress_status=409, response_headers=("content-type",), lease_ms=None,
                 ttl_ms=None, policy=None, wait=0.0, key_required=False, max_body=MAX_BODY,
                 store_4xx=False, deadline=None):
        if mismatch_status not in (409, 422):
            raise ValueError("mismatch_status is 409 or 422")
        if in_progress_status not in (409, 425):
            raise ValueError("in_progress_status is 409 or 425")
        if policy not in (None, "conflict", "takeover"):
            raise ValueError('policy is "conflict" or "takeover"')
        if client is None:
            raise ValueError("the middleware needs an idem.Client (its nodes, TLS, deadline)")
        self.routes = parse_routes(routes)
        self.clients = {}
        for r in self.routes:
            tok = r.token or token
            if tok not in self.clients:
                self.clients[tok] = client if tok is None else client.with_token(tok)
        self.default_token = token
        self.mismatch_status = mismatch_status
        self.in_progress_status = in_progress_status
        self.response_headers = frozenset(h.lower() for h in response_headers) - {"set-cookie"}
        self.lease_ms = lease_ms
        self.ttl_ms = ttl_ms
        self.policy = policy
        self.wait = wait
        self.key_required = key_required
        self.max_body = max_body
        self.store_4xx = store_4xx
        self.deadline = deadline

    def match(self, method, path):
        for r in self.routes:
            if r.matches(method, path):
                return r
        return None

    def client_for(self, r):
        return self.clients[r.token or self.default_token]


def _is_json(ctype):
    t = (ctype or "").split(";", 1)[0].strip().lower()
    return t == "application/json" or (t.endswith("+json") and "/" in t)


def _no_dupes(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("a member name appears twice in an object")
        d[k] = v
    return d


def _no_constants(name):
    raise ValueError("%s is not JSON" % name)


def claim_args(method, path, query, ctype, body, r=None):
    """The request or fingerprint a claim sends for this request: the request object
    (method, path with its query, body: canonical JSON for a JSON body, else its text), for
    the gateway to fingerprint as proxy mode would; with a JSON body, the route r's
    fingerprint options too (they apply to JSON only); a body that is not UTF-8 text, which
    the JSON API cannot carry, is fingerprinted here instead (SHA-256 over method, path and
    body, each framed by its length). Raises InvalidRequest for a JSON body that is not."""
    target = path + ("?" + query if query else "")
    req = {"method": method, "path": target}
    if not body:
        return {"request": req}
    if _is_json(ctype):
        try:
            req["body"] = json.loads(body.decode("utf-8"), object_pairs_hook=_no_dupes,
                                     parse_constant=_no_constants)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRequest("the body is labelled JSON but is not: %s" % e,
                                 status=400, code="invalid_request") from None
        if r is not None and r.fingerprint_fields:
            req["fingerprint_fields"] = list(r.fingerprint_fields)
        if r is not None and r.fingerprint_ignore:
            req["fingerprint_ignore"] = list(r.fingerprint_ignore)
        return {"request": req}
    try:
        req["body"] = body.decode("utf-8")
        return {"request": req}
    except UnicodeDecodeError:
        h = hashlib.sha256()
        for part in (b"idem-python-raw-v1", method.encode(), target.encode("utf-8", "replace"),
                     body):
            h.update(len(part).to_bytes(4, "big") + part)
        return {"fingerprint": h.hexdigest()}


def quote_path(raw):
    """A path (bytes or str) percent-encoded as it travels (for the fingerprint only)."""
    if isinstance(raw, str):
        raw = raw.encode("latin-1", "replace")
    return urllib.parse.quote(raw, safe=_PATH_SAFE)


def refusal(cfg, e):
    """The HTTP answer to a claim refused with e (docs/contract.md, HTTP mapping): the
    middleware fails closed, so anything but a definite answer is 503."""
    rid = e.request_id
    if isinstance(e, Mismatch):
        return error_answer(cfg.mismatch_status, "idempotency_key_reused",
                            "the key was used with a different request", rid)
    if isinstance(e, InProgress):
        return error_answer(cfg.in_progress_status, "idempotency_request_in_progress",
                            "another attempt holds the key's lease", rid,
                            retry_after=e.retry_after or 1)
    if isinstance(e, (LeaseExpired, UnknownOutcome, Expired, QuotaExceeded, InvalidRequest,
                      ResponseTooLarge)):
        return error_answer(e.status or 400, e.code or "invalid_request", e.message, rid)
    if isinstance(e, (Unauthorized, Forbidden)):
        log.error("idem: idemd refused the middleware's token (%s): check its configuration",
                  e.code)
        return error_answer(500, "internal", "the idempotency layer is misconfigured", rid)
    log.warning("idem: claim failed, answering 503: %s", e)
    return error_answer(503, "idempotency_unavailable",
                        "the idempotency service did not answer; retry with the same key",
                        rid, retry_after=1)


def replay_answer(resp):
    h = [(k, v) for k, v in resp.headers.items()]
    if resp.body_ref:
        h.append(("Idempotency-Body-Ref", resp.body_ref))
        h.append(("Idempotency-Body-SHA256", resp.body_sha256 or ""))
    h.append(("Idempotency-Replayed", "true"))
    body = b"" if resp.status in (204, 304) else resp.body
    return Answer(resp.status, h, body)


def begin(cfg, r, key, method, path, query, ctype, body):
    """Claims key for this request: (None, Held) when the app is to run, else (Answer, None)
    (a replay, or the refusal)."""
    if len(body) > cfg.max_body:
        return error_answer(413, "payload_too_large", "the request body is too large"), None
    client = cfg.client_for(r)
    try:
        args = claim_args(method, path, query, ctype, body, r)
        claim, sent = client.acquire(key, lease_ms=cfg.lease_ms, ttl_ms=cfg.ttl_ms,
                                     policy=cfg.policy, wait=cfg.wait, deadline=cfg.deadline,
                                     **args)
    except IdemError as e:
        return refusal(cfg, e), None
    if claim.replayed:
        return replay_answer(claim.response), None
    return None, client.hold(key, claim, sent, lease_ms=cfg.lease_ms)


def app_failed(cfg, held, exc):
    """The app raised exc: its effects are unknown, the record is quarantined."""
    held.stop()
    held.quarantine_after(exc, cfg.deadline)


def _sha256_hex(b):
    return hashlib.sha256(b).hexdigest()


def finish(cfg, held, status, headers, body):
    """Records the app's answer (status, [(name, value)], body) and returns the Answer to
    send: the app's own, with `Idempotency-Recorded: false` when it was meant to be recorded
    and was not (the complete failed, the lease was lost, or only its SHA-256 could be
    recorded: its retries get 502)."""
    held.stop()
    answer = Answer(status, list(headers), body)
    if not 200 <= status <= 599:
        # Not a status idemd stores (1xx): nothing to replay, the outcome stays unknown.
        held.quarantine_after(None, cfg.deadline)
        answer.headers.append(("Idempotency-Recorded", "false"))
        return answer
    if 400 <= status < 500 and not cfg.store_4xx:
        err = held.release_after(None, cfg.deadline)
        if err is not None:
            log.warning("idem: release after a %d failed: %s", status, err)
        return answer
    stored = {}
    for k, v in headers:
        k = k.lower()
        if k in cfg.response_headers:
            stored[k] = stored[k] + ", " + v if k in stored else v
    resp = Response(status=status, headers=stored, body=body, failed_final=status >= 500)
    try:
        fits = len(body) <= cfg.max_body
        resp.to_json()
    except ValueError:
        fits = False
    try:
        if fits:
            try:
                held.complete(resp, cfg.deadline)
                return answer
            except NotRecorded as e:
                # Refusals that a retry would meet again: left processing, the record would
                # let the app run a second time once the lease ended (takeover).
                if not isinstance(e.cause, (InvalidRequest, QuotaExceeded)):
                    raise
        # An answer idemd cannot keep (not UTF-8 text, too large for the middleware or for a
        # log entry, past the tenant's bytes quota): recorded as proxy mode records one,
        # outcome failed_final with its SHA-256 and no body; its replays answer 502
        # upstream_response_too_large, so this answer is not the key's recorded result.
        marker = Response(status=status, headers={}, body=b"", body_sha256=_sha256_hex(body)
                          if body else None, failed_final=True)
        held.complete(marker, cfg.deadline)
        answer.headers.append(("Idempotency-Recorded", "false"))
    except NotRecorded as e:
        log.warning("idem: the app's answer was not recorded: %s", e)
        answer.headers.append(("Idempotency-Recorded", "false"))
    return answer
