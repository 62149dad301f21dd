"""Every way a researcher's browser reaches JupyterLab, in a real headless Chromium.

A real hub, proxy and JupyterLab servers on the demo inventory (seven H200
1g.18gb slices and a whole H200). Each path ends the way a person checks it:
JupyterLab's own shell on screen, a notebook opened from the launcher, a cell
typed and run with Shift+Enter that prints CUDA_VISIBLE_DEVICES, and in the
page the device UUIDs the hub assigned (its inventory says which). Any 4xx or
5xx answer on the way fails the test (tests/support/browser.py ALLOWED_ERRORS).

- bea creates a named server for a slice on the home page, stops it, resumes it
  on the whole card ("Other profile…"), opens it again with Open and follows a
  deep link to a notebook in it;
- cy starts a slice with a short idle timeout from the spawn page: JupyterLab
  shows the culler's warning, the server is suspended, and Resume on the home
  page brings the same profile back into JupyterLab.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES
from tests.support.browser import devices_seen_in_lab, wait_for_jupyterlab
from tests.support.hubproc import HubProcess

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
ADMIN_PW = "admin-secret-pw"
IDLE_S = 40  # the brief profile's idle timeout; the culler warns 20 s before


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser_lab")
    profiles = yaml.safe_load((SAMPLE_PROFILES).read_text())
    brief = next(p for p in profiles["profiles"] if p["slug"] == "h200-1g")
    profiles["profiles"].append({**brief, "slug": "brief", "display_name": "Brief slice",
                                 "idle_timeout": f"{IDLE_S}s", "min_run": "1m"})
    (base / "profiles.yaml").write_text(yaml.safe_dump(profiles))
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={base / 'profiles.yaml'}", "--GPULeaseHub.culler_interval=1",
        f"--GPULeaseHub.culler_warn_before={IDLE_S // 2}s"]).start()
    h.admin = h.token_for("admin", ADMIN_PW)
    yield h
    h.close()


def log_in(page, hub: HubProcess, user: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", f"{user}-pw-12345")
    page.click("#login_submit")
    page.locator("tr.gpulease-server, form#spawn_form").first.wait_for()


def home_row(page, hub: HubProcess, server: str):
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_function("window._jupyterhub_page_loaded === true")
    return page.locator(f'tr.gpulease-server[data-server-name="{server}"]')


def assert_lab_shows_the_assigned_devices(page, hub: HubProcess, user: str, server: str,
                                         prefix: str) -> list[str]:
    seen = devices_seen_in_lab(page)
    assigned = hub.assigned_devices(hub.admin, user, server)
    assert len(assigned) == 1 and assigned[0].startswith(prefix), assigned
    assert seen == assigned
    return seen


def test_named_server_other_profile_open_and_deep_link(hub, browser_context):
    token = hub.add_user(hub.admin, "bea")
    page = browser_context.new_page()
    log_in(page, hub, "bea")

    # a named server for the slice, from the home page
    home_row(page, hub, "")
    page.fill(".gpulease-new-name", "train")
    page.select_option(".gpulease-new-profile", "h200-1g")
    page.click(".gpulease-create-start")
    slice_ = assert_lab_shows_the_assigned_devices(page, hub, "bea", "train", "MIG-")

    # stopped, then resumed on the whole card through "Other profile…"
    row = home_row(page, hub, "train")
    row.locator(".stop-server").click()
    page.wait_for_selector('tr[data-server-name="train"][data-state="stopped"]',
                           timeout=60_000)
    row = home_row(page, hub, "train")
    row.get_by_role("link", name=re.compile("Other profile")).click()
    page.locator('input[name="profile"][value="h200-full"]').check()
    page.locator('form#spawn_form [type="submit"]').click()
    full = assert_lab_shows_the_assigned_devices(page, hub, "bea", "train", "GPU-")
    assert full != slice_

    # Open on the home page, and a deep link to a notebook
    row = home_row(page, hub, "train")
    assert row.get_attribute("data-state") == "running"
    row.get_by_role("link", name="Open").click()
    wait_for_jupyterlab(page)
    r = requests.put(hub.server_url("bea", "train", "api/contents/deep.ipynb"), timeout=30,
                     headers={"Authorization": f"token {token}"},
                     json={"type": "notebook", "format": "json", "content": {
                         "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})
    assert r.status_code in (200, 201), r.text
    page.goto(hub.server_url("bea", "train", "lab/tree/deep.ipynb"))
    wait_for_jupyterlab(page)
    tab = page.locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
                       has_text="deep.ipynb")
    tab.first.wait_for(timeout=120_000)
    browser_context.http_errors.check()
    hub.api("DELETE", "users/bea/servers/train", token)
    hub.wait_server_stopped("bea", token, "train")


def test_culler_warning_in_jupyterlab_then_resume(hub, browser_context):
    token = hub.add_user(hub.admin, "cy")
    page = browser_context.new_page()
    log_in(page, hub, "cy")
    page.goto(f"{hub.url}/hub/spawn")
    page.locator('input[name="profile"][value="brief"]').check()
    page.locator('form#spawn_form [type="submit"]').click()
    devices = assert_lab_shows_the_assigned_devices(page, hub, "cy", "", "MIG-")

    # the notebook sits idle: the culler warns, and JupyterLab shows it
    deadline = time.monotonic() + IDLE_S + 30
    while time.monotonic() < deadline:
        notices = hub.service("GET", "api/notices", token).json().get("notices", [])
        if any(n.get("kind") == "idle_warning" for n in notices):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no idle warning for cy within {IDLE_S + 30}s")
    # the researcher comes back to the tab (JupyterLab looks for notices on focus)
    page.evaluate("window.dispatchEvent(new Event('focus'))")
    toast = page.get_by_text(re.compile(
        r"Your default server has been idle .* will be suspended at \d\d:\d\d UTC unless you "
        r"use it\. Your files are kept\. \((\d+ min left|any moment now)\)", re.S))
    toast.first.wait_for(timeout=30_000)

    # suspended, then Resume on the home page: the same profile, in JupyterLab again
    hub.wait_server_stopped("cy", token, timeout=IDLE_S + 30)
    row = home_row(page, hub, "")
    assert row.get_attribute("data-state") == "suspended"
    row.get_by_role("button", name="Resume").click()
    again = assert_lab_shows_the_assigned_devices(page, hub, "cy", "", "MIG-")
    assert len(again) == len(devices)
    assert hub.service("GET", "api/usage", token).json()["sessions"][-1]["profile"] == "brief"
    browser_context.http_errors.check("server stopped")  # the open tab, after the suspend
    hub.api("DELETE", "users/cy/server", token)
    hub.wait_server_stopped("cy", token)
