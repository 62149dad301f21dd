"""Issue 48 in a real headless Chromium on a real hub: the spawn page's "Which profile does
my work need?" panel.

A researcher opens the panel, describes an inference run of Llama 3.2 1B, and reads the
estimate part by part with how each was computed, the profiles it fits cheapest first
with their price and what is free, and the one to start; "Choose" checks that profile's
card, and nothing starts. A full fine-tune of Llama 3.1 8B fits nothing here and the
panel says what to try; a parameter count that is none is refused, naming it. Waits are
for what a person sees.
"""

from __future__ import annotations

import re

import pytest

from tests.support.hubproc import HubProcess

ADMIN_PW = "admin-secret-pw"
ADA_PW = "ada-pw-123456"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = HubProcess(state=tmp_path_factory.mktemp("recommend") / "state",
                   admin_password=ADMIN_PW).start()
    admin = h.token_for("admin", ADMIN_PW)
    r = h.service("POST", "api/users", admin, {"name": "ada", "password": ADA_PW})
    assert r.status_code == 201, r.text
    yield h
    h.close()


def test_the_panel_recommends_a_profile_and_chooses_it(hub, browser_context):
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "ada")
    page.fill("#password_input", ADA_PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
    page.goto(f"{hub.url}/hub/spawn")

    panel = page.locator(".gpulease-recommend")
    panel.get_by_text("Which profile does my work need?").click()
    panel.get_by_label("Model").select_option("llama-3.2-1b")
    panel.get_by_label("Task").select_option("inference")
    panel.get_by_label("Sequence length").fill("4096")
    panel.get_by_role("button", name="Estimate").click()

    reason = panel.locator(".gl-rec-reason")
    reason.wait_for()
    assert "H200 slice (1g.18gb) (h200-1g) is the cheapest profile that fits" in \
        reason.inner_text()
    assert re.search(r"Estimated GPU memory: \d+\.\d\d GB", panel.inner_text())
    kv = panel.locator('.gl-rec-part[data-part="kv_cache"]')
    assert "16 layers x 8 KV heads x 64" in kv.inner_text()
    fits = panel.locator(".gl-rec-fit")
    assert fits.first.get_attribute("data-profile") == "h200-1g"
    assert "1.200000 credits/h, 7 of 7 free" in fits.first.inner_text()

    chosen = page.locator('input[name="profile"][value="h200-1g"]')
    page.locator('input[name="profile"][value="h200-full"]').check()
    panel.get_by_role("button", name="Choose H200 slice (1g.18gb)").click()
    assert chosen.is_checked()
    assert "/hub/spawn" in page.url  # choosing starts nothing

    # A full fine-tune of an 8B model fits no profile here: the panel says what to try.
    panel.get_by_label("Model").select_option("llama-3.1-8b")
    panel.get_by_label("Task").select_option("full")
    panel.get_by_role("button", name="Estimate").click()
    page.get_by_text("No profile you may use fits").wait_for()
    assert panel.locator(".gl-rec-fit").count() == 0
    browser_context.http_errors.check()

    # A parameter count that is none: refused, naming the field.
    panel.get_by_label("Model").select_option("")
    panel.get_by_label("Parameters (if another)").fill("lots")
    panel.get_by_role("button", name="Estimate").click()
    page.locator(".gl-rec-error").get_by_text("parameters:").wait_for()
    assert [a[:2] for a in browser_context.http_errors.answers] == [(400, "GET")]
    assert browser_context.http_errors.answers[0][2].endswith("/hub/gpulease/recommend")
