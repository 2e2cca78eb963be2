"""report: the figures of a chaos run, a timeline picture of it, and a short summary.

    python3 report.py DIR

reads DIR/history.jsonl, DIR/ledger.jsonl, DIR/nemesis.jsonl (format: history.py) and
DIR/summary.json when present (its "t_start", "t_end", "violations" and "final"), writes
DIR/timeline.svg and prints the summary; its last line is one line starting "chaos:".

Definitions used throughout:
    definite answer   an op of type "ok"
    success           a definite business success: proxy 2xx; json/lib outcome acquired,
                      replay or ok
    claim success     a new claim that went through: proxy 2xx neither replayed nor passed
                      on unrecorded (Idempotency-Recorded: false), or json/lib outcome
                      acquired
    phase of a time   the phase of the fault active then (faults are closed [t0, t1]
                      intervals); of overlapping faults the most severe (PHASE_SEVERITY);
                      "healthy" when none is. No-quorum windows are drawn, not phased.
    recovery          for a fault that hit the leader (kill, pause, partition) and for every
                      quorum fault: from the fault's t0 to the earliest t1 of a claim success
                      among the ops invoked at or after that t0
    p50               nearest-rank median (a sample value)

Only the Python 3 standard library is used.
"""
import bisect
import json
import math
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from history import read_jsonl  # noqa: E402

CLIENTS = ("proxy", "json", "lib")
TYPES = ("ok", "info")
KINDS = ("kill", "pause", "quorum", "partition", "wipe", "membership", "powercut")
PHASES = ("healthy", "one_down", "no_quorum", "partitioned", "membership")
# higher wins when faults overlap
PHASE_SEVERITY = {"healthy": 0, "membership": 1, "one_down": 2, "partitioned": 3,
                  "no_quorum": 4}
SUCCESS_OUTCOMES = ("acquired", "replay", "ok")
RECOVERY_KINDS = ("kill", "pause", "partition", "quorum")
RECOVERY_ANY_LEADER = ("quorum",)  # counted whether or not the leader was hit

BASE_BUCKET_S = 0.1
MAX_BUCKETS = 2000


# ---------------------------------------------------------------------------- predicates

def is_fault(ev):
    return isinstance(ev, dict) and "kind" in ev and "window" not in ev


def is_window(ev):
    return isinstance(ev, dict) and "window" in ev


def is_success(op):
    """A definite business success."""
    if op.get("type") != "ok":
        return False
    if op.get("client") == "proxy":
        st = op.get("status")
        return isinstance(st, int) and 200 <= st < 300
    return op.get("outcome") in SUCCESS_OUTCOMES


def is_claim_success(op):
    """A definite success of a new claim (proof the cluster serves claims)."""
    if op.get("type") != "ok":
        return False
    if op.get("client") == "proxy":
        st = op.get("status")
        return (isinstance(st, int) and 200 <= st < 300 and not op.get("replayed")
                and op.get("recorded") is not False)
    return op.get("outcome") == "acquired"


def _num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def percentile(values, p):
    """Nearest-rank percentile of values (p in 0..100); None when there are none."""
    vals = sorted(v for v in values if _num(v))
    if not vals:
        return None
    k = max(1, math.ceil(p / 100.0 * len(vals)))
    return vals[min(k, len(vals)) - 1]


# ---------------------------------------------------------------------------- phases

def _fault_span(f, t_end):
    t0 = f.get("t0")
    t1 = f.get("t1")
    if not _num(t0):
        return None
    if not _num(t1):
        t1 = t_end if _num(t_end) else t0  # never healed: active to the end
    return (t0, max(t0, t1))


class PhaseMap:
    """The phase of every time, from the faults' [t0, t1] intervals and their "phase"."""

    def __init__(self, faults, t_end=None):
        spans = []
        for f in faults:
            if not is_fault(f):
                continue
            sp = _fault_span(f, t_end)
            ph = f.get("phase")
            if sp is None or ph not in PHASE_SEVERITY:
                continue
            spans.append((sp[0], sp[1], ph))
        self.bounds = sorted({s[0] for s in spans} | {s[1] for s in spans})
        # phase exactly at bounds[i], and on the open interval (bounds[i], bounds[i+1])
        self.at_point = []
        self.after = []
        for i, b in enumerate(self.bounds):
            self.at_point.append(self._worst(spans, lambda a, z: a <= b <= z))
            if i + 1 < len(self.bounds):
                nb = self.bounds[i + 1]
                self.after.append(self._worst(spans, lambda a, z: a <= b and nb <= z))
            else:
                self.after.append("healthy")

    @staticmethod
    def _worst(spans, active):
        best = "healthy"
        for a, z, ph in spans:
            if active(a, z) and PHASE_SEVERITY[ph] > PHASE_SEVERITY[best]:
                best = ph
        return best

    def phase(self, t):
        i = bisect.bisect_left(self.bounds, t)
        if i < len(self.bounds) and self.bounds[i] == t:
            return self.at_point[i]
        if i == 0 or i == len(self.bounds):
            return "healthy"
        return self.after[i - 1]

    def seconds(self, t_start, t_end):
        """Seconds spent in each phase between t_start and t_end."""
        out = {p: 0.0 for p in PHASES}
        if not (_num(t_start) and _num(t_end)) or t_end <= t_start:
            return out
        covered = 0.0
        for i in range(len(self.bounds) - 1):
            a = max(self.bounds[i], t_start)
            z = min(self.bounds[i + 1], t_end)
            ph = self.after[i]
            if z > a and ph != "healthy":
                out[ph] += z - a
                covered += z - a
        out["healthy"] = max(0.0, (t_end - t_start) - covered)
        return out


# ---------------------------------------------------------------------------- figures

def _recovery(ops, faults, t_end):
    """Per fault to recover from: (fault, recovery_s or None)."""
    wins = sorted((op["t0"], op["t1"]) for op in ops
                  if is_claim_success(op) and _num(op.get("t0")) and _num(op.get("t1")))
    starts = [w[0] for w in wins]
    # suffix minimum of t1: the earliest answer among ops invoked at or after starts[i]
    suffix = [math.inf] * (len(wins) + 1)
    for i in range(len(wins) - 1, -1, -1):
        suffix[i] = min(wins[i][1], suffix[i + 1])
    out = []
    for f in faults:
        if f.get("kind") not in RECOVERY_KINDS or not _num(f.get("t0")):
            continue
        if not (f.get("leader") or f.get("kind") in RECOVERY_ANY_LEADER):
            continue
        i = bisect.bisect_left(starts, f["t0"])
        t = suffix[i]
        if t == math.inf or (_num(t_end) and t > t_end):
            out.append((f, None))
        else:
            out.append((f, t - f["t0"]))
    return out


def figures(ops, ledger, nemesis, t_start, t_end):
    """The run's figures as a dict (pure: reads its arguments only)."""
    ops = [op for op in ops if isinstance(op, dict)]
    nemesis = [ev for ev in nemesis if isinstance(ev, dict)]
    ledger = [ex for ex in ledger if isinstance(ex, dict)]
    faults = sorted((ev for ev in nemesis if is_fault(ev)),
                    key=lambda f: f.get("t0") if _num(f.get("t0")) else 0)
    windows = [ev for ev in nemesis if is_window(ev)]
    duration = (t_end - t_start) if _num(t_start) and _num(t_end) else None

    # ops
    by_client = {c: 0 for c in CLIENTS}
    by_type = {t: 0 for t in TYPES}
    successes = 0
    for op in ops:
        c = op.get("client")
        by_client[c] = by_client.get(c, 0) + 1
        t = op.get("type")
        by_type[t] = by_type.get(t, 0) + 1
        if is_success(op):
            successes += 1
    fig_ops = {"total": len(ops), "by_client": by_client, "by_type": by_type,
               "successes": successes}

    # executions
    accepted = sum(1 for ex in ledger if ex.get("accepted") is not False)
    fig_exec = {"total": len(ledger), "accepted": accepted,
                "refused": len(ledger) - accepted}

    # nemesis
    by_kind = {k: 0 for k in KINDS}
    for f in faults:
        by_kind[f.get("kind")] = by_kind.get(f.get("kind"), 0) + 1
    win_s = 0.0
    for w in windows:
        if _num(w.get("t0")) and _num(w.get("t1")):
            win_s += max(0.0, w["t1"] - w["t0"])
    fig_nem = {"faults": len(faults), "by_kind": by_kind,
               "no_quorum_windows": len(windows), "no_quorum_window_s": win_s}

    # availability
    pm = PhaseMap(faults, t_end)
    secs = pm.seconds(t_start, t_end)
    avail = {p: {"ops": 0, "ok": 0, "fraction": None, "seconds": secs[p]} for p in PHASES}
    for op in ops:
        if not _num(op.get("t0")):
            continue
        a = avail[pm.phase(op["t0"])]
        a["ops"] += 1
        if op.get("type") == "ok":
            a["ok"] += 1
    for a in avail.values():
        if a["ops"]:
            a["fraction"] = a["ok"] / a["ops"]

    # recovery
    rec = _recovery(ops, faults, t_end)
    per_kind = {k: [] for k in RECOVERY_KINDS}
    samples, unrecovered, detail = [], 0, []
    for f, r in rec:
        detail.append({"kind": f.get("kind"), "t0": f.get("t0"), "t1": f.get("t1"),
                       "nodes": f.get("nodes"), "leader": bool(f.get("leader")),
                       "recovery_s": r})
        if r is None:
            unrecovered += 1
        else:
            per_kind[f["kind"]].append(r)
            samples.append(r)
    fig_rec = {"per_kind": per_kind, "p50": percentile(samples, 50),
               "max": max(samples) if samples else None, "samples": len(samples),
               "unrecovered": unrecovered, "faults": detail}

    return {"t_start": t_start, "t_end": t_end, "duration_s": duration,
            "ops": fig_ops, "executions": fig_exec, "nemesis": fig_nem,
            "availability": avail, "recovery": fig_rec,
            "ops_per_s": (len(ops) / duration) if duration else None}


# ---------------------------------------------------------------------------- SVG

KIND_COLOURS = {"kill": "#e4572e", "pause": "#f3a712", "quorum": "#8e44ad",
                "partition": "#2e86de", "wipe": "#795548", "membership": "#27ae60",
                "powercut": "#e84393"}
OTHER_COLOUR = "#7f8c8d"
ANSWER_COLOUR = "#1b4f72"
ERROR_COLOUR = "#b03a2e"
FONT = "font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\""


def bucket_width(duration):
    """The narrowest 'nice' bucket (>= 100 ms) giving at most MAX_BUCKETS buckets."""
    if not duration or duration <= 0:
        return BASE_BUCKET_S
    need = duration / MAX_BUCKETS
    if need <= BASE_BUCKET_S:
        return BASE_BUCKET_S
    mag = 10 ** math.floor(math.log10(need))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= need - 1e-12:
            return m * mag
    return 10 * mag


def nice_step(span, target):
    """A 1/2/5 x 10^n step giving about target intervals over span."""
    if span <= 0:
        return 1
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _fmt_num(v):
    if abs(v - round(v)) < 1e-9:
        return str(int(round(v)))
    return ("%.2f" % v).rstrip("0").rstrip(".")


def _fmt_width(s):
    return ("%d ms" % round(s * 1000)) if s < 1 else ("%s s" % _fmt_num(s))


def _series(ops, t_start, t_end, width):
    n = max(1, int(math.ceil((t_end - t_start) / width - 1e-9)))
    ok = [0] * n
    info = [0] * n
    for op in ops:
        t = op.get("t1") if _num(op.get("t1")) else op.get("t0")
        if not _num(t) or t < t_start or t > t_end:
            continue
        i = min(n - 1, int((t - t_start) / width))
        if op.get("type") == "ok":
            ok[i] += 1
        else:
            info[i] += 1
    return n, ok, info


def timeline_svg(ops, nemesis, t_start, t_end, path):
    """Writes a self-contained SVG timeline of the run to path; returns path."""
    ops = [op for op in ops if isinstance(op, dict)]
    nemesis = [ev for ev in nemesis if isinstance(ev, dict)]
    if not (_num(t_start) and _num(t_end)) or t_end <= t_start:
        ts = [op[k] for op in ops for k in ("t0", "t1") if _num(op.get(k))]
        t_start = min(ts) if ts else 0.0
        t_end = max(ts) if ts else t_start + 1.0
        if t_end <= t_start:
            t_end = t_start + 1.0
    duration = t_end - t_start
    faults = sorted((ev for ev in nemesis if is_fault(ev)),
                    key=lambda f: f.get("t0") if _num(f.get("t0")) else 0)
    windows = [ev for ev in nemesis if is_window(ev)]
    width = bucket_width(duration)
    n, ok, info = _series(ops, t_start, t_end, width)

    kinds = [k for k in KINDS if any(f.get("kind") == k for f in faults)]
    kinds += sorted({str(f.get("kind")) for f in faults} - set(KINDS))
    W = 1400
    ML, MR = 100, 36
    PW = W - ML - MR
    lane_h, lane_gap = 15, 3
    lanes = kinds + (["no quorum"] if windows else [])
    y_lanes = 112
    lanes_h = len(lanes) * (lane_h + lane_gap)
    y_top = y_lanes + lanes_h + 14          # answers panel
    h_top = 250
    y_bot = y_top + h_top + 26               # errors panel
    h_bot = 120
    y_axis = y_bot + h_bot
    H = y_axis + 52

    def X(t):
        return ML + (min(max(t, t_start), t_end) - t_start) / duration * PW

    # legend (laid out first: it may take more than one row)
    items = []
    for k in kinds:
        items.append(("band", KIND_COLOURS.get(k, OTHER_COLOUR), k))
    if windows:
        items.append(("hatch", None, "no quorum (all nodes)"))
        items.append(("hatch-part", None, "no quorum (some nodes)"))
    items.append(("area", ANSWER_COLOUR, "definite answers / %s" % _fmt_width(width)))
    items.append(("area", ERROR_COLOUR, "errors (info) / %s" % _fmt_width(width)))
    placed = []
    lx, ly = ML, 72
    for item in items:
        tw = int(6.8 * len(item[2])) + 44
        if lx + tw > W - MR and lx > ML:
            lx, ly = ML, ly + 20
        placed.append((lx, ly) + item)
        lx += tw
    shift = max(0, ly - 72)
    y_lanes += shift
    y_top += shift
    y_bot += shift
    y_axis += shift
    H += shift

    out = []
    a = out.append
    a('<?xml version="1.0" encoding="UTF-8"?>')
    a('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
      'viewBox="0 0 %d %d" %s font-size="12">' % (W, H, W, H, FONT))
    a('<defs>')
    a('<pattern id="hatch" width="8" height="8" patternUnits="userSpaceOnUse" '
      'patternTransform="rotate(45)"><rect width="8" height="8" fill="#000" '
      'fill-opacity="0.10"/><line x1="0" y1="0" x2="0" y2="8" stroke="#000" '
      'stroke-width="3" stroke-opacity="0.45"/></pattern>')
    a('<pattern id="hatch-part" width="8" height="8" patternUnits="userSpaceOnUse" '
      'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="8" stroke="#000" '
      'stroke-width="1.5" stroke-opacity="0.35"/></pattern>')
    a('</defs>')
    a('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>' % (W, H))

    # title
    nfaults = len(faults)
    title = "idemd chaos run: %s s, %s ops, %d fault%s" % (
        _fmt_num(round(duration, 1)), format(len(ops), ","), nfaults,
        "" if nfaults == 1 else "s")
    a('<text x="%d" y="28" font-size="18" font-weight="bold" fill="#222">%s</text>'
      % (ML, escape(title)))
    sub = ("definite answers %s, indeterminate %s; counted by completion time in buckets "
           "of %s; lane labels: nodes hit, * = the leader was hit"
           % (format(sum(ok), ","), format(sum(info), ","), _fmt_width(width)))
    a('<text x="%d" y="48" fill="#555">%s</text>' % (ML, escape(sub)))
    for lx, ly, kind, colour, label in placed:
        if kind == "band":
            a('<rect x="%d" y="%d" width="18" height="12" fill="%s" fill-opacity="0.55"/>'
              % (lx, ly - 10, colour))
        elif kind in ("hatch", "hatch-part"):
            a('<rect x="%d" y="%d" width="18" height="12" fill="url(#%s)" stroke="#555" '
              'stroke-width="0.5"/>' % (lx, ly - 10, kind))
        else:
            a('<rect x="%d" y="%d" width="18" height="12" fill="%s" fill-opacity="0.3" '
              'stroke="%s" stroke-width="1.5"/>' % (lx, ly - 10, colour, colour))
        a('<text x="%d" y="%d" fill="#333">%s</text>' % (lx + 24, ly, escape(label)))

    # lanes: one row per fault kind, solid bars with the nodes hit
    for li, name in enumerate(lanes):
        y = y_lanes + li * (lane_h + lane_gap)
        a('<rect x="%d" y="%d" width="%d" height="%d" fill="#f4f4f4"/>'
          % (ML, y, PW, lane_h))
        a('<text x="%d" y="%d" text-anchor="end" fill="#333" font-size="11">%s</text>'
          % (ML - 6, y + lane_h - 3, escape(name)))
    lane_of = {k: i for i, k in enumerate(lanes)}

    def tip(ev, label):
        t0 = ev.get("t0")
        t1 = ev.get("t1")
        s = "%s %s-%s s" % (label, _fmt_num(round(t0 - t_start, 2)) if _num(t0) else "?",
                            _fmt_num(round(t1 - t_start, 2)) if _num(t1) else "?")
        if ev.get("nodes") is not None:
            s += " nodes %s" % ev.get("nodes")
        if ev.get("leader"):
            s += " (leader)"
        if ev.get("phase"):
            s += " phase %s" % ev.get("phase")
        if ev.get("detail"):
            s += ": %s" % ev.get("detail")
        return "<title>%s</title>" % escape(s)

    # fault bands across both panels, and the lane bars
    band_y, band_h = y_top, y_axis - y_top
    for f in faults:
        sp = _fault_span(f, t_end)
        if sp is None or sp[1] < t_start or sp[0] > t_end:
            continue
        x0, x1 = X(sp[0]), X(sp[1])
        w = max(1.5, x1 - x0)
        colour = KIND_COLOURS.get(f.get("kind"), OTHER_COLOUR)
        a('<rect class="band" data-kind="%s" x="%.1f" y="%d" width="%.1f" height="%d" '
          'fill="%s" fill-opacity="0.16">%s</rect>'
          % (escape(str(f.get("kind"))), x0, band_y, w, band_h, colour,
             tip(f, str(f.get("kind")))))
        ly_ = y_lanes + lane_of[str(f.get("kind"))] * (lane_h + lane_gap)
        a('<rect class="lane" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" '
          'fill-opacity="0.85" stroke="%s" stroke-width="0.6">%s</rect>'
          % (x0, ly_, w, lane_h, colour, "#00000055", tip(f, str(f.get("kind")))))
        nodes = f.get("nodes")
        if isinstance(nodes, list) and nodes:
            label = ",".join(str(x) for x in nodes) + ("*" if f.get("leader") else "")
            if 7 * len(label) + 4 < w:
                a('<text x="%.1f" y="%d" fill="#fff" font-size="10" font-weight="bold">'
                  '%s</text>' % (x0 + 3, ly_ + lane_h - 4, escape(label)))
    for wv in windows:
        sp = _fault_span(wv, t_end)
        if sp is None or sp[1] < t_start or sp[0] > t_end:
            continue
        x0, x1 = X(sp[0]), X(sp[1])
        w = max(1.5, x1 - x0)
        pat = "hatch" if wv.get("nodes") is None else "hatch-part"
        a('<rect class="window" x="%.1f" y="%d" width="%.1f" height="%d" fill="url(#%s)">'
          '%s</rect>' % (x0, band_y, w, band_h, pat, tip(wv, "no quorum")))
        ly_ = y_lanes + lane_of["no quorum"] * (lane_h + lane_gap)
        a('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="url(#%s)" stroke="#333" '
          'stroke-width="0.6">%s</rect>' % (x0, ly_, w, lane_h, pat, tip(wv, "no quorum")))

    # panels
    def panel(y0, h, values, colour, label):
        vmax = max(values) if values else 0
        step = max(1, nice_step(vmax if vmax > 0 else 1, 4 if h < 150 else 5))  # counts
        top = step * max(1, math.ceil((vmax if vmax > 0 else 1) / step))

        def Y(v):
            return y0 + h - v / top * h
        v = 0
        while v <= top + 1e-9:
            y = Y(v)
            a('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd" stroke-width="1"/>'
              % (ML, y, ML + PW, y))
            a('<text x="%d" y="%.1f" text-anchor="end" fill="#444" font-size="11">%s</text>'
              % (ML - 6, y + 4, _fmt_num(v)))
            v += step
        a('<text transform="translate(%d,%.1f) rotate(-90)" text-anchor="middle" '
          'fill="#333" font-size="11">%s</text>' % (16, y0 + h / 2, escape(label)))
        pts = []
        for i, val in enumerate(values):
            pts.append((ML + (i + 0.5) * width / duration * PW, Y(val)))
        if pts:
            line = " ".join("%.1f,%.1f" % p for p in pts)
            area = "M%.1f,%.1f L%s L%.1f,%.1f Z" % (pts[0][0], Y(0), line.replace(" ", " L"),
                                                     pts[-1][0], Y(0))
            a('<path class="series" d="%s" fill="%s" fill-opacity="0.22" stroke="none"/>'
              % (area, colour))
            a('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.3" '
              'stroke-linejoin="round"/>' % (line, colour))
        a('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888" '
          'stroke-width="1"/>' % (ML, y0, PW, h))

    panel(y_top, h_top, ok, ANSWER_COLOUR, "definite answers per %s" % _fmt_width(width))
    panel(y_bot, h_bot, info, ERROR_COLOUR, "errors per %s" % _fmt_width(width))

    # x axis
    step = nice_step(duration, 15)
    v = 0.0
    while v <= duration + 1e-9:
        x = ML + v / duration * PW
        a('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>'
          % (x, y_axis, x, y_axis + 5))
        a('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-opacity="0.06"/>'
          % (x, y_top, x, y_axis))
        a('<text x="%.1f" y="%d" text-anchor="middle" fill="#444" font-size="11">%s</text>'
          % (x, y_axis + 18, _fmt_num(v)))
        v += step
    a('<text x="%.1f" y="%d" text-anchor="middle" fill="#333">seconds since start</text>'
      % (ML + PW / 2, y_axis + 38))
    a('</svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


# ---------------------------------------------------------------------------- summary

def _pct(fr):
    """A fraction as a percentage rounded down, so only a perfect score shows 100.0%."""
    if fr is None:
        return "n/a"
    return "%.1f%%" % (math.floor(fr * 1000 + 1e-9) / 10)


def _secs(v):
    return "n/a" if v is None else "%.2f s" % v


def count_violations(violations):
    """How many violations: None (unknown), an int, a list, or a dict of lists/counts."""
    if violations is None:
        return None
    if isinstance(violations, bool):
        return int(violations)
    if isinstance(violations, int):
        return violations
    if isinstance(violations, dict):
        total = 0
        for v in violations.values():
            c = count_violations(v)
            total += c or 0
        return total
    if isinstance(violations, (list, tuple)):
        return len(violations)
    return None


def _violation_texts(violations, limit):
    out = []
    if isinstance(violations, dict):
        for k, v in violations.items():
            if isinstance(v, (list, tuple)):
                for x in v:
                    out.append("%s: %s" % (k, _one(x)))
            elif v:
                out.append("%s: %s" % (k, v))
    elif isinstance(violations, (list, tuple)):
        out = [_one(x) for x in violations]
    return out[:limit], max(0, len(out) - limit)


def _one(x):
    if isinstance(x, dict):
        kind = x.get("invariant") or x.get("kind") or x.get("check") or x.get("type") or "violation"
        msg = x.get("message") or x.get("msg") or x.get("detail") or x.get("text")
        if msg is None:
            msg = json.dumps({k: v for k, v in x.items() if k not in ("kind", "check")},
                             sort_keys=True)
        s = "%s: %s" % (kind, msg)
    else:
        s = str(x)
    return s if len(s) <= 200 else s[:197] + "..."


def summary_lines(fig, violations, final):
    """Human-readable summary; the last line is the one-line "chaos:" verdict."""
    lines = []
    o = fig["ops"]
    ops_s = fig.get("ops_per_s")
    lines.append("ops: %d (%s ops/s) proxy %d json %d lib %d; definite %d, indeterminate %d; "
                 "successes %d" % (
                     o["total"], "n/a" if ops_s is None else "%.1f" % ops_s,
                     o["by_client"].get("proxy", 0), o["by_client"].get("json", 0),
                     o["by_client"].get("lib", 0), o["by_type"].get("ok", 0),
                     o["by_type"].get("info", 0), o["successes"]))
    e = fig["executions"]
    lines.append("ledger: %d executions, %d accepted, %d refused (stale fence)"
                 % (e["total"], e["accepted"], e["refused"]))
    nm = fig["nemesis"]
    kinds = ", ".join("%s %d" % (k, c) for k, c in nm["by_kind"].items() if c)
    lines.append("nemesis: %d faults%s; %d no-quorum windows (%.1f s)"
                 % (nm["faults"], " (%s)" % kinds if kinds else "",
                    nm["no_quorum_windows"], nm["no_quorum_window_s"]))
    for p in PHASES:
        av = fig["availability"][p]
        if av["ops"] or av["seconds"]:
            lines.append("availability %-11s %7s of %d ops over %.1f s"
                         % (p, _pct(av["fraction"]), av["ops"], av["seconds"]))
    r = fig["recovery"]
    per = "; ".join("%s %s" % (k, " ".join("%.2f" % x for x in v))
                    for k, v in r["per_kind"].items() if v)
    lines.append("recovery: p50 %s max %s over %d faults%s%s" % (
        _secs(r["p50"]), _secs(r["max"]), r["samples"],
        ", %d without recovery before the end" % r["unrecovered"] if r["unrecovered"]
        else "", " (%s)" % per if per else ""))
    if isinstance(final, dict):
        parts = []
        if "recovered" in final:
            parts.append("recovered %s" % ("yes" if final.get("recovered") else "NO"))
        if final.get("recovery_s") is not None:
            parts.append("in %.2f s" % final["recovery_s"])
        if "converged" in final:
            parts.append("converged %s" % ("yes" if final.get("converged") else "NO"))
        if final.get("applied_index") is not None:
            parts.append("applied index %s" % final["applied_index"])
        if final.get("digest"):
            parts.append("digest %s" % str(final["digest"])[:16])
        ux = final.get("unexpected_exits") or []
        dx = final.get("driver_exits") or []
        lp = final.get("log_problems") or []
        parts.append("%d unexpected exits, %s%d log problems"
                     % (len(ux), "%d libidem driver exits, " % len(dx) if dx else "", len(lp)))
        fr = final.get("final_reads")
        if isinstance(fr, dict):
            parts.append("%s of %s acknowledged keys read back"
                         % (fr.get("answered"), fr.get("keys")))
        lines.append("final: " + ", ".join(parts))
        for x in ux[:5]:
            lines.append("  unexpected exit: node %s status %s%s"
                         % (x.get("node"), x.get("status"),
                            " (%s)" % x["at"] if x.get("at") else ""))
        for x in dx[:5]:
            tail = (x.get("stderr_tail") or "").splitlines()
            lines.append("  libidem driver exit: %s status %s %s%s"
                         % (x.get("driver"), x.get("status"), x.get("at"),
                            "; stderr ends:" if tail else "; nothing on its stderr"))
            for t in tail[-10:]:
                lines.append("    | " + t[:200])
        for x in lp[:5]:
            lines.append("  log problem: node %s: %s" % (x.get("node"), x.get("line")))
    nv = count_violations(violations)
    texts, more = _violation_texts(violations, 10)
    for t in texts:
        lines.append("VIOLATION " + t)
    if more:
        lines.append("... and %d more violations" % more)

    av = " ".join("%s %s" % (p, _pct(fig["availability"][p]["fraction"])) for p in PHASES)
    lines.append("chaos: %d ops, %d faults%s, %s violations, availability %s, recovery p50 "
                 "%s max %s%s" % (
                     o["total"], nm["faults"], " (%s)" % kinds if kinds else "",
                     "?" if nv is None else nv, av, _secs(r["p50"]), _secs(r["max"]),
                     " (%d unrecovered)" % r["unrecovered"] if r["unrecovered"] else ""))
    return lines


# ---------------------------------------------------------------------------- main

def _first_num(d, names):
    for n in names:
        if _num(d.get(n)):
            return d[n]
    return None


def run(d, out=None):
    """Reads the run in directory d, writes d/timeline.svg, prints the summary to out
    (stdout by default); returns (figures, summary lines)."""
    out = sys.stdout if out is None else out
    ops = read_jsonl(os.path.join(d, "history.jsonl"))
    ledger = read_jsonl(os.path.join(d, "ledger.jsonl"))
    nemesis = read_jsonl(os.path.join(d, "nemesis.jsonl"))
    summary = {}
    try:
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        if not isinstance(summary, dict):
            summary = {}
    except (FileNotFoundError, ValueError):
        summary = {}
    t_start = _first_num(summary, ("t_start", "t0", "start"))
    t_end = _first_num(summary, ("t_end", "t1", "end"))
    if t_start is None or t_end is None:
        ts = [op[k] for op in ops for k in ("t0", "t1") if _num(op.get(k))]
        if not ts:
            ts = [ev[k] for ev in nemesis for k in ("t0", "t1") if _num(ev.get(k))]
        if t_start is None:
            t_start = min(ts) if ts else 0.0
        if t_end is None:
            t_end = max(ts) if ts else t_start
    fig = figures(ops, ledger, nemesis, t_start, t_end)
    svg = os.path.join(d, "timeline.svg")
    timeline_svg(ops, nemesis, t_start, t_end, svg)
    lines = summary_lines(fig, summary.get("violations"), summary.get("final"))
    lines.insert(0, "timeline: %s" % svg)
    for line in lines:
        print(line, file=out)
    return fig, lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: report.py DIR", file=sys.stderr)
        return 2
    if not os.path.isdir(argv[0]):
        print("report.py: %s: not a directory" % argv[0], file=sys.stderr)
        return 2
    run(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
