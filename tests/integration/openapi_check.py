"""openapi_check: validates HTTP exchanges with idemd's gateway against docs/openapi.yaml.

One exchange (method, path, status, response headers, response body) is checked thus:
- the path matches a path item (concrete paths before templated ones, as OpenAPI says; the
  query is not part of it) and the method is one of its operations; otherwise the answer
  must be one the spec's x-idemd-unrouted lists (no-route: 404, or 400/413 refused before
  routing; other-method: 405 with the path item's x-idemd-allow in Allow, or 400/413);
- the status is listed for that operation (there is no `default`); a replay
  (`Idempotency-Replayed: true`) is checked against the operation's x-idemd-replay;
- the Content-Type is one listed for that status (parameters compared when the listed media
  type has any; `*/*` takes anything, an absent Content-Type included);
- the body validates against the media type's schema (jsonschema.Draft202012Validator; JSON
  media types are parsed first, text/plain is a string);
- every header listed as required is present, and every listed header that is present
  validates against its schema;
- and, for application/problem+json, the conventions of docs/http-api.md (Errors): the body's
  status is the answer's, request_id is X-Request-Id and instance is
  urn:idemd:request:<request_id>.

The checker records which (path template, method, status) it saw (`produced`): method
"OTHER" for a method the path does not take, path "*" for a request no path item matches,
status "replay" for a replay. `documented()` lists every such triple the spec holds and
`untested()` those marked x-idemd-untested.

Only python3, PyYAML and jsonschema (Debian 12's 4.10.3 or newer: `$ref`s are resolved here,
so no resolver API of jsonschema is used). A mismatch raises SpecMismatch naming the route,
method, status and what differed; it never quotes the request path of a request no route
matches (a path may hold an idempotency key): only a digest of it.

    python3 tests/integration/openapi_check.py            # the spec's own problems, if any
    python3 tests/integration/openapi_check.py --triples  # every documented triple
"""
import copy
import hashlib
import json
import os
import re
import sys

try:
    import yaml
except ImportError:  # pragma: no cover - a setup problem, said loudly
    raise ImportError("openapi_check needs PyYAML: apt-get install python3-yaml "
                      "(tools/setup.sh --test installs it)")
try:
    import jsonschema
except ImportError:  # pragma: no cover
    raise ImportError("openapi_check needs jsonschema: apt-get install python3-jsonschema "
                      "(tools/setup.sh --test installs it), or pip install jsonschema")

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                         "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
REQUEST_URN = "urn:idemd:request:"


class SpecMismatch(AssertionError):
    """An answer the spec does not describe."""


def path_digest(path):
    """What names a request path in a message: never the path (it may hold a key)."""
    return "path sha256:%s" % hashlib.sha256(path.encode("utf-8", "replace")).hexdigest()[:12]


def _media(value):
    """A Content-Type value as (essence, sorted parameters), lower-cased."""
    parts = [p.strip() for p in (value or "").split(";")]
    params = []
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            params.append((k.strip().lower(), v.strip().strip('"')))
    return parts[0].lower(), tuple(sorted(params))


def _is_json(essence):
    return essence == "application/json" or essence.endswith("+json")


class Spec:
    """docs/openapi.yaml loaded, its `$ref`s resolved, its paths ready to match."""

    def __init__(self, path=SPEC_PATH):
        with open(path) as f:
            self.raw = yaml.safe_load(f)
        self._resolved = {}
        self.doc = self.deref(self.raw)
        self.routes = []  # (template, regex, path item), concrete ones first
        for template, item in self.doc.get("paths", {}).items():
            names = re.findall(r"{([^}]+)}", template)
            rx = "^" + "".join(
                "(?P<%s>[^/]*)" % part[1:-1] if part.startswith("{") else re.escape(part)
                for part in re.split(r"({[^}]+})", template) if part) + "$"
            self.routes.append((len(names), -len(template), template, re.compile(rx), item))
        self.routes.sort(key=lambda r: (r[0], r[1]))
        self.routes = [(t, rx, item) for _, _, t, rx, item in self.routes]

    def pointer(self, ref):
        if not ref.startswith("#/"):
            raise ValueError("only local $refs are supported: %r" % ref)
        node = self.raw
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise ValueError("unresolved $ref %r" % ref)
            node = node[part]
        return node

    def deref(self, node, stack=()):
        """node with every $ref replaced by what it names (a schema's $ref beside other
        keywords becomes allOf, as JSON Schema 2020-12 reads it; another object's siblings,
        summary and description, override the target's)."""
        if isinstance(node, list):
            return [self.deref(x, stack) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node and isinstance(node["$ref"], str):
            ref = node["$ref"]
            if ref in stack:
                raise ValueError("a $ref cycle: %s" % " -> ".join(stack + (ref,)))
            if ref not in self._resolved:
                self._resolved[ref] = self.deref(self.pointer(ref), stack + (ref,))
            target = self._resolved[ref]
            rest = {k: self.deref(v, stack) for k, v in node.items() if k != "$ref"}
            if not rest:
                return target
            if ref.startswith("#/components/schemas/"):
                return dict(rest, allOf=[target] + rest.get("allOf", []))
            out = copy.copy(target)
            out.update(rest)
            return out
        return {k: self.deref(v, stack) for k, v in node.items()}

    def match(self, path):
        """(template, path item) of the path (its query dropped), or (None, None)."""
        p = path.split("?", 1)[0]
        for template, rx, item in self.routes:
            if rx.match(p):
                return template, item
        return None, None

    def operations(self):
        """[(template, METHOD, operation)]."""
        return [(t, m.upper(), item[m]) for t, _, item in self.routes for m in METHODS
                if m in item]

    def unrouted(self, which):
        return self.doc.get("x-idemd-unrouted", {}).get(which, {}).get("responses", {})

    def documented(self):
        """Every (template, method, status) the spec lists, replays and unrouted ones
        included (see the module's docstring)."""
        out = set()
        for t, m, op in self.operations():
            out.update((t, m, st) for st in op.get("responses", {}))
            if "x-idemd-replay" in op:
                out.add((t, m, "replay"))
        for t, _, _ in self.routes:
            out.add((t, "OTHER", "405"))
        out.update(("*", "OTHER", st) for st in self.unrouted("other-method") if st != "405")
        out.update(("*", "*", st) for st in self.unrouted("no-route"))
        return out

    def untested(self):
        """The documented triples whose response says x-idemd-untested."""
        return {(t, m, st) for t, m, op in self.operations()
                for st, r in op.get("responses", {}).items() if r.get("x-idemd-untested")}


class Checker:
    """Validates exchanges against a Spec; remembers the triples it saw (produced)."""

    def __init__(self, spec=None):
        self.spec = spec or Spec()
        self.produced = set()
        self.produced_codes = set()  # (template, method, status, error code)
        self._validators = {}

    def validator(self, schema):
        key = id(schema)
        v = self._validators.get(key)
        if v is None:
            jsonschema.Draft202012Validator.check_schema(schema)
            v = (schema, jsonschema.Draft202012Validator(schema))  # schema kept alive
            self._validators[key] = v
        return v[1]

    def schema_errors(self, schema, value, limit=3):
        """Up to `limit` texts, one per way value breaks schema (none: it validates)."""
        errs = sorted(self.validator(schema).iter_errors(value),
                      key=lambda e: list(map(str, e.absolute_path)))
        out = []
        for e in errs[:limit]:
            where = "/".join(str(p) for p in e.absolute_path) or "(the whole value)"
            msg = e.message if len(e.message) <= 300 else e.message[:300] + "..."
            out.append("at %s: %s" % (where, msg))
        return out

    def check(self, method, path, status, headers, body, request_headers=None):
        """Checks one exchange; returns its (template, method, status) triple (recorded in
        produced), or raises SpecMismatch. headers: the answer's, names in any case; body:
        bytes or str as received."""
        method = method.upper()
        st = str(status)
        hdrs = {k.lower(): v for k, v in (headers or {}).items()}
        template, item = self.spec.match(path)
        where = "%s %s -> %s" % (method, template or "(no route: %s)" % path_digest(path), st)
        if item is None:
            triple, response = ("*", "*", st), self.spec.unrouted("no-route").get(st)
            if response is None:
                raise SpecMismatch("%s: a path no route matches answers %s, not one of %s"
                                   % (where, st, sorted(self.spec.unrouted("no-route"))))
        elif method.lower() not in item:
            other = self.spec.unrouted("other-method")
            response = other.get(st)
            triple = (template, "OTHER", st) if st == "405" else ("*", "OTHER", st)
            if response is None:
                raise SpecMismatch("%s: a method %s does not take answers %s, not one of %s"
                                   % (where, template, st, sorted(other)))
            if st == "405" and hdrs.get("allow") != item.get("x-idemd-allow"):
                raise SpecMismatch("%s: Allow is %r, the spec's x-idemd-allow %r"
                                   % (where, hdrs.get("allow"), item.get("x-idemd-allow")))
        else:
            op = item[method.lower()]
            if hdrs.get("idempotency-replayed") == "true" and "x-idemd-replay" in op:
                triple, response = (template, method, "replay"), op["x-idemd-replay"]
                if not 200 <= int(status) <= 599:
                    raise SpecMismatch("%s: a replay with status %s" % (where, st))
                where += " (replay)"
            else:
                triple, response = (template, method, st), op.get("responses", {}).get(st)
                if response is None:
                    raise SpecMismatch("%s: status %s is not documented for %s %s (it lists %s)"
                                       % (where, st, method, template,
                                          ", ".join(sorted(op.get("responses", {})))))
        value = self._check_response(where, method, int(status), response, hdrs, body)
        self.produced.add(triple)
        if isinstance(value, dict) and isinstance(value.get("code"), str) and int(status) >= 400:
            self.produced_codes.add(triple + (value["code"],))
        return triple

    def _check_response(self, where, method, status, response, hdrs, body):
        for name, h in response.get("headers", {}).items():
            value = hdrs.get(name.lower())
            if value is None:
                if h.get("required"):
                    raise SpecMismatch("%s: the required header %s is missing" % (where, name))
                continue
            if "schema" in h:
                errs = self.schema_errors(h["schema"], value)
                if errs:
                    raise SpecMismatch("%s: header %s: %s" % (where, name, "; ".join(errs)))
        content = response.get("content")
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        body = body or ""
        if not content:
            if body:
                raise SpecMismatch("%s: a body where the spec lists none" % where)
            return None
        ctype = hdrs.get("content-type")
        media = self._media_for(content, ctype)
        if media is None:
            raise SpecMismatch("%s: Content-Type %r is not one listed (%s)"
                               % (where, ctype, ", ".join(sorted(content))))
        schema = content[media].get("schema")
        if schema is None or media == "*/*" or method == "HEAD":
            return None  # */*: a replay's stored body, as it was stored
        essence, _ = _media(ctype)
        if _is_json(essence):
            try:
                value = json.loads(body)
            except ValueError as e:
                raise SpecMismatch("%s: the %s body is not JSON (%s)" % (where, essence, e))
        else:
            value = body
        errs = self.schema_errors(schema, value)
        if errs:
            raise SpecMismatch("%s: the body (%s) does not match the spec: %s"
                               % (where, essence, "; ".join(errs)))
        if essence == "application/problem+json" and isinstance(value, dict):
            rid = hdrs.get("x-request-id")
            if "status" in value and value["status"] != status:
                raise SpecMismatch("%s: the problem's status is %r" % (where, value["status"]))
            if "request_id" in value and value["request_id"] != rid:
                raise SpecMismatch("%s: request_id %r is not X-Request-Id %r"
                                   % (where, value["request_id"], rid))
            if "instance" in value and value["instance"] != REQUEST_URN + str(rid):
                raise SpecMismatch("%s: instance %r does not name the request"
                                   % (where, value["instance"]))
        return value

    @staticmethod
    def _media_for(content, ctype):
        """The key of content that ctype (None: absent) is, or None."""
        got = _media(ctype) if ctype is not None else None
        for key in content:
            if key == "*/*":
                return key
            if got is None:
                continue
            want = _media(key)
            if want[0] == got[0] and (not want[1] or want[1] == got[1]):
                return key
        return None


def spec_problems(spec):
    """What is wrong with the spec as such (empty: nothing): its version, statuses that are
    not three digits (no `default`, no ranges), operations without responses, route name or
    a unique operationId, templates without their path parameter, schemas that are not valid
    JSON Schema 2020-12, a path item without x-idemd-allow."""
    out = []
    if spec.raw.get("openapi") != "3.1.0":
        out.append("openapi is %r, not 3.1.0" % spec.raw.get("openapi"))
    seen = set()
    for t, m, op in spec.operations():
        if not op.get("responses"):
            out.append("%s %s has no responses" % (m, t))
        for st in op.get("responses", {}):
            if not re.fullmatch(r"[1-5][0-9][0-9]", str(st)):
                out.append("%s %s lists status %r (only explicit statuses)" % (m, t, st))
        if not op.get("x-idemd-route"):
            out.append("%s %s has no x-idemd-route" % (m, t))
        oid = op.get("operationId")
        if not oid or oid in seen:
            out.append("%s %s: operationId %r missing or not unique" % (m, t, oid))
        seen.add(oid)
        params = {p["name"] for p in op.get("parameters", []) if p.get("in") == "path"}
        params |= {p["name"] for p in spec.doc["paths"][t].get("parameters", [])
                   if p.get("in") == "path"}
        for name in re.findall(r"{([^}]+)}", t):
            if name not in params:
                out.append("%s %s does not declare its path parameter %s" % (m, t, name))
    for t, _, item in spec.routes:
        if not item.get("x-idemd-allow"):
            out.append("%s has no x-idemd-allow" % t)

    def schemas(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "schema" and isinstance(v, dict):
                    yield v
                else:
                    yield from schemas(v)
        elif isinstance(node, list):
            for v in node:
                yield from schemas(v)
    for s in schemas(spec.doc):
        try:
            jsonschema.Draft202012Validator.check_schema(s)
        except jsonschema.exceptions.SchemaError as e:
            out.append("a schema is not valid: %s" % e.message)
    for name, s in spec.doc.get("components", {}).get("schemas", {}).items():
        try:
            jsonschema.Draft202012Validator.check_schema(s)
        except jsonschema.exceptions.SchemaError as e:
            out.append("components.schemas.%s is not valid: %s" % (name, e.message))
    return out


def main(argv):
    spec = Spec()
    if "--triples" in argv:
        for t in sorted(spec.documented()):
            print("%-28s %-6s %s%s" % (t + (" (untested)" if t in spec.untested() else "",)))
        return 0
    problems = spec_problems(spec)
    for p in problems:
        print(p)
    print("%d documented (route, method, status) triples, %d problems"
          % (len(spec.documented()), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
