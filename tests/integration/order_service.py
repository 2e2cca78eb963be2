#!/usr/bin/env python3
"""order_service: a small real HTTP/1.1 business service, the upstream of idemd's proxy mode
in test_proxy.py. Python 3 stdlib only.

    python3 order_service.py [--port N] [--log FILE]

Listens on 127.0.0.1 (port 0: any free one) and prints the port on stdout, one line, once it
accepts connections. Every business request is appended to --log (one JSON line with the
caller's TCP port as peer_port, flushed before the answer is sent) so that executions survive a kill and a restart; on start the log
is read back, so GET /stats counts executions across restarts.

Business endpoints (dispatched on the last path segment, so any route prefix works):
  POST /orders        JSON {"amount", "currency"} -> 201 {"id", "amount"}, header X-Order-Id
  POST /slow?ms=N     sleeps N ms, then 201 {"id", "slept"}
  POST /bad           400 {"error": ...}
  POST /boom          500 {"error": ...}
  POST /big           201 with a 2 MiB body
  POST /conn          201 with "Connection: keep-alive, X-Secret" and an X-Secret header
                      (hop-by-hop by that naming: a proxy must not pass it on)
  POST /mib           201 with a body of exactly 1 MiB (within max_inline_body's default,
                      too large for a log entry with the rest of the completion)
  POST /huge          201 with a body of 20,000,000 bytes (more than an RPC frame carries)
  POST /manyhdrs      201 {"id"} with 65 X-Order-Id header lines (a stored response holds
                      at most 64 headers)
  POST /cookie        201 {"id"} with Set-Cookie: session=<id> (a caller's own session)
  any other method/path: 200 echo of method, path and the idempotency headers seen (a GET
                      is counted under "gets", not as an execution); OPTIONS and PURGE
                      answer 200 too
Every request but the test-only ones is also kept as it arrived (its method, its raw
request target and its headers), in memory, for GET /_admin/seen.
Test-only endpoints (never sent through the proxy):
  GET  /stats         {"total", "by_key", "fences", "gets", "executions"}
  GET  /_admin/seen   {"seen": [{"method", "path", "headers": {lower-case name: [values]}}]}
  POST /_admin/next   {"action": "hang"|"close"|"delay", "ms": N}: queued, consumed by the
                      next business request (hang: accept, never answer; close: execute, then
                      close the connection without an answer; delay: sleep ms first)
  POST /_admin/clear  drops the queued actions
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MiB = 1024 * 1024


class State:
    def __init__(self, log_path):
        self.lock = threading.Lock()
        self.log_path = log_path
        self.executions = []   # every business execution, in arrival order
        self.gets = 0
        self.next_actions = []
        self.seen = []         # every request as it arrived (GET /_admin/seen)
        self.seq = 0
        if log_path and os.path.exists(log_path):
            with open(log_path) as f:
                for line in f:
                    line = line.strip()
                    if line:
                        try:
                            self.executions.append(json.loads(line))
                        except ValueError:
                            pass
        self.seq = len(self.executions)
        self.log = open(log_path, "a") if log_path else None

    def record(self, entry):
        with self.lock:
            self.seq += 1
            entry["seq"] = self.seq
            entry["pid"] = os.getpid()
            self.executions.append(entry)
            if self.log:
                self.log.write(json.dumps(entry) + "\n")
                self.log.flush()
            return self.seq

    def pop_action(self):
        with self.lock:
            return self.next_actions.pop(0) if self.next_actions else None

    def stats(self):
        with self.lock:
            by_key, fences = {}, {}
            for e in self.executions:
                k = e.get("key") or ""
                by_key[k] = by_key.get(k, 0) + 1
                fences.setdefault(k, []).append(e.get("fence"))
            return {"total": len(self.executions), "by_key": by_key, "fences": fences,
                    "gets": self.gets, "executions": list(self.executions)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "order-service/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    # ---- plumbing --------------------------------------------------------------------------

    def _body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = b""
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status, obj=None, raw=None, headers=None):
        data = raw if raw is not None else json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Noise", "%d" % time.monotonic_ns())  # not a stored header
        for k, v in (headers.items() if isinstance(headers, dict) else headers or ()):
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _keep_seen(self):
        """Keeps the request as it arrived: method, raw target, every header."""
        headers = {}
        for k, v in self.headers.items():
            headers.setdefault(k.lower(), []).append(v)
        st = self.server.state
        with st.lock:
            st.seen.append({"method": self.command, "path": self.path, "headers": headers})

    # ---- dispatch --------------------------------------------------------------------------

    def do_GET(self):
        st = self.server.state
        url = urlsplit(self.path)
        if url.path == "/stats":
            return self._send(200, st.stats())
        if url.path == "/ping":
            return self._send(200, {"ok": True})
        if url.path == "/_admin/seen":
            with st.lock:
                return self._send(200, {"seen": list(st.seen)})
        self._keep_seen()
        self._body()
        with st.lock:
            st.gets += 1
        self._send(200, {"method": "GET", "path": self.path,
                         "saw_key": self.headers.get("Idempotency-Key"),
                         "saw_fence": self.headers.get("Idempotency-Fence")},
                   headers={"X-Echo": "get"})

    def do_HEAD(self):
        # A GET's headers, Content-Length included (/nolen: left out), and no body.
        self._keep_seen()
        data = json.dumps({"method": "GET", "path": self.path}, separators=(",", ":")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if not self.path.startswith("/nolen"):
            self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Echo", "head")
        self.end_headers()
        self.wfile.flush()

    def do_POST(self):
        self._business("POST")

    def do_PUT(self):
        self._business("PUT")

    def do_PATCH(self):
        self._business("PATCH")

    def do_DELETE(self):
        self._business("DELETE")

    def _echo(self):
        self._keep_seen()
        self._body()
        self._send(200, {"method": self.command, "path": self.path})

    def do_OPTIONS(self):
        self._echo()

    def do_PURGE(self):
        self._echo()

    def _business(self, method):
        st = self.server.state
        url = urlsplit(self.path)
        body = self._body()
        if url.path == "/_admin/clear":
            with st.lock:
                st.next_actions = []
            return self._send(200, {"cleared": True})
        if url.path == "/_admin/next":
            st_obj = json.loads(body or b"{}")
            with st.lock:
                st.next_actions.append(st_obj)
            return self._send(200, {"queued": st_obj})
        self._keep_seen()
        key = self.headers.get("Idempotency-Key")
        fence_h = self.headers.get("Idempotency-Fence")
        try:
            fence = int(fence_h) if fence_h is not None else None
        except ValueError:
            fence = fence_h
        action = st.pop_action()
        seq = st.record({"method": method, "path": self.path, "key": key, "fence": fence,
                         "body": body.decode("utf-8", "replace")[:256],
                         "action": action and action.get("action"),
                         "peer_port": self.client_address[1]})
        if action:
            a = action.get("action")
            if a == "hang":
                time.sleep(float(action.get("ms", 120000)) / 1000.0)
                self.close_connection = True
                return
            if a == "close":
                self.close_connection = True
                return
            if a == "delay":
                time.sleep(float(action.get("ms", 0)) / 1000.0)
        seg = url.path.rstrip("/").rsplit("/", 1)[-1]
        qs = parse_qs(url.query)
        oid = "ord-%d-%d" % (os.getpid(), seq)
        if seg == "orders":
            try:
                req = json.loads(body)
                amount = req["amount"]
                req["currency"]
            except (ValueError, KeyError, TypeError):
                return self._send(400, {"error": "invalid order"})
            return self._send(201, {"id": oid, "amount": amount}, headers={"X-Order-Id": oid})
        if seg == "slow":
            ms = int(qs.get("ms", ["0"])[0])
            time.sleep(ms / 1000.0)
            return self._send(201, {"id": oid, "slept": ms}, headers={"X-Order-Id": oid})
        if seg == "bad":
            return self._send(400, {"error": "bad request", "id": oid})
        if seg == "boom":
            return self._send(500, {"error": "boom", "id": oid})
        if seg == "big":
            return self._send(201, raw=b"x" * (2 * MiB), headers={"X-Order-Id": oid})
        if seg == "conn":
            return self._send(201, {"id": oid}, headers={"X-Order-Id": oid, "X-Secret": "s3cret",
                                                         "Connection": "keep-alive, X-Secret"})
        if seg == "mib":
            return self._send(201, raw=b"y" * MiB, headers={"X-Order-Id": oid})
        if seg == "huge":  # more than a 16 MiB RPC frame carries
            return self._send(201, raw=b"z" * 20000000, headers={"X-Order-Id": oid})
        if seg == "manyhdrs":  # 65 X-Order-Id lines: more than a stored response may hold
            return self._send(201, {"id": oid}, headers=[("X-Order-Id", "%s-%d" % (oid, i))
                                                         for i in range(65)])
        if seg == "located":  # what points at what the request made
            return self._send(201, {"id": oid}, headers={
                "X-Order-Id": oid, "Location": "/orders/%s" % oid, "ETag": '"%s"' % oid,
                "Content-Location": "/orders/%s" % oid,
                "Link": '</orders/%s>; rel="self"' % oid, "X-Other": oid})
        if seg == "cookie":
            return self._send(201, {"id": oid}, headers={"X-Order-Id": oid,
                                                         "Set-Cookie": "session=%s" % oid})
        return self._send(200, {"method": method, "path": self.path, "id": oid},
                          headers={"X-Order-Id": oid})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # bursts of concurrent requests must not overflow the backlog


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    deadline = time.monotonic() + 20
    while True:
        try:
            srv = Server(("127.0.0.1", args.port), Handler)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    srv.state = State(args.log)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
