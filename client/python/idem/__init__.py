"""idem: a Python client of idemd's HTTP JSON API (standard library only).

    import idem
    client = idem.Client(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], token)
    result = client.run("order-7", charge,
                        request={"method": "POST", "path": "/orders", "body": order})

Client.run claims the key, runs the function at most once while its lease is renewed, and
records its response (or replays the one recorded); Client.claim/complete/release/renew/get
are the single calls. idem.wsgi and idem.asgi put a web application behind idemd by route.
Errors are typed by idemd's `code` (idem.errors). See client/python/README.md.
"""
from .client import (Ambiguous, Claim, Client, Held, Record, Renewal, Response, Result,
                     Retryable, __version__, check_pointers, new_attempt_id, tls_context)
from .errors import (Conflict, Expired, Forbidden, IdemError, InProgress, InProgressTimeout,
                     InternalError, InvalidFingerprintOption, InvalidRequest, LeaseExpired,
                     LeaseLost, Mismatch, NotFound, NotRecorded, PayloadTooLarge,
                     ProtocolError, QuotaExceeded, ResponseTooLarge, Unauthorized,
                     Unavailable, UnknownOutcome)

__all__ = [
    "Ambiguous", "Claim", "Client", "Held", "Record", "Renewal", "Response", "Result",
    "Retryable", "__version__", "check_pointers", "new_attempt_id", "tls_context",
    "Conflict", "Expired", "Forbidden", "IdemError", "InProgress", "InProgressTimeout",
    "InternalError", "InvalidFingerprintOption", "InvalidRequest", "LeaseExpired",
    "LeaseLost", "Mismatch", "NotFound", "NotRecorded", "PayloadTooLarge", "ProtocolError",
    "QuotaExceeded", "ResponseTooLarge", "Unauthorized", "Unavailable", "UnknownOutcome",
]
