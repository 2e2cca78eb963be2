"""harness: real idemd processes on 127.0.0.1 for the integration and chaos tests.

Every node gets free ports, its own temporary data dir and a generated config. Processes
are tracked by PID and killed (SIGKILL) in close(), which also removes the temp dir; before
that, close() looks at them (check()): a node that exited by itself (the test neither killed,
stopped nor awaited it: kill/stop/wait_exit, nor declared it may: may_exit) or whose log holds
a sanitizer report or a failed assertion is a problem, which fails the test. Every answer a
node's gateway gives through http_exchange() is checked against docs/openapi.yaml
(openapi_check.py); one it does not describe fails the test too. Waits poll a
condition with a generous bound; nothing sleeps for a fixed time to let something happen.
idemctl (--json) is the client, so the tests exercise it too.
"""
import fcntl
import hashlib
import http.client
import json
import os
import random
import re
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

BIN = os.environ.get("IDEM_BIN_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin")
IDEMD = os.path.join(BIN, "idemd")
IDEMCTL = os.path.join(BIN, "idemctl")


_PORTS_GIVEN = set()


_RANDOM = random.SystemRandom()

# Ports handed out are also reserved across the test processes that run at once (ctest -j),
# for the life of the process that took them: a node a test killed leaves its port free,
# and that test's other nodes keep dialling it; another test's node given that port
# refused them ("authentication failed": another cluster's secret) and failed its test
# (integration.idemctl_keys, beside integration.idemctl_membership). One file per port in a
# directory of this user's, locked (flock) by the process that holds the port; the kernel
# drops the lock when that process ends, however it ends. The files stay (never unlinked:
# a file removed while another process waits to lock it would let two hold one port).
_PORT_DIR = os.path.join(tempfile.gettempdir(), "idem-test-ports-%d" % os.getuid())
_PORT_LOCKS = []  # open files whose locks this process holds


def _reserve(port):
    try:
        os.makedirs(_PORT_DIR, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(_PORT_DIR, str(port)), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True  # no reservation possible here: the bind check above is all there is
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # held by another test process
    _PORT_LOCKS.append(fd)
    return True


def free_port():
    """A loopback port nothing listens on, never one this process handed out before: the
    kernel may return a port again once the probing socket is closed, and two nodes of one
    cluster were once given the same Raft port that way."""
    # Drawn at random below the kernel's ephemeral range (32768-60999), not from bind(0):
    # under ctest -j2 the kernel handed a killed node's port to another test's node, and a
    # client following a stale leader hint reached that node (an "unauthenticated" answer
    # in integration.idemctl_status). Client sockets take their ports from the ephemeral
    # range, so they never hold one of these.
    for _ in range(1000):
        port = _RANDOM.randrange(10000, 32768)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if not _reserve(port):
            continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError("no fresh loopback port after 1000 tries")


def fp(n):
    """A fingerprint (64 hex) derived from n."""
    return hashlib.sha256(str(n).encode()).hexdigest()


def recv_exact(sock, n):
    """Reads n bytes from sock; fewer (b"" at once) if the peer closes first."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


# What in a node's log (its stdout and stderr) says it went wrong, whatever its exit: a report
# of ASan, LSan, UBSan (-fno-sanitize-recover: also its "runtime error:" line) or TSan, or a
# failed assert() (glibc's "...: Assertion `x' failed.", libuv's and libraft's included).
# idemd's own stops on purpose (abort() after a disk failure) print none of these: they are
# told by their exit status (-SIGABRT), which the test that caused them awaits (wait_exit).
_BAD_LOG = re.compile(
    rb"ERROR: AddressSanitizer|ERROR: LeakSanitizer|AddressSanitizer:DEADLYSIGNAL"
    rb"|UndefinedBehaviorSanitizer|runtime error:|WARNING: ThreadSanitizer"
    rb"|Assertion `.*' failed|Assertion failed")


def log_reports(path, start=0):
    """[(offset, excerpt)] of each sanitizer report or failed assertion (_BAD_LOG) in the log
    at path from offset start on: the lines around it."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    out = []
    for m in _BAD_LOG.finditer(data):
        a = data.rfind(b"\n", 0, max(0, m.start() - 400)) + 1
        b = data.find(b"\n", m.end() + 2400)
        out.append((start + m.start(),
                    data[a:b if b >= 0 else len(data)].decode(errors="replace")))
    return out


def read_jsonl(path):
    """Every object of a JSONL file (none when it does not exist); a torn line (a writer
    killed mid-line) is skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


def pid_alive(pid):
    """Whether process pid exists and is not a zombie (sweeps of what killed runs left: a
    test's held disk, the chaos suite's namespaces and power-cut disks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:  # a zombie is gone too
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(cond, timeout, what, interval=0.05):
    """Polls cond() until it returns a truthy value; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last: %r)" % (timeout, what, last))


class Resp(tuple):
    """(status, headers with lower-cased names, parsed JSON or the body text); .raw is the
    body text exactly as received."""
    def __new__(cls, status, headers, parsed, raw):
        r = super().__new__(cls, (status, headers, parsed))
        r.raw = raw
        return r

    def __repr__(self):
        body = self.raw if len(self.raw) < 300 else self.raw[:300] + "...(%d bytes)" % len(self.raw)
        return "Resp(%d, %r, %r)" % (self[0], self[1], body)


# /metrics needs the admin token (http.metrics_public is off by default): the admin token of
# each node's HTTP address, filled as clusters write their configs, which http_exchange()
# sends with a GET of /metrics that names no Authorization itself (as a configured scraper
# would). A test of the refusal sends its own header.
ADMIN_BY_HTTP = {}


def metrics_auth(addr):
    """The Authorization header a scraper of addr's /metrics sends ({} if addr is unknown)."""
    admin = ADMIN_BY_HTTP.get(addr)
    return {"Authorization": "Bearer %s" % admin} if admin else {}


# Every answer of a gateway (node.http_address) the harness wrote a config for, or a test
# named with register_gateway(), is checked against docs/openapi.yaml by http_exchange()
# (openapi_check.py): a mismatch raises there, failing the test that got it, and is kept
# for the cluster's check() too (an answer got on another thread, or a test that catches
# AssertionError, fails all the same). Proxy listeners are not registered: they serve any
# path their routes match, not the JSON API.
GATEWAYS = set()
_OPENAPI = []  # [the checker], made at the first answer to check
_OPENAPI_MISMATCHES = []  # [(gateway address, text)] not yet reported by a check()


def register_gateway(addr):
    """Marks addr ("host:port", as http_request takes it) as a gateway whose answers are
    checked against docs/openapi.yaml."""
    GATEWAYS.add(addr)


def openapi_checker():
    """The process's openapi_check.Checker (its compiled validators cached). Without
    jsonschema or PyYAML this fails, saying how to install them: never skipped."""
    if not _OPENAPI:
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:  # harness imported from another folder (the chaos suite)
            sys.path.insert(0, here)
        try:
            import openapi_check
        except ImportError as e:
            raise AssertionError("the gateway's answers are checked against docs/openapi.yaml, "
                                 "which needs python3-jsonschema and python3-yaml: "
                                 "apt-get install python3-jsonschema python3-yaml (or "
                                 "tools/setup.sh --test): %s" % e)
        _OPENAPI.append(openapi_check.Checker())
    return _OPENAPI[0]


def _check_openapi(addr, method, path, resp):
    import openapi_check
    try:
        openapi_checker().check(method, path, resp[0], resp[1], resp.raw)
    except openapi_check.SpecMismatch as e:
        text = "the gateway %s answered what docs/openapi.yaml does not say: %s" % (addr, e)
        _OPENAPI_MISMATCHES.append((addr, text))
        raise openapi_check.SpecMismatch(text) from None


def openapi_mismatches(addrs):
    """The mismatches of gateways addrs not reported yet (removed from the list)."""
    out = [t for a, t in _OPENAPI_MISMATCHES if a in addrs]
    _OPENAPI_MISMATCHES[:] = [(a, t) for a, t in _OPENAPI_MISMATCHES if a not in addrs]
    return out


def http_exchange(conn, method, path, body=None, headers=None, raw=None):
    """One request on an open http.client connection. body: a JSON-able object (sent as
    application/json) or None; raw: bytes sent as they are (overrides body). The answer of
    a registered gateway (GATEWAYS) is checked against docs/openapi.yaml."""
    hdrs = {}
    host = "[%s]" % conn.host if ":" in conn.host else conn.host  # an IPv6 address
    addr = "%s:%d" % (host, conn.port)
    if method == "GET" and path == "/metrics" and "Authorization" not in (headers or {}):
        hdrs.update(metrics_auth(addr))
    data = None
    if raw is not None:
        data = raw
        hdrs["Content-Type"] = "application/json"
    elif body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    if headers:
        hdrs.update(headers)
    try:
        conn.request(method, path, body=data, headers=hdrs)
    except (BrokenPipeError, ConnectionResetError):
        # The server may answer (413) and close before reading a large body: read the answer.
        pass
    resp = conn.getresponse()
    payload = resp.read()
    rh = {k.lower(): v for k, v in resp.getheaders()}
    text = payload.decode("utf-8", errors="replace")
    parsed = text
    if text.strip():
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
    out = Resp(resp.status, rh, parsed, text)
    if addr in GATEWAYS:
        _check_openapi(addr, method, path, out)
    return out


# The prefix of an error's problem type (server/http_conv.h; docs/http-api.md, Errors).
PROBLEM_TYPE_BASE = "urn:idemd:problem:"


def assert_problem(tc, resp, status, code):
    """For unittest case tc: resp is an error answer with the RFC 9457 problem details of
    docs/http-api.md (Errors) as application/problem+json."""
    st, h, b = resp
    tc.assertEqual(h.get("content-type"), "application/problem+json", resp)
    tc.assertEqual(b.get("type"), PROBLEM_TYPE_BASE + code, resp)
    tc.assertIsInstance(b.get("title"), str, resp)
    tc.assertTrue(b["title"], resp)
    tc.assertEqual(b.get("status"), status, resp)
    tc.assertIsInstance(b.get("detail"), str, resp)
    tc.assertEqual(b.get("detail"), b.get("message"), resp)
    if b.get("request_id"):
        tc.assertEqual(b.get("instance"), "urn:idemd:request:" + b["request_id"], resp)


def http_request(addr, method, path, body=None, headers=None, timeout=10, raw=None):
    """http_exchange() on a fresh connection to addr ("host:port"), closed afterwards."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        return http_exchange(conn, method, path, body, headers, raw)
    finally:
        conn.close()


def request_past_503(addr, method, path, body=None, token=None, headers=None, timeout=20.0):
    """One request, tried again for up to 30 s while it answers 503 (a leader change on a
    loaded machine); token: a bearer token for the Authorization header."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer %s" % token

    def answer():
        r = http_request(addr, method, path, body, h, timeout=timeout)
        return r if r[0] != 503 else None
    return wait_for(answer, 30, "%s %s to answer other than 503" % (method, path),
                    interval=0.2)


class Node:
    def __init__(self, nid, root, host="127.0.0.1", listen=None):
        """host: the host of its advertised addresses (an IPv4 address, a name, "[::1]");
        listen: {"raft_listen": "0.0.0.0:{raft}", ...}, its node.*_listen keys, each formatted
        with the ports of its addresses (raft, rpc, http)."""
        self.id = nid
        self.raft = "%s:%d" % (host, free_port())
        self.rpc = "%s:%d" % (host, free_port())
        self.http = "%s:%d" % (host, free_port())
        ports = {k: getattr(self, k).rsplit(":", 1)[1] for k in ("raft", "rpc", "http")}
        self.listen = {k: v.format(**ports) for k, v in (listen or {}).items()}
        self.dir = os.path.join(root, "node%d" % nid)
        self.cfg = os.path.join(root, "node%d.yaml" % nid)
        self.log = os.path.join(root, "node%d.log" % nid)
        self.proc = None
        self.copier = None  # the thread that copies its output to log (Cluster.start: pipe)


class Cluster:
    def __init__(self, n=3, snapshot_threshold=8192, snapshot_trailing=2048,
                 election_ms=600, heartbeat_ms=100, extra_tenant=False, expiry_ms=1000,
                 snapshot_log_percent=None, segment_size_mb=8, snapshot_nice=None,
                 raft_secret=True, node_raft_secrets=None, node_raft_previous=None,
                 data_dirs=None, snapshot_log_max_mb=None, snapshot_trailing_max_mb=None,
                 alpha_quota=None, hosts=None, listen=None, beta_settings=None, batch=None):
        self.root = tempfile.mkdtemp(prefix="idem-it-")
        # Raft connections are authenticated (raft.secret_file) unless raft_secret is None;
        # node_raft_secrets: per-node secrets (None: that node has none).
        self.raft_secret = secrets.token_hex(24) if raft_secret is True else raft_secret
        self.node_raft_secrets = node_raft_secrets or {}
        # Per-node raft.previous_secret_file (a secret being moved away from).
        self.node_raft_previous = node_raft_previous or {}
        self.token = secrets.token_hex(16)
        self.token2 = secrets.token_hex(16)
        self.admin = secrets.token_hex(16)
        self.opts = dict(snapshot_threshold=snapshot_threshold,
                         snapshot_trailing=snapshot_trailing, election_ms=election_ms,
                         heartbeat_ms=heartbeat_ms, expiry_ms=expiry_ms,
                         snapshot_log_percent=snapshot_log_percent,
                         segment_size_mb=segment_size_mb, snapshot_nice=snapshot_nice,
                         snapshot_log_max_mb=snapshot_log_max_mb,
                         snapshot_trailing_max_mb=snapshot_trailing_max_mb)
        # alpha_quota: {"max_records": N, "max_bytes": N} for tenant alpha (else the defaults).
        self.alpha_quota = alpha_quota or {}
        # batch: {"delay_us": N, ...}: keys of the batch section (else the defaults).
        self.batch = batch or {}
        # beta_settings: {"mismatch_status": 422, ...}: more keys of tenant beta's.
        self.beta_settings = beta_settings or {}
        self.nodes = {}
        self.bootstrap = []
        # Nodes that may exit by themselves (a test that makes one do so and does not await it
        # with wait_exit() declares it: may_exit.add(nid)); any other one that does is a
        # problem (check()), as is any sanitizer report or failed assertion in any log.
        self.may_exit = set()
        self._exited = []  # (id, text): nodes found dead when killed, stopped or restarted
        self._reported = set()  # what check() already returned, not returned again
        # hosts: {id: host} of nodes not addressed by 127.0.0.1 (a name, "[::1]"); listen:
        # {id: node.*_listen keys} (Node).
        for i in range(1, n + 1):
            self.nodes[i] = Node(i, self.root, (hosts or {}).get(i, "127.0.0.1"),
                                 (listen or {}).get(i))
            self.bootstrap.append(self.nodes[i])
        # data_dirs: {id: path} for nodes whose data lives elsewhere (a test's own file
        # system); the test creates and removes those, close() leaves them.
        for i, d in (data_dirs or {}).items():
            self.nodes[i].dir = d
        try:
            for node in self.nodes.values():
                self._write_config(node, self.bootstrap)
            for node in self.nodes.values():
                self.start(node.id)
        except BaseException:
            # No caller holds this cluster yet to close() it (idemd missing or not executable,
            # a config that cannot be written): kill what started and remove the temp dir.
            self.close()
            raise

    # ---- processes ------------------------------------------------------------------------

    def _write_config(self, node, bootstrap):
        ADMIN_BY_HTTP[node.http] = self.admin
        register_gateway(node.http)
        h = lambda t: hashlib.sha256(t.encode()).hexdigest()
        # Addresses quoted: "[::1]:7001" unquoted would be a YAML list.
        lines = [
            "node:",
            "  id: %d" % node.id,
            "  raft_address: '%s'" % node.raft,
            "  rpc_address: '%s'" % node.rpc,
            "  http_address: '%s'" % node.http,
            "  data_dir: %s" % node.dir,
        ] + ["  %s: '%s'" % kv for kv in sorted(node.listen.items())] + [
            "cluster:",
            "  bootstrap:",
        ]
        for b in bootstrap:
            lines.append("    - {id: %d, raft_address: '%s', rpc_address: '%s', http_address: '%s'}"
                         % (b.id, b.raft, b.rpc, b.http))
        if not bootstrap:
            lines[-1] = "  bootstrap: []"
        o = self.opts
        lines += [
            "raft:",
            "  snapshot_threshold: %d" % o["snapshot_threshold"],
            "  snapshot_trailing: %d" % o["snapshot_trailing"],
        ]
        # None: the server's default. Tests keep raft_uv's small segments (8 MiB, three
        # preallocated per node) unless they ask: CI machines can be short of disk.
        if o["election_ms"] is not None:
            lines.append("  election_timeout_ms: %d" % o["election_ms"])
        if o["heartbeat_ms"] is not None:
            lines.append("  heartbeat_timeout_ms: %d" % o["heartbeat_ms"])
        for opt in ("snapshot_log_percent", "segment_size_mb", "snapshot_nice",
                    "snapshot_log_max_mb", "snapshot_trailing_max_mb"):
            if o[opt] is not None:
                lines.append("  %s: %d" % (opt, o[opt]))
        raft_secrets = (
            ("secret_file", "raft-secret", self.node_raft_secrets.get(node.id, self.raft_secret)),
            ("previous_secret_file", "raft-previous-secret", self.node_raft_previous.get(node.id)),
        )
        for field, name, sec in raft_secrets:
            if sec is not None:
                lines.append("  %s: %s" % (field, self.secret_file(node, name, sec)))
        if self.batch:
            lines += ["batch:"] + ["  %s: %d" % kv for kv in sorted(self.batch.items())]
        lines += [
            "expiry:",
            "  interval_ms: %d" % o["expiry_ms"],
            "admin:",
            "  token_sha256: %s" % h(self.admin),
            "tenants:",
            "  - name: alpha",
            "    token_sha256: %s" % h(self.token),
        ] + ["    %s: %d" % kv for kv in sorted(self.alpha_quota.items())] + [
            "  - name: beta",
            "    token_sha256: %s" % h(self.token2),
        ] + ["    %s: %s" % kv for kv in sorted(self.beta_settings.items())]
        with open(node.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")

    def secret_file(self, node, name, value):
        """Writes value (and a newline, as `echo` would) to a mode-600 file of node's in the
        cluster's directory; returns its path."""
        path = os.path.join(self.root, "node%d.%s" % (node.id, name))
        with open(path, "w") as f:
            f.write(value + "\n")
        os.chmod(path, 0o600)
        return path

    def add_node(self, nid):
        """A new node with an empty bootstrap list: it waits to be added as a member."""
        node = Node(nid, self.root)
        self.nodes[nid] = node
        self._write_config(node, [])
        self.start(nid)
        return node

    def start(self, nid, fsize=None, pipe=False):
        """Starts node nid; with fsize, its writes past that many bytes into a file fail
        (RLIMIT_FSIZE; idemd ignores SIGXFSZ, so they fail with EFBIG) and it dumps no core.
        With pipe (or fsize), its output reaches its log through a pipe, which no limit on
        its file sizes (set now or later) keeps it from writing."""
        node = self.nodes[nid]
        self._reap(node, "before the test restarted it")
        log = open(node.log, "ab")
        pipe = pipe or fsize is not None
        node.proc = subprocess.Popen([IDEMD, "--config", node.cfg],
                                     stdout=subprocess.PIPE if pipe else log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if fsize is not None:
            # Set from here (not with preexec_fn, unsafe while the log-copying threads run),
            # within the node's first milliseconds: before it has anything to snapshot.
            inf = resource.RLIM_INFINITY
            resource.prlimit(node.proc.pid, resource.RLIMIT_CORE, (0, inf))
            resource.prlimit(node.proc.pid, resource.RLIMIT_FSIZE, (fsize, inf))
        if pipe:
            def copy(src, dst):
                with src, dst:
                    for chunk in iter(lambda: src.read1(65536), b""):
                        dst.write(chunk)
                        dst.flush()
            node.copier = threading.Thread(target=copy, args=(node.proc.stdout, log), daemon=True)
            node.copier.start()
        else:
            log.close()

    def wait_exit(self, nid, timeout=30):
        """Waits until node nid's process has exited by itself (its log all written);
        returns its exit status (negative: the signal), which the test asserts: an exit it
        awaits is not a problem (check())."""
        node = self.nodes[nid]
        wait_for(lambda: node.proc.poll() is not None, timeout, "node %d to stop" % nid)
        if node.copier is not None:
            node.copier.join(timeout=10)
            node.copier = None
        rc, node.proc = node.proc.returncode, None
        return rc

    def _reap(self, node, when):
        """If node's process has exited by itself (found when: "before the test killed it",
        ...), it is reaped (node.proc = None) and, unless the test said it may (may_exit),
        that is a problem (check()). Returns its exit status, None if it is running."""
        if node.proc is None or node.proc.poll() is None:
            return None
        rc = node.proc.returncode
        if node.id not in self.may_exit:
            self._exited.append((node.id, "node %d exited by itself (status %d) %s"
                                 % (node.id, rc, when)))
        if node.copier is not None:
            node.copier.join(timeout=10)
            node.copier = None
        node.proc = None
        return rc

    def kill(self, nid, sig=9):
        node = self.nodes[nid]
        if node.proc is not None and self._reap(node, "before the test killed it") is None:
            node.proc.send_signal(sig)
            node.proc.wait(timeout=30)
            node.proc = None

    def stop(self, nid):
        """SIGTERM and wait: a clean shutdown must finish, with exit code 0."""
        node = self.nodes[nid]
        rc = self._reap(node, "before the test stopped it")
        if rc is not None:
            if nid in self.may_exit:
                return rc
            raise AssertionError(self._exited[-1][1])
        node.proc.terminate()
        rc = node.proc.wait(timeout=30)
        node.proc = None
        return rc

    def wipe(self, nid):
        shutil.rmtree(self.nodes[nid].dir, ignore_errors=True)

    def alive(self):
        return [n for n in self.nodes.values() if n.proc is not None]

    def _exit_problems(self):
        """Nodes that exited by themselves unexpectedly, each one with its log's tail; they are
        reaped (a node restarted later is a new process)."""
        for node in self.nodes.values():
            self._reap(node, "during the test")
        out, self._exited = self._exited, []
        return ["%s; its log ends:\n%s" % (text, self._log_tail(nid)) for nid, text in out]

    def _log_tail(self, nid, n=3000):
        try:
            with open(self.nodes[nid].log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def check(self):
        """What went wrong with the nodes since the last check(), as a list of texts (empty:
        nothing): a node that exited by itself (see may_exit, _reap), a sanitizer report or
        failed assertion in a node's log (_BAD_LOG), an answer of a node's gateway that
        docs/openapi.yaml does not describe (http_exchange). A test with a cluster of its own fails
        with what close() returns; one that shares a cluster calls this after each test."""
        out = self._exit_problems()
        out += openapi_mismatches({n.http for n in self.nodes.values()})
        for node in self.nodes.values():
            for off, text in log_reports(node.log):
                if (node.log, off) not in self._reported:
                    self._reported.add((node.log, off))
                    out.append("node %d's log reports:\n%s" % (node.id, text))
        return out

    def close(self):
        """Kills (SIGKILL) every node still running and removes the temp dir. Returns check()'s
        problems, looked for first (who had exited before the kill) and after the kill (the
        logs written to the end): the caller fails its test with them."""
        problems = self._exit_problems()
        for node in self.nodes.values():
            if node.proc is not None:
                node.proc.kill()
                node.proc.wait(timeout=30)
                node.proc = None
            if node.copier is not None:
                node.copier.join(timeout=10)
                node.copier = None
        problems += self.check()
        shutil.rmtree(self.root, ignore_errors=True)
        return problems

    def logs(self):
        out = []
        for node in self.nodes.values():
            try:
                with open(node.log, "rb") as f:
                    out.append("--- node %d ---\n%s" % (node.id, f.read()[-4000:].decode(errors="replace")))
            except OSError:
                pass
        return "\n".join(out)

    def logs_contain(self, text):
        """Whether any node's whole log (not only its tail, as logs() shows) has text."""
        for node in self.nodes.values():
            try:
                with open(node.log, "rb") as f:
                    if text.encode() in f.read():
                        return True
            except OSError:
                pass
        return False

    # ---- client ---------------------------------------------------------------------------

    def addrs(self, ids=None):
        ids = ids if ids is not None else [n.id for n in self.alive()]
        return ",".join(self.nodes[i].rpc for i in ids)

    def ctl(self, *args, ids=None, token=None, deadline=None, timeout=60):
        """Runs idemctl --json; returns (exit code, parsed JSON or None)."""
        cmd = [IDEMCTL, "--cluster", self.addrs(ids), "--token", token or self.token,
               "--admin-token", self.admin, "--json"]
        if deadline is not None:
            cmd += ["--deadline", str(deadline)]
        cmd += [str(a) for a in args]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        out = None
        if p.stdout.strip():
            try:
                out = json.loads(p.stdout)
            except ValueError:
                raise AssertionError("idemctl printed non-JSON: %r (stderr %r)" % (p.stdout, p.stderr))
        return p.returncode, out

    def status(self, ids=None):
        rc, out = self.ctl("status", ids=ids)
        return out if rc == 0 else None

    def leader(self, ids=None):
        st = self.status(ids)
        return st and st.get("leader_id")

    def wait_converged(self, n, timeout=30):
        """Waits until n nodes answer with the same applied index and the same state digest
        (the replicas hold identical tables); returns that status."""
        def cond():
            rc, st = self.ctl("status", "--digest")
            if rc != 0 or not st:
                return None
            nodes = [x for x in st["nodes"] if x.get("digest")]
            if len(nodes) != n:
                return None
            if len({x["applied_index"] for x in nodes}) != 1:
                return None
            return st if len({x["digest"] for x in nodes}) == 1 else None
        return wait_for(cond, timeout, "%d replicas with equal applied index and digest" % n)

    def wait_leader(self, timeout=15, ids=None, exclude=None):
        def cond():
            lid = self.leader(ids)
            if lid and lid != exclude:
                return lid
            return None
        return wait_for(cond, timeout, "a leader")


class ClusterTestCase(unittest.TestCase):
    """A test with a cluster of its own (self.c): made by make_cluster() (by default
    Cluster(**cluster_opts)), ready when cluster_ready() returns (by default: a leader within
    leader_timeout seconds); its logs are printed when the test failed, and it is closed
    (every process killed by PID, its temp dir removed) after the test."""
    cluster_opts = {}
    leader_timeout = 20

    def make_cluster(self):
        return Cluster(**self.cluster_opts)

    def cluster_ready(self):
        self.c.wait_leader(timeout=self.leader_timeout)

    def setUp(self):
        # free_port() picks a port that nothing holds, then the node binds it: under tests
        # run in parallel another process can take it in between, and that node exits at
        # start ("... Address already in use"). Such a cluster is made again, with new
        # ports, once; any other failure to come up fails the test.
        for attempt in (1, 2):
            self.c = self.make_cluster()
            try:
                self.cluster_ready()
            except AssertionError:
                logs = self.c.logs()
                self.c.close()
                if attempt == 1 and "Address already in use" in logs:
                    continue
                print(logs)
                raise
            except BaseException:
                # Anything else (idemctl missing, an interrupt): no process may outlive it.
                self.c.close()
                raise
            dead = [n for n in self.c.nodes.values()
                    if n.proc is not None and n.proc.poll() is not None]
            if attempt == 1 and dead and "Address already in use" in self.c.logs():
                self.c.close()
                continue
            return

    # Tests that send malformed Raft messages on purpose (test_raft_port) set this.
    malformed_raft_expected = False
    # And those that make Raft authentication fail on purpose (a wrong raft.secret_file).
    raft_auth_failure_expected = False

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.c.logs())
        refused = self.c.logs_contain("refused a malformed raft message")
        # A wrong MAC is never a race: between members with one secret it would be a bug.
        auth_failed = (self.c.logs_contain(": authentication failed (")
                       or self.c.logs_contain("the peer's authentication is wrong"))
        if ((refused and not self.malformed_raft_expected)
                or (auth_failed and not self.raft_auth_failure_expected)):
            print(self.c.logs())  # which node refused whom, for the assertion below
        problems = self.c.close()
        # A node that died during the test (by itself: not killed, stopped or awaited by it)
        # or whose log has a sanitizer report or a failed assertion fails the test.
        self.assertFalse(problems, "\n\n".join(problems))
        # Between the nodes themselves every Raft message is well formed: a refusal by the
        # check in front of libraft's decoder (cluster/raft015/wire_check.h) would be its bug.
        if not self.malformed_raft_expected:
            self.assertFalse(refused, "a node refused a Raft message from its peers")
        if not self.raft_auth_failure_expected:
            self.assertFalse(auth_failed, "Raft authentication failed between the members")
