"""workload: the chaos suite's clients, all at once, each operation written to the history
(history.py's format) with its invoke and complete times.

Three kinds of worker, each a thread with its own seeded random source:
- proxy: POST /pay through a random node's proxy listener, in front of the ledger. The body
  of a key is fixed (derived from the key); some requests send its members in another order
  (the same JSON: must match), and some, on a key the worker saw a recorded result for, a
  changed body (must be refused 409 and never reach the ledger).
- json: the gateway's JSON API on a random node: claim with an attempt id (the same one again
  after an indeterminate answer), then, as a business service would: execute at the ledger
  with the fencing token and complete with its answer; or release without executing (a
  retryable failure); or abandon the claim (a crashed holder), whose lease then runs out and
  a later claim takes it over (policy takeover) or is refused (conflict); or stall past the
  lease before executing (a slow holder, whose late call the ledger may refuse by its fence).
- lib: the same steps through libidem over the RPC (tests/client/client_driver.c's `serve`
  scenario, one long-lived process per worker), which finds the leader itself.

Keys come from small pools that slide forward (`--keys` live keys per pool, the whole pool
renewed every SLIDE_S seconds; a worker pauses THINK_S between two requests), so several workers hit one key at the same time.
"""
import hashlib
import http.client
import json
import os
import random
import threading
import time

SLIDE_S = 2.0
THINK_S = (0.001, 0.01)  # a worker's pause between two requests or tasks
LEASE_MS = 1500
HTTP_TIMEOUT = 10.0
PROXY_TIMEOUT = 30.0
LIB_DEADLINE_MS = 3000
RETRIES = 6
FINAL_READS = 500  # acknowledged keys read back after the faults (all when fewer)


def stderr_tail(path, max_bytes=4096, max_lines=40):
    """The last lines of a file (a driver's stderr: a sanitizer report ends it), or ""."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError as e:
        return "(unreadable: %s)" % e
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is cut
    return "\n".join(lines[-max_lines:])


def body_of(key, changed=False, reordered=False):
    """The proxy request body of key: its fixed members; changed adds a marker and another
    amount; reordered sends the members in another order with other white space."""
    amount = int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) % 10000
    obj = {"amount": amount + (1 if changed else 0), "currency": "EUR", "ref": key}
    if changed:
        obj["changed"] = True
    if reordered:
        items = list(reversed(sorted(obj.items())))
        return "{ " + ", ".join("%s: %s" % (json.dumps(k), json.dumps(v)) for k, v in items) + " }"
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def fingerprint_of(key, changed=False):
    return hashlib.sha256(("%s:%s" % ("changed" if changed else "orig", key)).encode()).hexdigest()


def _http(addr, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
    """(status, headers lower-cased, body text); raises OSError/HTTPException on failure."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body.encode() if isinstance(body, str) else body,
                     headers=headers or {})
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", errors="replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, text
    finally:
        conn.close()


def _code(text):
    try:
        o = json.loads(text)
    except ValueError:
        return None, None
    if isinstance(o, dict):
        return o.get("code"), o
    return None, o


class Workload:
    def __init__(self, cluster, ledger_addr, history, seed, workers, keys, policy, t_start,
                 kinds=("proxy", "json", "lib")):
        self.c = cluster
        self.ledger_addr = ledger_addr
        self.hist = history
        self.seed = seed
        self.keys = keys
        self.policy = policy
        self.t_start = t_start
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.next_id = 1
        self.acked = {"p": set(), "c": set()}
        self.ack_times = []  # (monotonic time, key) of each key's first acknowledgement seen
        self.threads = []
        self.drivers = []
        self.kinds = [kinds[i % len(kinds)] for i in range(workers)]
        self.counts = {}
        self.crashed = []  # workers that ended on an exception (the run fails)
        # lib drivers that exited while the run still used them, or failed at the end of
        # their input (the run fails): {"driver", "status", "at", "t", "stderr_tail"}
        self.driver_exits = []
        self.closing = False  # finish() is closing the drivers' input: their exits are due

    # ---- shared --------------------------------------------------------------------------

    def _id(self):
        with self.lock:
            i = self.next_id
            self.next_id += 1
            return i

    def _record(self, op):
        op["id"] = self._id()
        with self.lock:
            self.counts[op["client"]] = self.counts.get(op["client"], 0) + 1
        self.hist.write(op)

    def _pick(self, rng, pool):
        base = int((time.monotonic() - self.t_start) * self.keys / SLIDE_S)
        return "%s%d-%d" % (pool, self.seed, base + rng.randrange(self.keys))

    def _voters(self):
        return [i for i in self.c.voters]

    def _ack(self, pool, key):
        with self.lock:
            if key not in self.acked[pool]:
                self.ack_times.append((time.monotonic(), key))
            self.acked[pool].add(key)

    def _is_acked(self, pool, key):
        with self.lock:
            return key in self.acked[pool]

    # ---- lifecycle -------------------------------------------------------------------------

    def start_drivers(self, driver_bin, log_dir):
        """Starts one client_driver per lib worker (call from the main thread); each one's
        stderr (its sanitizer reports) goes to log_dir/lib-driver-N.log."""
        from cluster import spawn
        import subprocess
        seeds = ",".join(self.c.nodes[i].rpc for i in self.c.voters)
        for n, k in enumerate(self.kinds):
            if k == "lib":
                path = os.path.join(log_dir, "lib-driver-%d.log" % n)
                with open(path, "ab") as err:
                    p = spawn([driver_bin, "serve", seeds, self.c.token, self.c.ca],
                              stdout=subprocess.PIPE, stdin=subprocess.PIPE, stderr=err)
                p.worker = "%s-%d" % (k, n)
                p.stderr_path = path
                self.drivers.append(p)

    def _driver_exited(self, driver, at):
        """Notes (once) that driver exited, with its status and its stderr's tail: a
        driver gone mid-run turns every later lib call into an "info" and hides whatever
        it died of, so the run fails on it as on a node that exits on its own."""
        rc = driver.poll()
        with self.lock:
            if rc is None or getattr(driver, "noted", False):
                return
            driver.noted = True
        x = {"driver": getattr(driver, "worker", None), "status": rc, "at": at,
             "t": time.monotonic(),
             "stderr_tail": stderr_tail(getattr(driver, "stderr_path", None))}
        with self.lock:
            self.driver_exits.append(x)

    def _guard(self, name, fn, *args):
        """Runs a worker's loop; an exception ends the worker and is reported (crashed),
        which fails the run: a worker gone quiet would leave its share of the load out."""
        try:
            fn(name, *args)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            import traceback
            with self.lock:
                self.crashed.append("%s: %s\n%s" % (name, e, traceback.format_exc()))

    def start(self):
        drivers = iter(self.drivers)
        for n, kind in enumerate(self.kinds):
            rng = random.Random(self.seed * 1000 + n)
            name = "%s-%d" % (kind, n)
            if kind == "proxy":
                args = (name, self._proxy_loop, rng)
            else:
                args = (name, self._client_loop, rng, kind,
                        next(drivers) if kind == "lib" else None)
            t = threading.Thread(target=self._guard, args=args, daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self, timeout=60):
        """Stops issuing, waits for operations in flight (bounded), ends the drivers."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        for p in self.drivers:
            self._driver_exited(p, "during the run")
        self.closing = True
        for p in self.drivers:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=10)
            except Exception:
                p.kill()
                p.wait(timeout=10)
            if p.returncode != 0:
                self._driver_exited(p, "at the end of its input")
        return alive

    # ---- the final reads -------------------------------------------------------------------

    def final_sample(self, faults, limit=FINAL_READS, before_s=3.0):
        """At most limit acknowledged keys to read back after the faults (all of them when
        fewer): first those acknowledged within before_s before a fault that loses a node's
        state or memory (wipe, power cut, kill, quorum), nearest first, then others drawn
        with the seed."""
        with self.lock:
            acked = sorted(self.ack_times)
        starts = sorted(f["t0"] for f in faults if f.get("kind") in
                        ("wipe", "powercut", "kill", "quorum") and
                        isinstance(f.get("t0"), (int, float)))
        near = []
        for t, key in acked:
            gaps = [f0 - t for f0 in starts if 0 <= f0 - t <= before_s]
            if gaps:
                near.append((min(gaps), key))
        chosen = [k for _, k in sorted(near)][:limit]
        taken = set(chosen)
        rest = [k for _, k in acked if k not in taken]
        random.Random(self.seed).shuffle(rest)
        return chosen + rest[:max(0, limit - len(chosen))]

    def final_reads(self, keys, deadline_s=60.0):
        """Reads each key's record through the JSON API (GET /v1/claims/KEY, which goes
        through the log), on the voters in turn, one at a time, for at most deadline_s
        seconds; each read is an op of the history (f "read") for the checker's lost_ack
        rule. Returns how many got a definite answer."""
        end = time.monotonic() + deadline_s
        done = 0
        voters = self._voters()
        for n, key in enumerate(keys):
            if time.monotonic() >= end:
                break
            node = voters[n % len(voters)]
            op = self._base("final-read", "json", "read", key, node)
            op["t0"] = time.monotonic()
            try:
                st, _, text = _http(self.c.nodes[node].http, "GET", "/v1/claims/" + key,
                                    None, {"Authorization": "Bearer " + self.c.token}, 5)
            except (OSError, http.client.HTTPException) as e:
                op["t1"] = time.monotonic()
                op.update(type="info", error="%s: %s" % (type(e).__name__, e))
                self._record(op)
                continue
            op["t1"] = time.monotonic()
            op["status"] = st
            code, parsed = _code(text)
            if st == 503:
                op.update(type="info", code=code, error="503 %s" % code)
                self._record(op)
                continue
            op["type"] = "ok"
            rec = parsed.get("record") if isinstance(parsed, dict) else None
            if st == 200 and isinstance(rec, dict):
                op["outcome"] = "ok"
                op["state"] = rec.get("state")
                resp = rec.get("response")
                if isinstance(resp, dict):
                    op["stored_status"] = resp.get("status")
                    op["result"] = resp.get("body")
            else:
                op["code"] = code
                op["outcome"] = "not_found" if code == "not_found" else code
            self._record(op)
            done += 1
        return done

    # ---- proxy -----------------------------------------------------------------------------

    def _proxy_loop(self, name, rng):
        while not self.stop.is_set():
            key = self._pick(rng, "p")
            node = rng.choice(self._voters())
            changed = self._is_acked("p", key) and rng.random() < 0.15
            reordered = not changed and rng.random() < 0.3
            body = body_of(key, changed, reordered)
            op = {"client": "proxy", "worker": name, "node": node, "f": "request", "key": key,
                  "changed": changed, "reordered": reordered, "body": body, "attempt": None,
                  "lease_ms": None, "policy": None, "token": None, "takeover": False,
                  "previous_token": None, "outcome": None, "status": None, "code": None,
                  "replayed": False, "recorded": True, "result": None, "error": None}
            op["t0"] = time.monotonic()
            try:
                st, h, text = _http(self.c.nodes[node].proxy, "POST", "/pay", body,
                                    {"Idempotency-Key": key,
                                     "Content-Type": "application/json"}, PROXY_TIMEOUT)
            except (OSError, http.client.HTTPException) as e:
                op["t1"] = time.monotonic()
                op.update(type="info", error="%s: %s" % (type(e).__name__, e))
                self._record(op)
                time.sleep(rng.uniform(0.05, 0.2))
                continue
            op["t1"] = time.monotonic()
            op["status"] = st
            op["replayed"] = h.get("idempotency-replayed", "").lower() == "true"
            op["recorded"] = h.get("idempotency-recorded", "").lower() != "false"
            code, parsed = _code(text)
            if 200 <= st < 300:
                op["result"] = text
                if isinstance(parsed, dict):
                    op["token"] = parsed.get("fence")
                if op["recorded"]:
                    self._ack("p", key)
            else:
                op["code"] = code
            op["type"] = "info" if st == 503 else "ok"
            self._record(op)
            time.sleep(rng.uniform(0.05, 0.2) if st == 503 else rng.uniform(*THINK_S))

    # ---- json / lib ------------------------------------------------------------------------

    def _client_loop(self, name, rng, kind, driver):
        call = self._json_call if kind == "json" else self._lib_call
        while not self.stop.is_set():
            if driver is not None and driver.poll() is not None:
                self._driver_exited(driver, "during the run")
                return  # noted: the run fails; no point sending it more calls
            self._task(name, rng, kind, call, driver)
            time.sleep(rng.uniform(*THINK_S))

    def _base(self, name, kind, f, key, node):
        return {"client": kind, "worker": name, "node": node, "f": f, "key": key,
                "changed": False, "reordered": False, "body": None, "attempt": None,
                "lease_ms": None, "policy": None, "token": None, "takeover": False,
                "previous_token": None, "outcome": None, "status": None, "code": None,
                "replayed": False, "recorded": True, "result": None, "error": None}

    def _task(self, name, rng, kind, call, driver):
        key = self._pick(rng, "c")
        changed = self._is_acked("c", key) and rng.random() < 0.1
        attempt = "%016x" % rng.getrandbits(64)
        op = None
        for _ in range(RETRIES):
            op = self._base(name, kind, "claim", key, None)
            op.update(changed=changed, attempt=attempt, lease_ms=LEASE_MS, policy=self.policy)
            call(rng, driver, op, ("claim", fingerprint_of(key, changed), attempt))
            self._record(op)
            if op["type"] == "ok" or self.stop.is_set():
                break
            time.sleep(rng.uniform(0.05, 0.2))
        if op["type"] != "ok":
            return
        if op["outcome"] == "replay":
            self._ack("c", key)
            return
        if op["outcome"] != "acquired":
            if op["outcome"] in ("in_progress", "lease_expired"):
                time.sleep(rng.uniform(0.05, 0.3))
            return
        token = op["token"]
        r = rng.random()
        if r < 0.08:
            return  # a crashed holder: its lease runs out
        if r < 0.16:
            self._finish(name, rng, kind, call, driver, "release", key, token, None)
            return
        if r < 0.21:
            # A holder that stalls past its lease before it reaches the ledger: meanwhile
            # another claim may take the key over and execute with a higher fence, and the
            # ledger then refuses this one's (a fenced downstream at work).
            time.sleep(LEASE_MS / 1000.0 * rng.uniform(1.1, 1.5))
        # Execute the business operation at the ledger, fenced by the token.
        try:
            st, _, text = _http(self.ledger_addr, "POST", "/exec", body_of(key, changed),
                                {"Idempotency-Key": key, "Idempotency-Fence": str(token),
                                 "Content-Type": "application/json"})
        except (OSError, http.client.HTTPException):
            st, text = None, None
        if st != 201:
            # Refused by the fence (a newer holder wrote first), or not reached: nothing
            # happened on our behalf.
            self._finish(name, rng, kind, call, driver, "release", key, token, None)
            return
        self._finish(name, rng, kind, call, driver, "complete", key, token, text)

    def _finish(self, name, rng, kind, call, driver, f, key, token, result):
        for _ in range(RETRIES):
            op = self._base(name, kind, f, key, None)
            op["token"] = token
            if f == "complete":
                op["result"] = result
                op["stored_status"] = 201  # the status it asks to store (both clients)
            call(rng, driver, op, (f, key, token, result))
            if f == "complete" and op.get("outcome") != "ok":
                op["result"] = None if op["type"] == "ok" else result
            self._record(op)
            if op["type"] == "ok":
                if f == "complete" and op["outcome"] == "ok":
                    self._ack("c", key)
                return
            if self.stop.is_set():
                return
            time.sleep(rng.uniform(0.05, 0.2))

    def _json_call(self, rng, driver, op, args):
        node = rng.choice(self._voters())
        op["node"] = node
        addr = self.c.nodes[node].http
        auth = {"Authorization": "Bearer " + self.c.token, "Content-Type": "application/json"}
        key = op["key"]
        if args[0] == "claim":
            _, fp, attempt = args
            path = "/v1/claims"
            body = {"fingerprint": fp, "attempt_id": attempt, "lease_ms": LEASE_MS,
                    "policy": self.policy}
            auth["Idempotency-Key"] = key
        elif args[0] == "complete":
            _, _, token, result = args
            path = "/v1/claims/%s/complete" % key
            body = {"token": token, "outcome": "succeeded",
                    "response": {"status": 201, "headers": {"content-type": "application/json"},
                                 "body": result}}
        else:
            _, _, token, _ = args
            path = "/v1/claims/%s/release" % key
            body = {"token": token}
        op["t0"] = time.monotonic()
        try:
            st, h, text = _http(addr, "POST", path, json.dumps(body), auth)
        except (OSError, http.client.HTTPException) as e:
            op["t1"] = time.monotonic()
            op.update(type="info", error="%s: %s" % (type(e).__name__, e))
            return
        op["t1"] = time.monotonic()
        op["status"] = st
        code, parsed = _code(text)
        if st == 503:
            op.update(type="info", code=code, error="503 %s" % code)
            return
        op["type"] = "ok"
        if h.get("idempotency-replayed", "").lower() == "true":
            op.update(outcome="replay", replayed=True, result=text)
            return
        if isinstance(parsed, dict) and "outcome" in parsed:
            op["outcome"] = parsed["outcome"]
            if parsed["outcome"] == "acquired":
                op["token"] = parsed.get("token")
                op["takeover"] = bool(parsed.get("takeover"))
                op["previous_token"] = parsed.get("previous_token") if op["takeover"] else None
            return
        op["code"] = code
        op["outcome"] = {"idempotency_request_in_progress": "in_progress",
                         "idempotency_key_reused": "mismatch",
                         "idempotency_lease_expired": "lease_expired",
                         "idempotency_outcome_unknown": "outcome_unknown",
                         "idempotency_key_expired": "expired",
                         "idempotency_lease_lost": "lease_lost",
                         "not_found": "not_found"}.get(code, code)

    def _lib_call(self, rng, driver, op, args):
        if args[0] == "claim":
            _, fp, attempt = args
            line = "claim %s %s %s %d %s %d\n" % (op["key"], fp, attempt, LEASE_MS, self.policy,
                                                   LIB_DEADLINE_MS)
        elif args[0] == "complete":
            _, key, token, result = args
            line = "complete %s %d 201 %s %d\n" % (key, token, result.encode().hex(),
                                                    LIB_DEADLINE_MS)
        else:
            _, key, token, _ = args
            line = "release %s %d %d\n" % (key, token, LIB_DEADLINE_MS)
        op["t0"] = time.monotonic()
        err = "no answer"
        try:
            driver.stdin.write(line.encode())
            driver.stdin.flush()
            out = driver.stdout.readline()
        except (OSError, ValueError) as e:  # ValueError: its stdin closed at the run's end
            out = b""
            err = str(e)
        op["t1"] = time.monotonic()
        try:
            a = json.loads(out) if out else None
        except ValueError:
            a, err = None, "not JSON: %r" % out[:200]
        if not isinstance(a, dict) or "rv" not in a:
            op.update(type="info", error="client_driver: %s" % err)
            if not out and not self.closing:
                try:
                    driver.wait(timeout=2)  # an EOF: it is exiting (or closed its stdout)
                except Exception:  # noqa: BLE001 - still running: noted by finish() if it ends
                    pass
                self._driver_exited(driver, "during the run")
            return
        if a["rv"] != "ok":
            op.update(type="info", error="%s: %s" % (a["rv"], bytes.fromhex(
                a.get("detail_hex", "")).decode(errors="replace")))
            return
        op["type"] = "ok"
        op["outcome"] = a["outcome"]
        if a["outcome"] == "acquired":
            op["token"] = a["token"]
            op["takeover"] = bool(a["takeover"])
            op["previous_token"] = a["previous_token"] if a["takeover"] else None
        elif a["outcome"] == "replay":
            op["replayed"] = True
            op["stored_status"] = a.get("status")
            op["result"] = bytes.fromhex(a["body_hex"]).decode(errors="replace")
