"""Issue 47, end to end in-process: the real idle culler reading GPUs through the NVML TEST
DOUBLE (tests/support/nvml_double.py) pushes to the real gpulease service, and researchers see
it on `GET api/me/gpu`, the usage API and the usage page (the real page handler).

Why in-process and not a real hub (tests/e2e): the culler a hub starts takes its GPU source
from `--gpu-source` (nvml, prometheus:URL, none), and gpulease has no hook that loads a test
double in a production process (nor should it). So the culler here is the real `Culler` and
`ReadingsLoop` with `NvmlGpuSource(NvmlDouble(...))`; it lists servers from the culler's
FAKE hub (tests/support/culler_fakehub.py), whose `/services/gpulease/api/gpu-readings` is
relayed, as the proxy routes it, to the real service app (hub/service/app.py) on its own
port, with its own SQLite database and a FAKE hub API that only says whose each token is.

The "no reading" path: a GPU the double reports lost (an NVML error) is sent as null with
why, shown so to its researcher, and its session's statistics stay null: "no reading",
never 0.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado import web
from tornado.httpclient import AsyncHTTPClient

from gpulease.core.clock import utcnow
from gpulease.core.units import seconds_text
from gpulease.idle_culler.gpu import NvmlGpuSource
from gpulease.idle_culler.readings import ReadingsLoop
from gpulease.store.gpu_stats import GpuSample, fold_readings
from gpulease.store.sessions import SessionLedger
from tests.support.culler_fakehub import REF, TOKEN, Clock, FakeHandler, FakeServer, culler_for
from tests.support.culler_fakehub import start as start_culler_hub
from tests.support.nvml_double import NvmlDouble, NVMLErrorDouble
from tests.support.service_app import ctx_of, running_service

GIB = 1 << 30
HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
# Whose each token is, as the hub would say: the culler (a gpulease admin) and two researchers.
TOKENS: dict[str, dict[str, Any]] = {
    TOKEN: {"kind": "service", "name": "gpulease-culler",
            "scopes": ["custom:gpulease:admin", "access:services!service=gpulease"]},
    **{f"{name}-token": {"kind": "user", "name": name, "admin": False, "groups": [],
                         "scopes": [f"access:servers!user={name}", f"read:users!user={name}",
                                    "access:services!service=gpulease"]}
       for name in ("ada", "bob")},
}


class LostGpuNvml(NvmlDouble):
    """The NVML double with GPUs that fell off the bus: every query of them is an NVML error,
    as the driver answers for a GPU that is lost (Xid 79)."""

    def __init__(self, gpus: dict[str, int], lost: set[str], memory: dict[str, tuple[int, int]]):
        super().__init__({**gpus, **dict.fromkeys(lost, 0)}, {}, memory=memory)
        self.lost = lost

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        if h in self.lost:
            raise NVMLErrorDouble("GPU is lost")
        return super().nvmlDeviceGetUtilizationRates(h)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        if h in self.lost:
            raise NVMLErrorDouble("GPU is lost")
        return super().nvmlDeviceGetMemoryInfo(h)


def user_model(name: str) -> dict[str, Any] | None:
    """The hub's model of a user, which the usage page asks for their groups."""
    if f"{name}-token" not in TOKENS:
        return None
    return {"kind": "user", "name": name, "admin": False, "groups": [], "servers": {}}


@pytest.fixture
async def service(tmp_path, monkeypatch) -> AsyncIterator[tuple[str, web.Application]]:
    """The real gpulease service app and its fake hub API; (base URL, app)."""
    async with running_service(tmp_path, monkeypatch, TOKENS, user_model) as (base, app):
        yield base, app


def engine_of(app: web.Application) -> Any:
    return ctx_of(app).engine


async def call(base: str, path: str, token: str) -> tuple[int, Any]:
    r = await AsyncHTTPClient().fetch(base + path, raise_error=False,
                                      headers={"Authorization": f"token {token}"})
    return r.code, json.loads(r.body) if r.body else None


def login_cookie(app: web.Application, token: str) -> str:
    """What a signed-in browser sends: the service's signed cookie holding a hub token."""
    name = HubOAuth().cookie_name
    value = web.create_signed_value(app.settings["cookie_secret"], name, token)
    return f"{name}={value.decode()}"


async def usage_page(base: str, app: web.Application, user: str) -> str:
    r = await AsyncHTTPClient().fetch(base + "usage", raise_error=False, follow_redirects=False,
                                      headers={**HTML,
                                               "Cookie": login_cookie(app, f"{user}-token")})
    page = (r.body or b"").decode()
    assert r.code == 200, (r.code, page[:2000])
    return page


class ServiceRelay(FakeHandler):
    """The proxy's route from the culler's `public_url` to the real service: the culler's
    PUT, its token and body as sent, and the service's answer back."""

    def initialize(self, hub: Any, service_base: str) -> None:  # type: ignore[override]
        super().initialize(hub)
        self.service_base = service_base

    async def put(self) -> None:
        r = await AsyncHTTPClient().fetch(
            self.service_base + "api/gpu-readings", method="PUT", body=self.request.body,
            raise_error=False, headers={"Authorization": self.request.headers["Authorization"],
                                        "Content-Type": "application/json"})
        self.set_status(r.code)
        if r.body:
            self.write(r.body)


SESSIONS_TABLE = re.compile(r"<h2>Sessions</h2>.*?<table>(.*?)</table>", re.S)
ROW = re.compile(r"<tr>(.*?)</tr>", re.S)
CELL = re.compile(r"<t([hd])([^>]*)>(.*?)</t\1>", re.S)
COLSPAN = re.compile(r'colspan="(\d+)"')


def sessions_table(page: str) -> dict[str, Any]:
    """The usage page's sessions table: header labels, body rows' cells, and the footer's
    cells as (text, first column, width) so that what lines up under what can be checked."""
    found = SESSIONS_TABLE.search(page)
    assert found, "no sessions table"
    table = found.group(1)
    head = table[table.index("<thead>"):table.index("</thead>")]
    body = table[table.index("<tbody>"):table.index("</tbody>")]
    foot = table[table.index("<tfoot>"):table.index("</tfoot>")]

    def texts(row: str) -> list[str]:
        return [re.sub(r"\s+", " ", text).strip() for _, _, text in CELL.findall(row)]

    footer, column = [], 0
    for _, attrs, text in CELL.findall(ROW.findall(foot)[0]):
        span = int(COLSPAN.search(attrs).group(1)) if COLSPAN.search(attrs) else 1
        footer.append((text.strip(), column, span))
        column += span
    return {"head": texts(ROW.findall(head)[0]),
            "rows": [texts(r) for r in ROW.findall(body)], "footer": footer}


async def test_nvml_readings_reach_the_researcher_and_a_lost_gpu_reads_no_reading(service):
    base, app = service
    engine = engine_of(app)
    started = utcnow() - dt.timedelta(minutes=20)
    ledger = SessionLedger(engine)
    ada_session = ledger.open("ada", "", "h200-1g", "user:ada", 2_000_000, started)
    bob_session = ledger.open("bob", "train", "h200-1g", "user:bob", 2_000_000, started)

    servers = [FakeServer("ada", "", "gpu-busy", devices=["GPU-ada"]),
               FakeServer("bob", "train", "idle", devices=["GPU-bob"])]
    clock = Clock(REF)
    hub, http, client = await start_culler_hub(servers, clock=clock)
    http.request_callback.add_handlers(".*", [(
        r"/services/gpulease/api/gpu-readings", ServiceRelay,
        {"hub": hub, "service_base": base})])
    nvml = LostGpuNvml({"GPU-ada": 40}, lost={"GPU-bob"},
                       memory={"GPU-ada": (12 * GIB, 80 * GIB)})
    culler = culler_for(client, servers, clock)
    culler.gpu = NvmlGpuSource(nvml)  # the culler's GPU source: NVML, here its double
    try:
        await culler.run_pass()  # the servers the readings loop reads are the last pass's
        loop = ReadingsLoop(culler)
        assert await loop.tick()
        nvml.gpus["GPU-ada"], nvml.memory["GPU-ada"] = 80, (20 * GIB, 80 * GIB)
        assert await loop.tick()
        nvml.gpus["GPU-ada"], nvml.memory["GPU-ada"] = 60, (16 * GIB, 80 * GIB)
        assert await loop.tick()
    finally:
        http.stop()
        await client.close()
    assert "util" in nvml.calls and "memory GPU-ada" in nvml.calls  # read through the double

    # ada's server, as her status bar asks for it: the latest reading and the last hour's.
    code, ada = await call(base, "api/me/gpu", "ada-token")
    assert code == 200, ada
    assert ada["reading"]["activity"] == 60.0 and ada["reading"]["source"] == "nvml"
    assert ada["reading"]["memory_used_bytes"] == 16 * GIB
    assert ada["reading"]["memory_total_bytes"] == 80 * GIB and ada["reading"]["why"] == ""
    # the last hour a point a minute: the three ticks in one minute, or across two
    assert [h["activity"] for h in ada["history"]] in ([60.0], [40.0, 70.0], [60.0, 60.0])
    assert max(h["memory_used_bytes"] for h in ada["history"]) == 20 * GIB
    assert ada["profile"] == "h200-1g"

    # bob's lost GPU: null with the driver's why, never 0, never a guess.
    code, bob = await call(base, "api/me/gpu?server=train", "bob-token")
    assert code == 200, bob
    reading = bob["reading"]
    assert reading["activity"] is None and reading["memory_used_bytes"] is None
    assert reading["source"] == ""
    assert "GPU-bob: NVML: GPU is lost" in reading["why"]
    assert "memory: GPU-bob: NVML: GPU is lost" in reading["why"]
    assert bob["history"] and all(h["activity"] is None and h["memory_used_bytes"] is None
                                  for h in bob["history"])

    # Both servers stop; their closed sessions keep what their readings made of them.
    ended = utcnow()
    ledger.close(ada_session.id, ended, "user")
    ledger.close(bob_session.id, ended, "user")
    code, usage = await call(base, "api/usage", "ada-token")
    assert code == 200, usage
    assert usage["sessions"][0]["gpu"] == {"mean_activity": 60.0, "peak_activity": 80.0,
                                           "peak_memory_bytes": 20 * GIB, "source": "nvml"}
    code, usage = await call(base, "api/usage", "bob-token")
    assert code == 200, usage
    assert usage["sessions"][0]["gpu"] == {"mean_activity": None, "peak_activity": None,
                                           "peak_memory_bytes": None, "source": None}

    # And as each researcher's usage page shows them.
    ada_row = sessions_table(await usage_page(base, app, "ada"))["rows"][0]
    assert ada_row[-3:] == ["60.0 %", "80.0 %", "20.00 GiB"]
    bob_row = sessions_table(await usage_page(base, app, "bob"))["rows"][0]
    assert bob_row[-3:] == ["no reading"] * 3


async def test_the_usage_page_shows_gpu_columns_and_a_footer_that_lines_up(service):
    """A session with GPU statistics and one without, on the real page handler: the three
    GPU columns' text, "no reading" where null (never 0), and the footer's Total, billed
    seconds and cost under their own headers, its cells as wide as the header (ca232f3)."""
    base, app = service
    engine = engine_of(app)
    ledger = SessionLedger(engine)
    now = utcnow()
    read = ledger.open("ada", "", "h200-1g", "user:ada", 3_600_000,
                       now - dt.timedelta(hours=2))
    listed = now - dt.timedelta(hours=2, seconds=5)  # the hub lists it before it opens
    fold_readings(engine, [GpuSample("ada", "", listed, 30.0, 4 * GIB, "gpm"),
                           GpuSample("ada", "", listed, 70.0, 6 * GIB, "gpm")], 10_000)
    ledger.close(read.id, now - dt.timedelta(hours=1), "user")  # an hour: 1 credit
    # A CPU-only or never-read server: its session has no GPU figures at all.
    unread = ledger.open("ada", "cpu", "h200-1g", "user:ada", 3_600_000,
                         now - dt.timedelta(minutes=30))
    ledger.close(unread.id, now, "user")  # half an hour: 0.5 credit

    table = sessions_table(await usage_page(base, app, "ada"))
    head = table["head"]
    assert head[-5:] == ["billed seconds", "cost (credits)", "GPU mean", "GPU peak",
                         "GPU memory peak"]
    assert all(len(row) == len(head) for row in table["rows"]), table["rows"]
    by_server = {row[head.index("server")]: row for row in table["rows"]}
    assert by_server["(default)"][-3:] == ["50.0 %", "70.0 %", "6.00 GiB"]
    assert by_server["cpu"][-3:] == ["no reading", "no reading", "no reading"]

    # The footer: as wide as the header, Total first, the totals the usage API gives under
    # billed seconds and cost, one empty cell under the three GPU columns.
    code, usage = await call(base, "api/usage", "ada-token")
    assert code == 200, usage
    totals = usage["totals"]
    footer = table["footer"]
    assert sum(span for _, _, span in footer) == len(head)
    assert footer[0][:2] == ("Total", 0)
    under = {column: text for text, column, span in footer if span == 1}
    assert under == {head.index("billed seconds"): seconds_text(totals["billed_ms"]),
                     head.index("cost (credits)"): totals["cost"]}
    assert totals["billed_seconds"] == 5400  # the hour and the half hour
    assert footer[-1] == ("", head.index("GPU mean"), 3)
