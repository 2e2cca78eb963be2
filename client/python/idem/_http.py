"""The transport: one HTTP/1.1 request to idemd's JSON API, tried on the nodes in turn until
an answer comes or the call's deadline passes.

Rules (the HTTP counterpart of libidem's, client/idem.c):
- The client holds the nodes' base URLs in the order given and sends every request to the
  current one (any node serves: a follower forwards to the leader). A connection failure, a
  timeout, or a 502/503/504 that is not a replay moves the current node on to the next one,
  for every thread of the client (only the thread whose node failed moves it).
- Each attempt gets min(time left, max(time left / 3, 0.25 s)) for connect, TLS handshake,
  send and answer, so a node that accepts but never answers costs a third of a call. That
  time bounds the attempt as a whole, not each socket operation: a node that trickles its
  answer (a byte now and then) is cut off when it is over.
- Between attempts: a backoff from 25 ms doubling to 1 s, each sleep shortened by up to a
  quarter at random; after a 503 at least its Retry-After. A wait that would pass the
  deadline ends the call: Unavailable, naming the last failure of each node tried.
- The same request (same body, so the same key and attempt id; same X-Request-Id) is sent
  on every try: every idemd operation is safe to repeat that way (docs/contract.md).
- Connections are kept alive in a pool per node; one that the server closed while idle is
  noticed on its next use, and the request is sent again at once on a fresh connection to
  the same node.
"""
import heapq
import http.client
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse

from .errors import Unavailable

ATTEMPT_MIN = 0.25
BACKOFF_BASE = 0.025
BACKOFF_CAP = 1.0
RETRY_STATUSES = (502, 503, 504)
# An answer's body is read up to this many bytes (idemd's largest is a replay of a stored
# response: far smaller); a larger one is a failure of that node, as the Go client's.
MAX_ANSWER_BYTES = 64 << 20
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class AnswerTooLarge(http.client.HTTPException):
    """A node's answer past MAX_ANSWER_BYTES: not read, the connection closed, and the node
    counted as failed for this try."""


class Node:
    """One node's base URL: scheme, host, port and an optional path prefix."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url.strip())
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("a node URL is http://HOST:PORT or https://HOST:PORT: %r" % url)
        if u.query or u.fragment:
            raise ValueError("a node URL has no query or fragment: %r" % url)
        self.url = "%s://%s" % (u.scheme, u.netloc)
        self.tls = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")

    def __repr__(self):
        return self.url + self.prefix


def parse_nodes(nodes):
    """A list of Node from a list of URLs or one comma-separated string."""
    if isinstance(nodes, str):
        nodes = [n for n in nodes.split(",") if n.strip()]
    out = [Node(n) for n in nodes]
    if not out:
        raise ValueError("no node URL given")
    return out


class Answer:
    """An HTTP answer: status, headers (names lower-cased; repeated ones joined by ", "),
    the body's bytes, and the node that gave it."""

    def __init__(self, status, headers, data, node):
        self.status = status
        self.headers = headers
        self.data = data
        self.node = node


def _headers_of(resp):
    out = {}
    for k, v in resp.getheaders():
        k = k.lower()
        out[k] = out[k] + ", " + v if k in out else v
    return out


def _retry_after(headers):
    try:
        return max(0.0, float(int(headers.get("retry-after", "").strip())))
    except ValueError:
        return 0.0


class Transport:
    def __init__(self, nodes, ssl_context=None, rng=None):
        self.nodes = parse_nodes(nodes)
        self.ssl_context = ssl_context
        if ssl_context is None and any(n.tls for n in self.nodes):
            self.ssl_context = ssl.create_default_context()
        self._lock = threading.Lock()
        self._current = 0
        self._idle = [[] for _ in self.nodes]
        self._rng = rng or random.Random()
        self._closed = False

    # ---- connections ------------------------------------------------------------------

    def _connect(self, node, timeout):
        if node.tls:
            return http.client.HTTPSConnection(node.host, node.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(node.host, node.port, timeout=timeout)

    def _take(self, i):
        with self._lock:
            if self._idle[i]:
                return self._idle[i].pop(), True
        return None, False

    def _give(self, i, conn):
        with self._lock:
            if not self._closed:
                self._idle[i].append(conn)
                return
        conn.close()

    def close(self):
        with self._lock:
            self._closed = True
            conns = [c for lst in self._idle for c in lst]
            self._idle = [[] for _ in self.nodes]
        for c in conns:
            c.close()

    def _exchange(self, conn, method, path, headers, body, timeout):
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # The node may answer (413) and close before it read a large body: read it. But
            # a reset while connecting (a node killed as it accepted) left no socket, and
            # no answer to read: a connection failure like any other.
            if conn.sock is None:
                raise
        resp = conn.getresponse()
        if resp.length is not None:  # its Content-Length, which read() would allocate at once
            if resp.length > MAX_ANSWER_BYTES:
                raise AnswerTooLarge("an answer of %d bytes (at most %d are read)"
                                     % (resp.length, MAX_ANSWER_BYTES))
            return resp, resp.read()
        parts, got = [], 0  # chunked, or until the node closes: read by pieces
        while True:
            piece = resp.read(1 << 16)
            if not piece:
                return resp, b"".join(parts)
            got += len(piece)
            if got > MAX_ANSWER_BYTES:
                raise AnswerTooLarge("an answer larger than %d bytes" % MAX_ANSWER_BYTES)
            parts.append(piece)

    def _once(self, i, method, path, headers, body, timeout):
        node = self.nodes[i]
        cut = _Cutoff(timeout)
        conn, reused = self._take(i)
        try:
            if conn is None:
                conn = self._connect(node, timeout)
            cut.watch(conn)
            try:
                resp, data = self._exchange(conn, method, node.prefix + path, headers, body,
                                            timeout)
            except _STALE:
                if not reused or cut.fired:
                    raise
                # A kept-alive connection the node closed while idle: once more, fresh.
                conn.close()
                conn = self._connect(node, timeout)
                cut.watch(conn)
                resp, data = self._exchange(conn, method, node.prefix + path, headers, body,
                                            timeout)
        except BaseException as e:
            if conn is not None:
                conn.close()
            if cut.cancel():
                raise socket.timeout("no answer within the attempt's %.2f s" % timeout) from e
            raise
        if cut.cancel() or resp.will_close:
            conn.close()
        else:
            self._give(i, conn)
        return Answer(resp.status, _headers_of(resp), data, node)

    # ---- the call ---------------------------------------------------------------------

    def _move_on(self, i):
        with self._lock:
            if self._current == i:
                self._current = (i + 1) % len(self.nodes)

    def _sleep_for(self, backoff):
        with self._lock:
            f = self._rng.uniform(0.75, 1.0)
        return backoff * f

    def call(self, method, path, headers, body, deadline):
        """The answer to one request (deadline: time.monotonic() by which to give up); a
        502/503/504 that is not a replay, a connection failure or a timeout is tried again
        (above). Raises Unavailable when the deadline passes first."""
        backoff = BACKOFF_BASE
        words = {}  # node -> its last failure, in the order first seen
        last = None
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                break
            timeout = min(left, max(left / 3, ATTEMPT_MIN))
            with self._lock:
                i = self._current
            node = self.nodes[i]
            at_least = 0.0
            try:
                ans = self._once(i, method, path, headers, body, timeout)
            except (OSError, http.client.HTTPException) as e:
                # ssl.SSLError and socket.timeout are OSErrors.
                words[node.url] = _describe(e)
                self._move_on(i)
            else:
                if not _retryable(ans):
                    return ans
                last = ans
                words[node.url] = "%d %s" % (ans.status, _brief(ans))
                at_least = _retry_after(ans.headers)
                self._move_on(i)
            wait = max(self._sleep_for(backoff), at_least)
            backoff = min(backoff * 2, BACKOFF_CAP)
            if time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        why = "; ".join("%s: %s" % kv for kv in words.items()) or "the deadline passed"
        raise Unavailable("no answer from a leader before the deadline (%s)" % why,
                          status=last.status if last is not None else None,
                          code="idempotency_unavailable" if last is not None else
                          "connection_failed",
                          request_id=last.headers.get("x-request-id") if last is not None
                          else None)


def _retryable(ans):
    """Whether an answer says nothing about the request: a 503 (idemd's unavailable, or a
    proxy's), or a 502/504 that is not idemd's own error (a load balancer in front); never
    a replay, whatever the stored status."""
    if ans.headers.get("idempotency-replayed", "").lower() == "true":
        return False
    if ans.status == 503:
        return True
    return ans.status in RETRY_STATUSES and _code(ans) is None


def _code(ans):
    try:
        b = json.loads(ans.data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return b.get("code") if isinstance(b, dict) and isinstance(b.get("code"), str) else None


class _Cutoff:
    """One attempt's time as a whole: when it is over, the attempt's socket is shut down, so
    that the read (or TLS handshake) in progress ends, however the node paces its bytes; the
    per-operation socket timeouts alone would let a trickle go on. Timed by the process's
    one watchdog thread (a timer thread per attempt cost about 0.2 ms a call)."""

    def __init__(self, seconds):
        self.fired = False
        self.done = False
        self._conn = None
        self._lock = threading.Lock()
        _WATCHDOG.arm(self, seconds)

    def watch(self, conn):
        with self._lock:
            self._conn = conn
            fired = self.fired
        if fired:
            _shut(conn)

    def fire(self):
        with self._lock:
            if self.done:
                return
            self.fired = True
            conn = self._conn
        if conn is not None:
            _shut(conn)

    def cancel(self):
        """Ends the watch; whether it had fired (the connection is then not reusable)."""
        with self._lock:
            self.done = True
            return self.fired


class _Watchdog:
    """Fires the cutoffs whose time came, on one daemon thread started at the first one.
    Cancelled cutoffs stay in the heap until they reach its top, and are dropped there."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap = []  # (when on time.monotonic(), sequence, cutoff)
        self._seq = 0
        self._thread = None

    def arm(self, cutoff, seconds):
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + seconds, self._seq, cutoff))
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="idem-cutoff",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _main(self):
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                cutoff = heapq.heappop(self._heap)[2]
                self._cond.release()
                try:
                    cutoff.fire()
                finally:
                    self._cond.acquire()


_WATCHDOG = _Watchdog()


def _shut(conn):
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _describe(e):
    if isinstance(e, socket.timeout):
        return "no answer in time"
    if isinstance(e, ssl.SSLError):
        return "TLS: %s" % (e.reason or e)
    if isinstance(e, http.client.HTTPException):
        return "%s %s" % (type(e).__name__, e)
    return "%s" % (e.strerror or type(e).__name__) if isinstance(e, OSError) else str(e)


def _brief(ans):
    """The code and message of an error answer, shortened (they never hold a token)."""
    try:
        b = json.loads(ans.data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(b, dict):
        return ""
    code = b.get("code") if isinstance(b.get("code"), str) else ""
    msg = b.get("message") if isinstance(b.get("message"), str) else ""
    return ("%s: %s" % (code, msg[:120])) if msg else code
