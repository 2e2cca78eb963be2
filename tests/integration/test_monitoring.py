"""tools/monitoring/ (the Prometheus alert rules, their promtool unit tests, the Grafana
dashboard) against promtool and against what a real cluster's /metrics exposes. Two ctests:

- integration.monitoring_files (TestFiles, no cluster): `promtool check rules` and
  `promtool test rules`; the rules file's group, alert names, `for:`, severity,
  annotations and runbook anchors (each a heading of docs/operations.md); the unit tests
  show every alert both firing and not firing; the dashboard's structure and every one of
  its PromQL expressions parsed by promtool; the expression scanner below on known inputs.
- integration.monitoring_series (TestSeries): a three-node cluster (harness.Cluster) given
  a few claims over HTTP and the RPC, then every metric name in every expression of the
  dashboard and of the alert rules must be a series some node's /metrics exposes (a
  histogram's _bucket/_sum/_count samples; `up` is Prometheus's own), and every label a
  selector matches on must be one that series has. The check reports a made-up name.

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_monitoring

promtool comes from Debian's `prometheus` package (tools/setup.sh --test).
"""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ClusterTestCase, fp, http_request, request_past_503, wait_for  # noqa: E402
from test_metrics_doc import parse_exposition  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MON = os.path.join(ROOT, "tools", "monitoring")
ALERTS = os.path.join(MON, "idemd-alerts.yml")
ALERT_TESTS = os.path.join(MON, "idemd-alerts.test.yml")
DASHBOARD = os.path.join(MON, "idemd-dashboard.json")
OPERATIONS = os.path.join(ROOT, "docs", "operations.md")

ALERT_NAMES = ["IdemNoLeader", "IdemLeaderChangesFrequent", "IdemFailClosedAnswers",
               "IdemLogAppendSlow", "IdemLogAppendStuck", "IdemQuarantinedRecords",
               "IdemFollowerLagging", "IdemQuotaNearFull", "IdemNodeDown"]
SEVERITIES = ("critical", "warning")
# Series Prometheus makes itself, not idemd.
PROMETHEUS_SERIES = {"up"}
# Labels Prometheus gives every scraped series (the target's).
TARGET_LABELS = {"job", "instance"}
# Fewer names than these and the scan, not the files, is suspect.
MIN_DASHBOARD_NAMES = 25
MIN_ALERT_NAMES = 10
TIMEOUT = 20.0

# ---- PromQL: the metric names of an expression ------------------------------------------

# PromQL's functions and aggregation operators (Prometheus 2.x and 3.x).
FUNCTIONS = set("""
abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
days_in_month deg delta deriv double_exponential_smoothing end exp floor histogram_avg
histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
histogram_sum holt_winters hour idelta increase info irate label_join label_replace
last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin
sinh sort sort_by_label sort_by_label_desc sort_desc sqrt start stddev_over_time
stdvar_over_time sum_over_time tan tanh time timestamp vector year
""".split())
AGGREGATIONS = set("""
avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum
topk
""".split())
KEYWORDS = set("""
and or unless bool by without on ignoring group_left group_right offset atan2 inf nan
""".split())

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_COMMENT = re.compile(r"#[^\n]*")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_BRACKET = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$(?:\{[^}]*\}|\w+)")
# An identifier not inside another token (a number's exponent, a duration's unit).
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)")


class PromQLError(ValueError):
    pass


def scan(expr):
    """{metric name: set of label names its selectors match on} for a PromQL expression.
    Strings, comments, label matchers, ranges and offsets, grouping label lists and Grafana
    variables are set aside first; every identifier left is a function, an aggregation, a
    keyword or a metric name. An identifier called like a function that PromQL does not
    have raises PromQLError (so a misspelt function cannot pass as nothing)."""
    text = _COMMENT.sub(" ", _STRING.sub('""', expr))
    names = {}

    def selector(m):
        labels = set(_MATCHER.findall(m.group(2)))
        name = m.group(1)
        if name is None:  # {__name__="..."} is not used here; a bare {...} would hide names
            raise PromQLError("a selector without a metric name: %r" % m.group(0))
        if name not in FUNCTIONS | AGGREGATIONS | KEYWORDS:
            names.setdefault(name, set()).update(labels)
            return " %s " % name
        return m.group(0)

    text = _SELECTOR.sub(selector, text)
    text = _BRACKET.sub(" ", text)
    text = _GROUPING.sub(r" \1 ", text)
    text = _GRAFANA_VAR.sub(" ", text)
    if re.search(r"[{}\[\]]", text):
        raise PromQLError("unbalanced braces or brackets in %r" % expr)
    for m in _IDENT.finditer(text):
        ident = m.group(1)
        called = text[m.end():].lstrip().startswith("(")
        low = ident.lower()
        if ident in FUNCTIONS or ident in AGGREGATIONS or low in KEYWORDS:
            continue
        if called:
            raise PromQLError("%s( is not a PromQL function (in %r)" % (ident, expr))
        names.setdefault(ident, set())
    return names


def grafana_query_exprs(query):
    """The PromQL expressions of a Grafana Prometheus variable's query: label_values(expr,
    label) gives expr (label_values(label) none); query_result(expr) gives expr."""
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)", q, re.S)
    if m:
        return [m.group(1)]
    if re.fullmatch(r"label_values\(\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)", q):
        return []
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if m:
        return [m.group(1)]
    if re.fullmatch(r"(label_names|metrics)\(.*\)", q, re.S):
        return []
    return [q]


def dashboard_exprs(dash):
    """[(where, expr)] of every panel target (rows' nested panels included) and every query
    variable of the dashboard."""
    out = []

    def panels(ps):
        for p in ps:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append(("panel %r target %s" % (p.get("title"), t.get("refId")),
                                t["expr"]))
            panels(p.get("panels", []))

    panels(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        for e in grafana_query_exprs(q):
            out.append(("variable %s" % v.get("name"), e))
    return out


def alert_rules(doc):
    return [r for g in doc.get("groups", []) for r in g.get("rules", []) if "alert" in r]


def missing(exprs, exposed, allowed=PROMETHEUS_SERIES):
    """[(where, problem)] for every metric name of exprs [(where, expr)] that is not in
    exposed ({sample name: set of label names}) and every label a selector of it matches on
    that the series does not have (target labels aside)."""
    problems = []
    for where, expr in exprs:
        for name, labels in sorted(scan(expr).items()):
            if name in allowed:
                continue
            if name not in exposed:
                problems.append((where, "%s is not exposed by /metrics" % name))
                continue
            extra = labels - exposed[name] - TARGET_LABELS
            if extra:
                problems.append((where, "%s has no label %s" % (name, ", ".join(sorted(extra)))))
    return problems


def names_of(exprs):
    out = set()
    for _, e in exprs:
        out |= set(scan(e))
    return out


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(markdown):
    """The anchors of a Markdown file's headings (lines in fenced code blocks are not)."""
    out, fenced = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.*)$", line)
        if m and not fenced:
            out.add(slug(m.group(1)))
    return out


def promtool():
    path = shutil.which("promtool")
    if path is None:
        raise AssertionError("promtool not found: install Debian's prometheus package "
                             "(tools/setup.sh --test)")
    return path


def run_promtool(*args, cwd=MON):
    r = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


def load_alerts():
    with open(ALERTS) as f:
        return yaml.safe_load(f)


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


# ---- the files --------------------------------------------------------------------------

class TestFiles(unittest.TestCase):
    maxDiff = None

    def test_promtool_check_rules(self):
        rc, out = run_promtool("check", "rules", ALERTS)
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS: %d rules found" % len(ALERT_NAMES), out)

    def test_promtool_test_rules(self):
        rc, out = run_promtool("test", "rules", ALERT_TESTS)
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_promtool_test_rules_can_fail(self):
        """The unit tests fail when an alert's threshold moves: they test the rules."""
        with tempfile.TemporaryDirectory(prefix="idem-mon-") as d:
            with open(ALERTS) as f:
                text = f.read()
            changed = text.replace("idem_raft_append_oldest_seconds > 5",
                                   "idem_raft_append_oldest_seconds > 500")
            self.assertNotEqual(changed, text)
            with open(os.path.join(d, "idemd-alerts.yml"), "w") as f:
                f.write(changed)
            shutil.copy(ALERT_TESTS, d)
            rc, out = run_promtool("test", "rules", "idemd-alerts.test.yml", cwd=d)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("IdemLogAppendStuck", out)

    def test_rules_shape(self):
        doc = load_alerts()
        self.assertEqual([g["name"] for g in doc["groups"]], ["idemd"])
        rules = alert_rules(doc)
        self.assertEqual([r["alert"] for r in rules], ALERT_NAMES)
        with open(OPERATIONS) as f:
            anchors = headings(f.read())
        for r in rules:
            with self.subTest(alert=r["alert"]):
                self.assertRegex(str(r.get("for", "")), r"^\d+[smh]$")
                self.assertIn(r.get("labels", {}).get("severity"), SEVERITIES)
                ann = r.get("annotations", {})
                self.assertTrue(ann.get("summary", "").strip())
                self.assertTrue(ann.get("description", "").strip())
                m = re.fullmatch(r"docs/operations\.md#([a-z0-9_-]+)", ann.get("runbook_url", ""))
                self.assertIsNotNone(m, ann.get("runbook_url"))
                self.assertEqual(m.group(1), r["alert"].lower())
                self.assertIn(m.group(1), anchors, "no such heading in docs/operations.md")
        up = [r for r in rules if "up" in scan(r["expr"])]
        self.assertEqual([r["alert"] for r in up], ["IdemNodeDown"])
        self.assertIn('job="idemd"', up[0]["expr"])

    def test_unit_tests_cover_each_alert(self):
        """Each alert is tested firing (an eval with alerts expected) and not firing (an
        eval expecting none)."""
        with open(ALERT_TESTS) as f:
            doc = yaml.safe_load(f)
        self.assertEqual(doc["rule_files"], ["idemd-alerts.yml"])
        firing, quiet = set(), set()
        for t in doc["tests"]:
            for a in t.get("alert_rule_test", []):
                (firing if a.get("exp_alerts") else quiet).add(a["alertname"])
        self.assertEqual(sorted(firing), sorted(ALERT_NAMES))
        self.assertEqual(sorted(quiet), sorted(ALERT_NAMES))

    def test_dashboard_shape(self):
        dash = load_dashboard()
        self.assertGreaterEqual(dash["schemaVersion"], 36)
        self.assertEqual(dash["uid"], "idemd-overview")
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        ds = variables.get("datasource")
        self.assertIsNotNone(ds, "no datasource variable")
        self.assertEqual((ds["type"], ds["query"]), ("datasource", "prometheus"))
        ids, targets = set(), 0
        for p in dash["panels"]:
            with self.subTest(panel=p.get("title")):
                self.assertNotIn(p["id"], ids)
                ids.add(p["id"])
                self.assertTrue({"h", "w", "x", "y"} <= set(p["gridPos"]))
                self.assertLessEqual(p["gridPos"]["x"] + p["gridPos"]["w"], 24)
                if p["type"] == "row":
                    continue
                self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${datasource}"})
                self.assertTrue(p["targets"])
                for t in p["targets"]:
                    self.assertEqual(t["datasource"]["uid"], "${datasource}")
                    targets += 1
        self.assertGreaterEqual(targets, 25)
        # What the dashboard must show (by the series it reads).
        shown = names_of(dashboard_exprs(dash))
        for name in ("idem_is_leader", "idem_has_leader", "idem_raft_term",
                     "idem_raft_leader_changes_total", "idem_requests_total",
                     "idem_claim_duration_seconds_bucket", "idem_fail_closed_total",
                     "idem_raft_append_duration_seconds_bucket",
                     "idem_raft_append_oldest_seconds", "idem_raft_applied_index",
                     "idem_raft_commit_index", "idem_quarantined", "idem_tenant_records",
                     "idem_tenant_quota_records", "idem_tenant_bytes", "idem_tenant_quota_bytes",
                     "process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "process_max_fds"):
            self.assertIn(name, shown)

    def test_dashboard_promql_parses(self):
        """Every expression of the dashboard, its Grafana variables filled in, is PromQL
        that promtool accepts (each one a recording rule of a throwaway rules file)."""
        exprs = dashboard_exprs(load_dashboard())
        subst = {"$__rate_interval": "5m", "$__interval": "1m", "$job": "idemd",
                 "$instance": ".*"}
        rules = []
        for i, (_, e) in enumerate(exprs):
            for k, v in subst.items():
                e = e.replace(k, v)
            self.assertNotIn("$", e)
            rules.append({"record": "idem_dashboard:expr%d" % i, "expr": e})
        with tempfile.TemporaryDirectory(prefix="idem-mon-") as d:
            path = os.path.join(d, "dashboard-rules.yml")
            with open(path, "w") as f:
                yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
            rc, out = run_promtool("check", "rules", path)
            self.assertEqual(rc, 0, out)
            self.assertIn("SUCCESS: %d rules found" % len(rules), out)
            # And a broken one is refused (the check is not vacuous).
            with open(path, "w") as f:
                yaml.safe_dump({"groups": [{"name": "d", "rules": [
                    {"record": "x:y", "expr": "sum by (job (rate(idem_records[5m]))"}]}]}, f)
            rc, out = run_promtool("check", "rules", path)
            self.assertNotEqual(rc, 0, out)

    def test_scan(self):
        self.assertEqual(
            scan('sum by (job, le) (rate(foo_bucket{a="b", le=~"0.1|x"}[5m] offset 1h))'
                 ' / on (job) group_left bar offset 2m > bool 1e3'),
            {"foo_bucket": {"a", "le"}, "bar": set()})
        self.assertEqual(
            scan('label_replace(a / (b > 0), "dst", "records", "src", "(.*)") or c'),
            {"a": set(), "b": set(), "c": set()})
        self.assertEqual(scan('histogram_quantile(0.99, sum by (le) (rate(h_bucket'
                              '{job="$job",instance=~"$instance"}[$__rate_interval])))'),
                         {"h_bucket": {"job", "instance"}})
        self.assertEqual(scan("time() - process_start_time_seconds"),
                         {"process_start_time_seconds": set()})
        self.assertEqual(scan('count by (version) (idem_build_info) # a "comment" x_y'),
                         {"idem_build_info": set()})
        self.assertEqual(scan("max without (instance) (Inf - NaN + x:recorded:rate5m)"),
                         {"x:recorded:rate5m": set()})
        with self.assertRaises(PromQLError):
            scan("rte(idem_records[5m])")
        with self.assertRaises(PromQLError):
            scan('{__name__="idem_records"}')
        self.assertEqual(grafana_query_exprs('label_values(idem_build_info{job="$job"}, instance)'),
                         ['idem_build_info{job="$job"}'])
        self.assertEqual(grafana_query_exprs("label_values(job)"), [])

    def test_missing_reports_made_up_names(self):
        exposed = {"idem_records": set(), "idem_requests_total": {"outcome", "transport"}}
        probs = missing([("x", 'idem_records + rate(idem_made_up_total[5m])'),
                         ("y", 'sum(idem_requests_total{outcome="ok",tenant="a"})'),
                         ("z", 'up{job="idemd"} == 0')], exposed)
        self.assertEqual(probs, [("x", "idem_made_up_total is not exposed by /metrics"),
                                 ("y", "idem_requests_total has no label tenant")])


# ---- against a live cluster -------------------------------------------------------------

class TestSeries(ClusterTestCase):
    """Every series the dashboard and the alert rules read is one a node exposes."""
    maxDiff = None

    _call = staticmethod(request_past_503)  # a 503 is tried again

    def _drive(self):
        """A few claims over HTTP (completed) and over the RPC: the histograms, the
        per-outcome and per-route series have samples."""
        lid = self.c.wait_leader(timeout=20)
        for nid in sorted(self.c.nodes):  # through each node (followers forward)
            addr = self.c.nodes[nid].http
            k = "monitoring-%s" % secrets.token_hex(6)
            r = self._call(addr, "POST", "/v1/claims", {"fingerprint": fp(k)}, self.c.token,
                           {"Idempotency-Key": k})
            self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)
            r = self._call(addr, "POST", "/v1/claims/%s/complete" % k,
                           {"token": r[2]["token"], "outcome": "succeeded",
                            "response": {"status": 201, "headers": {}, "body": "{}"}},
                           self.c.token)
            self.assertEqual(r[0], 200, r)
        k = "monitoring-rpc-%s" % secrets.token_hex(6)
        rc, res = self.c.ctl("claim", k, "--fingerprint", fp(k))
        self.assertEqual((rc, (res or {}).get("outcome")), (0, "acquired"), res)
        return lid

    def _exposed(self):
        """{sample name: label names} over every node's /metrics (a histogram's family gives
        its _bucket, _sum and _count samples, as the exposition names them)."""
        exposed = {}
        for nid in sorted(self.c.nodes):
            r = http_request(self.c.nodes[nid].http, "GET", "/metrics", timeout=TIMEOUT)
            self.assertEqual(r[0], 200, r)
            families, samples, problems = parse_exposition(r.raw)
            self.assertFalse(problems, problems)
            for _family, name, labels in samples:
                exposed.setdefault(name, set()).update(labels)
        return exposed

    def test_series_exist(self):
        lid = self._drive()
        # The leader's tenant usage shows the claims (the series read real figures).
        exposed = self._exposed()
        self.assertGreater(len(exposed), 60)
        for name in ("idem_is_leader", "idem_tenant_records", "process_open_fds",
                     "idem_raft_append_duration_seconds_bucket"):
            self.assertIn(name, exposed)
        text = http_request(self.c.nodes[lid].http, "GET", "/metrics", timeout=TIMEOUT).raw
        self.assertRegex(text, r'(?m)^idem_tenant_records\{tenant="alpha"\} [1-9]')
        self.assertRegex(text, r"(?m)^idem_is_leader 1$")

        dash = dashboard_exprs(load_dashboard())
        rules = [("alert %s" % r["alert"], r["expr"]) for r in alert_rules(load_alerts())]
        with self.subTest(what="dashboard"):
            found = names_of(dash) - PROMETHEUS_SERIES
            self.assertGreaterEqual(len(found), MIN_DASHBOARD_NAMES, sorted(found))
            self.assertEqual(missing(dash, exposed), [])
        with self.subTest(what="alert rules"):
            found = names_of(rules) - PROMETHEUS_SERIES
            self.assertGreaterEqual(len(found), MIN_ALERT_NAMES, sorted(found))
            self.assertEqual(missing(rules, exposed), [])
        # The same check on an expression with a made-up name and a made-up label reports
        # both, against this cluster's series.
        self.assertEqual(
            missing([("made up", 'rate(idem_made_up_total[5m]) + idem_records'),
                     ("label", 'idem_fail_closed_total{reason="x"}')], exposed),
            [("made up", "idem_made_up_total is not exposed by /metrics"),
             ("label", "idem_fail_closed_total has no label reason")])


if __name__ == "__main__":
    unittest.main()
