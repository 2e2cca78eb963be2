"""Self-test of checker.py: small synthetic runs built in code.

Two clean runs must pass without a single violation:
  - proxy_run(): proxy traffic with first answers, replays (one with its JSON members
    reordered), a changed body refused 409 key reused / 503 / 410, answers passed on
    unrecorded after a lost lease with other bodies than the recorded one, a timeout
    followed by a replay, 503s inside a cluster-wide and a per-node no-quorum window,
    a 400 inside a window (decided before the log), an answer from a node outside a
    per-node window;
  - claim_run(): json and lib claims: a lease taken over after it ran out (with a lost
    claim answer retried under the same attempt id, which gets its token back), the stale
    holder's late ledger call refused for its fence after the answer was out, its complete
    answered lease_lost, replays, a changed fingerprint answered mismatch, a release
    followed by a new grant, in_progress and lease_expired under the conflict policy, lib
    and json claims failing with 503 in no-quorum windows and a lib grant while only one
    node was cut off.

Then one fault per invariant (and per sub-rule) is planted into a copy of a clean run,
and the test asserts that exactly the expected invariant is flagged, after asserting the
clean run it was planted into passes.

Run: cd tests/chaos && python3 -m unittest -v test_checker
"""
import copy
import io
import json
import os
import random
import tempfile
import unittest
from contextlib import redirect_stdout

import checker

GOOD_FINAL = {"recovered": True, "recovery_s": 1.2, "converged": True,
              "applied_index": 420, "digest": "ab12cd34", "unexpected_exits": [],
              "log_problems": []}


class Run:
    """Builds a synthetic run: ops, ledger executions, nemesis records and final."""

    def __init__(self):
        self.ops, self.ledger, self.nemesis = [], [], []
        self.final = copy.deepcopy(GOOD_FINAL)
        self.ref = {}  # name -> op or execution, for planting faults

    # ledger

    def exec(self, key, t, fence, accepted=True, changed=False, name=None):
        n = len(self.ledger) + 1
        if accepted:
            doc = {"exec": n, "fence": fence, "key": key, "status": "accepted"}
        else:
            doc = {"code": "stale_fence", "exec": n, "fence": fence, "key": key}
        e = {"exec": n, "key": key, "fence": fence, "body": '{"amount":%d}' % n,
             "changed": changed, "t_start": t, "t_end": t + 0.002, "accepted": accepted,
             "status": 201 if accepted else 409,
             "response": json.dumps(doc, sort_keys=True, separators=(",", ":"))}
        self.ledger.append(e)
        if name:
            self.ref[name] = e
        return e["response"]

    # client operations

    def op(self, client, f, key, t0, t1, name=None, **kw):
        o = {"id": len(self.ops) + 1, "client": client, "worker": "%s-1" % client,
             "node": None if client == "lib" else 1, "f": f, "key": key, "t0": t0,
             "t1": t1, "type": "ok", "status": None, "code": None, "outcome": None,
             "changed": False, "reordered": False, "body": None, "attempt": None,
             "lease_ms": None, "policy": None, "token": None, "takeover": False,
             "previous_token": None, "replayed": False, "recorded": True, "result": None,
             "error": None}
        o.update(kw)
        if o["type"] == "info" and o["error"] is None:
            o["error"] = "timeout" if o["status"] is None else "503"
        self.ops.append(o)
        if name:
            self.ref[name] = o
        return o

    def proxy(self, key, t0, t1, status=201, result=None, **kw):
        kw.setdefault("type", "info" if status in (None, 503) else "ok")
        kw.setdefault("body", '{"amount":1,"to":"x"}')
        if status is not None and status >= 400 and status != 503:
            kw.setdefault("code", {409: "idempotency_key_reused",
                                   410: "idempotency_key_expired",
                                   400: "idempotency_key_invalid"}.get(status))
        elif status == 503:
            kw.setdefault("code", "idempotency_unavailable")
        return self.op("proxy", "request", key, t0, t1, status=status, result=result, **kw)

    def claim(self, key, t0, t1, outcome, attempt, client="json", lease_ms=500,
              policy="takeover", **kw):
        if client == "json":
            kw.setdefault("status", {None: 503, "acquired": 200, "replay": 201,
                                     "mismatch": 409, "in_progress": 409,
                                     "lease_expired": 409}.get(outcome, 200))
        kw.setdefault("type", "info" if outcome is None else "ok")
        kw.setdefault("replayed", outcome == "replay")
        return self.op(client, "claim", key, t0, t1, outcome=outcome, attempt=attempt,
                       lease_ms=lease_ms, policy=policy, **kw)

    def complete(self, key, t0, t1, token, outcome="ok", result=None, client="json", **kw):
        if client == "json":
            kw.setdefault("status", 200)
        return self.op(client, "complete", key, t0, t1, outcome=outcome, token=token,
                       result=result, **kw)

    def release(self, key, t0, t1, token, outcome="ok", client="json", **kw):
        if client == "json":
            kw.setdefault("status", 200)
        return self.op(client, "release", key, t0, t1, outcome=outcome, token=token, **kw)

    def read(self, key, t0, t1, status=200, state="completed", result=None,
             stored_status=201, **kw):
        """A final read of key's record (GET /v1/claims/KEY)."""
        if status == 200:
            kw.update(outcome="ok", state=state, stored_status=stored_status)
        else:
            kw.update(outcome="not_found" if status == 404 else None,
                      code="not_found" if status == 404 else None)
        kw.setdefault("type", "info" if status in (None, 503) else "ok")
        return self.op("json", "read", key, t0, t1, status=status, result=result, **kw)

    # nemesis

    def window(self, t0, t1, nodes=None):
        self.nemesis.append({"window": "no_quorum", "t0": t0, "t1": t1, "nodes": nodes})

    def fault(self, kind, t0, t1, nodes, phase):
        self.nemesis.append({"kind": kind, "t0": t0, "t1": t1, "nodes": nodes,
                             "leader": False, "phase": phase, "detail": kind})

    def check(self, **params):
        return checker.check(self.ops, self.ledger, self.nemesis, self.final, params)


def proxy_run():
    r = Run()
    r.fault("kill", 2.9, 4.1, [2, 3], "no_quorum")
    r.window(3.0, 4.0)
    r.fault("partition", 4.9, 6.1, [2], "partitioned")
    r.window(5.0, 6.0, [2])

    # p-once: one execution, its answer, replays, changed bodies refused
    R1 = r.exec("p-once", 1.00, 10, name="E1")
    r.proxy("p-once", 0.99, 1.02, 201, R1, name="P1")
    r.proxy("p-once", 2.00, 2.01, 201, R1, replayed=True, reordered=True, node=2)
    r.proxy("p-once", 2.10, 2.11, 409, changed=True, body='{"amount":2,"changed":1}')
    r.proxy("p-once", 3.20, 3.30, 503, changed=True)            # inside the window
    r.proxy("p-once", 9.00, 9.01, 410, changed=True, node=3)   # expired since

    # p-lost: A's slow upstream call loses its lease, B takes over; A's answer goes
    # out unrecorded with another body
    R2 = r.exec("p-lost", 1.10, 20)
    R3 = r.exec("p-lost", 1.50, 25)
    r.proxy("p-lost", 1.45, 1.55, 201, R3, node=2, name="PB")
    r.proxy("p-lost", 1.05, 1.60, 201, R2, recorded=False)
    r.proxy("p-lost", 2.50, 2.51, 201, R3, replayed=True, node=3)

    # p-unrec: the only answer before B's run was passed on unrecorded: B may still run
    RA = r.exec("p-unrec", 0.50, 70)
    r.proxy("p-unrec", 0.40, 1.00, 201, RA, recorded=False)
    RB = r.exec("p-unrec", 1.50, 75)
    r.proxy("p-unrec", 1.40, 1.60, 201, RB, node=3)

    # p-quorum: 503 inside both windows, 400 inside (decided before the log), an answer
    # from node 1 while only node 2 was cut off, one straddling the window's start
    r.proxy("p-quorum", 2.95, 3.05, 409, code="idempotency_request_in_progress")
    r.proxy("p-quorum", 3.10, 3.40, 503, node=1)
    r.proxy("p-quorum", 3.20, 3.90, 503, node=3)
    r.proxy("bad key!", 3.30, 3.31, 400)
    r.proxy("p-quorum", 5.10, 5.30, 503, node=2)
    R5 = r.exec("p-quorum", 5.20, 40)
    r.proxy("p-quorum", 5.10, 5.30, 201, R5, node=1)
    r.proxy("p-quorum", 5.90, 6.20, 201, R5, replayed=True, node=2)  # straddles the end

    # p-lost-answer: the first answer timed out, the retry is a replay
    R6 = r.exec("p-lost-answer", 7.00, 50)
    r.proxy("p-lost-answer", 6.99, 7.50, None, node=3)
    r.proxy("p-lost-answer", 8.00, 8.01, 201, R6, replayed=True, name="PR6")
    return r


def claim_run():
    r = Run()
    r.window(6.0, 7.0)
    r.window(8.0, 9.0, [3])

    # j-take: A's lease (500 ms from 1.00) runs out; B takes over at 1.60 (its first
    # claim's answer was lost, the retry with the same attempt gets the lease, a second
    # retry gets the same token back), runs and completes; A's late call is refused for
    # its stale fence, its complete is lease_lost
    r.claim("j-take", 1.00, 1.01, "acquired", "a1", token=100, name="CA")
    r.claim("j-take", 1.52, 1.58, None, "b1", client="lib")
    r.claim("j-take", 1.59, 1.60, "acquired", "b1", client="lib", token=140, takeover=True,
            previous_token=100, name="CB")
    r.claim("j-take", 1.605, 1.61, "acquired", "b1", client="lib", token=140,
            takeover=True, previous_token=100, name="CB2")
    Rb = r.exec("j-take", 1.62, 140)
    r.complete("j-take", 1.65, 1.66, 140, result=Rb, client="lib")
    r.exec("j-take", 1.70, 100, accepted=False, name="EA")
    r.complete("j-take", 1.72, 1.73, 100, outcome="lease_lost", code="idempotency_lease_lost",
               status=409)
    r.claim("j-take", 2.00, 2.01, "replay", "c1", client="lib", result=Rb)
    r.claim("j-take", 2.05, 2.06, "replay", "c2", result=Rb, node=2)
    r.claim("j-take", 2.10, 2.11, "mismatch", "c3", changed=True,
            code="idempotency_key_reused")

    # j-release: released (no side effect), granted again, completed, replayed; a
    # repeated release of the old token
    r.claim("j-release", 3.00, 3.01, "acquired", "d1", token=200)
    r.release("j-release", 3.05, 3.06, 200)
    r.claim("j-release", 3.10, 3.11, "acquired", "d2", token=210, client="lib", name="CD2")
    Rd = r.exec("j-release", 3.12, 210)
    r.complete("j-release", 3.15, 3.16, 210, result=Rd, client="lib")
    r.release("j-release", 3.20, 3.21, 200, outcome="lease_lost", status=409)
    r.claim("j-release", 3.50, 3.51, "replay", "d3", client="lib", result=Rd)

    # j-conflict: policy conflict: in_progress while held, lease_expired once run out
    r.claim("j-conflict", 4.00, 4.01, "acquired", "e1", token=300, lease_ms=300,
            policy="conflict")
    r.claim("j-conflict", 4.10, 4.11, "in_progress", "e2", policy="conflict",
            code="idempotency_request_in_progress")
    r.claim("j-conflict", 4.50, 4.51, "lease_expired", "e3", policy="conflict",
            code="idempotency_lease_expired")

    # j-q: 503 / IDEM_E* inside the cluster-wide window; a lib grant while node 3 alone
    # is cut off (lib has no node), a json claim to node 3 failing then
    r.claim("j-q", 6.10, 6.30, None, "f0", node=1)
    r.claim("j-q", 6.20, 6.50, None, "f0", client="lib", error="IDEM_EUNAVAILABLE")
    r.claim("j-q", 8.05, 8.40, None, "f0", node=3)
    r.claim("j-q", 8.10, 8.11, "acquired", "f1", client="lib", token=400)
    Rq = r.exec("j-q", 8.12, 400)
    r.complete("j-q", 8.20, 8.21, 400, result=Rq, client="lib")
    r.release("j-q", 8.30, 8.31, 400, outcome="not_found", client="lib")
    return r


class CheckerTest(unittest.TestCase):

    def assertClean(self, run, **params):
        vs = run.check(**params)
        self.assertEqual(vs, [], "\n".join(checker.format_violation(v) for v in vs))

    def assertOnly(self, run, invariant, count=1, key="-", **params):
        vs = run.check(**params)
        text = "\n".join(checker.format_violation(v) for v in vs)
        self.assertEqual({v["invariant"] for v in vs}, {invariant}, text)
        if count is not None:
            self.assertEqual(len(vs), count, text)
        if key != "-":
            self.assertEqual({v["key"] for v in vs}, {key}, text)
        for v in vs:
            self.assertIsInstance(v["detail"], str)
            self.assertTrue(v["detail"])
        return vs

    def plant(self, base, fn, invariant, count=1, key="-", **params):
        """Asserts base() passes, plants fn(run) into a fresh copy, asserts exactly
        `invariant` is flagged (count times when count is not None)."""
        clean = base()
        self.assertClean(clean, **params)
        run = base()
        fn(run)
        return self.assertOnly(run, invariant, count, key, **params)

    # clean runs

    def test_clean_proxy_run(self):
        self.assertClean(proxy_run())

    def test_clean_claim_run(self):
        self.assertClean(claim_run())

    def test_clean_runs_together(self):
        a, b = proxy_run(), claim_run()
        for w in b.nemesis:  # the claim run happens 100 s after the proxy run
            w["t0"] += 100
            w["t1"] += 100
        for e in b.ledger:  # keep exec ids unique across both
            e["t_start"] += 100
            e["t_end"] += 100
            e["exec"] += 1000
            doc = json.loads(e["response"])
            doc["exec"] = e["exec"]
            e["response"] = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        for o in b.ops:
            o["t0"] += 100
            o["t1"] += 100
            o["id"] += 1000
            if o["result"]:
                doc = json.loads(o["result"])
                doc["exec"] += 1000
                o["result"] = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        vs = checker.check(a.ops + b.ops, a.ledger + b.ledger, a.nemesis + b.nemesis,
                           GOOD_FINAL)
        self.assertEqual(vs, [])

    def test_final_none_skips_final_checks(self):
        r = proxy_run()
        r.final = None
        self.assertClean(r)

    # one_result

    def test_one_result_second_proxy_result(self):
        def f(r):
            other = r.exec("p-once", 0.995, 11)
            r.proxy("p-once", 0.98, 1.03, 201, other, node=2)
        vs = self.plant(proxy_run, f, "one_result", key="p-once")
        self.assertIn("op 2", vs[0]["detail"])

    def test_one_result_second_complete(self):
        def f(r):  # the fenced-off holder's complete answered ok with its own body
            r.complete("j-take", 1.63, 1.64, 100, result='{"exec":1,"mine":true}')
        # Sent after the takeover was answered, so stale_complete flags it as well.
        r = claim_run()
        self.assertClean(r)
        f(r)
        vs = r.check()
        self.assertEqual([(v["invariant"], v["key"]) for v in vs],
                         [("one_result", "j-take"), ("stale_complete", "j-take")])

    def test_one_result_unrecorded_different_is_exempt(self):
        r = proxy_run()
        # Sent before the recorded result was delivered (at 1.02): its holder lost the lease.
        r.proxy("p-once", 0.90, 2.40, 201, '{"exec":77}', recorded=False)
        self.assertClean(r)

    # lost_ack

    def test_proxy_refusal_after_ack(self):
        def f(r):  # a lost record: the retry ran again, the ledger refused its fence
            r.proxy("p-once", 2.00, 2.10, 409, '{"error":"stale_fence"}', code=None)
        vs = self.plant(proxy_run, f, "lost_ack", key="p-once")
        self.assertIn("status 409", vs[0]["detail"])

    def test_claim_acquired_after_complete_ack(self):
        def f(r):  # the completed record is gone: a new attempt acquires the key
            r.claim("j-release", 5.00, 5.01, "acquired", "z1", token=500)
        vs = self.plant(claim_run, f, "lost_ack", key="j-release")
        self.assertIn("outcome acquired", vs[0]["detail"])

    def test_expired_before_the_ttl_could_end(self):
        def f(r):  # the record is gone an hour early: 410 on a retry with the same body
            r.proxy("p-once", 3.00, 3.01, 410, node=2)
        vs = self.plant(proxy_run, f, "lost_ack", key="p-once")
        self.assertIn("ttl could not have run out", vs[0]["detail"])

        def g(r):  # a day early for a claim
            r.claim("j-release", 5.00, 5.01, "expired", "z2", status=410,
                    code="idempotency_key_expired", client="lib")
        vs = self.plant(claim_run, g, "lost_ack", key="j-release")
        self.assertIn("outcome expired", vs[0]["detail"])

    def test_expired_once_the_ttl_could_end(self):
        r = proxy_run()
        # p-once's first request was sent at 0.99: with a 5 s ttl it may be gone from 5.99
        r.proxy("p-once", 5.995, 6.00, 410, node=2)
        self.assertClean(r, ttl_s={"proxy": 5.0})
        self.assertOnly(r, "lost_ack", key="p-once", ttl_s={"proxy": 6.0})
        self.assertClean(r, ttl_s={})  # no known ttl: taken

    def test_final_reads_that_find_the_record(self):
        r = proxy_run()
        r.read("p-once", 20.0, 20.01, result=r.ref["E1"]["response"])
        r.read("p-once", 20.1, 20.2, status=503)  # indeterminate
        r.read("p-never", 20.3, 20.31, status=404)  # never acknowledged
        self.assertClean(r)
        c = claim_run()
        c.read("j-release", 20.0, 20.01, result=c.ops[12]["result"])
        self.assertEqual(c.ops[12]["f"], "complete")
        self.assertClean(c)

    def test_final_read_finds_no_record(self):
        def f(r):  # lost at a later election: nobody asked for the key again but the read
            r.read("p-once", 20.0, 20.01, status=404)
        vs = self.plant(proxy_run, f, "lost_ack", key="p-once")
        self.assertIn("no record", vs[0]["detail"])
        r = proxy_run()
        f(r)
        self.assertClean(r, ttl_s={"proxy": 10.0})  # gone once its ttl may have ended

    def test_final_read_finds_another_record(self):
        def f(r):
            r.read("p-once", 20.0, 20.01, result='{"exec":99}')
            r.read("p-lost-answer", 20.0, 20.01, result=r.ref["PR6"]["result"],
                   stored_status=200)
            r.read("j-x", 0.0, 0.01, state="processing")  # not acknowledged: not checked
        vs = self.plant(proxy_run, f, "lost_ack", count=2)
        by_key = {v["key"]: v["detail"] for v in vs}
        self.assertIn("another stored response", by_key["p-once"])
        self.assertIn("stored status 200", by_key["p-lost-answer"])

    def test_final_read_finds_the_record_processing_or_a_tombstone(self):
        def f(r):
            r.read("j-release", 20.0, 20.01, state="processing")
            r.read("j-take", 20.0, 20.01, state="tombstone")
        self.plant(claim_run, f, "lost_ack", count=2)

    def test_answers_after_ack_that_are_fine(self):
        r = proxy_run()
        # A changed body refused, a reordered request that raced the ack (sent before it).
        r.proxy("p-once", 2.00, 2.10, 409, changed=True)
        r.proxy("p-once", 1.00, 1.10, 409, code="idempotency_request_in_progress")
        self.assertClean(r)

    # no_exec_after_ack

    def test_exec_after_ack(self):
        def f(r):
            r.exec("p-once", 2.50, 30)
        vs = self.plant(proxy_run, f, "no_exec_after_ack", key="p-once")
        self.assertIn("op 1", vs[0]["detail"])  # P1 gave the answer at 1.02

    def test_unfenced_exec_after_ack(self):
        def f(r):  # refused by the fenced ledger, but it reached the upstream: it ran again
            r.exec("p-once", 2.50, None, accepted=False)
        vs = self.plant(proxy_run, f, "no_exec_after_ack", key="p-once")
        self.assertIn("no fence", vs[0]["detail"])

    def test_stale_fence_after_ack_is_exempt(self):
        r = claim_run()
        r.exec("j-take", 2.50, 100, accepted=False)  # a late holder fenced off
        self.assertClean(r)

    def test_exec_after_replay_ack(self):
        def f(r):  # the first answer was lost; the replay at 8.01 is the ack
            r.exec("p-lost-answer", 8.50, 55)
        self.plant(proxy_run, f, "no_exec_after_ack", key="p-lost-answer")

    def test_exec_within_tolerance_of_ack(self):
        r = proxy_run()
        r.exec("p-once", 1.02 + 0.003, 30)
        self.assertClean(r)

    # fences

    def test_fence_not_increasing_accepted(self):
        def f(r):
            r.exec("p-lost", 1.52, 22)
        self.plant(proxy_run, f, "fences", key="p-lost")

    def test_fence_equal_accepted(self):
        def f(r):
            r.exec("p-lost", 1.52, 25)
        self.plant(proxy_run, f, "fences", key="p-lost")
        r = proxy_run()
        f(r)
        self.assertClean(r, allow_equal_fence=True)

    # token_order

    def test_takeover_of_a_lease_granted_to_a_lost_answer(self):
        # The holder's first claim (sent at 0.0) was granted, its answer lost (503); its
        # retry with the same attempt id got the token back at 0.40. The lease began no
        # earlier than 0.0, so a takeover answered at 0.55 with a 500 ms lease is legal.
        r = Run()
        r.claim("j-lost", 0.00, 0.30, None, "h1", status=503)
        r.claim("j-lost", 0.40, 0.41, "acquired", "h1", token=10)
        r.claim("j-lost", 0.52, 0.55, "acquired", "t1", token=20, takeover=True,
                previous_token=10)
        self.assertClean(r)
        r.ops[0]["t0"] = 0.10  # now the lease could not have ended before 0.60
        self.assertOnly(r, "takeover_early", key="j-lost")

    def test_token_lower_than_an_earlier_grant(self):
        def f(r):
            r.claim("j-release", 3.12, 3.13, "acquired", "z1", token=150)
        self.plant(claim_run, f, "token_order", count=2, key="j-release")

    def test_takeover_token_not_above_previous(self):
        def f(r):
            r.ref["CB"]["token"] = 90
            r.ref["CB2"]["token"] = 90
        self.plant(claim_run, f, "token_order", count=None, key="j-take")

    # dup_token

    def test_duplicate_token_two_attempts(self):
        def f(r):
            r.claim("j-release", 3.105, 3.115, "acquired", "x9", token=210)
        vs = self.plant(claim_run, f, "dup_token", key="j-release")
        self.assertIn("x9", vs[0]["detail"])
        self.assertIn("d2", vs[0]["detail"])

    def test_token_as_string_is_the_same_token(self):
        def f(r):
            r.claim("j-release", 3.105, 3.115, "acquired", "x9", token="210")
        self.plant(claim_run, f, "dup_token", key="j-release")

    # takeover_early

    def test_takeover_early(self):
        def f(r):
            for name in ("CB", "CB2"):
                r.ref[name]["t0"] -= 0.30
                r.ref[name]["t1"] -= 0.30
        vs = self.plant(claim_run, f, "takeover_early", count=2, key="j-take")
        self.assertIn("token 100", vs[0]["detail"])

    def test_takeover_within_tolerance(self):
        r = claim_run()
        for name in ("CB", "CB2"):
            r.ref[name]["t0"] = 1.496
            r.ref[name]["t1"] = 1.497  # lease ends at 1.500, 3 ms < 5 ms tolerance
        self.assertClean(r)
        self.assertOnly(r, "takeover_early", count=2, tolerance_s=0.001)

    # overlap

    def test_overlap_plain_grant_while_the_lease_ran(self):
        def f(r):
            # A holds j-over with a 500 ms lease from no earlier than 10.00; B, another
            # attempt, is granted the key plainly at 10.11, and both reach the ledger in
            # fence order, so both are accepted: the business ran twice.
            r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
            r.claim("j-over", 10.10, 10.11, "acquired", "o2", client="lib", token=610)
            r.exec("j-over", 10.12, 600)
            Rb = r.exec("j-over", 10.15, 610)
            r.complete("j-over", 10.20, 10.21, 600, outcome="lease_lost",
                       code="idempotency_lease_lost", status=409)
            r.complete("j-over", 10.22, 10.23, 610, result=Rb, client="lib")
            # A release sent after B's grant was answered cannot have freed the key first.
            r.release("j-over", 10.30, 10.40, 600, type="info", status=503)
        vs = self.plant(claim_run, f, "overlap", key="j-over")
        self.assertIn("granted token 610 at t1=10.1100", vs[0]["detail"])
        self.assertIn("could not run out before 10.5000", vs[0]["detail"])

    def test_overlap_early_takeover_both_executed(self):
        def f(r):  # taken over 300 ms into a 500 ms lease; both holders' calls accepted
            r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
            r.claim("j-over", 10.30, 10.31, "acquired", "o2", token=610, takeover=True,
                    previous_token=600)
            r.exec("j-over", 10.32, 600)
            Rb = r.exec("j-over", 10.35, 610)
            r.complete("j-over", 10.36, 10.37, 600, outcome="lease_lost",
                       code="idempotency_lease_lost", status=409)
            r.complete("j-over", 10.38, 10.39, 610, result=Rb)
        r = claim_run()
        self.assertClean(r)
        f(r)
        vs = r.check()
        self.assertEqual([v["invariant"] for v in vs], ["takeover_early", "overlap"],
                         "\n".join(checker.format_violation(v) for v in vs))

    def test_overlap_is_flagged_once_per_extra_execution(self):
        def f(r):  # three holders at once, all three accepted: two executions too many
            r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
            r.claim("j-over", 10.10, 10.11, "acquired", "o2", token=610)
            r.claim("j-over", 10.20, 10.21, "acquired", "o3", client="lib", token=620)
            for t, fence in ((10.22, 600), (10.24, 610), (10.26, 620)):
                r.exec("j-over", t, fence)
        vs = self.plant(claim_run, f, "overlap", count=2, key="j-over")
        self.assertIn("fence 610", vs[0]["detail"])
        self.assertIn("fence 620", vs[1]["detail"])
        self.assertIn("lease on token 600", vs[1]["detail"])

    def test_overlap_takeover_after_the_lease_ran_out(self):
        # A's lease (from no earlier than 10.00, 500 ms) ran out; B took over at 10.53. A's
        # slow call reached the ledger first, so both were accepted, as a fenced downstream
        # allows: only B's complete was accepted. No overlap: the leases did not overlap.
        r = claim_run()
        A = r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
        B = r.claim("j-over", 10.52, 10.53, "acquired", "o2", token=610, takeover=True,
                    previous_token=600)
        r.exec("j-over", 10.51, 600)
        Rb = r.exec("j-over", 10.55, 610)
        r.complete("j-over", 10.56, 10.57, 600, outcome="lease_lost",
                   code="idempotency_lease_lost", status=409)
        r.complete("j-over", 10.58, 10.59, 610, result=Rb)
        self.assertClean(r)
        A["lease_ms"] = 600  # the same answers with a longer lease: taken over while live
        vs = r.check()
        self.assertEqual([v["invariant"] for v in vs], ["takeover_early", "overlap"])
        A["lease_ms"] = 500
        B["t0"], B["t1"] = 10.496, 10.497  # 3 ms early: within the tolerance
        self.assertClean(r)

    def test_overlap_same_attempt_retry(self):
        # A's first claim was granted but its answer lost (503); the retry with the same
        # attempt id got the token back at 10.36, and again at 10.38. The lease ran from the
        # first try, so B's takeover at 10.53 is legal although 10.36 + 500 ms is later.
        r = claim_run()
        A = r.claim("j-over", 10.00, 10.30, None, "o1", status=503)
        r.claim("j-over", 10.35, 10.36, "acquired", "o1", token=600)
        r.claim("j-over", 10.37, 10.38, "acquired", "o1", client="lib", token=600)
        r.claim("j-over", 10.52, 10.53, "acquired", "o2", token=610, takeover=True,
                previous_token=600)
        r.exec("j-over", 10.51, 600)
        Rb = r.exec("j-over", 10.55, 610)
        r.complete("j-over", 10.56, 10.57, 600, outcome="lease_lost",
                   code="idempotency_lease_lost", status=409)
        r.complete("j-over", 10.58, 10.59, 610, result=Rb)
        self.assertClean(r)
        A["t0"] = 10.10  # the lease could not have run out before 10.60 now
        vs = r.check()
        self.assertEqual([v["invariant"] for v in vs], ["takeover_early", "overlap"])

    def test_overlap_release_then_a_new_grant(self):
        # A's call reached the ledger but its answer was lost, so A gave the key back; B was
        # granted it afresh while A's lease would still have run: legal, as the key was free.
        # An indeterminate release may have freed it too. One refused is no release.
        for kw, clean in (({}, True), ({"type": "info", "status": 503, "outcome": None}, True),
                          ({"outcome": "lease_lost", "status": 409}, False)):
            r = claim_run()
            r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
            r.exec("j-over", 10.02, 600)
            r.release("j-over", 10.05, 10.06, 600, **kw)
            r.claim("j-over", 10.10, 10.11, "acquired", "o2", client="lib", token=610)
            Rb = r.exec("j-over", 10.12, 610)
            r.complete("j-over", 10.15, 10.16, 610, result=Rb, client="lib")
            if clean:
                self.assertClean(r)
            else:
                self.assertOnly(r, "overlap", key="j-over")

    def test_overlap_fenced_off_is_no_double_execution(self):
        # B was granted the key while A's lease ran, but A's call came after B's and the
        # ledger refused its stale fence: the business ran once. (The grant is outside what
        # this rule judges: it counts executions.)
        r = claim_run()
        r.claim("j-over", 10.00, 10.01, "acquired", "o1", token=600)
        r.claim("j-over", 10.10, 10.11, "acquired", "o2", client="lib", token=610)
        Rb = r.exec("j-over", 10.12, 610)
        r.exec("j-over", 10.14, 600, accepted=False)
        r.release("j-over", 10.16, 10.17, 600, outcome="lease_lost", status=409)
        r.complete("j-over", 10.18, 10.19, 610, result=Rb, client="lib")
        self.assertClean(r)

    # stale_complete

    def test_stale_complete_after_takeover(self):
        def f(r):
            # B took over A's run-out lease (answered at 10.53); A's slow call reached the
            # ledger first (accepted), then A's complete, sent at 10.56, was accepted
            # instead of lease_lost: A's result is the key's, B's execution ran as well.
            r.claim("j-stale", 10.00, 10.01, "acquired", "o1", token=600)
            r.claim("j-stale", 10.52, 10.53, "acquired", "o2", client="lib", token=610,
                    takeover=True, previous_token=600)
            Ra = r.exec("j-stale", 10.51, 600)
            r.exec("j-stale", 10.55, 610)
            r.complete("j-stale", 10.56, 10.57, 600, result=Ra)
            r.complete("j-stale", 10.58, 10.59, 610, outcome="lease_lost", client="lib")
        vs = self.plant(claim_run, f, "stale_complete", key="j-stale")
        self.assertIn("token 600", vs[0]["detail"])
        self.assertIn("higher token 610 by takeover at t1=10.5300", vs[0]["detail"])

        def g(r):  # the same when the new holder never got to run (a crashed holder)
            r.claim("j-stale", 10.00, 10.01, "acquired", "o1", token=600, client="lib")
            r.claim("j-stale", 10.52, 10.53, "acquired", "o2", token=610, takeover=True,
                    previous_token=600)
            Ra = r.exec("j-stale", 10.51, 600)
            r.complete("j-stale", 10.56, 10.57, 600, result=Ra, client="lib")
        self.plant(claim_run, g, "stale_complete", key="j-stale")

    def test_stale_complete_before_any_takeover(self):
        # A's lease ran out at 10.50 but nobody took over: its token is still the record's,
        # its complete at 10.55 is accepted, and the next claim replays it.
        r = claim_run()
        r.claim("j-stale", 10.00, 10.01, "acquired", "o1", token=600)
        Ra = r.exec("j-stale", 10.45, 600)
        r.complete("j-stale", 10.55, 10.56, 600, result=Ra)
        r.claim("j-stale", 10.57, 10.58, "replay", "o2", client="lib", result=Ra)
        self.assertClean(r)

    def test_stale_complete_same_attempt_retry(self):
        # A's first claim was granted, its answer lost; the retry with the same attempt id,
        # after the lease ran out and nobody took over, got the token back with a fresh
        # lease. Its complete timed out (and was applied), its retry answered ok (a repeat),
        # the next claim replays it.
        r = claim_run()
        r.claim("j-stale", 10.00, 10.30, None, "o1", status=503)
        r.claim("j-stale", 10.60, 10.61, "acquired", "o1", token=600)
        r.claim("j-stale", 10.62, 10.63, "acquired", "o1", client="lib", token=600)
        Ra = r.exec("j-stale", 10.64, 600)
        r.complete("j-stale", 10.65, 10.75, 600, result=Ra, type="info", status=None,
                   outcome=None)
        r.complete("j-stale", 10.80, 10.81, 600, result=Ra)
        r.claim("j-stale", 10.85, 10.86, "replay", "o2", result=Ra, status=201)
        self.assertClean(r)

    # changed_body

    def test_changed_body_executed(self):
        def f(r):
            r.exec("p-new", 9.50, 60, changed=True)
        self.plant(proxy_run, f, "changed_body", key="p-new")

    def test_changed_body_answered_replay(self):
        def f(r):
            r.proxy("p-once", 2.20, 2.21, 201, r.ref["E1"]["response"], replayed=True,
                    changed=True)
        self.plant(proxy_run, f, "changed_body", key="p-once")

    def test_changed_body_answered_2xx(self):
        def f(r):
            r.proxy("p-once", 2.20, 2.21, 200, r.ref["E1"]["response"], changed=True)
        self.plant(proxy_run, f, "changed_body", key="p-once")

    def test_changed_claim_acquired(self):
        def f(r):
            r.claim("j-conflict", 4.60, 4.61, "acquired", "g1", token=310, changed=True)
        self.plant(claim_run, f, "changed_body", key="j-conflict")

    def test_changed_claim_replay(self):
        def f(r):
            r.claim("j-take", 2.20, 2.21, "replay", "g2", client="lib", changed=True,
                    result=r.ledger[0]["response"])
        self.plant(claim_run, f, "changed_body", key="j-take")

    # quorum

    def test_answer_inside_cluster_window(self):
        def f(r):
            r.proxy("p-quorum", 3.50, 3.60, 409, node=3,
                    code="idempotency_request_in_progress")
        vs = self.plant(proxy_run, f, "quorum", key="p-quorum")
        self.assertIn("whole cluster", vs[0]["detail"])

    def test_lib_grant_inside_cluster_window(self):
        def f(r):
            r.claim("j-q2", 6.40, 6.41, "acquired", "h1", client="lib", token=390)
        self.plant(claim_run, f, "quorum", key="j-q2")

    def test_answer_from_cut_off_node(self):
        def f(r):
            r.proxy("p-cut", 5.40, 5.50, 409, node=2,
                    code="idempotency_request_in_progress")
        vs = self.plant(proxy_run, f, "quorum", key="p-cut")
        self.assertIn("nodes [2]", vs[0]["detail"])

    def test_grant_from_cut_off_node(self):
        def f(r):
            r.claim("j-q3", 8.50, 8.51, "acquired", "k1", token=420, node=3)
        self.plant(claim_run, f, "quorum", key="j-q3")

    def test_answer_within_tolerance_of_window_edge(self):
        r = proxy_run()
        r.proxy("p-quorum", 3.002, 3.01, 409, node=3, code="idempotency_request_in_progress")
        self.assertClean(r)

    # replay_identical

    def test_replay_one_byte_differs(self):
        def f(r):
            op = r.ref["PR6"]
            op["result"] = op["result"].replace("accepted", "acceptet")
            self.assertEqual(len(op["result"]), len(r.ledger[-1]["response"]))
        vs = self.plant(proxy_run, f, "replay_identical", key="p-lost-answer")
        self.assertIn("exec 7", vs[0]["detail"])

    def test_replay_of_unknown_exec(self):
        def f(r):
            r.ref["PR6"]["result"] = '{"exec":999,"key":"p-lost-answer"}'
        vs = self.plant(proxy_run, f, "replay_identical", key="p-lost-answer")
        self.assertIn("999", vs[0]["detail"])

    def test_replay_not_parsable(self):
        def f(r):
            r.ref["PR6"]["result"] = "not json"
        self.plant(proxy_run, f, "replay_identical", key="p-lost-answer")

    def test_replay_of_another_keys_exec(self):
        def f(r):
            r.ref["PR6"]["result"] = r.ref["E1"]["response"]
        self.plant(proxy_run, f, "replay_identical", key="p-lost-answer")

    def test_lib_replay_of_unknown_exec(self):
        def f(r):
            r.claim("j-new", 9.0, 9.01, "replay", "m1", client="lib",
                    result='{"exec":999,"key":"j-new"}')
        self.plant(claim_run, f, "replay_identical", key="j-new")

    def test_proxy_replay_with_another_status(self):
        def f(r):  # P1 was acknowledged 201; the stored response comes back 200
            r.proxy("p-once", 2.20, 2.21, 200, r.ref["E1"]["response"], replayed=True,
                    node=3)
        vs = self.plant(proxy_run, f, "replay_identical", key="p-once")
        self.assertIn("replayed status 200", vs[0]["detail"])
        self.assertIn("acknowledged with status 201", vs[0]["detail"])

    def test_claim_replays_with_another_status(self):
        def f(r):  # j-take was completed (stored 201); a json and a lib replay differ
            for o in r.ops:
                if o["f"] == "complete" and o["outcome"] == "ok":
                    o["stored_status"] = 201
            r.claim("j-take", 2.30, 2.31, "replay", "c4", result=r.ops[4]["result"],
                    status=200)
            r.claim("j-take", 2.40, 2.41, "replay", "c5", client="lib",
                    result=r.ops[4]["result"], stored_status=202)
        vs = self.plant(claim_run, f, "replay_identical", count=2, key="j-take")
        self.assertIn("status 200", vs[0]["detail"])
        self.assertIn("status 202", vs[1]["detail"])

    def test_replays_with_the_stored_status(self):
        r = claim_run()
        for o in r.ops:
            if o["f"] == "complete" and o["outcome"] == "ok":
                o["stored_status"] = 201
            if o["client"] == "lib" and o["outcome"] == "replay":
                o["stored_status"] = 201
        self.assertClean(r)

    # final

    def test_final_not_recovered(self):
        self.plant(proxy_run, lambda r: r.final.update(recovered=False), "final", key=None)

    def test_final_not_converged(self):
        self.plant(proxy_run, lambda r: r.final.update(converged=False), "final", key=None)

    def test_final_unexpected_exit(self):
        vs = self.plant(proxy_run, lambda r: r.final.update(
            unexpected_exits=[{"node": 2, "status": 139}]), "final", key=None)
        self.assertIn("139", vs[0]["detail"])

    def test_final_driver_exit(self):
        vs = self.plant(proxy_run, lambda r: r.final.update(driver_exits=[
            {"driver": "lib-2", "status": -6, "at": "during the run",
             "stderr_tail": "==1==ERROR: AddressSanitizer: heap-use-after-free"}]),
            "final", key=None)
        self.assertIn("lib-2", vs[0]["detail"])
        self.assertIn("-6", vs[0]["detail"])
        self.assertIn("heap-use-after-free", vs[0]["detail"])

    def test_final_log_problem(self):
        vs = self.plant(proxy_run, lambda r: r.final.update(
            log_problems=[{"node": 1, "line": "ERROR assertion failed"}]), "final", key=None)
        self.assertIn("assertion", vs[0]["detail"])

    def test_final_all_items(self):
        def f(r):
            r.final = {"recovered": False, "converged": False,
                       "unexpected_exits": [{"node": 1, "status": 1}, {"node": 3, "status": 6}],
                       "log_problems": [{"node": 2, "line": "x"}]}
        self.plant(proxy_run, f, "final", count=5, key=None)

    # robustness and determinism

    def test_missing_fields_and_indeterminate_ops(self):
        r = proxy_run()
        r.ops += [{}, {"type": "info"}, {"client": "proxy", "type": "info", "status": 201,
                                         "result": "x", "key": "p-once"},
                  {"client": "lib", "f": "claim", "type": "ok", "outcome": "acquired",
                   "key": "j", "token": None}, "garbage"]
        r.ledger += [{}, {"key": "p-x", "fence": "n/a"}]
        r.nemesis += [{}, {"window": "no_quorum"}]
        self.assertClean(r)

    def test_deterministic_order(self):
        r = proxy_run()
        r.exec("p-once", 2.50, 30)
        r.exec("p-new", 9.50, 60, changed=True)
        r.proxy("p-quorum", 3.50, 3.60, 409, node=3)
        r.final["converged"] = False
        vs = r.check()
        self.assertEqual([v["invariant"] for v in vs],
                         ["no_exec_after_ack", "changed_body", "quorum", "final"])
        for seed in range(5):
            s = copy.deepcopy(r)
            random.Random(seed).shuffle(s.ops)
            random.Random(seed).shuffle(s.ledger)
            random.Random(seed).shuffle(s.nemesis)
            self.assertEqual(s.check(), vs)

    def test_main_reads_a_run_directory(self):
        for planted, rc in ((False, 0), (True, 1)):
            r = claim_run()
            if planted:
                r.final["log_problems"] = [{"node": 1, "line": "oops"}]
            with tempfile.TemporaryDirectory() as d:
                for name, rows in (("history", r.ops), ("ledger", r.ledger),
                                   ("nemesis", r.nemesis)):
                    with open(os.path.join(d, name + ".jsonl"), "w") as f:
                        for row in rows:
                            f.write(json.dumps(row) + "\n")
                        f.write('{"torn": ')  # a writer killed mid-line
                with open(os.path.join(d, "summary.json"), "w") as f:
                    json.dump({"final": r.final}, f)
                out = io.StringIO()
                with redirect_stdout(out):
                    self.assertEqual(checker.main([d]), rc)
                self.assertIn("no violations" if rc == 0 else "final", out.getvalue())


if __name__ == "__main__":
    unittest.main()
