"""JupyterLab's status bar shows the server's GPU and cost, in a real headless Chromium.

A real hub, proxy and JupyterLab server (an H200 1g.18gb slice of the demo inventory)
whose culler pushes no GPU readings (`culler_readings_interval=0`): the status bar
shows the profile, the cost and rate, and "no reading", never a made-up figure. A
reading then PUT to `api/gpu-readings` with an admin token (what the culler does)
shows in it within seconds, with its source; clicking it opens the last hour's
chart (a point a second here: `gpu_chart_step=1`), where a step without activity is
a gap. The status bar asks the server
(gpulease.singleuser.gpu_status), which asks the service with the server's own
token: another researcher's token gets 403 at the server. Any 4xx or 5xx answer
on the way fails the test (tests/support/browser.py ALLOWED_ERRORS).
"""

from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime

import pytest
import requests

from tests.support.browser import sign_in, wait_for_jupyterlab
from tests.support.hubproc import ADMIN_PW, HubProcess

pytestmark = pytest.mark.e2e
GIB = 2**30


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser_lab_gpu")
    # No culler readings: the server starts with none, and the test's PUTs are the only ones.
    # A point a second on the chart, so that three readings a second apart are three points.
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW,
                   extra_args=["--GPULeaseHub.culler_readings_interval=0",
                               "--GPULeaseHub.gpu_chart_step=1"]).start()
    h.admin = h.token_for("admin", ADMIN_PW)
    yield h
    h.close()


def reading(started: str, activity: float | None, used: int | None, why: str = "") -> dict:
    return {"servers": [{"user": "dee", "server": "", "started": started, "activity": activity,
                         "memory_used_bytes": used, "memory_total_bytes": int(17.8 * GIB),
                         "source": "nvml", "why": why}]}


def test_status_bar_cost_then_a_reading_then_the_chart(hub, browser_context):
    token = hub.add_user(hub.admin, "dee")
    other = hub.add_user(hub.admin, "eve")
    page = browser_context.new_page()
    sign_in(page, hub.url, "dee", "dee-pw-12345")
    page.goto(f"{hub.url}/hub/spawn")
    page.locator('input[name="profile"][value="h200-1g"]').check()
    page.locator('form#spawn_form [type="submit"]').click()
    wait_for_jupyterlab(page)

    # the profile, the cost and its rate, and no reading: the culler has pushed none
    item = page.locator(".gpulease-gpu-status")
    item.wait_for(state="visible", timeout=30_000)
    page.wait_for_function(
        "() => /h200-1g .* cr \\(.* cr\\/h\\).*GPU: no reading/.test("
        "document.querySelector('.gpulease-gpu-status').textContent)", timeout=30_000)
    assert "%" not in item.text_content() and "GiB" not in item.text_content()

    # the culler's readings (an admin's PUT): the bar shows the latest within seconds
    # (each for the server's start as the hub lists it, as the culler sends them)
    started = hub.api("GET", "users/dee", hub.admin).json()["servers"][""]["started"]
    # the session the spawner opened names that very run (what the readings are matched to)
    with sqlite3.connect(hub.state / "private" / "gpulease.sqlite") as db:
        (run,) = db.execute("SELECT run_started_at FROM sessions WHERE user_name = 'dee' "
                            "AND ended_at IS NULL").fetchone()
    assert datetime.fromisoformat(run) == datetime.fromisoformat(
        started.replace("Z", "+00:00")).replace(tzinfo=None), (run, started)
    for body in (reading(started, 20.0, 2 * GIB),
                 reading(started, None, 3 * GIB, why="no GPM on this GPU"),
                 reading(started, 37.0, int(4.1 * GIB))):
        r = hub.service("PUT", "api/gpu-readings", hub.admin, body)
        assert r.status_code == 204, r.text
        time.sleep(1.1 - time.time() % 1)  # just into the chart's next step (a second)
    page.wait_for_function(
        "() => document.querySelector('.gpulease-gpu-status').textContent"
        ".includes('GPU 37% · 4.1/17.8 GiB (nvml)')", timeout=15_000)
    text = item.text_content()
    assert re.search(r"h200-1g · \d+\.\d+ cr \(\d+\.\d+ cr/h\)", text), text

    # clicking it opens the last hour's chart; the reading without activity is a gap
    item.click()
    panel = page.locator("#gpulease-gpu-panel")
    panel.wait_for(state="visible", timeout=15_000)
    chart = panel.locator("svg.gpulease-gpu-chart")
    chart.wait_for(state="visible")
    assert "read by nvml" in panel.locator(".gpulease-gpu-panel-legend").text_content()
    # activity: 20, none, 37 — two separate points, never a line through a made-up zero
    assert chart.locator("circle.gpulease-gpu-activity").count() == 2
    assert chart.locator("polyline.gpulease-gpu-activity").count() == 0
    memory = chart.locator("polyline.gpulease-gpu-memory")
    assert memory.count() == 1 and len(memory.get_attribute("points").split()) == 3

    # another researcher's token is refused by the server itself, before the service
    r = requests.get(hub.server_url("dee", "", "gpulease/gpu"), timeout=30,
                     headers={"Authorization": f"token {other}"}, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    mine = requests.get(hub.server_url("dee", "", "gpulease/gpu"), timeout=30,
                        headers={"Authorization": f"token {token}"}, allow_redirects=False)
    assert mine.status_code == 200 and mine.json()["reading"]["source"] == "nvml", mine.text

    browser_context.http_errors.check()
    hub.api("DELETE", "users/dee/server", token)
    hub.wait_server_stopped("dee", token)
