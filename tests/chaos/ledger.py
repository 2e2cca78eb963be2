#!/usr/bin/python3
"""ledger: the chaos suite's upstream business service, a fenced downstream.

    ledger.py --listen ADDR:PORT --log FILE [--seed N] [--max-sleep-ms 300]

Every POST is one execution of the business operation of its Idempotency-Key: the ledger
takes the Idempotency-Fence header (the fencing token idemd gave the holder), refuses it
(409 {"error": "stale_fence"}) when it is below the highest fence it accepted for that key,
as a real fenced downstream would, else accepts it; sleeps a random 0..max-sleep-ms; then
answers 201 with a body that names the execution ({"exec": N, "fence": F, "key": K, ...}), so
that a replay can be traced to the execution that produced it and compared byte for byte.
Each execution is written to FILE (one JSON line, history.py's ledger format, flushed)
before its answer is sent. The proxy's clients and the JSON/libidem workers (which call the
ledger themselves between claim and complete) both use it. GET /ping answers 200.

Prints its port on stdout once listening. Ends when its parent goes away (the runner sets
PR_SET_PDEATHSIG) or on SIGTERM.
"""
import argparse
import http.server
import json
import random
import socketserver
import sys
import threading
import time


class Ledger:
    def __init__(self, log_path, seed, max_sleep_ms):
        self.log = open(log_path, "a", buffering=1)
        self.lock = threading.Lock()
        self.next_exec = 1
        self.highest = {}  # key -> highest accepted fence
        self.rng = random.Random(seed)
        self.max_sleep = max_sleep_ms / 1000.0

    def execute(self, key, fence, body):
        with self.lock:
            # Arrival time, exec id and the fence decision together: the ledger's order.
            t_start = time.monotonic()
            ex = self.next_exec
            self.next_exec += 1
            top = self.highest.get(key)
            accepted = fence is not None and (top is None or fence >= top)
            if accepted:
                self.highest[key] = fence
            sleep = self.rng.random() * self.max_sleep
        try:
            changed = bool(json.loads(body).get("changed"))
        except (ValueError, AttributeError):
            changed = False
        if accepted:
            status = 201
            resp = json.dumps({"exec": ex, "fence": fence, "key": key, "ok": True},
                              sort_keys=True)
        else:
            status = 409
            resp = json.dumps({"error": "stale_fence", "exec": ex, "fence": fence,
                               "highest": top}, sort_keys=True)
        time.sleep(sleep)
        rec = {"exec": ex, "key": key, "fence": fence, "body": body, "changed": changed,
               "t_start": t_start, "t_end": time.monotonic(), "accepted": accepted,
               "status": status, "response": resp}
        line = json.dumps(rec, sort_keys=True)
        with self.lock:
            self.log.write(line + "\n")
        return status, resp


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keys are secrets: nothing is logged per request
        pass

    def _send(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, '{"ok": true}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > 65536:
            self._send(413, '{"error": "too_large"}')
            self.close_connection = True
            return
        body = self.rfile.read(n).decode("utf-8", errors="replace")
        key = self.headers.get("Idempotency-Key") or ""
        fence = self.headers.get("Idempotency-Fence")
        try:
            fence = int(fence) if fence is not None else None
        except ValueError:
            fence = None
        status, resp = self.server.ledger.execute(key, fence, body)
        self._send(status, resp)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # A caller that went away before its answer (a node killed while its proxy waited)
        # is part of a chaos run; its execution is already in the log. Anything else is a
        # bug of the ledger's and is printed.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-sleep-ms", type=int, default=300)
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    srv = Server((host, int(port)), Handler)
    srv.ledger = Ledger(a.log, a.seed, a.max_sleep_ms)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
