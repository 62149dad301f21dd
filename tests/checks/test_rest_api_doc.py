"""docs/rest-api.yml against the service's route table, both ways (no hub).

Every route of the tornado app (hub/service/app.py) is a path of the
document with the same methods, and every path of the document reaches the
handler it describes (tornado takes the first route that matches, so a path
shadowed by another route, or by the `api/.*` catch-all, fails). Errors of
the JSON API are the one documented shape; the served copy is this file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tornado import web
from tornado.routing import PathMatches

from gpulease.hub.service import openapi
from gpulease.hub.service.app import make_app
from gpulease.hub.service.base import NotFoundHandler

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = ROOT / "docs" / "rest-api.yml"
PREFIX = "/services/gpulease/"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# Routes that are no API operation: the catch-all answering 404 in the error
# shape for any other path under api/ (the document's description says so).
NOT_OPERATIONS = {NotFoundHandler}


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(DOC_PATH.read_text())


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> list[tuple[re.Pattern, type[web.RequestHandler]]]:
    db = tmp_path_factory.mktemp("routes") / "gpulease.sqlite"
    app = make_app({"GPULEASE_DB_URL": f"sqlite:///{db}", "JUPYTERHUB_SERVICE_PREFIX": PREFIX})
    # Rules that match on something other than the path (the body-size bound, which
    # answers 413 on any path) are no route of their own.
    return [(rule.matcher.regex, rule.target) for rule in app.wildcard_router.rules
            if isinstance(rule.matcher, PathMatches)]


def route_template(pattern: str) -> str:
    """`/services/gpulease/api/limits/((?:user|group):[^/]+)$` -> `/api/limits/{}`."""
    assert pattern.startswith(PREFIX) and pattern.endswith("$"), pattern
    body, out, depth = pattern[len(PREFIX) - 1:-1], [], 0
    for i, c in enumerate(body):
        escaped = i > 0 and body[i - 1] == "\\"
        if c == "(" and not escaped:
            if depth == 0:
                out.append("{}")
            depth += 1
        elif c == ")" and not escaped:
            depth -= 1
        elif depth == 0 and c != "\\":
            out.append(c)
    return "".join(out)


def doc_template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def handler_methods(cls: type[web.RequestHandler]) -> set[str]:
    return {m for m in METHODS if getattr(cls, m) is not getattr(web.RequestHandler, m)}


def doc_methods(item: dict) -> set[str]:
    return {m for m in METHODS if m in item}


def operations(doc: dict):
    for path, item in doc["paths"].items():
        for method in doc_methods(item):
            yield path, method, item[method], item.get("parameters", [])


def resolve(doc: dict, node: dict) -> dict:
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/")
        node = doc
        for part in name.split("/"):
            node = node[part]
    return node


def example_path(doc: dict, path: str, params: list[dict]) -> str:
    """`path` with each path parameter replaced by its schema's example."""
    examples = {}
    for param in map(lambda p: resolve(doc, p), params):
        if param["in"] == "path":
            assert "example" in param["schema"], f"{path}: path parameter {param['name']} " \
                                                 "needs an example (the route check uses it)"
            examples[param["name"]] = str(param["schema"]["example"])
    return re.sub(r"\{([^}]+)\}", lambda m: examples[m.group(1)], path)


def test_every_route_is_documented_with_its_methods(doc, rules):
    documented = {doc_template(p): doc_methods(item) for p, item in doc["paths"].items()}
    missing, wrong = [], []
    for regex, cls in rules:
        if cls in NOT_OPERATIONS:
            continue
        template = route_template(regex.pattern)
        if template not in documented:
            missing.append(f"{template} ({cls.__name__})")
        elif documented[template] != handler_methods(cls):
            wrong.append(f"{template}: {cls.__name__} serves {sorted(handler_methods(cls))}, "
                         f"the document says {sorted(documented[template])}")
    assert not missing, f"routes not in docs/rest-api.yml: {missing}"
    assert not wrong, wrong


def test_every_documented_path_reaches_its_handler(doc, rules):
    served = {route_template(regex.pattern): cls for regex, cls in rules}
    for path, item in doc["paths"].items():
        expected = served.get(doc_template(path))
        assert expected is not None, f"{path} is in docs/rest-api.yml but no route serves it"
        # Operation-level path parameters count too (e.g. api/inventory/{uuid}/return).
        params = item.get("parameters", []) + [
            p for m in doc_methods(item) for p in item[m].get("parameters", [])]
        concrete = PREFIX.rstrip("/") + example_path(doc, path, params)
        first = next((cls for regex, cls in rules if regex.match(concrete)), None)
        assert first is expected, f"{concrete} reaches {first and first.__name__}, " \
                                  f"not {expected.__name__}"


def test_catch_all_is_last(rules):
    """Any other path under api/ answers 404 in the error shape: the catch-all
    must come after every documented route, which it would otherwise shadow."""
    assert rules[-1][1] is NotFoundHandler


def test_every_api_error_is_the_error_shape(doc):
    error = {"$ref": "#/components/schemas/Error"}
    for path, method, op, _ in operations(doc):
        if not path.startswith("/api/"):
            continue
        for status, response in op["responses"].items():
            if int(status[0]) < 4:
                continue
            schema = resolve(doc, response)["content"]["application/json"]["schema"]
            assert schema == error or error in schema.get("allOf", []), \
                f"{method.upper()} {path} {status} is not the Error shape"


def test_authenticated_operations_document_their_refusals(doc):
    """403 for a caller the token does not identify; 503 when the database is gone."""
    for path, method, op, _ in operations(doc):
        if not path.startswith("/api/") or op.get("security") == []:
            continue
        assert {"403", "503"} <= set(op["responses"]), f"{method.upper()} {path}"


def test_operation_ids_are_unique(doc):
    ids = [op["operationId"] for _, _, op, _ in operations(doc)]
    assert len(ids) == len(set(ids))


def test_schemathesis_reads_every_operation(doc):
    import schemathesis
    from schemathesis.core.result import Ok

    schema = schemathesis.openapi.from_dict(doc)
    results = list(schema.get_all_operations())
    bad = [r.err() for r in results if not isinstance(r, Ok)]
    assert not bad
    assert len(results) == sum(1 for _ in operations(doc))


def test_the_package_serves_this_file():
    assert openapi.DOCUMENT.resolve() == DOC_PATH.resolve()


def test_served_document_names_the_hubs_prefix():
    text = DOC_PATH.read_text()
    assert openapi.served_document(text, PREFIX) == text
    moved = yaml.safe_load(openapi.served_document(text, "/jupyter/services/gpulease/"))
    assert moved["servers"][0]["url"] == "/jupyter/services/gpulease"
    assert moved["paths"] == yaml.safe_load(text)["paths"]


def test_route_template():
    assert route_template(PREFIX + r"api/limits/((?:user|group):[^/]+)$") == "/api/limits/{}"
    assert route_template(PREFIX + r"api/openapi\.yml$") == "/api/openapi.yml"
    assert route_template(PREFIX + "$") == "/"
