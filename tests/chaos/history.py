"""history: the three logs a chaos run writes, and their format (read by checker.py and
report.py; written by chaos.py, workload.py, ledger.py and nemesis.py).

Every time below is time.monotonic() in seconds (CLOCK_MONOTONIC: one clock for every
process of the machine, so the ledger's times and the clients' compare directly).

history.jsonl: one JSON object per client operation, written when the operation ended:
    id          int, unique in the run
    client      "proxy" (an HTTP request through a node's proxy listener to the ledger),
                "json" (the gateway's JSON API), "lib" (libidem over the RPC)
    worker      the worker's name, e.g. "proxy-2"
    node        the node id the request was sent to; None for lib (libidem picks)
    f           "request" (proxy), "claim", "complete", "release" (json, lib); "read" (json:
                the run's final reads of acknowledged keys, GET /v1/claims/KEY, with the
                record's "state", its response's body as "result" and status as
                "stored_status"; outcome "ok", or "not_found" for a 404)
    key         the idempotency key
    t0, t1      invoke and complete times
    type        "ok": a definite answer came back (any HTTP status but 503; for json/lib an
                outcome); "info": indeterminate (503, timeout, connection error, IDEM_E*):
                the operation may or may not have taken effect
    status      HTTP status (proxy, json), None for lib or when no answer came
    code        the error body's "code" (json and proxy error answers), else None
    outcome     json/lib: the outcome name (acquired, replay, in_progress, mismatch,
                lease_expired, outcome_unknown, expired, ok, lease_lost, not_found, ...);
                None for proxy
    changed     True when the request's body (proxy) or fingerprint (json/lib) differs from
                the one the key was first used with: sent only for keys the worker saw a
                recorded result for, so it must be refused (mismatch / 409)
    reordered   proxy: the JSON body's members were sent in another order (same meaning)
    body        proxy: the request body exactly as sent; else None
    attempt     json/lib claim: the attempt id; else None
    lease_ms    json/lib claim: the lease asked for (ms); else None
    policy      json/lib claim: "takeover" or "conflict"; else None
    token       claim acquired: the fencing token; complete/release: the token used
    takeover    claim: True when acquired by takeover of an expired lease
    previous_token  claim by takeover: the token fenced off; else None
    replayed    proxy: Idempotency-Replayed: true; json/lib claim: outcome replay
    recorded    proxy: False when the answer says it was passed on unrecorded
                (Idempotency-Recorded: false), else True; json/lib: True
    result      the business result delivered to the client, as text: proxy: the response
                body of a 2xx answer; json/lib claim replay: the stored response body;
                json/lib complete: the body it asked to store; else None
    stored_status  lib claim replay: the stored response's status; json/lib complete: the
                status it asked to store (201); absent otherwise (a json replay's stored
                status is its HTTP status)
    error       what went wrong for "info" operations (text), else None

ledger.jsonl: one JSON object per request the ledger (the upstream business service) received:
    exec        int, unique execution id (also in its response body)
    key         the Idempotency-Key header
    fence       the Idempotency-Fence header as an int (None when absent)
    body        the request body as received (text)
    changed     True when the body carries the "changed" marker (a changed body: must never
                reach the ledger once the key has a recorded result)
    t_start     when the request arrived; t_end when its answer was sent
    accepted    False when the fence was below the highest accepted for the key (refused
                409 stale_fence, as a fenced downstream would), else True
    status      the status answered (201 accepted, 409 refused)
    response    the response body sent, exactly (a replay must be byte-identical to it)

nemesis.jsonl: one JSON object per fault, written when it was healed, and one per window
without quorum:
    fault:  {"kind": "kill"|"pause"|"quorum"|"partition"|"wipe"|"membership"|"powercut",
             "t0": injected, "t1": healed (restarted, resumed, reconnected, ...),
             "nodes": [ids hit], "leader": whether the leader (as known at t0) was hit,
             "phase": "one_down"|"no_quorum"|"partitioned"|"membership", "detail": text}
    window: {"window": "no_quorum", "t0": ..., "t1": ..., "nodes": None (no node has a
             quorum: every request) or [ids] (these nodes are cut off from the majority:
             requests sent to them)}

summary.json also carries "final": what the run found after the nemesis stopped:
    {"recovered": bool, "recovery_s": float or None, "converged": bool,
     "applied_index": int or None, "digest": str or None,
     "unexpected_exits": [{"node": id, "status": rc}],
     "driver_exits": [{"driver": worker, "status": rc, "at": "during the run" | "at the end
     of its input", "stderr_tail": text}] (libidem drivers that exited while the run used
     them, or exited non-zero once their input ended),
     "log_problems": [{"node": id, "line": text}],
     "final_reads": {"keys": acknowledged keys read back, "answered": definite answers}}
"""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import read_jsonl  # noqa: E402,F401 - the logs' reader, for checker and report


class JsonlWriter:
    """Appends one JSON object per line to path, flushed at once; safe across threads."""

    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, obj):
        line = json.dumps(obj, sort_keys=True)
        with self.lock:
            self.f.write(line + "\n")

    def close(self):
        with self.lock:
            self.f.close()
