"""docs/metrics.md against a live node's /metrics: a real three-node cluster on 127.0.0.1
(test_proxy.ProxyCluster: harness.Cluster with its two tenants, alpha and beta, plus a proxy
listener per node with one route to order_service.py), driven over every gateway route, the
proxy listener and the binary RPC, then every node's /metrics compared with the doc's tables.
Run as its own ctest (integration.metricsdoc) or:

    IDEM_BIN_DIR=build/bin python3 -m unittest -v test_metrics_doc.TestMetricsDoc

What is checked, both ways (a series exposed and not documented fails, as does a documented
one not exposed):
- series names: the `# TYPE` families of the exposition (a histogram's _bucket, _sum and
  _count samples belong to its family; a sample without a `# TYPE` line is a failure) against
  the backticked names in the first column of the doc's tables (those whose header's first
  cell is "Series");
- types: the `# TYPE` against the doc's Type column;
- label names (without a histogram's `le`) against the doc's Labels column, on every node;
- label values, on the node the test drove: a label the doc lists with backticked values
  (`outcome`, `transport`, `route`, `kind` ...) must take exactly those values; a label the
  doc describes without backticked values (`tenant`, `status`) takes open-ended ones.
A row whose first cell says "(conditional)" may be missing from /metrics: for series that
only appear under conditions a test cluster cannot create. None is so marked today.
"""
import os
import re
import secrets
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ClusterTestCase, fp, http_request, request_past_503, wait_for  # noqa: E402
from test_proxy import ORDER, OrderService, ProxyCluster, route  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.normpath(os.path.join(HERE, "..", "..", "docs", "metrics.md"))
TYPES = ("counter", "gauge", "histogram")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
CONDITIONAL = "(conditional)"
NO_LABELS = ("", "—", "-", "none")
TIMEOUT = 20.0

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(r"^(%s)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$" % _NAME)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


# ---- the doc --------------------------------------------------------------------------------

def _cells(line):
    """The cells of a Markdown table row (an escaped \\| stays inside its cell)."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [c.replace("\\|", "|").strip() for c in re.split(r"(?<!\\)\|", body)]


def parse_doc(text):
    """{series: {"type", "labels": {name: set of values, or None when open-ended},
    "conditional", "line"}} from the doc's tables whose first header cell is "Series";
    raises AssertionError on a row it cannot read (so that a malformed row is not skipped)."""
    series = {}
    in_table = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells[0] == "Series":
            in_table = True
            continue
        if not in_table or re.fullmatch(r"[-: ]*", cells[0]):
            continue
        m = re.match(r"`(%s)`(.*)$" % _NAME, cells[0])
        if m is None or len(cells) < 3:
            raise AssertionError("docs/metrics.md:%d: a series row must start with "
                                 "| `name` | type | labels |: %r" % (n, line))
        name, rest = m.group(1), m.group(2)
        if name in series:
            raise AssertionError("docs/metrics.md:%d: %s has a row already (line %d)"
                                 % (n, name, series[name]["line"]))
        typ = cells[1].strip("` ").lower()
        if typ not in TYPES:
            raise AssertionError("docs/metrics.md:%d: %s: type %r is not one of %s"
                                 % (n, name, cells[1], ", ".join(TYPES)))
        labels = {}
        if cells[2].strip("` ").lower() not in NO_LABELS:
            for part in cells[2].split(";"):
                lm = re.match(r"\s*`([a-zA-Z_][a-zA-Z0-9_]*)`\s*:\s*(.*)$", part, re.S)
                if lm is None:
                    raise AssertionError("docs/metrics.md:%d: %s: a label must read "
                                         "`name`: values (%r)" % (n, name, part))
                values = set(re.findall(r"`([^`]*)`", lm.group(2)))
                labels[lm.group(1)] = values or None
        series[name] = {"type": typ, "labels": labels, "conditional": CONDITIONAL in rest,
                        "line": n}
    return series


# ---- the exposition -------------------------------------------------------------------------

def parse_exposition(text):
    """(families {name: type}, samples [(family, sample name, {label: value})], problems):
    every sample is given to the family its # TYPE line names (a histogram's _bucket, _sum
    and _count to the histogram)."""
    families, samples, problems = {}, [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                if parts[2] in families:
                    problems.append("two # TYPE lines for %s" % parts[2])
                families[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if m is None:
            problems.append("unreadable line: %r" % line)
            continue
        name, raw = m.group(1), m.group(2) or ""
        labels = dict(_LABEL.findall(raw))
        if raw.strip() and _LABEL.sub("", raw).strip():
            problems.append("unreadable labels: %r" % line)
        family = name if name in families else None
        if family is None:
            for suffix in HISTOGRAM_SUFFIXES:
                base = name[:-len(suffix)]
                if name.endswith(suffix) and families.get(base) == "histogram":
                    family = base
        if family is None:
            problems.append("a sample without a # TYPE line: %r" % line)
            continue
        samples.append((family, name, labels))
    return families, samples, problems


def label_values(samples):
    """{family: {label: set of values}} (a histogram's le left out)."""
    out = {}
    for family, name, labels in samples:
        d = out.setdefault(family, {})
        for k, v in labels.items():
            if k == "le" and name.endswith("_bucket"):
                continue
            d.setdefault(k, set()).add(v)
    return out


# ---- the test -------------------------------------------------------------------------------

class TestMetricsDoc(ClusterTestCase):
    """Every series a node exposes has a row in docs/metrics.md with its type, labels and label
    values, and every row is exposed."""
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.svc = OrderService()

    @classmethod
    def tearDownClass(cls):
        cls.svc.close()

    def make_cluster(self):
        # A proxy route (so that route="proxy" is answered) and the cluster secret (so that
        # followers' proxies could forward); the harness's two tenants give the per-tenant
        # series two values each.
        return ProxyCluster([route(self.svc.url, path_prefix="/orders")],
                            secret=secrets.token_hex(24))

    def cluster_ready(self):
        super().cluster_ready()
        for node in self.c.nodes.values():
            wait_for(lambda: self._status(node.http, "/healthz") == 200, 30,
                     "the gateway of node %d" % node.id)

    @staticmethod
    def _status(addr, path):
        try:
            return http_request(addr, "GET", path, timeout=5)[0]
        except OSError:
            return None

    _call = staticmethod(request_past_503)  # a 503 is tried again

    def _drive(self, nid):
        """Traffic through node nid: every gateway route, the proxy listener, both tenants,
        and claims over the binary RPC. Returns the acquired claims answered over HTTP."""
        node = self.c.nodes[nid]
        addr = node.http
        acquired = 0
        for token in (self.c.token, self.c.token2):  # alpha, beta
            k = "metrics-doc-%s" % secrets.token_hex(6)
            r = self._call(addr, "POST", "/v1/claims", {"fingerprint": fp(k)}, token,
                           {"Idempotency-Key": k})
            self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)
            acquired += 1
            tok = r[2]["token"]
            r = self._call(addr, "POST", "/v1/claims/%s/renew" % k,
                           {"token": tok, "lease_ms": 30000}, token)
            self.assertEqual(r[0], 200, r)
            r = self._call(addr, "POST", "/v1/claims/%s/complete" % k,
                           {"token": tok, "outcome": "succeeded",
                            "response": {"status": 201, "headers": {}, "body": "{}"}}, token)
            self.assertEqual(r[0], 200, r)
            r = self._call(addr, "GET", "/v1/claims/%s" % k, token=token)
            self.assertEqual(r[0], 200, r)
            k2 = "metrics-doc-%s" % secrets.token_hex(6)
            r = self._call(addr, "POST", "/v1/claims", {"fingerprint": fp(k2)}, token,
                           {"Idempotency-Key": k2})
            self.assertEqual((r[0], r[2].get("outcome")), (200, "acquired"), r)
            acquired += 1
            r = self._call(addr, "POST", "/v1/claims/%s/release" % k2, {"token": r[2]["token"]},
                           token)
            self.assertEqual(r[0], 200, r)
        # The proxy listener: an order through the route, its replay, and a path no route has.
        k = "metrics-doc-order-%s" % secrets.token_hex(6)
        for _ in range(2):
            r = self._call(node.proxy, "POST", "/orders", ORDER, headers={"Idempotency-Key": k})
            self.assertLess(r[0], 500, r)
        r = self._call(node.proxy, "POST", "/no-route-here", ORDER,
                       headers={"Idempotency-Key": k})
        self.assertEqual(r[0], 404, r)
        # The rest of the gateway's routes; /metrics is counted once answered.
        for path, status in (("/healthz", 200), ("/livez", 200), ("/readyz", 200),
                             ("/metrics", 200), ("/no-such-route", 404)):
            self.assertEqual(self._call(addr, "GET", path)[0], status, path)
        # The binary RPC (transport="rpc").
        k = "metrics-doc-rpc-%s" % secrets.token_hex(6)
        rc, res = self.c.ctl("claim", k, "--fingerprint", fp(k))
        self.assertEqual((rc, (res or {}).get("outcome")), (0, "acquired"), res)
        return acquired

    def _metrics(self, nid):
        r = http_request(self.c.nodes[nid].http, "GET", "/metrics", timeout=TIMEOUT)
        self.assertEqual(r[0], 200, r)
        self.assertIn("text/plain", r[1].get("content-type", ""), r[1])
        families, samples, problems = parse_exposition(r.raw)
        self.assertFalse(problems, "node %d's /metrics: %s" % (nid, "; ".join(problems)))
        return r.raw, families, samples

    def test_doc_matches_metrics(self):
        with open(DOC) as f:
            doc = parse_doc(f.read())
        self.assertTrue(doc, "no series table found in %s" % DOC)
        lid = self.c.wait_leader(timeout=20)
        acquired = self._drive(lid)
        for nid in sorted(self.c.nodes):
            with self.subTest(node=nid):
                self._metrics(nid)  # so that route="metrics" has a sample on every node
                text, families, samples = self._metrics(nid)
                exposed = set(families)
                documented = set(doc)
                required = {s for s in documented if not doc[s]["conditional"]}
                self.assertEqual(sorted(exposed - documented), [],
                                 "node %d exposes series that docs/metrics.md does not "
                                 "document" % nid)
                self.assertEqual(sorted(required - exposed), [],
                                 "docs/metrics.md documents series that node %d does not "
                                 "expose (mark a row \"(conditional)\" only when a test "
                                 "cluster cannot make it appear)" % nid)
                wrong = ["%s: exposed as %s, documented as %s (docs/metrics.md:%d)"
                         % (s, families[s], doc[s]["type"], doc[s]["line"])
                         for s in sorted(exposed & documented) if families[s] != doc[s]["type"]]
                self.assertFalse(wrong, "types differ: " + "; ".join(wrong))
                seen = label_values(samples)
                for s in sorted(exposed & documented):
                    want = doc[s]["labels"]
                    got = seen.get(s, {})
                    self.assertEqual(sorted(got), sorted(want),
                                     "%s: label names exposed by node %d vs documented "
                                     "(docs/metrics.md:%d)" % (s, nid, doc[s]["line"]))
                    if nid != lid:
                        continue
                    for label, values in sorted(want.items()):
                        if values is None:
                            continue
                        self.assertEqual(sorted(got.get(label, ())), sorted(values),
                                         "%s{%s}: values exposed vs documented "
                                         "(docs/metrics.md:%d)" % (s, label, doc[s]["line"]))
                if nid == lid:
                    # Both tenants of the configuration have their series, and the claims
                    # driven through this node are counted.
                    self.assertEqual(
                        seen["idem_tenant_proposals_refused_total"]["tenant"], {"alpha", "beta"})
                    m = re.search(r'^idem_requests_total\{outcome="acquired",transport="http"\} '
                                  r'(\d+)$', text, re.M)
                    self.assertIsNotNone(m, "idem_requests_total acquired/http missing")
                    self.assertGreaterEqual(int(m.group(1)), acquired)


if __name__ == "__main__":
    unittest.main()
