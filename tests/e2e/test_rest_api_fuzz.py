"""schemathesis against a real hub: no 5xx, every error in the documented shape.

One hub for the module (tests/support/hubproc.py), once on SQLite and once on
PostgreSQL. The schema is loaded from the service itself (`GET
api/openapi.yml`, public), so the served document is the one held to the
answers. Every operation is fuzzed with an admin's token and with a plain
user's (alice), `PUT api/server-activity` with servers' own tokens; positive
and negative data, a fixed number of examples each, derandomized: the same
requests every run. Checks: no server error; status code, content type,
headers and body as documented; negative data refused with a 4xx; a token is
needed where the document says so (ignored_auth, once per operation); every
4xx/5xx of the JSON API in the error shape `{"status", "message", "errors":
[{"field", "message"}]}` with `status` the response's own; and the service
still up at the end. The count of requests sent is printed and recorded
(junit property `generated_requests`).

Destructive operations cannot break the run: after each admin's operation the
profiles are put back (`PUT api/profiles` with `prune`), so a generated
`{"profiles": [], "prune": true}` or a DELETE of a profile is undone. Page
forms (POST) are left out: they post what the fuzzed JSON operations take,
and need a browser's `_xsrf`. The hub's OAuth callback is JupyterHub's own.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpulease.hub.service.base import NUL_REFUSED
from tests.support.hubproc import HubProcess

pytestmark = pytest.mark.e2e
ADMIN_PW = "admin-secret-pw"
SERVICE = "/services/gpulease"
# Examples per operation, per token and per generation mode (more for a deeper run).
EXAMPLES = int(os.environ.get("GPULEASE_FUZZ_EXAMPLES", "6"))
# Unset: derandomized, the same requests every run. A number: other requests, for
# exploring by hand (GPULEASE_FUZZ_SEED=7 GPULEASE_FUZZ_EXAMPLES=25 pytest ...).
SEED = os.environ.get("GPULEASE_FUZZ_SEED")
# Fewer than this many requests means the run skipped operations.
MIN_REQUESTS = 600


@dataclass
class Run:
    sent: int = 0
    waited_s: float = 0.0  # for the answers, of the run's time (the rest is generating)
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # Operations whose auth was probed (ignored_auth sends 3 more requests each time).
    auth_probed: set[str] = field(default_factory=set)

    def ignored_auth_once(self, ctx, response, case) -> bool | None:
        """schemathesis' ignored_auth (an operation that needs a token refuses none or
        a wrong one), on the first success of each operation only."""
        if not 200 <= response.status_code < 300 or case.operation.label in self.auth_probed:
            return None
        self.auth_probed.add(case.operation.label)
        return ignored_auth(ctx, response, case)


@schemathesis.check
def error_shape(ctx, response, case) -> bool | None:
    """A 4xx/5xx of the JSON API is `{"status", "message", "errors"}`."""
    if response.status_code < 400 or not case.path.startswith("/api/"):
        return None
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} is not JSON: {response.text[:200]!r}") \
            from None
    problems = []
    if not isinstance(body, dict) or body.get("status") != response.status_code:
        problems.append(f"status is not {response.status_code}")
    if not isinstance(body, dict) or not isinstance(body.get("message"), str) \
            or not body["message"]:
        problems.append("no message")
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list) or not all(
            isinstance(e, dict) and isinstance(e.get("field"), str)
            and isinstance(e.get("message"), str) for e in errors):
        problems.append("errors is not a list of {field, message}")
    assert not problems, f"off the error shape ({'; '.join(problems)}): {response.text[:300]}"
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, error_shape]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def hub(request, tmp_path_factory):
    """One hub per database: PostgreSQL refuses values SQLite stores (NUL in text)."""
    base = tmp_path_factory.mktemp("rest-api-fuzz")
    args = []
    if request.param == "postgres":
        db_url = request.getfixturevalue("module_postgres_database")
        args.append(f"--GPULeaseHub.billing_db_url={db_url}")
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=args).start()
    yield h
    h.close()


@pytest.fixture(scope="module")
def tokens(hub) -> dict[str, str]:
    admin = hub.token_for("admin", ADMIN_PW)
    return {"admin": admin, "alice": hub.add_user(admin, "alice")}


@pytest.fixture(scope="module")
def server_tokens(hub, tokens) -> list[str]:
    """Tokens scoped as a server's own (Spawner.server_token_scopes), for alice's
    servers s0..s3: what `PUT api/server-activity` takes. Several, so that the push
    ration (5 at once per server, 20 per user) lets the examples through."""
    minted = []
    for i in range(4):
        scopes = [f"access:servers!server=alice/s{i}", "access:services!service=gpulease",
                  "users:activity!user=alice"]
        r = hub.api("POST", "users/alice/tokens", tokens["alice"],
                    {"scopes": scopes, "note": "a server's own, for the fuzz"})
        assert r.status_code == 201, r.text
        minted.append(r.json()["token"])
    return minted


def fuzzed(op) -> bool:
    tags = set(op.tags or [])
    return "oauth" not in tags and not ("pages" in tags and op.method.upper() != "GET")


def fuzz(op, callers: list[list[str]], mode: GenerationMode, run: Run,
         base_url: str) -> None:
    """EXAMPLES cases of `op`, each sent once by every caller (a caller's tokens in
    turn): generating, not sending, is most of the run's time."""
    checks = CHECKS + [run.ignored_auth_once] + (
        [negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
    turn = iter(range(1 << 30))

    @settings(max_examples=EXAMPLES, derandomize=SEED is None, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @seed(int(SEED or 0))
    @given(case=op.as_strategy(generation_mode=mode))
    def one(case):
        n = next(turn)
        for tokens in callers:
            send(case, tokens[n % len(tokens)])

    def send(case, token: str) -> None:
        headers = {"Authorization": f"token {token}"}
        asked = time.monotonic()
        response = case.call(base_url=base_url, headers=headers, timeout=30,
                             allow_redirects=False)
        run.waited_s += time.monotonic() - asked
        run.sent += 1
        run.by_status[response.status_code] = run.by_status.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except FailureGroup as group:
            run.failures.append(f"{mode.value} {op.label} as {token[:4]}: " + "; ".join(
                f"{f.title}: {f.message}"[:400] for f in group.exceptions)
                + f"\n    answered {response.status_code} {response.text[:200]!r}"
                + f"\n    {case.as_curl_command(headers=headers)}"[:600])

    try:
        one()
    except Unsatisfiable:
        # Nothing to make invalid (no parameters, no body): negative mode has no case.
        assert mode is GenerationMode.NEGATIVE, op.label


def test_fuzz_the_api(hub, tokens, server_tokens, capsys, record_property):
    url = f"{hub.urls.service().rstrip('/')}"
    schema = schemathesis.openapi.from_url(f"{url}/api/openapi.yml", timeout=30)
    ops = [r.ok() for r in schema.get_all_operations() if isinstance(r, Ok)]
    ops = [op for op in ops if fuzzed(op)]
    admin = tokens["admin"]
    profiles = hub.service("GET", "api/profiles", admin).json()["profiles"]
    document = {"profiles": [{k: v for k, v in p.items() if k != "availability"}
                             for p in profiles], "prune": True}
    run, started = Run(), time.monotonic()
    for op in ops:
        callers = [[admin], [tokens["alice"]]]
        if op.label == "PUT /api/server-activity":
            callers.append(server_tokens)  # a server's own token is for its pushes only
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(op, callers, mode, run, url)
        if op.method.upper() != "GET":
            restored = hub.service("PUT", "api/profiles", admin, document)
            assert restored.status_code == 200, restored.text
    # The service answered everything and is still up.
    assert requests.get(f"{url}/", timeout=10).status_code == 200
    summary = (f"schemathesis sent {run.sent} generated requests to {len(ops)} operations "
               f"(statuses {dict(sorted(run.by_status.items()))}); "
               f"in {time.monotonic() - started:.1f} s, {run.waited_s:.1f} s of it waiting "
               f"for answers; {len(run.failures)} failed")
    record_property("generated_requests", run.sent)
    with capsys.disabled():
        print(f"\n{summary}")
    assert not run.failures, summary + "\n" + "\n".join(run.failures)
    assert run.sent >= MIN_REQUESTS, summary


# --- found by fuzzing: each once as a plain request ---------------------------------


@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "api/notices", {"user": "alice", "kind": "credit_low", "message": "a\x00b"},
     "message"),
    ("PUT", "api/profiles", {"profiles": [{"slug": "x", "groups": ["\x00"]}]},
     "profiles[0].groups[0]"),
    ("POST", "api/credits", {"user": "alice", "amount": "1", "note": "\x00"}, "note"),
    ("PUT", "api/limits/user:a%00b", {"max_gpus": 1}, "path"),
    ("DELETE", "api/profiles/a%00b", None, "path"),
])
def test_nul_in_text_is_a_400_naming_where(hub, tokens, method, path, body, field):
    """PostgreSQL cannot store NUL in text: it answered 503 "database cannot be
    reached" (a DataError taken for an outage); SQLite stored it."""
    r = hub.service(method, path, tokens["admin"], body)
    assert r.status_code == 400, r.text
    assert r.json()["errors"] == [{"field": field, "message": NUL_REFUSED}]


@pytest.mark.parametrize("method, path, body", [
    ("GET", "api/usage?since=0001-01-01T00:00:00%2B01:00", None),
    ("GET", "api/audit?until=9999-12-31T23:59:59-01:00", None),
    ("POST", "api/notices", {"user": "alice", "kind": "idle_warning", "message": "m",
                             "deadline": "0001-01-01T00:00:00+01:00"}),
])
def test_a_time_out_of_range_in_utc_is_a_400(hub, tokens, method, path, body):
    """Converting such a time to UTC overflowed: a 500."""
    r = hub.service(method, path, tokens["admin"], body)
    assert r.status_code == 400, r.text
    assert "out of range" in r.json()["message"]


def test_a_push_refused_before_its_body_is_read_leaves_the_service_answering(
        hub, tokens, server_tokens):
    """A push refused in prepare (429 over the ration, 403 not a server's token) left
    its body unread, and tornado closed the connection without saying so: the hub's
    proxy sent its next request, to any path, down that connection, and answered 503
    (40% of such pairs). Found by this module's last check that the service is up."""
    session = requests.Session()
    body = {"kernels": [{"id": f"k{i}", "execution_state": "idle"} for i in range(50)]}
    refused, answers = [], []
    for token in [server_tokens[0]] * 30 + [tokens["alice"]] * 10:
        push = session.put(f"{hub.urls.service().rstrip('/')}/api/server-activity", json=body, timeout=30,
                           headers={"Authorization": f"token {token}"})
        if push.status_code in (403, 429):
            refused.append(push.headers.get("Connection"))
        answers.append(session.get(f"{hub.urls.service().rstrip('/')}/", timeout=30).status_code)
    assert set(answers) == {200}, answers
    assert len(refused) >= 30 and set(refused) == {"close"}, refused


def test_a_deeply_nested_body_is_a_400(hub, tokens):
    """json's recursion limit was a 500."""
    deep = "[" * 100_000 + "]" * 100_000
    r = requests.put(f"{hub.urls.service().rstrip('/')}/api/limits/user:alice", data=deep,
                     headers={"Authorization": f"token {tokens['admin']}"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "nests arrays or objects deeper" in r.json()["message"]


def test_undocumented_methods_are_405_in_the_error_shape(hub, tokens):
    doc = yaml.safe_load(requests.get(f"{hub.urls.service().rstrip('/')}/api/openapi.yml", timeout=30).text)
    admin = {"Authorization": f"token {tokens['admin']}"}
    for path, item in doc["paths"].items():
        if not path.startswith("/api/"):
            continue
        concrete = re.sub(r"\{[^}]+\}", "x", path).replace("group:x", "group:lab")
        for method in {"GET", "PUT", "POST", "DELETE", "PATCH"} - {m.upper() for m in item}:
            r = requests.request(method, f"{hub.urls.service().rstrip('/')}{concrete}", headers=admin,
                                 timeout=30)
            assert r.status_code == 405, f"{method} {concrete}: {r.status_code} {r.text}"
            assert error_shape(None, r, SimpleNamespace(path=path)) is True


def test_the_error_shape_check_can_fail():
    def answer(status: int, text: str):
        response = requests.Response()
        response.status_code, response._content = status, text.encode()
        return response

    api = SimpleNamespace(path="/api/limits")
    good = '{"status": 400, "message": "m", "errors": [{"field": "f", "message": "m"}]}'
    assert error_shape(None, answer(400, good), api) is True
    assert error_shape(None, answer(200, "{}"), api) is None
    assert error_shape(None, answer(404, "<html>"), SimpleNamespace(path="/usage")) is None
    for bad in ("<html>", '{"status": 404, "message": "m", "errors": []}',
                '{"status": 400, "message": "", "errors": []}',
                '{"status": 400, "message": "m", "errors": [{"field": 1}]}',
                '{"status": 400, "message": "m"}'):
        with pytest.raises(AssertionError):
            error_shape(None, answer(400, bad), api)
