"""Unit tests of report.py on small synthetic histories.

    cd tests/chaos && python3 -m unittest -v test_report
"""
import contextlib
import io
import json
import os
import re
import shutil
import tempfile
import unittest
import xml.etree.ElementTree as ET

import report

SVG_NS = "{http://www.w3.org/2000/svg}"


def op(i, t0, t1, client="json", type_="ok", f="claim", outcome="acquired", status=None,
       replayed=False, recorded=True):
    d = {"id": i, "client": client, "worker": "%s-0" % client, "node": 1, "f": f,
         "key": "k%d" % i, "t0": t0, "t1": t1, "type": type_, "status": status,
         "code": None, "outcome": outcome, "replayed": replayed, "recorded": recorded}
    if client == "proxy":
        d["outcome"] = None
        d["f"] = "request"
    if type_ == "info":
        d["outcome"] = None
        d["error"] = "timeout"
    return d


def fault(kind, t0, t1, phase, leader=False, nodes=(1,)):
    return {"kind": kind, "t0": t0, "t1": t1, "nodes": list(nodes), "leader": leader,
            "phase": phase, "detail": "test %s" % kind}


class PhaseTest(unittest.TestCase):
    def test_no_fault_is_healthy(self):
        pm = report.PhaseMap([])
        self.assertEqual(pm.phase(5.0), "healthy")
        self.assertEqual(pm.seconds(0, 10)["healthy"], 10)

    def test_overlaps_take_the_most_severe(self):
        faults = [fault("membership", 0, 10, "membership"),
                  fault("kill", 2, 8, "one_down"),
                  fault("partition", 3, 5, "partitioned"),
                  fault("quorum", 4, 4.5, "no_quorum"),
                  {"window": "no_quorum", "t0": 20, "t1": 30, "nodes": None}]
        pm = report.PhaseMap(faults)
        cases = [(-1, "healthy"), (0, "membership"), (1, "membership"), (2, "one_down"),
                 (2.5, "one_down"), (3, "partitioned"), (4, "no_quorum"),
                 (4.25, "no_quorum"), (4.5, "no_quorum"), (4.6, "partitioned"),
                 (5, "partitioned"), (5.1, "one_down"), (8, "one_down"),
                 (9, "membership"), (10, "membership"), (10.5, "healthy"),
                 (25, "healthy")]  # windows are drawn, not phased
        for t, want in cases:
            self.assertEqual(pm.phase(t), want, "t=%s" % t)
        s = pm.seconds(-2, 12)
        self.assertAlmostEqual(s["no_quorum"], 0.5)
        self.assertAlmostEqual(s["partitioned"], 1.5)
        self.assertAlmostEqual(s["one_down"], 4.0)
        self.assertAlmostEqual(s["membership"], 4.0)
        self.assertAlmostEqual(s["healthy"], 4.0)
        self.assertAlmostEqual(sum(s.values()), 14.0)

    def test_seconds_clipped_to_the_run(self):
        pm = report.PhaseMap([fault("kill", -5, 5, "one_down")])
        s = pm.seconds(0, 20)
        self.assertAlmostEqual(s["one_down"], 5)
        self.assertAlmostEqual(s["healthy"], 15)

    def test_unhealed_fault_lasts_to_the_end(self):
        f = fault("kill", 5, None, "one_down")
        pm = report.PhaseMap([f], t_end=20)
        self.assertEqual(pm.phase(19), "one_down")


class FiguresTest(unittest.TestCase):
    def setUp(self):
        self.nemesis = [
            fault("kill", 10, 20, "one_down", leader=True),
            fault("quorum", 30, 40, "no_quorum", leader=False, nodes=(1, 2)),
            fault("pause", 50, 55, "one_down", leader=False),
            fault("partition", 90, 95, "partitioned", leader=True),  # never recovered
            {"window": "no_quorum", "t0": 30, "t1": 40, "nodes": None},
        ]
        ops = []
        i = 0
        # healthy 0..10: 4 ok of 4
        for t in (1, 3, 5, 7):
            ops.append(op(i, t, t + 0.1)); i += 1
        # one_down 10..20: 3 ok of 4; the first claim success after 10 ends at 12.5
        ops.append(op(i, 10, 11, type_="info")); i += 1
        ops.append(op(i, 10.5, 12.5, client="proxy", status=201, outcome=None)); i += 1
        ops.append(op(i, 11, 13, outcome="replay")); i += 1  # not a claim success
        ops.append(op(i, 14, 14.2, client="lib")); i += 1
        # no_quorum 30..40: 0 of 2
        ops.append(op(i, 31, 33, type_="info")); i += 1
        ops.append(op(i, 35, 37, client="proxy", type_="info", status=503)); i += 1
        # healthy after: a replayed proxy 2xx at 40.5 does not count; acquired at 41..41.4
        ops.append(op(i, 40.5, 40.6, client="proxy", status=200, replayed=True)); i += 1
        ops.append(op(i, 41, 41.4)); i += 1
        ops.append(op(i, 60, 60.1, client="proxy", status=409, outcome=None)); i += 1
        ops.append(op(i, 61, 61.2, f="complete", outcome="ok")); i += 1
        # partitioned 90..95: 1 ok (in_progress, a definite answer but not a success) of 2
        ops.append(op(i, 91, 91.1, outcome="in_progress")); i += 1
        ops.append(op(i, 92, 94, type_="info")); i += 1
        self.ops = ops
        self.ledger = [{"exec": 1, "accepted": True}, {"exec": 2, "accepted": True},
                       {"exec": 3, "accepted": False}]
        self.fig = report.figures(ops, self.ledger, self.nemesis, 0.0, 100.0)

    def test_ops(self):
        o = self.fig["ops"]
        self.assertEqual(o["total"], len(self.ops))
        self.assertEqual(o["by_client"]["proxy"], 4)
        self.assertEqual(o["by_client"]["lib"], 1)
        self.assertEqual(o["by_client"]["json"], len(self.ops) - 5)
        self.assertEqual(o["by_type"]["info"], 4)
        self.assertEqual(o["by_type"]["ok"], len(self.ops) - 4)
        # 4 early + proxy 201 + replay + lib + proxy 200 replayed + acquired + complete ok
        self.assertEqual(o["successes"], 10)
        self.assertAlmostEqual(self.fig["ops_per_s"], len(self.ops) / 100.0)

    def test_executions_and_nemesis(self):
        self.assertEqual(self.fig["executions"],
                         {"total": 3, "accepted": 2, "refused": 1})
        n = self.fig["nemesis"]
        self.assertEqual(n["faults"], 4)
        self.assertEqual(n["by_kind"]["kill"], 1)
        self.assertEqual(n["by_kind"]["wipe"], 0)
        self.assertEqual(n["no_quorum_windows"], 1)
        self.assertAlmostEqual(n["no_quorum_window_s"], 10)

    def test_availability(self):
        av = self.fig["availability"]
        self.assertEqual((av["one_down"]["ops"], av["one_down"]["ok"]), (4, 3))
        self.assertAlmostEqual(av["one_down"]["fraction"], 0.75)
        self.assertEqual((av["no_quorum"]["ops"], av["no_quorum"]["ok"]), (2, 0))
        self.assertEqual(av["no_quorum"]["fraction"], 0.0)
        self.assertAlmostEqual(av["partitioned"]["fraction"], 0.5)
        self.assertEqual(av["healthy"]["ops"], 8)
        self.assertAlmostEqual(av["healthy"]["fraction"], 1.0)
        self.assertEqual(av["membership"]["ops"], 0)
        self.assertIsNone(av["membership"]["fraction"])
        self.assertAlmostEqual(av["one_down"]["seconds"], 15)
        self.assertAlmostEqual(av["no_quorum"]["seconds"], 10)
        self.assertAlmostEqual(av["partitioned"]["seconds"], 5)
        self.assertAlmostEqual(av["healthy"]["seconds"], 70)

    def test_recovery(self):
        r = self.fig["recovery"]
        # kill (leader) at 10: the proxy 201 invoked at 10.5 answered at 12.5
        self.assertEqual(len(r["per_kind"]["kill"]), 1)
        self.assertAlmostEqual(r["per_kind"]["kill"][0], 2.5)
        # quorum at 30 (counted without the leader): replayed 2xx skipped; acquired at 41.4
        self.assertAlmostEqual(r["per_kind"]["quorum"][0], 11.4)
        # pause did not hit the leader: not counted
        self.assertEqual(r["per_kind"]["pause"], [])
        # partition (leader) at 90: no claim success afterwards
        self.assertEqual(r["per_kind"]["partition"], [])
        self.assertEqual(r["unrecovered"], 1)
        self.assertEqual(r["samples"], 2)
        self.assertAlmostEqual(r["p50"], 2.5)  # nearest rank of [2.5, 11.4]
        self.assertAlmostEqual(r["max"], 11.4)

    def test_recovery_takes_the_earliest_answer(self):
        # an op invoked first but answered late does not hide an earlier answer
        ops = [op(0, 10.1, 15.0), op(1, 10.2, 10.6)]
        fig = report.figures(ops, [], [fault("kill", 10, 11, "one_down", leader=True)],
                             0, 20)
        self.assertAlmostEqual(fig["recovery"]["per_kind"]["kill"][0], 0.6)

    def test_recovery_none(self):
        fig = report.figures([op(0, 1, 2)], [], [], 0, 10)
        self.assertIsNone(fig["recovery"]["p50"])
        self.assertIsNone(fig["recovery"]["max"])
        self.assertEqual(fig["recovery"]["unrecovered"], 0)

    def test_percentile(self):
        self.assertIsNone(report.percentile([], 50))
        self.assertEqual(report.percentile([3], 50), 3)
        self.assertEqual(report.percentile([4, 1, 3, 2], 50), 2)
        self.assertEqual(report.percentile([5, 1, 3], 50), 3)
        self.assertEqual(report.percentile([5, 1, 3], 100), 5)

    def test_summary_last_line(self):
        final = {"recovered": True, "recovery_s": 1.5, "converged": True,
                 "applied_index": 42, "digest": "abc", "unexpected_exits": [],
                 "log_problems": [{"node": 2, "line": "ERROR x"}]}
        lines = report.summary_lines(self.fig, [{"kind": "lost", "message": "m"}], final)
        self.assertTrue(all(isinstance(x, str) and "\n" not in x for x in lines))
        last = lines[-1]
        self.assertTrue(last.startswith("chaos: "), last)
        self.assertRegex(last, r"^chaos: %d ops, " % len(self.ops))
        self.assertIn("4 faults (kill 1, pause 1, quorum 1, partition 1)", last)
        self.assertIn(", 1 violations,", last)
        self.assertIn("healthy 100.0%", last)
        self.assertIn("one_down 75.0%", last)
        self.assertIn("no_quorum 0.0%", last)
        self.assertIn("membership n/a", last)
        self.assertRegex(last, r"recovery p50 2\.50 s max 11\.40 s")
        self.assertIn("1 unrecovered", last)
        self.assertTrue(any("VIOLATION lost: m" in x for x in lines))
        self.assertTrue(any("log problem" in x for x in lines))

    def test_summary_shows_driver_exits(self):
        final = {"recovered": True, "converged": True, "unexpected_exits": [],
                 "driver_exits": [{"driver": "lib-2", "status": 7, "at": "during the run",
                                   "stderr_tail": "a\nSUMMARY: AddressSanitizer: x"}],
                 "log_problems": []}
        lines = report.summary_lines(self.fig, [], final)
        self.assertTrue(all(isinstance(x, str) and "\n" not in x for x in lines))
        self.assertTrue(any("1 libidem driver exits" in x for x in lines), lines)
        self.assertTrue(any("libidem driver exit: lib-2 status 7" in x for x in lines), lines)
        self.assertTrue(any("SUMMARY: AddressSanitizer" in x for x in lines), lines)

    def test_summary_without_violations_or_final(self):
        fig = report.figures([], [], [], 0, 1)
        last = report.summary_lines(fig, None, None)[-1]
        self.assertRegex(last, r"^chaos: 0 ops, 0 faults, \? violations, availability "
                               r".*recovery p50 n/a max n/a$")
        self.assertIn(", 0 violations,", report.summary_lines(fig, [], None)[-1])
        self.assertIn(", 3 violations,",
                      report.summary_lines(fig, {"a": [1, 2], "b": 1}, None)[-1])

    def test_percent_rounds_down(self):
        self.assertEqual(report._pct(0.99999), "99.9%")
        self.assertEqual(report._pct(1.0), "100.0%")
        self.assertEqual(report._pct(None), "n/a")


class SvgTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_report")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def _parse(self, path):
        root = ET.parse(path).getroot()
        self.assertEqual(root.tag, SVG_NS + "svg")
        return root

    def test_well_formed_with_one_band_per_fault(self):
        nemesis = [fault("kill", 10, 20, "one_down", leader=True),
                   fault("partition", 15, 25, "partitioned", nodes=(3,)),
                   fault("membership", 30, 31, "membership"),
                   fault("weird<&>", 40, 41, "one_down"),
                   {"window": "no_quorum", "t0": 15, "t1": 25, "nodes": [3]},
                   {"window": "no_quorum", "t0": 50, "t1": 52, "nodes": None}]
        ops = [op(i, i * 0.05, i * 0.05 + 0.01, type_="ok" if i % 7 else "info")
               for i in range(1200)]
        path = os.path.join(self.dir, "t.svg")
        report.timeline_svg(ops, nemesis, 0.0, 60.0, path)
        root = self._parse(path)
        bands = [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "band"]
        self.assertEqual(len(bands), 4)
        self.assertEqual(sorted(b.get("data-kind") for b in bands),
                         ["kill", "membership", "partition", "weird<&>"])
        windows = [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "window"]
        self.assertEqual(len(windows), 2)
        text = " ".join("".join(e.itertext()) for e in root.iter(SVG_NS + "text"))
        self.assertIn("60 s", text)
        self.assertIn("1,200 ops", text)
        self.assertIn("100 ms", text)
        with open(path) as f:
            raw = f.read()
        self.assertNotRegex(raw, r"<script|@import|href=\"http|xlink:href=\"http")

    def test_long_run_is_aggregated(self):
        self.assertEqual(report.bucket_width(60), 0.1)
        self.assertEqual(report.bucket_width(200), 0.1)
        self.assertEqual(report.bucket_width(600), 0.5)
        self.assertLessEqual(3600 / report.bucket_width(3600), report.MAX_BUCKETS)
        ops = [op(i, i * 0.01, i * 0.01 + 0.005) for i in range(60000)]
        path = os.path.join(self.dir, "t.svg")
        report.timeline_svg(ops, [], 0.0, 600.0, path)
        root = self._parse(path)
        for pl in root.iter(SVG_NS + "polyline"):
            self.assertLessEqual(len(pl.get("points").split()), report.MAX_BUCKETS)
        text = " ".join("".join(e.itertext()) for e in root.iter(SVG_NS + "text"))
        self.assertIn("500 ms", text)

    def test_empty_run(self):
        path = os.path.join(self.dir, "t.svg")
        report.timeline_svg([], [], None, None, path)
        self._parse(path)


class MainTest(unittest.TestCase):
    def test_main_reads_a_directory(self):
        d = tempfile.mkdtemp(prefix="test_report")
        try:
            ops = [op(0, 100.0, 100.5), op(1, 101.0, 101.2, type_="info"),
                   op(2, 102.0, 102.1)]
            with open(os.path.join(d, "history.jsonl"), "w") as f:
                for o in ops:
                    f.write(json.dumps(o) + "\n")
                f.write('{"torn":')  # a torn last line is skipped
            with open(os.path.join(d, "nemesis.jsonl"), "w") as f:
                f.write(json.dumps(fault("kill", 100.8, 101.5, "one_down", leader=True))
                        + "\n")
            out = io.StringIO()
            fig, lines = report.run(d, out=out)
            # no summary.json: times come from the ops
            self.assertEqual(fig["t_start"], 100.0)
            self.assertEqual(fig["t_end"], 102.1)
            self.assertTrue(os.path.exists(os.path.join(d, "timeline.svg")))
            printed = out.getvalue().splitlines()
            self.assertEqual(printed, lines)
            self.assertTrue(re.match(r"^chaos: 3 ops, 1 faults \(kill 1\), \? violations",
                                     printed[-1]), printed[-1])
            self.assertIn("recovery p50 1.30 s max 1.30 s", printed[-1])

            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump({"t_start": 99.0, "t_end": 103.0, "violations": [],
                           "final": {"recovered": True, "converged": True}}, f)
            fig, lines = report.run(d, out=io.StringIO())
            self.assertEqual((fig["t_start"], fig["t_end"]), (99.0, 103.0))
            self.assertIn(", 0 violations,", lines[-1])
            with contextlib.redirect_stdout(io.StringIO()) as buf:
                self.assertEqual(report.main([d]), 0)
            self.assertTrue(buf.getvalue().splitlines()[-1].startswith("chaos: "))
        finally:
            shutil.rmtree(d)


if __name__ == "__main__":
    unittest.main()
