"""The typed errors of the idem client, keyed on the `code` of idemd's error bodies.

Every error body of idemd is RFC 9457 problem details (`application/problem+json`, or
`application/json` from an older node) with `code`, `message` (the same as `detail`) and
`request_id` (docs/http-api.md, *Errors*): only `code` is relied on, other members are
tolerated, and the HTTP status is the fallback when a code is not known here. `message`
(else `detail`, else `title`) is for people and may change.
"""

__all__ = [
    "IdemError", "InvalidRequest", "PayloadTooLarge", "Unauthorized", "Forbidden", "NotFound",
    "Conflict", "Mismatch", "InProgress", "InProgressTimeout", "LeaseExpired", "UnknownOutcome",
    "LeaseLost", "Expired", "QuotaExceeded", "ResponseTooLarge", "InternalError", "Unavailable",
    "ProtocolError", "NotRecorded", "InvalidFingerprintOption", "error_from_answer",
]


class IdemError(Exception):
    """Base of every error this package raises about idemd's answers.

    status: the HTTP status (None when no answer came); code: idemd's `code` (or a code of
    this package: "connection_failed", "protocol_error", "not_recorded"); message: the
    server's or the client's explanation; request_id: the X-Request-Id of the request (the
    same on every retry of one call); body: the parsed error body (a dict) when there was one.
    """

    def __init__(self, message, *, status=None, code=None, request_id=None, body=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id
        self.body = body

    def __str__(self):
        parts = [self.message]
        if self.code:
            parts.append("code=%s" % self.code)
        if self.status is not None:
            parts.append("status=%d" % self.status)
        if self.request_id:
            parts.append("request_id=%s" % self.request_id)
        return " ".join(parts[:1]) + (" (%s)" % ", ".join(parts[1:]) if parts[1:] else "")


class InvalidRequest(IdemError):
    """400: the request was refused as it stands (invalid_request, idempotency_key_missing,
    idempotency_key_invalid, invalid_path): the same request never succeeds; nothing changed."""


class PayloadTooLarge(InvalidRequest):
    """413 payload_too_large: the request body is over idemd's limit (1 MiB)."""


class Unauthorized(IdemError):
    """401 unauthenticated: no bearer token, or one no tenant has."""


class Forbidden(IdemError):
    """403 forbidden: the admin token used for a data operation."""


class NotFound(IdemError):
    """404 not_found: no record for the key (or a released one, or a tombstone for complete,
    release and renew)."""


class Conflict(IdemError):
    """409: the key's record does not let this request run now. Subclasses name why."""


class Mismatch(Conflict):
    """409 idempotency_key_reused: the key was used with a different request (fingerprint)."""


class InProgress(Conflict):
    """409 idempotency_request_in_progress: another attempt holds the key's lease.
    retry_after: seconds (from Retry-After: the lease time left, at least 1), or None."""

    def __init__(self, message, *, retry_after=None, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class InProgressTimeout(InProgress):
    """Client.run waited for another attempt's outcome (in_progress answered each time) until
    its `wait` ran out. Nothing ran here; retry later with the same key."""


class LeaseExpired(Conflict):
    """409 idempotency_lease_expired: the holder's lease passed (policy conflict) with no
    outcome recorded: check the business state before running it again."""


class UnknownOutcome(Conflict):
    """409 idempotency_outcome_unknown: the record is quarantined (an attempt completed it
    with outcome unknown) until an operator resolves it."""


class LeaseLost(Conflict):
    """409 idempotency_lease_lost: complete, release or renew with a token that is not the
    current one (another attempt took over, or the record was completed or resolved)."""


class Expired(IdemError):
    """410 idempotency_key_expired: the record expired; its tombstone remains."""


class QuotaExceeded(IdemError):
    """429 idempotency_quota_exceeded: the tenant's records or bytes quota."""


class ResponseTooLarge(IdemError):
    """502 upstream_response_too_large: the key's recorded answer was too large to keep
    (proxy mode, or idem's middlewares, kept only its SHA-256); every replay answers so."""


class InternalError(IdemError):
    """500 internal: a fault inside the node."""


class Unavailable(IdemError):
    """No answer from the cluster before the deadline: connection failures, or 503
    idempotency_unavailable (no leader, no quorum, load) on every try. The request may or may
    not have been applied; retrying it with the same key (and, for a claim, the same
    attempt id) is safe."""


class ProtocolError(IdemError):
    """An answer this client cannot read (not JSON, no outcome, an unexpected status). The
    request may have been applied; retrying with the same key is safe."""


class NotRecorded(IdemError):
    """Client.run: the function ran, but its response was not recorded: the complete failed
    or answered otherwise (cause: the error, e.g. Unavailable, LeaseLost, QuotaExceeded).
    token and response are the run's: retry Client.complete(key, token, response) while the
    lease allows; do not run the business again."""

    def __init__(self, message, *, token, response, cause, **kw):
        kw.setdefault("code", "not_recorded")
        super().__init__(message, **kw)
        self.token = token
        self.response = response
        self.cause = cause


class InvalidFingerprintOption(ValueError):
    """A fingerprint option (fingerprint_fields or fingerprint_ignore: a list of RFC 6901
    JSON Pointers) refused on this side, by the rule the gateway applies: at most 32
    pointers, each of 1-256 bytes of UTF-8 text that starts with "/" and has no "~" but in
    "~0" or "~1". Raised before anything is sent (a ValueError: the call, or the
    middleware's route, is wrong as written). option: the option's name; index: the
    pointer's place in the list (None when the list itself is wrong); pointer: it (None
    then); reason: what rule it broke."""

    def __init__(self, option, index, pointer, reason):
        where = option if index is None else "%s[%d]" % (option, index)
        shown = "" if pointer is None else " %s" % _shorten(pointer)
        super().__init__("%s%s: %s" % (where, shown, reason))
        self.option = option
        self.index = index
        self.pointer = pointer
        self.reason = reason


def _shorten(s, n=64):
    r = repr(s)
    return r if len(r) <= n else r[:n - 3] + "..."


_BY_CODE = {
    "invalid_request": InvalidRequest,
    "invalid_path": InvalidRequest,
    "idempotency_key_missing": InvalidRequest,
    "idempotency_key_invalid": InvalidRequest,
    "payload_too_large": PayloadTooLarge,
    "unauthenticated": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "idempotency_key_reused": Mismatch,
    "idempotency_request_in_progress": InProgress,
    "idempotency_lease_expired": LeaseExpired,
    "idempotency_outcome_unknown": UnknownOutcome,
    "idempotency_lease_lost": LeaseLost,
    "idempotency_key_expired": Expired,
    "idempotency_quota_exceeded": QuotaExceeded,
    "upstream_response_too_large": ResponseTooLarge,
    "internal": InternalError,
    "idempotency_unavailable": Unavailable,
}

_BY_STATUS = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    410: Expired, 413: PayloadTooLarge, 422: Mismatch, 425: InProgress, 429: QuotaExceeded,
    500: InternalError, 503: Unavailable,
}


def _retry_after(headers):
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return max(0.0, float(int(v.strip())))
    except ValueError:
        return None  # an HTTP date: idemd sends seconds only


def error_from_answer(status, headers, body, request_id=None):
    """The typed error for an answer (status, lower-cased headers, parsed body or None).

    The class comes from the body's `code`; an unknown code (or no body) falls back on the
    status, then on IdemError."""
    code = body.get("code") if isinstance(body, dict) else None
    message = None
    for member in ("message", "detail", "title"):  # problem details: detail, as message
        v = body.get(member) if isinstance(body, dict) else None
        if isinstance(v, str) and v:
            message = v
            break
    if message is None:
        message = "idemd answered %d" % status
    rid = body.get("request_id") if isinstance(body, dict) else None
    rid = rid if isinstance(rid, str) else request_id
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(status, IdemError)
    kw = dict(status=status, code=code if isinstance(code, str) else None, request_id=rid,
              body=body if isinstance(body, dict) else None)
    if issubclass(cls, InProgress):
        return cls(message, retry_after=_retry_after(headers), **kw)
    return cls(message, **kw)
