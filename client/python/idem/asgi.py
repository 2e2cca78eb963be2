"""idem.asgi: any ASGI application behind idemd, by route.

    from idem import Client
    from idem.asgi import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, Client(nodes, token), [("POST", "/orders")])

The same rules as idem.wsgi (read its docstring): a matching request with an
`Idempotency-Key` is claimed, the app runs at most once per key, its answer is recorded and
replayed with `Idempotency-Replayed: true`; refusals map as idemd's do (RFC 9457 problem
details, application/problem+json), and the middleware answers 503 when idemd does not
(fail closed). The client's calls block, so each runs in a
worker thread (asyncio.to_thread) and the event loop goes on meanwhile; the lease is renewed
by the client's own thread while the app runs. Only "http" scopes are looked at (lifespan
and websocket pass through). The app gets the fencing token as scope["idem"]["token"] and
the `idempotency-fence` request header; a fence a caller sent is never passed on. Request
and answer are buffered (the body up to max_body bytes, 1 MiB).
"""
import asyncio
import functools
import threading
import urllib.parse

from . import _middleware as mw
from ._middleware import route  # noqa: F401  (idem.asgi.route)

_FENCE = b"idempotency-fence"


def _give_back(deadline, begun):
    """A done callback of a claim whose request was cancelled meanwhile: when it got the
    key, its renewals stop and the key is released, on a thread of its own (the calls
    block, and this runs on the event loop)."""
    if begun.cancelled() or begun.exception() is not None:
        return
    _, held = begun.result()
    if held is None:
        return

    def release():
        held.stop()
        err = held.release_after(None, deadline)
        if err is not None:
            mw.log.warning("idem: release of a claim whose request was cancelled failed: %s",
                           err)
    threading.Thread(target=release, name="idem-give-back", daemon=True).start()


class IdempotencyMiddleware:
    """An ASGI app in front of `app`; arguments and options as idem.wsgi's."""

    def __init__(self, app, client, routes, **options):
        self.app = app
        tok = options.pop("token", None)
        self.cfg = mw.Config(client, routes, token=tok, **options)

    async def _send(self, send, ans):
        headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1"))
                   for k, v in ans.headers]
        headers.append((b"content-length", str(len(ans.body)).encode()))
        await send({"type": "http.response.start", "status": ans.status, "headers": headers})
        await send({"type": "http.response.body", "body": ans.body, "more_body": False})

    async def _read_body(self, receive):
        """The request body; None when over max_body; False when the caller went away."""
        parts, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return False
            if msg["type"] != "http.request":
                continue
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.cfg.max_body:
                return None
            parts.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(parts)

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != _FENCE]
        scope["headers"] = headers
        method = scope.get("method", "GET").upper()
        path = scope.get("path") or "/"
        r = self.cfg.match(method, path)
        keys = [v for k, v in headers if k.lower() == b"idempotency-key"]
        if r is None or (not keys and not self.cfg.key_required):
            await self.app(scope, receive, send)
            return
        if not keys or not keys[0]:
            await self._send(send, mw.error_answer(
                400, "idempotency_key_missing", "the Idempotency-Key header is empty"
                if keys else "this route needs an Idempotency-Key"))
            return
        if len(keys) > 1:
            await self._send(send, mw.error_answer(400, "idempotency_key_invalid",
                                                   "the Idempotency-Key header sent twice"))
            return
        key = keys[0].decode("latin-1")
        body = await self._read_body(receive)
        if body is False:
            return
        if body is None:
            await self._send(send, mw.error_answer(413, "payload_too_large",
                                                   "the request body is too large"))
            return
        ctype = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"),
                     None)
        raw = scope.get("raw_path") or urllib.parse.quote(path.encode("utf-8"))
        raw = raw.decode("latin-1") if isinstance(raw, bytes) else raw
        raw = raw.split("?", 1)[0]
        query = scope.get("query_string", b"").decode("latin-1")
        begun = asyncio.ensure_future(asyncio.to_thread(
            mw.begin, self.cfg, r, key, method,
            mw.quote_path(urllib.parse.unquote_to_bytes(raw)), query, ctype, body))
        try:
            ans, held = await asyncio.shield(begun)
        except asyncio.CancelledError:
            # Cancelled (a request timeout, the server stopping) while the claim is on its
            # way: its thread goes on, and a claim it gets is released (the app does not
            # run) instead of held and renewed until the process ends.
            begun.add_done_callback(functools.partial(_give_back, self.cfg.deadline))
            raise
        if ans is not None:
            await self._send(send, ans)
            return
        await self._run(scope, receive, send, held, key, body)

    async def _run(self, scope, receive, send, held, key, body):
        scope["headers"] = scope["headers"] + [(_FENCE, str(held.token).encode())]
        scope["idem"] = {"key": key, "token": held.token}
        delivered = False

        async def replay_receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when the caller goes

        got = {}
        chunks = []

        async def capture(msg):
            if msg["type"] == "http.response.start":
                got["status"] = msg["status"]
                got["headers"] = [(k.decode("latin-1"), v.decode("latin-1"))
                                  for k, v in msg.get("headers", [])]
            elif msg["type"] == "http.response.body":
                chunks.append(bytes(msg.get("body", b"")))

        try:
            await self.app(scope, replay_receive, capture)
            if "status" not in got:
                raise RuntimeError("the ASGI app returned without starting a response")
        except BaseException as e:
            await asyncio.to_thread(mw.app_failed, self.cfg, held, e)
            raise
        hdrs = [(k, v) for k, v in got["headers"] if k.lower() != "content-length"]
        ans = await asyncio.to_thread(mw.finish, self.cfg, held, got["status"], hdrs,
                                      b"".join(chunks))
        await self._send(send, ans)
