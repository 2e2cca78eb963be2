"""idem.wsgi: any WSGI application behind idemd, by route.

    from idem import Client
    from idem.wsgi import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, Client(nodes, token), [("POST", "/orders")])

A request on a matching route that carries an `Idempotency-Key` header is claimed (the
request object -- method, path with its query, body -- sent for the gateway to
fingerprint), and the app runs at most once per key while the lease is renewed; its answer
is recorded (status, the headers named in response_headers, body) and every retry with the
same key and request gets it back with `Idempotency-Replayed: true`. The app's answer is
recorded as proxy mode records an upstream's: 2xx/3xx as succeeded, 5xx as failed_final,
4xx released (the next try runs again) unless store_4xx; an app that raises quarantines the
key (outcome unknown) and the exception goes on to the server. Refusals are idemd's HTTP
mapping, written as the gateway writes its errors (RFC 9457 problem details,
application/problem+json: type urn:idemd:problem:CODE, title, status, detail, code,
message, and request_id and instance when idemd answered): 409 (or mismatch_status 422) for
a key used with another request, 409 (or in_progress_status 425) with Retry-After while
another attempt holds the key, 409 for an expired lease or a quarantined key, 410, 429,
400, 413; and 503 with Retry-After when idemd does not answer: the middleware fails closed,
the app does not run unchecked. Requests without a key pass through (400
idempotency_key_missing with key_required), and so do other routes. A route made with
route(..., fingerprint_fields=[...], fingerprint_ignore=[...]) sends those JSON Pointers in
the claim's request object with a JSON body (only those values hashed / those left out).

The app gets the fencing token as environ["idem.token"] and the `Idempotency-Fence` request
header (environ["HTTP_IDEMPOTENCY_FENCE"]); a fence a caller sent is never passed on. The
answer is buffered (not streamed), as the request body is (up to max_body bytes, 1 MiB).
"""
import http
import io

from . import _middleware as mw
from ._middleware import route  # noqa: F401  (idem.wsgi.route)


def _status_line(code):
    try:
        return "%d %s" % (code, http.HTTPStatus(code).phrase)
    except ValueError:
        return "%d Unknown" % code


class IdempotencyMiddleware:
    """A WSGI app in front of `app`.

    client: an idem.Client (its nodes, TLS, deadline); routes: a list of (method,
    path_prefix) or (method, path_prefix, token) tuples, dicts (method, path_prefix, token,
    fingerprint_fields, fingerprint_ignore) or idem.wsgi.route(...) objects (method: one, a
    list, or "*"; token: the tenant's bearer token for that route, else `token`, else the
    client's own). A pointer the gateway would refuse raises InvalidFingerprintOption here. Options: mismatch_status (409 or 422),
    in_progress_status (409 or 425), response_headers (the headers recorded; default
    content-type), lease_ms, ttl_ms, policy ("conflict" or "takeover") for the claims, wait
    (seconds to wait for another attempt's outcome instead of answering in_progress;
    default 0), key_required, max_body, store_4xx, deadline (of each call to idemd)."""

    def __init__(self, app, client, routes, **options):
        self.app = app
        tok = options.pop("token", None)
        self.cfg = mw.Config(client, routes, token=tok, **options)

    def _send(self, start_response, ans, status_line=None):
        headers = list(ans.headers)
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers.append(("Content-Length", str(len(ans.body))))
        start_response(status_line or _status_line(ans.status), headers)
        return [ans.body]

    def _read_body(self, environ):
        """The request body, or None when it is over max_body."""
        inp = environ.get("wsgi.input")
        try:
            n = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            n = 0
        if n > self.cfg.max_body:
            return None
        if n > 0:
            data = inp.read(n)
        elif environ.get("wsgi.input_terminated") and inp is not None:
            data = inp.read(self.cfg.max_body + 1)
            if len(data) > self.cfg.max_body:
                return None
        else:
            data = b""
        return data

    def __call__(self, environ, start_response):
        environ.pop("HTTP_IDEMPOTENCY_FENCE", None)
        method = environ.get("REQUEST_METHOD", "GET").upper()
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        r = self.cfg.match(method, path or "/")
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if r is None:
            return self.app(environ, start_response)
        if key is None:
            if self.cfg.key_required:
                return self._send(start_response, mw.error_answer(
                    400, "idempotency_key_missing", "this route needs an Idempotency-Key"))
            return self.app(environ, start_response)
        if not key:
            return self._send(start_response, mw.error_answer(
                400, "idempotency_key_missing", "the Idempotency-Key header is empty"))
        body = self._read_body(environ)
        if body is None:
            return self._send(start_response, mw.error_answer(
                413, "payload_too_large", "the request body is too large"))
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        ans, held = mw.begin(self.cfg, r, key, method, mw.quote_path(path),
                             environ.get("QUERY_STRING", ""), environ.get("CONTENT_TYPE"), body)
        if ans is not None:
            return self._send(start_response, ans)
        environ["idem.token"] = held.token
        environ["idem.key"] = key
        environ["HTTP_IDEMPOTENCY_FENCE"] = str(held.token)
        try:
            status_line, headers, out = self._run_app(environ)
        except BaseException as e:
            mw.app_failed(self.cfg, held, e)
            raise
        ans = mw.finish(self.cfg, held, int(status_line.split(None, 1)[0]), headers, out)
        return self._send(start_response, ans, status_line)

    def _run_app(self, environ):
        got = {}
        chunks = []

        def capture(status, headers, exc_info=None):
            if exc_info is not None and "status" in got:
                # Nothing was sent yet (the answer is buffered): the new one replaces it.
                chunks.clear()
            got["status"] = status
            got["headers"] = list(headers)
            return chunks.append

        result = self.app(environ, capture)
        try:
            for c in result:
                chunks.append(c)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if "status" not in got:
            raise RuntimeError("the WSGI app returned without calling start_response")
        return got["status"], got["headers"], b"".join(bytes(c) for c in chunks)
