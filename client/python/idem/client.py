"""Client: idemd's HTTP JSON API (docs/http-api.md) from Python, standard library only.

The low-level calls (claim, complete, release, renew, get) each send one request, tried on
the nodes until a node answers or the call's deadline passes (idem/_http.py), and return the
answer or raise the typed error of its `code` (idem/errors.py). Client.run is libidem's
idem_run (client/include/idem.h): claim, run the caller's function while a thread renews the
lease, then complete or release by what the function did.
"""
import dataclasses
import email.utils
import json
import random
import re
import secrets
import ssl
import time

from . import _http
from ._renew import LEASE_GUESS_MS, Renewer, now_ms
from .errors import (IdemError, InProgress, InProgressTimeout, InvalidFingerprintOption,
                     NotRecorded, ProtocolError, error_from_answer)

__version__ = "0.1.0"

DEFAULT_DEADLINE = 10.0
DEFAULT_WAIT = 30.0
WAIT_BACKOFF_BASE = 0.05
WAIT_BACKOFF_CAP = 1.0

# Headers of a replay that idemd adds itself (framing, its own origin's, the replay's
# markers): not part of the stored response.
_NOT_STORED = frozenset((
    "date", "server", "connection", "keep-alive", "content-length", "transfer-encoding",
    "x-request-id", "x-content-type-options", "idempotency-replayed", "idempotency-body-ref",
    "idempotency-body-sha256", "idempotency-expires", "idempotency-attempt"))
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
MAX_HEADERS = 64
# The fingerprint options (docs/http-api.md, POST /v1/claims): lists of RFC 6901 JSON
# Pointers, at most MAX_POINTERS of at most MAX_POINTER_BYTES each.
FINGERPRINT_OPTIONS = ("fingerprint_fields", "fingerprint_ignore")
MAX_POINTERS = 32
MAX_POINTER_BYTES = 256
_BAD_TILDE = re.compile(r"~(?![01])")
_REQUEST_MEMBERS = frozenset(("method", "path", "body") + FINGERPRINT_OPTIONS)


class Retryable(Exception):
    """Raised by a function under Client.run: it failed and changed nothing (a validation
    error, a refused connection), so the claim is released and the next try runs again.
    response (optional): what this caller should get (the middlewares send it); it is not
    stored. Client.run re-raises it after the release."""

    def __init__(self, message="", response=None):
        super().__init__(message)
        self.response = response


class Ambiguous(Exception):
    """Raised by a function under Client.run when it cannot tell whether its effect
    happened (e.g. a timeout after sending): the record is completed with outcome unknown
    (quarantined until an operator resolves it). Any exception other than Retryable (or one
    of run's retry_on types) is taken the same way; this one only says so explicitly."""


@dataclasses.dataclass
class Response:
    """A response as idemd stores and replays it. headers: lower-case names to values;
    body: bytes (a str is taken as its UTF-8 bytes); a body kept elsewhere is body_ref with
    body_sha256 (64 hex digits) and no body. failed_final (for Client.run): record it as
    outcome failed_final (a failure with side effects) rather than succeeded; both replay
    alike."""
    status: int = 200
    headers: dict = dataclasses.field(default_factory=dict)
    body: bytes = b""
    body_ref: str = None
    body_sha256: str = None
    failed_final: bool = False

    def __post_init__(self):
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")
        elif self.body is None:
            self.body = b""
        self.body = bytes(self.body)
        self.headers = {str(k).lower(): str(v) for k, v in (self.headers or {}).items()}

    def text(self):
        return self.body.decode("utf-8")

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def to_json(self):
        """The `response` object of a complete; ValueError when idemd could not store it."""
        if not isinstance(self.status, int) or not 200 <= self.status <= 599:
            raise ValueError("a stored response's status is an integer 200-599")
        if len(self.headers) > MAX_HEADERS:
            raise ValueError("at most %d stored headers" % MAX_HEADERS)
        for k, v in self.headers.items():
            if not _TOKEN.match(k):
                raise ValueError("a header name that is not an HTTP token: %r" % k)
            if _BAD_VALUE.search(v):
                raise ValueError("a control character in the value of header %r" % k)
        out = {"status": self.status, "headers": dict(self.headers)}
        if self.body_ref:
            if self.body:
                raise ValueError("a response has a body or a body_ref, not both")
            if not self.body_sha256 or not _HEX64.match(self.body_sha256):
                raise ValueError("body_ref needs body_sha256 (64 hex digits)")
            out["body_ref"] = self.body_ref
            out["body_sha256"] = self.body_sha256
            return out
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the JSON API stores a body as text: this one is not UTF-8 "
                             "(keep it elsewhere and store body_ref and body_sha256)") from None
        if self.body_sha256:
            out["body_sha256"] = self.body_sha256
        return out


@dataclasses.dataclass
class Claim:
    """A claim's answer: outcome "acquired" (token, lease_expires_at, expires_at, takeover,
    previous_token; lease_ms is the lease the renewals plan on: the one asked for, else
    estimated from lease_expires_at and the answer's Date) or "replay" (response, the stored
    one). attempt_id: the one sent (made by the call when none was given)."""
    outcome: str
    attempt_id: str
    token: int = None
    lease_expires_at: int = None
    expires_at: int = None
    takeover: bool = False
    previous_token: int = 0
    lease_ms: int = None
    response: Response = None

    @property
    def replayed(self):
        return self.outcome == "replay"


@dataclasses.dataclass
class Renewal:
    """A renewal's answer: the lease's new end (Unix ms, the cluster's clock) and the lease
    the schedule follows (asked for, else estimated as for Claim.lease_ms)."""
    lease_expires_at: int
    lease_ms: int


@dataclasses.dataclass
class Record:
    """get's answer (docs/http-api.md, GET /v1/claims): state is processing, completed,
    quarantined or tombstone; response when one is stored (its body None when not UTF-8)."""
    state: str
    token: int
    fingerprint_prefix: str = None
    created_at: int = None
    expires_at: int = None
    lease_expires_at: int = None
    response: Response = None


@dataclasses.dataclass
class Result:
    """What Client.run came to. replayed: the stored response of an earlier run (the
    function did not run here); ran: the function ran here and its response was recorded
    (completion: "succeeded" or "failed_final"). token: the fencing token of this run (None
    for a replay). note: what the lease renewals saw ("" when nothing went wrong);
    renewals: how many renewals answered ok while the function ran."""
    response: Response
    replayed: bool
    ran: bool
    attempt_id: str
    token: int = None
    completion: str = None
    note: str = ""
    renewals: int = 0


def new_attempt_id():
    """A fresh random attempt id: 32 lower-case hex digits."""
    return secrets.token_hex(16)


def _lease_estimate(asked, lease_expires_at, date):
    """The lease the renewal schedule follows: the one asked for, unless even the most the
    answer allows for is shorter (a claim its own attempt repeated keeps the lease it has,
    which may be nearly over); then, or when none was asked for, what is left of it by the
    answer's Date (whole seconds, so less a second: never more than the truth, when the
    node's clock and the cluster's agree); LEASE_GUESS_MS when nothing is known."""
    upper = None  # the lease left is at most this, and more than it less a second
    try:
        d = email.utils.parsedate_to_datetime(date).timestamp() * 1000.0
        if isinstance(lease_expires_at, int):
            upper = lease_expires_at - d
    except (TypeError, ValueError, IndexError):
        pass
    if upper is None:
        return int(asked) if asked else LEASE_GUESS_MS
    least = max(int(upper - 1000), 0)
    if asked:
        # Only a lease certainly shorter than the one asked for (a claim repeated by its own
        # attempt keeps the lease it had) is followed by the least that may be left of it.
        return int(asked) if upper >= int(asked) else least
    return least


def _replay_response(ans):
    h = {k: v for k, v in ans.headers.items() if k not in _NOT_STORED}
    return Response(status=ans.status, headers=h, body=ans.data,
                    body_ref=ans.headers.get("idempotency-body-ref"),
                    body_sha256=ans.headers.get("idempotency-body-sha256"))


def _stored_response(o):
    if not isinstance(o, dict):
        return None
    body = o.get("body")
    return Response(status=o.get("status"), headers=o.get("headers") or {},
                    body=body.encode("utf-8") if isinstance(body, str) else b"",
                    body_ref=o.get("body_ref"), body_sha256=o.get("body_sha256"))


def tls_context(cafile=None, certfile=None, keyfile=None):
    """A client TLS context: verifies the nodes against cafile (else the system's CAs), and
    presents certfile/keyfile when given (for tls.http_client_certs)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


class Client:
    """A client of idemd's JSON API, safe to share between threads.

    nodes: the gateways' base URLs (a list, or one comma-separated string), e.g.
    ["http://10.0.0.1:8001", "http://10.0.0.2:8001"]; any node serves (a follower forwards
    to the leader). token: the tenant's bearer token. TLS (https:// URLs): cafile to trust,
    certfile/keyfile to present a client certificate, or a ready ssl_context. deadline:
    seconds each call may take, retries included (default 10)."""

    def __init__(self, nodes, token, *, cafile=None, certfile=None, keyfile=None,
                 ssl_context=None, deadline=DEFAULT_DEADLINE, _transport=None):
        if not token:
            raise ValueError("a bearer token is needed")
        if not isinstance(token, str) or any(not "!" <= ch <= "~" for ch in token):
            # Said without the token: http.client's own refusal would quote it (and a trailing
            # newline, from a file read as it is, is the usual cause).
            raise ValueError("the bearer token has a character that cannot be sent in a header "
                             "(a space, a control character such as a trailing newline, or "
                             "non-ASCII)")
        if _transport is None:
            ctx = ssl_context
            if ctx is None and (cafile or certfile):
                ctx = tls_context(cafile, certfile, keyfile)
            _transport = _http.Transport(nodes, ssl_context=ctx)
        self._t = _transport
        self._token = token
        self.deadline = deadline

    def with_token(self, token):
        """A client for another tenant's token that shares this one's nodes and connections."""
        return Client(None, token, deadline=self.deadline, _transport=self._t)

    @property
    def nodes(self):
        return [repr(n) for n in self._t.nodes]

    def close(self):
        """Closes the kept-alive connections (of every client sharing them)."""
        self._t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- one request ------------------------------------------------------------------

    def _call(self, method, path, key, body, deadline):
        rid = secrets.token_hex(8)
        headers = {"Authorization": "Bearer " + self._token, "Idempotency-Key": key,
                   "X-Request-Id": rid, "User-Agent": "idem-python/" + __version__}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode("utf-8")
            headers["Content-Type"] = "application/json"
        limit = time.monotonic() + (self.deadline if deadline is None else deadline)
        try:
            ans = self._t.call(method, path, headers, data, limit)
        except IdemError as e:
            if e.request_id is None and e.status is not None:
                e.request_id = rid  # a node answered (503): it had this request's id
            raise
        return ans, rid

    @staticmethod
    def _parse(ans):
        try:
            return json.loads(ans.data.decode("utf-8")) if ans.data else None
        except (ValueError, UnicodeDecodeError):
            return None

    def _ok(self, ans, rid, what):
        """The JSON object of a 200 {"outcome": "ok", ...}; raises the typed error otherwise."""
        body = self._parse(ans)
        if ans.status != 200:
            raise error_from_answer(ans.status, ans.headers, body, rid)
        if not isinstance(body, dict) or body.get("outcome") != "ok":
            raise ProtocolError("%s: a 200 without outcome ok from %s" % (what, ans.node.url),
                                status=200, code="protocol_error", request_id=rid)
        return body

    # ---- the low-level calls ----------------------------------------------------------

    def claim(self, key, *, request=None, fingerprint=None, attempt_id=None, lease_ms=None,
              ttl_ms=None, policy=None, deadline=None):
        """Claims key for a request: `request` {"method", "path", optional "body",
        optional "fingerprint_fields" / "fingerprint_ignore" (lists of JSON Pointers: only
        those values of a JSON body are hashed / those are left out)} for the gateway to
        fingerprint (a JSON value as canonical JSON, a str as its bytes), or your own
        `fingerprint` (64 hex digits or 32 bytes) -- the same way on every retry of a key.
        A request member not named here, or a pointer the gateway would refuse, raises
        ValueError (InvalidFingerprintOption) before anything is sent.
        Returns a Claim ("acquired" or "replay"); raises InProgress, Mismatch, LeaseExpired,
        UnknownOutcome, Expired, QuotaExceeded, InvalidRequest, Unauthorized, Forbidden,
        Unavailable. attempt_id: made here when None; a claim retried after Unavailable
        with the same one gets its own lease back."""
        attempt_id = attempt_id or new_attempt_id()
        body = _claim_body(request, fingerprint, attempt_id, lease_ms, ttl_ms, policy)
        return self._claim(key, body, attempt_id, lease_ms, deadline)

    def _claim(self, key, body, attempt_id, lease_ms, deadline):
        ans, rid = self._call("POST", "/v1/claims", key, body, deadline)
        if ans.headers.get("idempotency-replayed", "").lower() == "true":
            return Claim("replay", attempt_id, response=_replay_response(ans))
        o = self._parse(ans)
        if ans.status != 200:
            raise error_from_answer(ans.status, ans.headers, o, rid)
        if not isinstance(o, dict) or o.get("outcome") != "acquired" or \
                not isinstance(o.get("token"), int):
            raise ProtocolError("claim: a 200 that is neither acquired nor a replay",
                                status=200, code="protocol_error", request_id=rid)
        return Claim("acquired", attempt_id, token=o["token"],
                     lease_expires_at=o.get("lease_expires_at"), expires_at=o.get("expires_at"),
                     takeover=bool(o.get("takeover")), previous_token=o.get("previous_token", 0),
                     lease_ms=_lease_estimate(lease_ms, o.get("lease_expires_at"),
                                              ans.headers.get("date")))

    def complete(self, key, token, response=None, *, outcome="succeeded", deadline=None):
        """Stores the holder's result: outcome "succeeded" or "failed_final" with a
        Response, or "unknown" (quarantine; response optional). Repeating it with the same
        token and outcome answers the same. Raises LeaseLost, NotFound, QuotaExceeded,
        InvalidRequest, Unavailable; ValueError for a response idemd could not store."""
        if outcome not in ("succeeded", "failed_final", "unknown"):
            raise ValueError("outcome is succeeded, failed_final or unknown")
        body = {"token": int(token), "outcome": outcome}
        if response is not None:
            body["response"] = response.to_json()
        elif outcome != "unknown":
            raise ValueError("a complete with outcome %s needs a response" % outcome)
        ans, rid = self._call("POST", "/v1/claims/complete", key, body, deadline)
        self._ok(ans, rid, "complete")

    def release(self, key, token, *, deadline=None):
        """Gives the key back (the attempt changed nothing). Raises LeaseLost, NotFound,
        Unavailable."""
        ans, rid = self._call("POST", "/v1/claims/release", key, {"token": int(token)},
                              deadline)
        self._ok(ans, rid, "release")

    def renew(self, key, token, *, lease_ms=None, deadline=None):
        """Extends the lease to now + lease_ms (None: the tenant's). Returns a Renewal;
        raises LeaseLost, NotFound, Unavailable."""
        body = {"token": int(token)}
        if lease_ms:
            body["lease_ms"] = int(lease_ms)
        ans, rid = self._call("POST", "/v1/claims/renew", key, body, deadline)
        o = self._ok(ans, rid, "renew")
        exp = o.get("lease_expires_at")
        return Renewal(exp, _lease_estimate(lease_ms, exp, ans.headers.get("date")))

    def get(self, key, *, deadline=None):
        """The key's record (read through the leader's log). Raises NotFound, Unavailable."""
        ans, rid = self._call("GET", "/v1/claims", key, None, deadline)
        o = self._ok(ans, rid, "get").get("record")
        if not isinstance(o, dict):
            raise ProtocolError("get: no record in the answer", status=200,
                                code="protocol_error", request_id=rid)
        return Record(state=o.get("state"), token=o.get("token"),
                      fingerprint_prefix=o.get("fingerprint_prefix"),
                      created_at=o.get("created_at"), expires_at=o.get("expires_at"),
                      lease_expires_at=o.get("lease_expires_at"),
                      response=_stored_response(o.get("response")))

    # ---- run ----------------------------------------------------------------------------

    def acquire(self, key, *, request=None, fingerprint=None, attempt_id=None, lease_ms=None,
                ttl_ms=None, policy=None, wait=DEFAULT_WAIT, deadline=None):
        """claim, with in_progress waited on: claimed again with the same attempt id after a
        backoff (50 ms doubling to 1 s, jittered, never longer than the Retry-After) until
        an answer other than in_progress, or until `wait` seconds have passed
        (InProgressTimeout; with wait 0, the first InProgress is raised as it is). Returns
        (Claim, the monotonic ms at which the answered claim was sent)."""
        attempt_id = attempt_id or new_attempt_id()
        body = _claim_body(request, fingerprint, attempt_id, lease_ms, ttl_ms, policy)
        end = time.monotonic() + wait
        backoff = WAIT_BACKOFF_BASE
        tries = 0
        while True:
            sent = now_ms()
            tries += 1
            try:
                return self._claim(key, body, attempt_id, lease_ms, deadline), sent
            except InProgress as e:
                left = end - time.monotonic()
                if wait <= 0:
                    raise
                if left <= 0:
                    raise InProgressTimeout(
                        "another attempt still held the key after %.1f s (%d claims)"
                        % (wait, tries), retry_after=e.retry_after, status=e.status,
                        code=e.code, request_id=e.request_id, body=e.body) from e
                pause = backoff * random.uniform(0.75, 1.0)
                if e.retry_after:
                    pause = min(pause, e.retry_after)
                backoff = min(backoff * 2, WAIT_BACKOFF_CAP)
                time.sleep(min(pause, left))

    def hold(self, key, claim, sent_ms, *, lease_ms=None):
        """A Held claim: the lease of an acquired `claim` renewed by a thread from now on."""
        return Held(self, key, claim, sent_ms, lease_ms)

    def run(self, key, fn, *, request=None, fingerprint=None, attempt_id=None, lease_ms=None,
            ttl_ms=None, policy=None, wait=DEFAULT_WAIT, deadline=None, retry_on=()):
        """Runs fn(token) at most once per key, across every process that uses the key.

        acquire (claim; in_progress waited on up to `wait` s, then InProgressTimeout) ->
        - replay: fn does not run; Result(replayed=True, response=the stored one).
        - acquired: fn(token) runs on this thread while another renews the lease (every
          third of it, proto/renew_plan.h); token is the fencing token for downstream
          systems. Then, by what fn did:
          * returned a Response (or bytes/str: status 200): complete, outcome succeeded (or
            failed_final when response.failed_final): Result(ran=True); when the complete
            fails or answers otherwise (LeaseLost, QuotaExceeded, Unavailable at its
            deadline), NotRecorded with the token, the response and the cause.
          * raised Retryable (or one of retry_on): release, then the exception is raised
            again; the next run of the key runs fn again.
          * raised anything else (Ambiguous, a timeout, a bug) or returned what cannot be
            stored: complete with outcome unknown (the key is quarantined until an
            operator resolves it), then the exception is raised again (TypeError/
            ValueError for a return value that cannot be stored).
          A failed release or complete after an exception is added to it as a note.
        - anything else (Mismatch, LeaseExpired, UnknownOutcome, Expired, QuotaExceeded,
          Unavailable, ...): raised; fn does not run.
        The attempt id is made once per run (unless given) and sent on every claim of it, so
        a claim whose answer was lost gets its own lease back. `deadline` bounds each call."""
        claim, sent = self.acquire(key, request=request, fingerprint=fingerprint,
                                   attempt_id=attempt_id, lease_ms=lease_ms, ttl_ms=ttl_ms,
                                   policy=policy, wait=wait, deadline=deadline)
        if claim.replayed:
            return Result(claim.response, True, False, claim.attempt_id)
        held = self.hold(key, claim, sent, lease_ms=lease_ms)
        try:
            out = fn(claim.token)
        except BaseException as e:
            held.stop()
            if isinstance(e, Retryable) or (retry_on and isinstance(e, retry_on)):
                held.release_after(e, deadline)
            else:
                held.quarantine_after(e, deadline)
            raise
        held.stop()
        try:
            resp = out if isinstance(out, Response) else Response(body=_as_body(out))
            resp.to_json()
        except (TypeError, ValueError) as e:
            held.quarantine_after(e, deadline)
            raise
        held.complete(resp, deadline)
        return Result(resp, False, True, claim.attempt_id, claim.token,
                      "failed_final" if resp.failed_final else "succeeded", held.note,
                      held.renewer.renewals)


class Held:
    """An acquired claim whose lease a Renewer keeps while its holder works; stop() the
    renewals, then complete(), release_after() or quarantine_after() (Client.run and the
    middlewares use it; each call is bounded by `deadline` as the client's calls are)."""

    def __init__(self, client, key, claim, sent_ms, lease_ms):
        self.client = client
        self.key = key
        self.claim = claim
        self.token = claim.token
        est = claim.lease_ms if claim.lease_ms is not None else LEASE_GUESS_MS
        self.renewer = Renewer(client, key, claim.token, lease_ms, est, sent_ms).start()
        self.note = ""

    def stop(self):
        self.renewer.stop()
        self.note = self.renewer.note()
        return self.note

    def _notes(self, what, err):
        parts = [p for p in (self.note, "%s after the function ran: %s" % (what, err)) if p]
        return "; ".join(parts)

    def complete(self, response, deadline=None):
        """complete (succeeded, or failed_final) with response; NotRecorded when it fails."""
        outcome = "failed_final" if response.failed_final else "succeeded"
        try:
            self.client.complete(self.key, self.token, response, outcome=outcome,
                                 deadline=deadline)
        except IdemError as e:
            raise NotRecorded(self._notes("complete", e), token=self.token, response=response,
                              cause=e, request_id=e.request_id) from e

    def _after(self, exc, what, call):
        try:
            call()
        except IdemError as e:
            if exc is not None:
                exc.add_note("idem: " + self._notes(what, e))
            return e
        if self.note and exc is not None:
            exc.add_note("idem: " + self.note)
        return None

    def release_after(self, exc=None, deadline=None):
        """release (after fn raised exc, when not None); returns the release's error, or
        None, and adds it to exc as a note."""
        return self._after(exc, "release",
                           lambda: self.client.release(self.key, self.token, deadline=deadline))

    def quarantine_after(self, exc=None, deadline=None):
        """complete(unknown) (after fn raised exc, when not None, or returned what cannot be
        stored); returns its error, or None, and adds it to exc as a note."""
        return self._after(exc, "complete(unknown)", lambda: self.client.complete(
            self.key, self.token, outcome="unknown", deadline=deadline))


def _as_body(out):
    if isinstance(out, (bytes, bytearray, memoryview, str)):
        return out
    raise TypeError("the function returns an idem.Response, bytes or str, not %s"
                    % type(out).__name__)


def check_pointers(option, pointers):
    """The list of JSON Pointers of a fingerprint option (fingerprint_fields or
    fingerprint_ignore), checked by the gateway's rule: a list (or tuple) of at most 32
    strings, each 1-256 bytes of UTF-8 that start with "/" and use "~" only in the escapes
    "~0" ("~") and "~1" ("/"). None is no pointer ([]). Raises InvalidFingerprintOption."""
    if pointers is None:
        return []
    if not isinstance(pointers, (list, tuple)):
        raise InvalidFingerprintOption(option, None, None, "a list of JSON Pointers, not %s"
                                       % type(pointers).__name__)
    if len(pointers) > MAX_POINTERS:
        raise InvalidFingerprintOption(option, None, None, "%d pointers, over the limit of %d"
                                       % (len(pointers), MAX_POINTERS))
    out = []
    for i, p in enumerate(pointers):
        if not isinstance(p, str):
            raise InvalidFingerprintOption(option, i, None, "a pointer is a str, not %s"
                                           % type(p).__name__)
        try:
            n = len(p.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidFingerprintOption(option, i, p, "not UTF-8 text") from None
        if not p.startswith("/"):
            raise InvalidFingerprintOption(option, i, p, 'a pointer starts with "/"')
        if n > MAX_POINTER_BYTES:
            raise InvalidFingerprintOption(option, i, p, "%d bytes, over the limit of %d"
                                           % (n, MAX_POINTER_BYTES))
        bad = _BAD_TILDE.search(p)
        if bad:
            raise InvalidFingerprintOption(option, i, p, '"~" at offset %d is not "~0" or "~1"'
                                           % bad.start())
        out.append(p)
    return out


def request_object(request):
    """The claim's `request` member for a request dict (see Client.claim); ValueError
    (InvalidFingerprintOption for a bad pointer) when idemd would refuse it."""
    if not isinstance(request, dict) or not isinstance(request.get("method"), str) or \
            not isinstance(request.get("path"), str):
        raise ValueError('request is {"method": str, "path": str, optional "body", '
                         '"fingerprint_fields", "fingerprint_ignore"}')
    unknown = sorted(str(k) for k in request if k not in _REQUEST_MEMBERS)
    if unknown:
        raise ValueError("request has no member %s (it takes method, path, body, "
                         "fingerprint_fields, fingerprint_ignore)" % ", ".join(unknown))
    r = {"method": request["method"], "path": request["path"]}
    if request.get("body") is not None:
        b = request["body"]
        r["body"] = b.decode("utf-8") if isinstance(b, (bytes, bytearray)) else b
    for opt in FINGERPRINT_OPTIONS:
        ptrs = check_pointers(opt, request.get(opt))
        if ptrs:  # an empty list is no option: the member is left out
            r[opt] = ptrs
    return r


def _claim_body(request, fingerprint, attempt_id, lease_ms, ttl_ms, policy):
    if (request is None) == (fingerprint is None):
        raise ValueError("a claim takes a request or a fingerprint (one of the two)")
    body = {"attempt_id": attempt_id}
    if request is not None:
        body["request"] = request_object(request)
    else:
        fp = fingerprint.hex() if isinstance(fingerprint, (bytes, bytearray)) else fingerprint
        if not isinstance(fp, str) or not _HEX64.match(fp):
            raise ValueError("a fingerprint is 32 bytes or 64 hex digits")
        body["fingerprint"] = fp.lower()
    if not isinstance(attempt_id, str) or not 0 < len(attempt_id.encode("utf-8")) <= 64:
        raise ValueError("an attempt id is 1-64 bytes")
    if lease_ms:
        body["lease_ms"] = int(lease_ms)
    if ttl_ms:
        body["ttl_ms"] = int(ttl_ms)
    if policy is not None:
        if policy not in ("conflict", "takeover"):
            raise ValueError('policy is "conflict" or "takeover"')
        body["policy"] = policy
    return body
