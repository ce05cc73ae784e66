#!/usr/bin/python3
"""openapi_check.py - the services' OpenAPI documents (examples/openapi/),
checked: the documents themselves, the routes the services serve against
their paths, and real answers against their responses.

Debian 12 has no OpenAPI validator package, so the OpenAPI 3.1 structure
is checked here, and every schema with python3-jsonschema (Draft 2020-12,
the dialect of OpenAPI 3.1):

  lint DOC...            every $ref resolves (across files too), every
                         operation has responses with a description, status
                         keys are status codes, operationIds are unique,
                         path templates and path parameters agree, security
                         names a scheme, every schema is a valid JSON Schema
                         (check_schema), every error response is
                         application/problem+json, every 503 declares
                         Retry-After, every 201 Location
  routes DOC BINARY      BINARY --routes (METHOD PATH lines) equal the
                         document's operations ({name} is {id} there)
  selftest DOC           wrong answers are caught (a 201 without Location,
                         a body missing a required member, a problem whose
                         status is not the answer's, an undocumented
                         status, a 405 without its Allow, ...), right ones
                         pass, and broken documents fail lint
  check DOC ANSWERS      every answer in the JSON-lines file ANSWERS
                         ({method, path, status, headers, body}) against
                         DOC (what tests/integration/test_openapi.sh
                         records from the running services)

An answer is held to its operation's response for its status (or nXX, or
default): declared required headers present and valid, the Content-Type one
of the response's media types, the body valid against its schema; a
problem's "status" equal to the answer's and its "type" equal to
urn:txc:problem:<error>.  A path no operation has must answer 404
not_found; a method its path lacks, 405 with an Allow listing exactly the
documented methods.  Exit status 0 when everything holds, 1 otherwise.
"""
import copy
import json
import os
import re
import sys
import urllib.parse
import warnings

import yaml

warnings.simplefilter("ignore", DeprecationWarning)  # RefResolver in newer jsonschema
import jsonschema  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PROBLEM_TYPE = "urn:txc:problem:"
PROBLEM_MEDIA = "application/problem+json"


# ------------------------------------------------------------ documents

class Docs:
    """A document and the files its $refs reach, loaded once."""

    def __init__(self, path, preloaded=None):
        self.root = os.path.abspath(path)
        self.files = {}  # absolute path -> loaded document
        if preloaded:
            self.files.update(preloaded)
        self.load(self.root)
        # every file the $refs reach, so that schemas resolve in any of them
        todo = [self.root]
        while todo:
            f = todo.pop()
            for _, ref in walk_refs(self.files[f]):
                part = ref.partition("#")[0]
                target = os.path.normpath(os.path.join(os.path.dirname(f), part)) if part else f
                if target not in self.files and os.path.exists(target):
                    self.load(target)
                    todo.append(target)

    def load(self, path):
        if path not in self.files:
            with open(path, encoding="utf-8") as f:
                self.files[path] = yaml.safe_load(f)
        return self.files[path]

    @property
    def doc(self):
        return self.files[self.root]

    @staticmethod
    def uri(path):
        return "file://" + urllib.parse.quote(path)

    def resolve(self, base, ref):
        """(file, pointer, node) of 'ref' seen from file 'base'; KeyError
        with a message when it does not resolve."""
        part, _, frag = ref.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(base), part)) if part else base
        try:
            node = self.load(target)
        except OSError as e:
            raise KeyError("%s: %s" % (ref, e)) from None
        if frag and not frag.startswith("/"):
            raise KeyError("%s: the fragment is not a JSON pointer" % ref)
        for tok in frag.split("/")[1:]:
            tok = urllib.parse.unquote(tok).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and tok in node:
                node = node[tok]
            elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
                node = node[int(tok)]
            else:
                raise KeyError("%s: no %r in %s" % (ref, tok, os.path.basename(target)))
        return target, frag, node

    def deref(self, base, ptr, node, seen=0):
        """Follow an OpenAPI object's $ref (not a schema's) to the object."""
        while isinstance(node, dict) and "$ref" in node:
            seen += 1
            if seen > 20:
                raise KeyError("a $ref cycle at %s#%s" % (os.path.basename(base), ptr))
            base, ptr, node = self.resolve(base, node["$ref"])
        return base, ptr, node

    def validator(self, base, ptr):
        """A Draft 2020-12 validator of the schema at file 'base', pointer
        'ptr', whose $refs resolve in every loaded file."""
        store = {self.uri(p): d for p, d in self.files.items()}
        resolver = jsonschema.RefResolver(base_uri=self.uri(base), referrer=self.files[base], store=store)
        return Draft202012Validator({"$ref": self.uri(base) + "#" + ptr}, resolver=resolver,
                                    format_checker=Draft202012Validator.FORMAT_CHECKER)


def esc(tok):
    return str(tok).replace("~", "~0").replace("/", "~1")


def operations(docs):
    """(path, method, file, pointer, operation, path item) of every operation."""
    for path, item in (docs.doc.get("paths") or {}).items():
        base, ptr, item = docs.deref(docs.root, "/paths/" + esc(path), item)
        for m in METHODS:
            if isinstance(item, dict) and m in item:
                yield path, m, base, ptr + "/" + m, item[m], (base, ptr, item)


# ----------------------------------------------------------------- lint

def walk_refs(node, where=""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield where, v
            else:
                yield from walk_refs(v, where + "/" + esc(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_refs(v, "%s/%d" % (where, i))


def lint(docs):
    errs = []

    def err(msg):
        errs.append(msg)

    d = docs.doc
    if not str(d.get("openapi", "")).startswith("3.1."):
        err("openapi must be 3.1.x, not %r" % d.get("openapi"))
    info = d.get("info") or {}
    if not isinstance(info.get("title"), str) or not isinstance(info.get("version"), str):
        err("info needs a title and a version (strings)")
    if not isinstance(d.get("paths"), dict) or not d["paths"]:
        err("no paths")
        return errs
    # every $ref of every file reached resolves (schemas' too)
    checked = set()
    todo = [docs.root]
    while todo:
        f = todo.pop()
        if f in checked:
            continue
        checked.add(f)
        for where, ref in walk_refs(docs.files[f]):
            try:
                target, _, _ = docs.resolve(f, ref)
                todo.append(target)
            except KeyError as e:
                err("%s#%s: $ref does not resolve: %s" % (os.path.basename(f), where, e))
    if errs:
        return errs
    # every schema of every file is a valid JSON Schema
    for f in sorted(checked):
        comps = (docs.files[f].get("components") or {}).get("schemas") or {}
        for name, schema in comps.items():
            try:
                Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as e:
                err("%s components/schemas/%s: %s" % (os.path.basename(f), name, e.message))
    schemes = (d.get("components") or {}).get("securitySchemes") or {}
    op_ids = {}
    for path, m, base, ptr, op, (ibase, iptr, item) in operations(docs):
        where = "%s %s" % (m.upper(), path)
        if not path.startswith("/"):
            err("%s: a path starts with /" % where)
        if op.get("operationId") in op_ids:
            err("%s: operationId %s also on %s" % (where, op["operationId"], op_ids[op["operationId"]]))
        op_ids[op.get("operationId")] = where
        # path parameters: exactly the template's names, required
        names = set(re.findall(r"{([^}/]+)}", path))
        declared = {}
        for pbase, plist in ((ibase, item.get("parameters") or []), (base, op.get("parameters") or [])):
            for p in plist:
                _, _, p = docs.deref(pbase, "", p)
                if p.get("in") not in ("path", "query", "header", "cookie") or not p.get("name"):
                    err("%s: a parameter needs a name and in: path|query|header|cookie" % where)
                    continue
                if "schema" in p:
                    try:
                        Draft202012Validator.check_schema(p["schema"])
                    except jsonschema.SchemaError as e:
                        err("%s: parameter %s: %s" % (where, p["name"], e.message))
                if p["in"] == "path":
                    declared[p["name"]] = p.get("required") is True
        if set(declared) != names:
            err("%s: path parameters %s, template %s" % (where, sorted(declared), sorted(names)))
        if not all(declared.values()):
            err("%s: a path parameter must be required" % where)
        for req in op.get("security") or []:
            for name in req:
                if name not in schemes:
                    err("%s: security names %s, not in components/securitySchemes" % (where, name))
        rb = op.get("requestBody")
        if rb is not None:
            rbase, rptr, rb = docs.deref(base, ptr + "/requestBody", rb)
            for mt, media in (rb.get("content") or {}).items():
                if "schema" in media:
                    try:
                        Draft202012Validator.check_schema(media["schema"])
                    except jsonschema.SchemaError as e:
                        err("%s: request body %s: %s" % (where, mt, e.message))
        responses = op.get("responses")
        if not isinstance(responses, dict) or not responses:
            err("%s: no responses" % where)
            continue
        for code, r in responses.items():
            code = str(code)
            if not re.fullmatch(r"[1-5](\d\d|XX)|default", code):
                err("%s: response key %s is not a status code" % (where, code))
                continue
            rbase, rptr, r = docs.deref(base, "%s/responses/%s" % (ptr, esc(code)), r)
            if not isinstance(r.get("description"), str):
                err("%s %s: a response needs a description" % (where, code))
            content = r.get("content") or {}
            for mt, media in content.items():
                if "schema" in media:
                    try:
                        Draft202012Validator.check_schema(media["schema"])
                    except jsonschema.SchemaError as e:
                        err("%s %s %s: %s" % (where, code, mt, e.message))
            hdrs = {k.lower(): docs.deref(rbase, "", v)[2] for k, v in (r.get("headers") or {}).items()}
            for h in hdrs.values():
                if "schema" in h:
                    try:
                        Draft202012Validator.check_schema(h["schema"])
                    except jsonschema.SchemaError as e:
                        err("%s %s: header: %s" % (where, code, e.message))
            if code[0] in "45" and set(content) != {PROBLEM_MEDIA}:
                err("%s %s: an error answer is %s only, not %s" % (where, code, PROBLEM_MEDIA, sorted(content)))
            if code == "503" and not hdrs.get("retry-after", {}).get("required"):
                err("%s 503: Retry-After must be a required header" % where)
            if code == "201" and not hdrs.get("location", {}).get("required"):
                err("%s 201: Location must be a required header" % where)
    return errs


def routes_of_doc(docs):
    return sorted("%s %s" % (m.upper(), re.sub(r"{[^}/]+}", "{id}", p)) for p, m, *_ in operations(docs))


# ------------------------------------------------------------- answers

def match_path(docs, path):
    """The document's path key whose template matches 'path', or None."""
    for key in (docs.doc.get("paths") or {}):
        rx = "^" + re.sub(r"\\{[^}/]+\\}", "[^/]+", re.escape(key)) + "$"
        if re.match(rx, path):
            return key
    return None


def common_response(docs, name):
    base = os.path.join(os.path.dirname(docs.root), "common.yaml")
    return docs.resolve(base, "#/components/responses/" + name)


def check_answer(docs, a):
    """The errors of answer 'a' ({method, path, status, headers, body}):
    a list, empty when it conforms."""
    errs = []
    method, path, status = a["method"].lower(), a["path"].split("?")[0], int(a["status"])
    headers = {k.lower(): v for k, v in (a.get("headers") or {}).items()}
    key = match_path(docs, path)
    where = "%s %s -> %d" % (method.upper(), path, status)
    if key is None:
        if status != 404:
            return ["%s: no such path in the document, so 404 was due" % where]
        rbase, rptr, resp = common_response(docs, "NotFound")
    else:
        base, ptr, item = docs.deref(docs.root, "/paths/" + esc(key), docs.doc["paths"][key])
        allowed = sorted(m.upper() for m in METHODS if m in item)
        if method not in item:
            if status != 405:
                return ["%s: %s has no %s, so 405 was due" % (where, key, method.upper())]
            allow = sorted(x.strip() for x in headers.get("allow", "").split(",") if x.strip())
            if allow != allowed:
                errs.append("%s: Allow %r, the document has %s" % (where, headers.get("allow"), ", ".join(allowed)))
            rbase, rptr, resp = common_response(docs, "MethodNotAllowed")
        else:
            responses = item[method].get("responses") or {}
            code = next((c for c in (str(status), "%dXX" % (status // 100), "default") if c in responses), None)
            if code is None:
                return ["%s: status %d is not documented for %s %s" % (where, status, method.upper(), key)]
            rbase, rptr, resp = docs.deref(base, "%s/%s/responses/%s" % (ptr, method, esc(code)), responses[code])
    # headers
    for name, h in (resp.get("headers") or {}).items():
        hbase, hptr, h = docs.deref(rbase, "", h)
        v = headers.get(name.lower())
        if v is None:
            if h.get("required"):
                errs.append("%s: no %s header" % (where, name))
            continue
        schema = h.get("schema") or {}
        val = v
        if schema.get("type") == "integer":
            val = int(v) if re.fullmatch(r"-?\d+", v) else v
        for e in Draft202012Validator(schema).iter_errors(val):
            errs.append("%s: header %s %r: %s" % (where, name, v, e.message))
    # body
    content = resp.get("content") or {}
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    body = a.get("body", "")
    if not content:
        if body:
            errs.append("%s: a body where the document has none" % where)
        return errs
    if ctype not in content:
        errs.append("%s: Content-Type %r, the document has %s" % (where, ctype, sorted(content)))
        return errs
    media = content[ctype]
    if ctype.endswith("json"):
        try:
            inst = json.loads(body)
        except ValueError as e:
            return errs + ["%s: the body is not JSON: %s" % (where, e)]
    else:
        inst = body
    if "schema" in media:
        v = docs.validator(rbase, "%s/content/%s/schema" % (rptr, esc(ctype)))
        for e in sorted(v.iter_errors(inst), key=lambda e: list(e.absolute_path)):
            errs.append("%s: body%s: %s" % (where, "".join("[%r]" % p for p in e.absolute_path), e.message))
    if status >= 400 and isinstance(inst, dict):
        if inst.get("status") != status:
            errs.append("%s: the problem's status is %r" % (where, inst.get("status")))
        if inst.get("type") != PROBLEM_TYPE + str(inst.get("error")):
            errs.append("%s: the problem's type %r is not %s<error>" % (where, inst.get("type"), PROBLEM_TYPE))
    return errs


# ------------------------------------------------------------ selftest

def problem(status, error, **extra):
    return dict({"type": PROBLEM_TYPE + error, "title": "T", "status": status, "detail": "d", "error": error},
                **extra)


def answer(method, path, status, body, ctype=None, **headers):
    if ctype is None:
        ctype = PROBLEM_MEDIA if status >= 400 else "application/json"
    h = {"Content-Type": ctype}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return {"method": method, "path": path, "status": status, "headers": h,
            "body": body if isinstance(body, str) else json.dumps(body)}


ORDER = {"order_id": 7, "activity": 1, "ticket_type": 1, "user": 9, "qty": 1, "bucket": 0, "status": "UNPAID",
         "xid": "x:1", "order_token": "0" * 64}


def selftest(path):
    """Wrong answers are caught and right ones pass, against the
    order-service document at 'path'; broken copies of it fail lint."""
    docs = Docs(path)
    failures = 0

    def expect(what, a, bad):
        nonlocal failures
        errs = check_answer(docs, a)
        if bool(errs) != bad:
            failures += 1
            print("FAILED - selftest: %s: %s" % (what, errs or "no error found"))
        else:
            print("ok - selftest: %s%s" % (what, (": " + errs[0]) if errs else ""))

    no_id = {k: v for k, v in ORDER.items() if k != "order_id"}
    expect("a right 201", answer("POST", "/orders", 201, ORDER, Location="/orders/7"), False)
    expect("a 201 without Location", answer("POST", "/orders", 201, ORDER), True)
    expect("a 201 missing order_id", answer("POST", "/orders", 201, no_id, Location="/orders/7"), True)
    expect("a 201 with a member the document lacks",
           answer("POST", "/orders", 201, dict(ORDER, secret=1), Location="/orders/7"), True)
    expect("a 201 with a bad order_token",
           answer("POST", "/orders", 201, dict(ORDER, order_token="zz"), Location="/orders/7"), True)
    expect("a right refusal", answer("POST", "/orders", 409, problem(409, "rejected", reason="sold_out")), False)
    expect("a refusal without its reason", answer("POST", "/orders", 409, problem(409, "rejected")), True)
    expect("the old error body (no problem members)",
           answer("POST", "/orders", 409, {"error": "rejected", "reason": "sold_out"}), True)
    expect("a problem whose status is not the answer's",
           answer("POST", "/orders", 409, problem(500, "rejected", reason="sold_out")), True)
    expect("a problem whose type is not its error's",
           answer("POST", "/orders", 409, dict(problem(409, "rejected", reason="sold_out"), type=PROBLEM_TYPE + "x")),
           True)
    expect("an error sent as application/json",
           answer("POST", "/orders", 409, problem(409, "rejected", reason="sold_out"), ctype="application/json"), True)
    expect("a right 503", answer("POST", "/orders", 503, problem(503, "unavailable"), Retry_After="1"), False)
    expect("a 503 without Retry-After", answer("POST", "/orders", 503, problem(503, "unavailable")), True)
    expect("a 503 with a Retry-After that is no number",
           answer("POST", "/orders", 503, problem(503, "unavailable"), Retry_After="soon"), True)
    expect("an undocumented status", answer("GET", "/orders/7", 418, problem(418, "teapot")), True)
    expect("an error word the response does not list", answer("GET", "/orders/7", 404, problem(404, "sold_out")), True)
    expect("a right 405", answer("GET", "/orders", 405, problem(405, "method_not_allowed"), Allow="POST"), False)
    expect("a 405 whose Allow is not the document's",
           answer("GET", "/orders", 405, problem(405, "method_not_allowed"), Allow="GET, POST"), True)
    expect("a 405 without Allow", answer("GET", "/orders", 405, problem(405, "method_not_allowed")), True)
    expect("a method the path lacks answered 404", answer("GET", "/orders", 404, problem(404, "not_found")), True)
    expect("a right 404 of a path nobody serves", answer("GET", "/nowhere", 404, problem(404, "not_found")), False)
    expect("a path nobody serves answered 503",
           answer("GET", "/nowhere", 503, problem(503, "unavailable"), Retry_After="1"), True)
    expect("a 401 without WWW-Authenticate", answer("GET", "/orders/7", 401, problem(401, "unauthorized")), True)
    expect("a bad_state without order_status", answer("POST", "/orders/7/pay", 409, problem(409, "bad_state")), True)
    expect("metrics as text", answer("GET", "/metrics", 200, "x 1\n", ctype="text/plain"), False)
    expect("a body that is not JSON", answer("GET", "/healthz", 200, "{", ctype="application/json"), True)

    def expect_lint(what, mutate):
        nonlocal failures
        d = copy.deepcopy(docs.doc)
        mutate(d)
        broken = Docs(path, preloaded={k: v for k, v in docs.files.items() if k != docs.root})
        broken.files[broken.root] = d
        errs = lint(broken)
        if not errs:
            failures += 1
            print("FAILED - selftest: lint of a document with %s found nothing" % what)
        else:
            print("ok - selftest: lint of a document with %s: %s" % (what, errs[0]))

    def drop(d, *keys):
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]

    errs = lint(docs)
    if errs:
        failures += 1
        print("FAILED - selftest: the document itself does not lint: %s" % errs)
    expect_lint("a $ref that resolves nowhere",
                lambda d: d["paths"]["/orders"]["post"]["responses"].update({"400": {"$ref": "#/nowhere"}}))
    expect_lint("an operation without responses", lambda d: drop(d, "paths", "/orders/{order_id}", "get", "responses"))
    expect_lint("a schema that is no schema",
                lambda d: d["components"]["schemas"]["OrderRequest"].update({"type": 5}))
    expect_lint("a 201 without Location",
                lambda d: drop(d, "paths", "/orders", "post", "responses", "201", "headers", "Location"))
    expect_lint("a path parameter the template lacks",
                lambda d: d["paths"].update({"/x": {"get": {"parameters": [{"name": "id", "in": "path", "required": True,
                                                                            "schema": {"type": "integer"}}],
                                                        "responses": {"200": {"description": "x"}}}}}))
    expect_lint("an error answer as application/json",
                lambda d: d["paths"]["/orders"]["post"]["responses"].update(
                    {"418": {"description": "x", "content": {"application/json": {"schema": {}}}}}))
    return failures


# ----------------------------------------------------------------- main

def main(argv):
    if len(argv) < 3 or argv[1] not in ("lint", "routes", "selftest", "check"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cmd = argv[1]
    if cmd == "lint":
        bad = 0
        for p in argv[2:]:
            errs = lint(Docs(p))
            for e in errs:
                print("FAILED - %s: %s" % (os.path.basename(p), e))
            if not errs:
                n = sum(1 for _ in operations(Docs(p)))
                print("ok - %s: OpenAPI 3.1, %d operations, every $ref and schema valid" % (os.path.basename(p), n))
            bad += len(errs)
        return 1 if bad else 0
    if cmd == "routes":
        import subprocess
        docs = Docs(argv[2])
        served = sorted(subprocess.run([argv[3], "--routes"], check=True, capture_output=True,
                                       text=True).stdout.splitlines())
        documented = routes_of_doc(docs)
        if served != documented:
            print("FAILED - %s: served but not documented %s; documented but not served %s"
                  % (os.path.basename(argv[3]), sorted(set(served) - set(documented)),
                     sorted(set(documented) - set(served))))
            return 1
        print("ok - %s serves the %d routes %s describes" % (os.path.basename(argv[3]), len(served),
                                                             os.path.basename(argv[2])))
        return 0
    if cmd == "selftest":
        return 1 if selftest(argv[2]) else 0
    docs = Docs(argv[2])
    n = bad = 0
    seen = {}
    with open(argv[3], encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            a = json.loads(line)
            n += 1
            errs = check_answer(docs, a)
            key = "%s %s %s" % (a["method"], match_path(docs, a["path"].split("?")[0]) or "(none)", a["status"])
            seen[key] = seen.get(key, 0) + 1
            for e in errs:
                print("FAILED - %s" % e)
            bad += bool(errs)
    print("%s: %d answers checked (%d operation/status pairs), %d not as documented"
          % (os.path.basename(argv[2]), n, len(seen), bad))
    for k in sorted(seen):
        print("  %s x%d" % (k, seen[k]))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
