"""checker: decides whether a chaos run kept the idempotency promises.

It reads the three logs a run writes (their format is described in history.py: the
clients' operations, the executions the upstream ledger received, the faults and the
windows without quorum) plus the "final" state found after the nemesis stopped, and
returns every broken promise it can prove from them.  check() is a pure function: no
I/O, the same input always gives the same violations in the same order.

Times are CLOCK_MONOTONIC seconds from every process of the machine, so they compare
directly; params["tolerance_s"] (default 0.005) absorbs the few milliseconds between a
process taking a time stamp and the event it stamps.  Every bound below is applied in the
direction that makes a violation harder to claim.

An operation is *delivered* only when it got a definite answer (type "ok"); an "info"
operation (503, timeout, broken connection) may or may not have happened and never
counts as an answer the client relied on.

A *recorded successful result* is what a client was told is the one outcome of its key:
  - a proxy answer with type ok, a 2xx status and recorded not False (a replay included);
  - a json/lib claim answered "replay" (its result: the stored response), unless the
    stored response is known not to be 2xx (the op's "stored_status", the json answer's
    own status, or the status the ledger sent for the execution the body names);
  - a json/lib complete answered "ok" (its result: the body it stored).
A proxy answer marked recorded=False was passed on after the proxy lost its lease while
the upstream call ran: nothing was stored, so it promises nothing and is exempt.

Invariants (the "invariant" member of each violation):

one_result      For each key, every recorded successful result is the same text.  An
                idempotency key names one business intent: once one result has been
                recorded and given out, every later answer for the key is that result.
no_exec_after_ack
                For each key, no execution reached the upstream after the first recorded
                successful result was delivered (t_start later than that answer's t1).
                Once a client holds the answer, a retry must replay it, never run the
                business again.  Executions the ledger refused for a stale fence are
                exempt: they had no effect, which is what fencing is for.  One without a
                fence is not: the ledger refuses it as well, but an upstream that does
                not fence would have run it (the workload always sends a fence).
lost_ack        Nothing acknowledged is lost: once a key's recorded result was delivered,
                every later request for it with the same body (proxy) or fingerprint
                (json/lib claim) that gets a definite answer is answered with that
                result (a replay), or 410 / expired once its ttl could have ended: the
                record was created no earlier than the key's first request was sent, and
                kept params["ttl_s"][client] seconds (the shortest of the clients that
                used the key; a 410 is taken at any time for a client without a known
                ttl).  A record lost by a crash, a power cut or a wiped node would show
                as a fresh execution, an acquired claim, a refusal or an early 410
                instead.  A read of the record (f "read", the run's final reads through
                GET /v1/claims/KEY after the faults) must find it completed with the
                acknowledged result and status (no record or a tombstone only once the ttl
                could have ended).
fences          The ledger's fencing, per key and in arrival order: an execution whose
                fence is not above the highest fence accepted before it must have been
                refused; so the accepted fences strictly increase.  The order is the
                ledger's exec ids, given with the accept decision under one lock.  An execution
                without a fence is not ordered.  The ledger refuses only fences below
                its highest, so an equal one gets through: that is still flagged here,
                as one grant's token reached the upstream twice (params
                ["allow_equal_fence"] lets it pass).
token_order     Fencing tokens grow with time: for one key, when claim A was acquired
                (answered) before claim B of another attempt was even sent, A's token is
                lower than B's, and a takeover's token is above the token it fenced off.
                A stale holder can only be fenced off if newer holders carry higher tokens.
dup_token       For one key, one fencing token is never given to two different attempt
                ids (a retried claim with the same attempt id may get its token back).
takeover_early  A takeover acquired for a json/lib claim must not be answered before the
                lease it took over could possibly have run out: that lease was granted no
                earlier than its claim's t0 and lasted lease_ms, so the takeover's t1 is
                at least claim t0 + lease_ms/1000.  Taking over a live lease lets two
                holders run the business at once.
overlap         Two holders never both run the business: for one key, when the ledger
                accepted executions with fences A < B, both tokens granted to json/lib
                claims of different attempt ids, the grant of B (plain or by takeover) was
                not answered before the lease of A could have run out: that lease began no
                earlier than the first claim op of A's attempt was sent (answered or not)
                and lasted its lease_ms, as for takeover_early.  The one exception is a key
                given back: a release of A sent before B's grant was answered, answered ok
                or indeterminate (it may have been applied first).  An execution the
                ledger refused for its stale fence had no effect and overlaps nothing; a
                takeover once A's lease could have run out is no overlap either, even when
                A's late call was accepted before B's (the fence only refuses the later
                one).  The tokens' order is the log's, so A was granted before B.  The
                service measures leases on the leaders' wall clock (one machine's, in a
                run): this rule, like takeover_early, takes it to keep pace with
                CLOCK_MONOTONIC within the tolerance.
stale_complete  A holder fenced off by a newer grant cannot record its result: for one key,
                a json/lib complete with token A is not answered ok when a claim of another
                attempt id was answered acquired with a token above A before the first
                complete with token A was sent (any try of it, answered or not).  That
                grant was applied first, so the record no longer held A and the complete
                had to be lease_lost; accepting it records the stale holder's result while
                the new holder may run the business as well.  A complete first sent before
                the grant's answer is not judged: that try may have been applied first.
changed_body    A request whose body (proxy) or fingerprint (json/lib) differs from the
                one the key was first used with must be refused as a reuse of the key: it
                must never reach the upstream (ledger execution marked changed), never get
                a 2xx or replayed proxy answer, and a changed claim must never be answered
                acquired or replay.  409 key reused, 503 / timeout and 410 expired are all
                fine answers.
quorum          Fail closed: no definite answer (type ok, grants included) may be given by
                an operation whose whole interval [t0, t1] lies inside a window without
                quorum that applies to it.  A window with nodes None covers every request;
                one with a node list covers the requests sent to those nodes (lib
                operations have no node, so only cluster-wide windows cover them).
                Without a committed entry there is no answer to give.  Answers decided
                before the log is consulted (by default statuses 400, 401, 403, 413, 429;
                params["quorum_exempt_status"]) are exempt.  The window is shrunk by the
                tolerance at both ends.
replay_identical
                A replay (a proxy answer with Idempotency-Replayed and a 2xx status, a
                json/lib claim answered replay) is byte-identical to the response the
                ledger sent for the execution its body names (its "exec" member), and that
                execution is of the same key.  A replay that cannot be parsed, names no
                known execution or differs in one byte was not stored faithfully.  And
                every replay of a key (a proxy answer marked replayed whatever its status,
                a json/lib claim replay) carries the status of the key's acknowledged
                completion (its first recorded successful result): a proxy answer's or a
                json replay's HTTP status, a lib replay's or a complete's stored_status
                (the status it asked to store).
final           After the nemesis stopped the cluster recovered and converged (every
                replica at the same state), no node exited unexpectedly, no libidem driver
                exited while the run used it (or failed at the end of its input: its
                "driver_exits", with its status and its stderr's tail) and no node logged
                a problem.  Each failing item is one violation.  Skipped when final is None.

Run as a script: python3 checker.py DIR reads DIR/history.jsonl, DIR/ledger.jsonl,
DIR/nemesis.jsonl and DIR/summary.json (its "final" member), prints the violations and
exits 1 when there is any (0 when none, 2 when DIR is not a directory).
"""
import argparse
import json
import os
import sys

try:
    from history import read_jsonl
except ImportError:  # imported as a package member
    from .history import read_jsonl


INVARIANTS = ("one_result", "no_exec_after_ack", "lost_ack", "fences", "token_order", "dup_token",
              "takeover_early", "overlap", "stale_complete", "changed_body", "quorum",
              "replay_identical", "final")

DEFAULT_PARAMS = {
    "tolerance_s": 0.005,
    "allow_equal_fence": False,
    "quorum_exempt_status": (400, 401, 403, 413, 429),
    # The records' ttl in seconds by client, as the suite configures them (cluster.py: the
    # proxy route's ttl_ms, the tenant's for JSON API and libidem claims, which ask for
    # none). A client missing here has no known ttl: its 410 / expired answers are taken.
    "ttl_s": {"proxy": 3600.0, "json": 86400.0, "lib": 86400.0},
}


# --- small helpers ------------------------------------------------------------------

def _num(x):
    """A time or other number, or None (bools and text are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return x


def _int(x):
    """An integer from an int, an integral float or a decimal string (tokens travel as
    both numbers and strings); else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        s = x.strip().strip('"')
        try:
            return int(s)
        except ValueError:
            return None
    return None


def _t(x):
    x = _num(x)
    return "?" if x is None else "%.4f" % x


def _short(s, n=80):
    if s is None:
        return "None"
    r = repr(s)
    return r if len(r) <= n else r[:n - 3] + "..."


def _is2xx(status):
    s = _int(status)
    return s is not None and 200 <= s <= 299


def _key_order(k):
    return (k is None, str(k))


def _op_order(op):
    t0 = _num(op.get("t0"))
    i = _int(op.get("id"))
    return (t0 is None, t0 or 0.0, i is None, i or 0)


def _exec_order(e):
    """The ledger's own order: its exec ids are given under the lock that decides whether
    a fence is accepted (t_start can tie, or be taken by a thread that lost the race)."""
    i = _int(e.get("exec"))
    t = _num(e.get("t_start"))
    return (i is None, i or 0, t is None, t or 0.0)


def _by_key(items):
    out = {}
    for x in items:
        out.setdefault(x.get("key"), []).append(x)
    return out


def _ok(op):
    return op.get("type") == "ok"


def _client(op):
    return op.get("client")


def _is_claim(op):
    return _client(op) in ("json", "lib") and op.get("f") == "claim"


def _result_exec(result):
    """The execution id a response body names (its "exec" member), or None."""
    if not isinstance(result, str):
        return None
    try:
        doc = json.loads(result)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    return _int(doc.get("exec"))


def _replay_stored_not_2xx(op, execs):
    """True when a json/lib replay's stored response is known not to be a 2xx one."""
    if op.get("stored_status") is not None:
        return not _is2xx(op.get("stored_status"))
    if _client(op) == "json" and op.get("status") is not None and \
            not _is2xx(op.get("status")):
        return True
    e = execs.get(_result_exec(op.get("result")))
    if e is not None and e.get("status") is not None:
        return not _is2xx(e.get("status"))
    return False


def recorded_results(op, execs):
    """(True, result text) when op delivered a recorded successful result, else (False, None)."""
    if not _ok(op):
        return False, None
    c = _client(op)
    if c == "proxy":
        if _is2xx(op.get("status")) and op.get("recorded") is not False:
            return True, op.get("result")
        return False, None
    if c in ("json", "lib"):
        f = op.get("f")
        if f == "claim" and op.get("outcome") == "replay":
            if _replay_stored_not_2xx(op, execs):
                return False, None
            return True, op.get("result")
        if f == "complete" and op.get("outcome") == "ok":
            return True, op.get("result")
    return False, None


def _is_replay(op):
    if not _ok(op):
        return False
    c = _client(op)
    if c == "proxy":
        return op.get("replayed") is True and _is2xx(op.get("status"))
    return _is_claim(op) and op.get("outcome") == "replay"


def _v(invariant, key, detail):
    return {"invariant": invariant, "key": key, "detail": detail}


# --- the invariants -----------------------------------------------------------------

def _check_one_result(ops_by_key, execs):
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        firsts = {}  # text -> first op delivering it
        for op in sorted(ops_by_key[key], key=lambda o: (_num(o.get("t1")) or 0.0,
                                                         _op_order(o))):
            yes, text = recorded_results(op, execs)
            if yes and text not in firsts:
                firsts[text] = op
        if len(firsts) > 1:
            parts = ["op %s (%s, t1=%s) got %s" % (o.get("id"), _client(o), _t(o.get("t1")),
                                                    _short(text))
                     for text, o in firsts.items()]
            out.append(_v("one_result", key, "%d different recorded results: %s"
                          % (len(firsts), "; ".join(parts))))
    return out


def _first_ack(ops, execs):
    """The op that delivered a key's first recorded successful result (earliest t1), or
    None."""
    ack = None
    for op in ops:
        yes, _ = recorded_results(op, execs)
        t1 = _num(op.get("t1"))
        if yes and t1 is not None and (ack is None or (t1, _op_order(op)) <
                                       (_num(ack.get("t1")), _op_order(ack))):
            ack = op
    return ack


def _check_no_exec_after_ack(ops_by_key, execs_by_key, execs, tol):
    out = []
    for key in sorted(execs_by_key, key=_key_order):
        ack = _first_ack(ops_by_key.get(key, []), execs)
        if ack is None:
            continue
        t_ack = _num(ack.get("t1"))
        for e in sorted(execs_by_key[key], key=_exec_order):
            ts = _num(e.get("t_start"))
            fence = _int(e.get("fence"))
            # Refused for a stale fence: no effect. Without a fence the ledger refuses too,
            # but only because it is a fenced downstream: an unfenced one would have run it.
            if (e.get("accepted") is False and fence is not None) or ts is None:
                continue
            if ts > t_ack + tol:
                out.append(_v("no_exec_after_ack", key,
                              "exec %s (%s) started at %s, %.4fs after op %s (%s) "
                              "delivered the recorded result at t1=%s"
                              % (e.get("exec"), "fence %s" % fence if fence is not None else
                                 "no fence: an unfenced upstream would have run it again",
                                 _t(ts), ts - t_ack, ack.get("id"), _client(ack),
                                 _t(t_ack))))
    return out


def _earliest_expiry(ops, ttl_s):
    """The earliest time a key's record could have run out of ttl, or None when unknown: it
    was created no earlier than the first request for the key was sent, and kept for the
    shortest ttl of the clients that used the key."""
    t0s = [_num(o.get("t0")) for o in ops if _num(o.get("t0")) is not None]
    ttls = [_num((ttl_s or {}).get(_client(o))) for o in ops]
    if not t0s or not ttls or any(t is None for t in ttls):
        return None
    return min(t0s) + min(ttls)


def _read_lost(op, ack, expiry, tol):
    """What is wrong with a definite read of an acknowledged key's record (a text), or None:
    it must find the record completed with the acknowledged result and status (a tombstone
    or none at all only once its ttl could have ended)."""
    t1 = _num(op.get("t1"))
    ttl_over = expiry is None or (t1 is not None and t1 >= expiry - tol)
    if op.get("outcome") == "not_found" or _int(op.get("status")) == 404:
        return None if ttl_over else "no record (404)"
    if op.get("outcome") != "ok":
        return None  # refused, not an answer about the record (e.g. 429)
    state = op.get("state")
    if state == "tombstone":
        return None if ttl_over else "a tombstone"
    if state != "completed":
        return "the record %s" % state
    if op.get("result") != ack.get("result"):
        return "another stored response: %s, acknowledged %s" % (_short(op.get("result")),
                                                                  _short(ack.get("result")))
    base, st = _answer_status(ack), _int(op.get("stored_status"))
    if base is not None and st is not None and st != base:
        return "stored status %d, acknowledged %d" % (st, base)
    return None


def _check_lost_ack(ops_by_key, execs, tol, ttl_s):
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        ack = _first_ack(ops_by_key[key], execs)
        if ack is None:
            continue
        t_ack = _num(ack.get("t1"))
        expiry = _earliest_expiry(ops_by_key[key], ttl_s)
        for op in sorted(ops_by_key[key], key=_op_order):
            t0 = _num(op.get("t0"))
            if op.get("f") == "read" and _ok(op) and t0 is not None and t0 > t_ack + tol:
                bad = _read_lost(op, ack, expiry, tol)
                if bad:
                    out.append(_v("lost_ack", key,
                                  "op %s (read of the record, t0=%s) found %s, after op %s "
                                  "(%s) delivered the key's recorded result at t1=%s"
                                  % (op.get("id"), _t(t0), bad, ack.get("id"), _client(ack),
                                     _t(t_ack))))
                continue
            if (not _ok(op) or t0 is None or t0 <= t_ack + tol or op.get("changed") is True
                    or not (_client(op) == "proxy" or _is_claim(op))):
                continue
            if _is_replay(op):
                continue
            expired = op.get("outcome") == "expired" or _int(op.get("status")) == 410
            t1 = _num(op.get("t1"))
            if expired and (expiry is None or (t1 is not None and t1 >= expiry - tol)):
                continue
            what = ("status %s" % op.get("status") if _client(op) == "proxy"
                    else "outcome %s" % op.get("outcome"))
            out.append(_v("lost_ack", key,
                          "op %s (%s, sent at t0=%s) was answered %s, not a replay, after op "
                          "%s (%s) delivered the key's recorded result at t1=%s%s"
                          % (op.get("id"), _client(op), _t(t0), what, ack.get("id"),
                             _client(ack), _t(t_ack),
                             "; the record's ttl could not have run out before %s"
                             % _t(expiry) if expired else "")))
    return out


def _check_fences(execs_by_key, allow_equal):
    out = []
    for key in sorted(execs_by_key, key=_key_order):
        best = None  # (fence, exec) of the highest accepted fence so far
        for e in sorted(execs_by_key[key], key=_exec_order):
            f = _int(e.get("fence"))
            if f is None or e.get("accepted") is False:
                continue
            if best is not None and (f < best[0] or (f == best[0] and not allow_equal)):
                out.append(_v("fences", key,
                              "exec %s (t_start=%s) was accepted with fence %d, not above "
                              "fence %d accepted earlier by exec %s (t_start=%s)"
                              % (e.get("exec"), _t(e.get("t_start")), f, best[0],
                                 best[1].get("exec"), _t(best[1].get("t_start")))))
            if best is None or f > best[0]:
                best = (f, e)
    return out


def _grants(ops):
    """The json/lib claims answered acquired, with their token as an int."""
    out = []
    for op in sorted(ops, key=_op_order):
        if _ok(op) and _is_claim(op) and op.get("outcome") == "acquired":
            tok = _int(op.get("token"))
            if tok is not None:
                out.append((op, tok))
    return out


def _check_token_order(ops_by_key, tol):
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        grants = _grants(ops_by_key[key])
        for b, tb in grants:
            prev = _int(b.get("previous_token"))
            if b.get("takeover") is True and prev is not None and tb <= prev:
                out.append(_v("token_order", key,
                              "op %s took over with token %d, not above the token %d it "
                              "fenced off" % (b.get("id"), tb, prev)))
        for a, ta in grants:
            a1 = _num(a.get("t1"))
            for b, tb in grants:
                b0 = _num(b.get("t0"))
                if a is b or a1 is None or b0 is None or a.get("attempt") == b.get("attempt"):
                    continue
                if a1 + tol < b0 and ta > tb:
                    out.append(_v("token_order", key,
                                  "op %s (attempt %s) got token %d at t1=%s, but op %s "
                                  "(attempt %s), sent later at t0=%s, got the lower token %d"
                                  % (a.get("id"), a.get("attempt"), ta, _t(a1), b.get("id"),
                                     b.get("attempt"), _t(b0), tb)))
    return out


def _check_dup_token(ops_by_key):
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        seen = {}  # token -> {attempt: first op}
        for op, tok in _grants(ops_by_key[key]):
            seen.setdefault(tok, {}).setdefault(op.get("attempt"), op)
        for tok in sorted(seen):
            attempts = seen[tok]
            if len(attempts) > 1:
                parts = ["op %s (attempt %s)" % (o.get("id"), a) for a, o in attempts.items()]
                out.append(_v("dup_token", key, "token %d was given to %d attempts: %s"
                              % (tok, len(attempts), ", ".join(parts))))
    return out


def _check_takeover_early(ops_by_key, tol):
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        grants = _grants(ops_by_key[key])
        for op in sorted(ops_by_key[key], key=_op_order):
            if not (_ok(op) and _is_claim(op) and op.get("takeover") is True):
                continue
            prev = _int(op.get("previous_token"))
            t1 = _num(op.get("t1"))
            if prev is None or t1 is None:
                continue
            # The lease may have been granted to an earlier try of the same attempt whose
            # answer was lost (a retry with the attempt id gets the same token back): it
            # began no earlier than the first claim op of that attempt, answered or not.
            attempts = {o.get("attempt") for o, tok in grants if tok == prev and o is not op}
            attempts.discard(None)
            holders = [(o, _num(o.get("t0")), _num(o.get("lease_ms")))
                       for o in ops_by_key[key]
                       if _is_claim(o) and o is not op and o.get("attempt") in attempts]
            holders = [h for h in holders if h[1] is not None and h[2] is not None]
            if not holders:
                continue  # the grant's answer was lost: no lower bound known
            h, h0, lease = min(holders, key=lambda h: (h[1], _op_order(h[0])))
            end = h0 + lease / 1000.0
            if t1 < end - tol:
                out.append(_v("takeover_early", key,
                              "op %s took over token %d at t1=%s, but op %s was granted "
                              "it no earlier than t0=%s with a %sms lease, which could not "
                              "run out before %s (%.4fs early)"
                              % (op.get("id"), prev, _t(t1), h.get("id"), _t(h0),
                                 h.get("lease_ms"), _t(end), end - t1)))
    return out


def _attempts(grants):
    """The attempt ids of some grant ops (None included when one names none)."""
    return {o.get("attempt") for o in grants}


def _lease_floor(ops, attempts):
    """(op, end): the earliest time a lease granted to one of these attempt ids could run
    out, or None when unknown. The grant came no earlier than the first claim op of the
    attempt was sent (answered or not: a retry with the attempt id gets the token an
    earlier try was granted), and lasted at least its lease (a retry only ever lengthens
    it); end is the least t0 + lease_ms / 1000 over those ops."""
    best = None
    for o in sorted(ops, key=_op_order):
        if not _is_claim(o) or o.get("attempt") is None or o.get("attempt") not in attempts:
            continue
        t0, lease = _num(o.get("t0")), _num(o.get("lease_ms"))
        if t0 is None or lease is None:
            continue
        end = t0 + lease / 1000.0
        if best is None or end < best[1]:
            best = (o, end)
    return best


def _released_before(ops, token, t, tol):
    """A release of token sent no later than t (+ tol) that may have taken effect: answered
    ok, or indeterminate (it may have committed). None when there is none."""
    for o in sorted(ops, key=_op_order):
        if o.get("f") != "release" or _int(o.get("token")) != token:
            continue
        t0 = _num(o.get("t0"))
        if t0 is None or t0 > t + tol:
            continue
        if not _ok(o) or o.get("outcome") == "ok":
            return o
    return None


def _check_overlap(ops_by_key, execs_by_key, tol):
    """Two holders' executions both accepted by the ledger, the later one's grant answered
    while the earlier holder's lease certainly still ran and was not given back."""
    out = []
    for key in sorted(execs_by_key, key=_key_order):
        ops = ops_by_key.get(key, [])
        by_tok = {}
        for o, tok in _grants(ops):
            by_tok.setdefault(tok, []).append(o)
        accepted = {}  # fence -> first accepted execution with it
        for e in sorted(execs_by_key[key], key=_exec_order):
            f = _int(e.get("fence"))
            if f is not None and e.get("accepted") is True:
                accepted.setdefault(f, e)
        fences = sorted(f for f in accepted if f in by_tok)
        # One violation per execution that ran beside another holder's: the later fence B,
        # against the lowest fence A whose lease it certainly overlapped.
        for j, fb in enumerate(fences):
            bs = by_tok[fb]
            att_b = _attempts(bs)
            b = min((o for o in bs if _num(o.get("t1")) is not None),
                    key=lambda o: (_num(o.get("t1")), _op_order(o)), default=None)
            if None in att_b or b is None:
                continue
            b1 = _num(b.get("t1"))
            for fa in fences[:j]:
                att_a = _attempts(by_tok[fa])
                if None in att_a or att_a & att_b:
                    continue  # the same attempt: its own retry
                floor = _lease_floor(ops, att_a)
                if floor is None:
                    continue
                h, end = floor
                if b1 >= end - tol:
                    continue  # the lease may have run out: a takeover is no overlap
                if _released_before(ops, fa, b1, tol) is not None:
                    continue  # given back first: the key was free
                ea, eb = accepted[fa], accepted[fb]
                out.append(_v("overlap", key,
                              "exec %s (fence %d, t_start=%s) and exec %s (fence %d, "
                              "t_start=%s) were both accepted, but op %s (attempt %s) was "
                              "granted token %d%s at t1=%s, while the lease on token %d "
                              "(attempt %s, first claimed by op %s at t0=%s with a %sms "
                              "lease) could not run out before %s (%.4fs later) and was "
                              "never released: two holders ran the business at once"
                              % (ea.get("exec"), fa, _t(ea.get("t_start")), eb.get("exec"),
                                 fb, _t(eb.get("t_start")), b.get("id"), b.get("attempt"),
                                 fb, " by takeover of token %s" % b.get("previous_token")
                                 if b.get("takeover") is True else "", _t(b1), fa,
                                 ", ".join(sorted(str(a) for a in att_a)), h.get("id"),
                                 _t(h.get("t0")), h.get("lease_ms"), _t(end), end - b1)))
                break
    return out


def _check_stale_complete(ops_by_key, tol):
    """A complete accepted for a token after a grant of a higher token (another attempt)
    was answered, before any try of that complete was sent."""
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        ops = ops_by_key[key]
        grants = _grants(ops)
        if not grants:
            continue
        completes = [o for o in sorted(ops, key=_op_order)
                     if _client(o) in ("json", "lib") and o.get("f") == "complete"
                     and _int(o.get("token")) is not None]
        first_sent = {}  # token -> earliest t0 of any try of a complete with it
        for o in completes:
            t0 = _num(o.get("t0"))
            tok = _int(o.get("token"))
            if t0 is not None and (tok not in first_sent or t0 < first_sent[tok]):
                first_sent[tok] = t0
        seen = set()
        for op in completes:
            ta = _int(op.get("token"))
            if not (_ok(op) and op.get("outcome") == "ok") or ta in seen:
                continue
            sent = first_sent.get(ta)
            if sent is None:
                continue
            att_a = _attempts([o for o, tok in grants if tok == ta])
            if not att_a or None in att_a:
                continue  # whose token it is is not known
            newer = [(o, tok) for o, tok in grants
                     if tok > ta and o.get("attempt") is not None
                     and o.get("attempt") not in att_a
                     and _num(o.get("t1")) is not None and _num(o.get("t1")) + tol < sent]
            if not newer:
                continue
            seen.add(ta)
            g, tg = min(newer, key=lambda x: (_num(x[0].get("t1")), _op_order(x[0])))
            out.append(_v("stale_complete", key,
                          "op %s (%s complete, t1=%s) was answered ok for token %d, but op %s "
                          "(attempt %s) had been granted the higher token %d%s at t1=%s, "
                          "%.4fs before the first complete with token %d was sent (t0=%s): "
                          "the fenced-off holder's result was recorded, not lease_lost"
                          % (op.get("id"), _client(op), _t(op.get("t1")), ta, g.get("id"),
                             g.get("attempt"), tg, " by takeover" if g.get("takeover") is True
                             else "", _t(g.get("t1")), sent - _num(g.get("t1")), ta,
                             _t(sent))))
    return out


def _check_changed_body(ops, ledger):
    out = []
    for e in sorted(ledger, key=_exec_order):
        if e.get("changed") is True:
            out.append(_v("changed_body", e.get("key"),
                          "exec %s (t_start=%s, fence %s, status %s): a changed body reached "
                          "the upstream" % (e.get("exec"), _t(e.get("t_start")),
                                            e.get("fence"), e.get("status"))))
    for op in sorted(ops, key=_op_order):
        if op.get("changed") is not True or not _ok(op):
            continue
        c = _client(op)
        if c == "proxy" and (_is2xx(op.get("status")) or op.get("replayed") is True):
            out.append(_v("changed_body", op.get("key"),
                          "op %s (proxy, t0=%s t1=%s) sent a changed body and was answered "
                          "%s%s instead of 409 key reused"
                          % (op.get("id"), _t(op.get("t0")), _t(op.get("t1")),
                             op.get("status"),
                             " replayed" if op.get("replayed") is True else "")))
        elif _is_claim(op) and op.get("outcome") in ("acquired", "replay"):
            out.append(_v("changed_body", op.get("key"),
                          "op %s (%s claim, t0=%s t1=%s) with a changed fingerprint was "
                          "answered %s instead of mismatch"
                          % (op.get("id"), c, _t(op.get("t0")), _t(op.get("t1")),
                             op.get("outcome"))))
    return out


def _check_quorum(ops, nemesis, tol, exempt):
    out = []
    windows = [w for w in nemesis if w.get("window") == "no_quorum"
               and _num(w.get("t0")) is not None and _num(w.get("t1")) is not None]
    windows.sort(key=lambda w: (w["t0"], w["t1"], str(w.get("nodes"))))
    if not windows:
        return out
    exempt = set(exempt or ())
    for op in sorted(ops, key=_op_order):
        if not _ok(op):
            continue
        if _int(op.get("status")) in exempt:
            continue
        t0, t1 = _num(op.get("t0")), _num(op.get("t1"))
        if t0 is None or t1 is None:
            continue
        node = op.get("node")
        for w in windows:
            nodes = w.get("nodes")
            if nodes is not None and (node is None or node not in nodes):
                continue
            if t0 >= w["t0"] + tol and t1 <= w["t1"] - tol:
                what = op.get("outcome") if op.get("outcome") is not None else \
                    "status %s" % op.get("status")
                out.append(_v("quorum", op.get("key"),
                              "op %s (%s %s to node %s, t0=%s t1=%s) got a definite answer "
                              "(%s) inside the no-quorum window [%s, %s] of %s"
                              % (op.get("id"), _client(op), op.get("f"), node, _t(t0),
                                 _t(t1), what, _t(w["t0"]), _t(w["t1"]),
                                 "the whole cluster" if nodes is None else "nodes %s"
                                 % list(nodes))))
                break
    return out


def _answer_status(op):
    """The status of the stored response an answer stands for, as an int, or None when the
    op does not say: a proxy answer's HTTP status (its replay's included); a json claim
    replay's HTTP status (the stored one); a lib replay's stored_status; a complete's
    stored_status (the status it asked to store)."""
    c = _client(op)
    if c == "proxy" or (c == "json" and _is_claim(op)):
        return _int(op.get("status"))
    return _int(op.get("stored_status"))


def _is_any_replay(op):
    """Any replay: a proxy answer marked Idempotency-Replayed whatever its status, a json/lib
    claim answered replay."""
    return _ok(op) and ((_client(op) == "proxy" and op.get("replayed") is True) or
                        (_is_claim(op) and op.get("outcome") == "replay"))


def _check_replay_status(ops_by_key, execs):
    """Every replay of a key carries the status of the completion that was acknowledged
    (the key's first recorded successful result)."""
    out = []
    for key in sorted(ops_by_key, key=_key_order):
        ack = _first_ack(ops_by_key[key], execs)
        base = None if ack is None else _answer_status(ack)
        if base is None:
            continue
        for op in sorted(ops_by_key[key], key=_op_order):
            if op is ack or op.get("changed") is True or not _is_any_replay(op):
                continue
            st = _answer_status(op)
            if st is not None and st != base:
                out.append(_v("replay_identical", key,
                              "op %s (%s, t1=%s) replayed status %d, but op %s (%s, t1=%s) "
                              "was acknowledged with status %d"
                              % (op.get("id"), _client(op), _t(op.get("t1")), st,
                                 ack.get("id"), _client(ack), _t(ack.get("t1")), base)))
    return out


def _check_replay_identical(ops, execs):
    out = []
    for op in sorted(ops, key=_op_order):
        if not _is_replay(op):
            continue
        key, result = op.get("key"), op.get("result")
        who = "op %s (%s, t1=%s)" % (op.get("id"), _client(op), _t(op.get("t1")))
        if not isinstance(result, str):
            out.append(_v("replay_identical", key, "%s replayed no result text" % who))
            continue
        ex = _result_exec(result)
        if ex is None:
            out.append(_v("replay_identical", key, "%s replayed a body naming no execution: %s"
                          % (who, _short(result))))
            continue
        e = execs.get(ex)
        if e is None:
            out.append(_v("replay_identical", key, "%s replayed exec %d, which the ledger "
                          "never ran: %s" % (who, ex, _short(result))))
            continue
        if e.get("key") != key:
            out.append(_v("replay_identical", key, "%s replayed exec %d, which ran for key %r"
                          % (who, ex, e.get("key"))))
            continue
        resp = e.get("response")
        if result != resp:
            at = next((i for i, (x, y) in enumerate(zip(result, resp or "")) if x != y),
                      min(len(result), len(resp or "")))
            out.append(_v("replay_identical", key,
                          "%s replayed exec %d with other bytes than the ledger sent "
                          "(first difference at offset %d): replayed %s, sent %s"
                          % (who, ex, at, _short(result), _short(resp))))
    return out


def _check_final(final):
    out = []
    if final.get("recovered") is not True:
        out.append(_v("final", None, "the cluster did not recover after the nemesis stopped "
                      "(recovered=%r, recovery_s=%r)"
                      % (final.get("recovered"), final.get("recovery_s"))))
    if final.get("converged") is not True:
        out.append(_v("final", None, "the replicas did not converge (converged=%r, "
                      "applied_index=%r, digest=%r)" % (final.get("converged"),
                                                        final.get("applied_index"),
                                                        final.get("digest"))))
    for x in final.get("unexpected_exits") or []:
        x = x if isinstance(x, dict) else {"node": None, "status": x}
        out.append(_v("final", None, "node %s exited unexpectedly with status %s"
                      % (x.get("node"), x.get("status"))))
    for x in final.get("driver_exits") or []:
        x = x if isinstance(x, dict) else {"driver": None, "status": x}
        tail = x.get("stderr_tail") or ""
        out.append(_v("final", None, "libidem driver %s exited with status %s %s (every later "
                      "call of its worker went unanswered)%s"
                      % (x.get("driver"), x.get("status"), x.get("at") or "during the run",
                         "; its stderr ends: " + _short(tail[-600:], 620) if tail
                         else "; nothing on its stderr")))
    for x in final.get("log_problems") or []:
        x = x if isinstance(x, dict) else {"node": None, "line": x}
        out.append(_v("final", None, "node %s logged a problem: %s"
                      % (x.get("node"), _short(x.get("line"), 200))))
    return out


def check(ops, ledger, nemesis, final, params=None):
    """Every violation the logs prove, as dicts {"invariant", "key", "detail"}, in a
    deterministic order: by invariant as listed in INVARIANTS, and within one invariant
    by key or by time (ties broken by op / exec id)."""
    p = dict(DEFAULT_PARAMS)
    p.update(params or {})
    tol = float(p["tolerance_s"])
    ops = [o for o in (ops or []) if isinstance(o, dict)]
    ledger = [e for e in (ledger or []) if isinstance(e, dict)]
    nemesis = [n for n in (nemesis or []) if isinstance(n, dict)]

    execs = {}
    for e in sorted(ledger, key=_exec_order):
        i = _int(e.get("exec"))
        if i is not None:
            execs.setdefault(i, e)
    ops_by_key = _by_key(ops)
    execs_by_key = _by_key(ledger)

    out = []
    out += _check_one_result(ops_by_key, execs)
    out += _check_no_exec_after_ack(ops_by_key, execs_by_key, execs, tol)
    out += _check_lost_ack(ops_by_key, execs, tol, p["ttl_s"])
    out += _check_fences(execs_by_key, bool(p["allow_equal_fence"]))
    out += _check_token_order(ops_by_key, tol)
    out += _check_dup_token(ops_by_key)
    out += _check_takeover_early(ops_by_key, tol)
    out += _check_overlap(ops_by_key, execs_by_key, tol)
    out += _check_stale_complete(ops_by_key, tol)
    out += _check_changed_body(ops, ledger)
    out += _check_quorum(ops, nemesis, tol, p["quorum_exempt_status"])
    out += _check_replay_identical(ops, execs)
    out += _check_replay_status(ops_by_key, execs)
    if isinstance(final, dict):
        out += _check_final(final)
    elif final is not None:
        out.append(_v("final", None, "final is not a dict: %s" % _short(final)))
    return out


def load(run_dir):
    """(ops, ledger, nemesis, final) read from a run directory; final None without
    summary.json or without its "final" member."""
    ops = read_jsonl(os.path.join(run_dir, "history.jsonl"))
    ledger = read_jsonl(os.path.join(run_dir, "ledger.jsonl"))
    nemesis = read_jsonl(os.path.join(run_dir, "nemesis.jsonl"))
    final = None
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        if isinstance(summary, dict):
            final = summary.get("final")
    except (OSError, ValueError):
        pass
    return ops, ledger, nemesis, final


def format_violation(v):
    key = "" if v.get("key") is None else " key=%s" % v.get("key")
    return "%s%s: %s" % (v.get("invariant"), key, v.get("detail"))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Check a chaos run's logs against the "
                                 "idempotency invariants.")
    ap.add_argument("dir", help="the run directory (history.jsonl, ledger.jsonl, "
                    "nemesis.jsonl, summary.json)")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_PARAMS["tolerance_s"],
                    help="seconds of slack on every time comparison (default %(default)s)")
    ap.add_argument("--allow-equal-fence", action="store_true",
                    help="let the ledger accept a fence equal to the highest accepted")
    ap.add_argument("--json", action="store_true", help="print the violations as JSON lines")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.dir):
        print("checker: %s is not a directory" % a.dir, file=sys.stderr)
        return 2
    ops, ledger, nemesis, final = load(a.dir)
    vs = check(ops, ledger, nemesis, final, {"tolerance_s": a.tolerance,
                                             "allow_equal_fence": a.allow_equal_fence})
    for v in vs:
        print(json.dumps(v, sort_keys=True) if a.json else format_violation(v))
    counts = {}
    for v in vs:
        counts[v["invariant"]] = counts.get(v["invariant"], 0) + 1
    print("checker: %d ops, %d executions, %d nemesis records%s: %s"
          % (len(ops), len(ledger), len(nemesis), "" if final is not None else
             " (no final state)",
             "no violations" if not vs else "%d violations (%s)" % (
                 len(vs), ", ".join("%s %d" % (k, counts[k]) for k in INVARIANTS
                                   if k in counts))),
          file=sys.stderr if a.json else sys.stdout)
    return 1 if vs else 0


if __name__ == "__main__":
    sys.exit(main())
