#!/usr/bin/env python3
"""wsgi_orders: a small order service (a plain WSGI app) behind idem.wsgi's middleware.

    python3 examples/python/wsgi_orders.py --idem http://127.0.0.1:8001 --token "$IDEM_TOKEN"
    curl -si -X POST 127.0.0.1:8080/orders -H 'Idempotency-Key: o-1' \\
         -H 'content-type: application/json' -d '{"amount": 10, "currency": "EUR"}'   # 201
    # the same again (any JSON spacing or key order): the same 201, Idempotency-Replayed: true
    # another body with the key o-1: 409 idempotency_key_reused; idemd down: 503

POST /orders makes an order (400 for a bad one: released, so a corrected retry with the same
key runs) and GET /orders/ID reads one; POST requests under /orders that carry an
Idempotency-Key go through idemd, the rest pass straight to the app. The app sees the
fencing token in the Idempotency-Fence header. Served by wsgiref on 127.0.0.1 (a threading
server, for the example; use a production WSGI server for real). Python 3.11+, standard
library only: the package `idem` is found in client/python when it is not installed.
"""
import argparse
import itertools
import json
import os
import socketserver
import sys
import threading
import wsgiref.simple_server

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "..", "client", "python"))
import idem  # noqa: E402
import idem.wsgi  # noqa: E402


class Orders:
    """The business: an in-memory order book."""

    def __init__(self):
        self.orders = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method == "POST" and path == "/orders":
            return self.create(environ, start_response)
        if method == "GET" and path.startswith("/orders/"):
            order = self.orders.get(path[len("/orders/"):])
            if order is not None:
                return answer(start_response, "200 OK", order)
        return answer(start_response, "404 Not Found", {"error": "no such order"})

    def create(self, environ, start_response):
        try:
            body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH")
                                                             or 0)) or b"{}")
            amount, currency = body["amount"], body["currency"]
            if not isinstance(amount, int) or amount <= 0 or not isinstance(currency, str):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return answer(start_response, "400 Bad Request",
                          {"error": "an order is {\"amount\": >0, \"currency\": \"...\"}"})
        with self.lock:
            oid = str(next(self.ids))
            order = {"id": oid, "amount": amount, "currency": currency,
                     "fence": environ.get("HTTP_IDEMPOTENCY_FENCE")}
            self.orders[oid] = order
        print("wsgi_orders: order %s created (%d %s)" % (oid, amount, currency),
              file=sys.stderr)
        return answer(start_response, "201 Created", order,
                      [("Location", "/orders/" + oid)])


def answer(start_response, status, obj, extra=()):
    data = json.dumps(obj).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))] + list(extra))
    return [data]


class Server(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    daemon_threads = True


class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *a):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--idem", default=os.environ.get("IDEM_HTTP"),
                   help="the nodes' gateway URLs, comma-separated (default: $IDEM_HTTP, else "
                        "the quickstart cluster's 127.0.0.1:8001-8003, https:// when "
                        "$IDEM_TLS_CA is set)")
    p.add_argument("--token", default=os.environ.get("IDEM_TOKEN"),
                   help="the tenant's bearer token (default: $IDEM_TOKEN)")
    p.add_argument("--cafile", default=os.environ.get("IDEM_TLS_CA"), help="CA for https://")
    p.add_argument("--certfile", default=os.environ.get("IDEM_TLS_CERT"),
                   help="client certificate for https:// (default: $IDEM_TLS_CERT)")
    p.add_argument("--keyfile", default=os.environ.get("IDEM_TLS_KEY"),
                   help="its key (default: $IDEM_TLS_KEY)")
    p.add_argument("--port", type=int, default=8080, help="0: any free port")
    a = p.parse_args()
    if not a.token:
        p.error("no token: --token or IDEM_TOKEN")
    if bool(a.certfile) != bool(a.keyfile):
        p.error("a client certificate needs its key: --certfile and --keyfile together")
    if not a.idem:
        scheme = "https" if a.cafile else "http"
        a.idem = ",".join("%s://127.0.0.1:%d" % (scheme, 8000 + i) for i in (1, 2, 3))
    client = idem.Client(a.idem, a.token, cafile=a.cafile, certfile=a.certfile or None,
                         keyfile=a.keyfile or None)
    app = idem.wsgi.IdempotencyMiddleware(
        Orders(), client, [("POST", "/orders")],
        response_headers=("content-type", "location"))
    srv = wsgiref.simple_server.make_server("127.0.0.1", a.port, app, server_class=Server,
                                            handler_class=QuietHandler)
    print("wsgi_orders: serving on http://127.0.0.1:%d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        client.close()


if __name__ == "__main__":
    main()
