"""gpulease.singleuser.gpu_status: `GET {base_url}gpulease/gpu` of a real Jupyter server.

The same real `jupyter server` as test_singleuser_notices.py (the environment's config
enables the extension as installs do; the hub's environment for the named server
`gpu2`), against a loopback stand-in for the gpulease service's `GET api/me/gpu`:
the answer passed through (documented fields only), asked with the server's own
token for its own server, cached, and a failure 200 with `error`, never a 500.
The real service's own 403s are tests/integration/web/test_gpu_api.py's; another
researcher's browser at a real hub's server is tests/browser/test_lab_gpu_status.py's.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpulease.singleuser.gpu_status import GpuStatusSource, gpu_url, passed_through
from tests.integration.host.test_singleuser_notices import (
    BROWSER_TOKEN,
    SERVER_TOKEN,
    Server,
    free_port,
)

MY_GPU: dict[str, Any] = {
    "user": "alice", "server": "gpu2", "account": "user:alice", "profile": "h200-1g",
    "rate_per_hour": "36.000000", "cost_so_far": "1.230000", "balance": "1476.000000",
    "runway_s": 147600, "runway_by": "cap", "as_of": "2030-01-01T00:02:03Z",
    "history_step_s": 60, "now": "2030-01-01T00:02:05Z",
    "reading": {"activity": 37.0, "memory_used_bytes": 4402341478,
                "memory_total_bytes": 19112493056, "source": "nvml", "why": "",
                "at": "2030-01-01T00:02:00Z", "extra": "not passed on"},
    "history": [{"at": "2030-01-01T00:01:50Z", "activity": None, "memory_used_bytes": None},
                {"at": "2030-01-01T00:02:00Z", "activity": 37.0,
                 "memory_used_bytes": 4402341478, "extra": 1}],
    "internal": "not passed on",
}


class FakeService:
    """The gpulease service's `GET api/me/gpu`: the server's own token only, as the
    real one (another server's or user's is 403 there)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.answer: tuple[int, bytes] = (200, json.dumps(MY_GPU).encode())
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):  # noqa: N802 - the server's activity pushes: accepted, unread
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(204)
                self.end_headers()

            def do_GET(self):  # noqa: N802
                service.requests.append((self.path, self.headers.get("Authorization")))
                code, body = service.answer
                if not self.path.startswith("/services/gpulease/api/me/gpu"):
                    code, body = 404, b'{"message": "not found"}'
                elif self.headers.get("Authorization") != f"token {SERVER_TOKEN}":
                    code, body = 403, b'{"message": "forbidden"}'
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def gpu_requests(self) -> list[tuple[str, str | None]]:
        return [r for r in self.requests if r[0].startswith("/services/gpulease/api/me/gpu")]


@pytest.fixture(scope="module")
def service() -> Iterator[FakeService]:
    s = FakeService()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture(scope="module")
def server(service, tmp_path_factory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("gpu"), f"http://127.0.0.1:{service.port}/hub/api")
    yield s
    s.stop()


@pytest.fixture
def fresh(server) -> Server:
    time.sleep(3.1)  # past the handler's cache (CACHE_SECONDS): the next GET asks again
    return server


def test_the_answer_is_passed_through_with_the_documented_fields_only(fresh, service):
    service.answer = (200, json.dumps(MY_GPU).encode())
    r = fresh.get("gpulease/gpu")
    assert r.status_code == 200, fresh.output()
    assert r.headers["Cache-Control"] == "no-store"
    body = r.json()
    assert "error" not in body, body
    expected = {k: v for k, v in MY_GPU.items() if k != "internal"}
    expected["reading"] = {k: v for k, v in MY_GPU["reading"].items() if k != "extra"}
    expected["history"] = [{k: v for k, v in h.items() if k != "extra"}
                           for h in MY_GPU["history"]]
    # all of it, the service's clock ("now") included: the chart's points are on it
    assert body == expected
    # its own server, with its own token, at the service's URL the spawner gave
    assert service.gpu_requests()[-1] == ("/services/gpulease/api/me/gpu?server=gpu2",
                                          f"token {SERVER_TOKEN}")


def test_many_tabs_one_request(fresh, service):
    service.answer = (200, json.dumps(MY_GPU).encode())
    assert fresh.get("gpulease/gpu").status_code == 200
    before = len(service.gpu_requests())
    for _ in range(5):
        assert fresh.get("gpulease/gpu").status_code == 200
    assert len(service.gpu_requests()) == before  # within the cache: no new request
    time.sleep(3.1)
    assert fresh.get("gpulease/gpu").status_code == 200
    assert len(service.gpu_requests()) == before + 1  # and then a fresh answer


@pytest.mark.parametrize(("answer", "error"), [
    ((503, b'{"message": "database down"}'), "the gpulease service answered 503"),
    ((403, b'{"message": "no"}'), "the gpulease service answered 403"),
    ((200, b"<html>a proxy's page</html>"), "unreadable answer from the gpulease service"),
    ((200, b'{"user": "alice"}'), "unreadable answer from the gpulease service"),
])
def test_a_failing_service_is_200_with_error_never_a_500(fresh, service, answer, error):
    service.answer = answer
    r = fresh.get("gpulease/gpu")
    assert r.status_code == 200, fresh.output()
    body = r.json()
    assert body["server"] == "gpu2" and error in body["error"], body
    assert "reading" not in body and "cost_so_far" not in body  # nothing made up


def test_service_unreachable_is_200_with_error(tmp_path):
    down = Server(tmp_path, f"http://127.0.0.1:{free_port()}/hub/api")
    try:
        r = down.get("gpulease/gpu")
        assert r.status_code == 200, down.output()
        assert "cannot reach the gpulease service" in r.json()["error"]
    finally:
        down.stop()


def test_only_the_servers_own_clients_get_in(server, service):
    before = len(service.gpu_requests())
    for token in (None, "someone-elses-token", SERVER_TOKEN):
        r = server.get("gpulease/gpu", token=token)
        assert r.status_code == 403, (token, r.status_code, r.text[:200])
    assert len(service.gpu_requests()) == before  # refused before the service is asked
    assert server.get("gpulease/gpu", token=BROWSER_TOKEN).status_code == 200


def test_polling_is_not_activity(server):
    before = server.get("api/status").json()["last_activity"]
    time.sleep(0.05)
    for _ in range(3):
        assert server.get("gpulease/gpu").status_code == 200
    assert server.get("api/status").json()["last_activity"] == before


# --- pure parts ----------------------------------------------------------------


def test_gpu_url_names_this_server_and_never_guesses_the_service():
    env = {"GPULEASE_SERVICE_URL": "http://127.0.0.1:10101/services/gpulease/",
           "JUPYTERHUB_SERVER_NAME": "a b&c"}
    assert gpu_url(env) == \
        "http://127.0.0.1:10101/services/gpulease/api/me/gpu?server=a+b%26c"
    assert gpu_url({"GPULEASE_SERVICE_URL": "http://s/"}) == "http://s/api/me/gpu?server="
    assert gpu_url({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}) is None


def test_passed_through_keeps_no_reading_as_null():
    body = passed_through({**MY_GPU, "reading": None, "history": ["junk"]})
    assert body["reading"] is None and body["history"] == []
    with pytest.raises(ValueError):
        passed_through([MY_GPU])


def test_concurrent_asks_share_one_request():
    calls = 0

    async def fetch() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return dict(MY_GPU)

    async def main() -> list[dict[str, Any]]:
        source = GpuStatusSource(url="http://unused/", token="t", server_name="gpu2")
        source._fetch = fetch  # type: ignore[method-assign]
        return await asyncio.gather(*(source.get() for _ in range(10)))

    answers = asyncio.run(main())
    assert calls == 1 and all(a["profile"] == "h200-1g" for a in answers)
