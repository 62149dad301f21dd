"""Issue 48 in a real headless Chromium on a real hub: the spawn page's "Which profile does
my work need?" panel.

A parameter count typed with the Model select left alone is what is estimated, and the
answer names it; an admin on another user's spawn page is shown that user's profiles.

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

from tests.support.browser import sign_in
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
    # a cheap profile only the staff group may start: the admin is in it, ada is not
    r = h.service("PUT", "api/profiles/staff-h200", admin, {
        "display_name": "Staff H200", "description": "staff only", "cpu": 1,
        "memory": "1Gi", "images": ["pytorch"], "price_per_hour": "0.50",
        "groups": ["staff"], "gpu": {"model": "H200", "count": 1}})
    assert r.status_code == 201, r.text
    h.join_group(admin, "staff", ["admin"])
    yield h
    h.close()


def _estimate_fits(page, model: str, task: str) -> list[str]:
    """Open the panel, estimate `model` for `task`, and read the profiles it lists."""
    panel = page.locator(".gpulease-recommend")
    panel.get_by_text("Which profile does my work need?").click()
    panel.get_by_label("Model").select_option(model)
    panel.get_by_label("Task").select_option(task)
    panel.get_by_role("button", name="Estimate").click()
    panel.locator(".gl-rec-reason").wait_for()
    return panel.locator(".gl-rec-fit").evaluate_all("els => els.map(e => e.dataset.profile)")


def test_the_panel_recommends_a_profile_and_chooses_it(hub, browser_context):
    page = browser_context.new_page()
    sign_in(page, hub.url, "ada", ADA_PW)
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
    assert re.search(r"Estimated GPU memory for Llama 3.2 1B, 1.24 B parameters: \d+\.\d\d GB",
                     panel.inner_text())
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
    assert browser_context.http_errors.answers[0][2].endswith("/hub/gpulease/recommend/ada")


def test_the_parameter_count_typed_is_the_model_estimated(hub, browser_context):
    page = browser_context.new_page()
    sign_in(page, hub.url, "ada", ADA_PW)
    page.goto(f"{hub.url}/hub/spawn")
    panel = page.locator(".gpulease-recommend")
    panel.get_by_text("Which profile does my work need?").click()
    model = panel.get_by_label("Model")
    count = panel.get_by_label("Parameters (if another)")
    result = panel.locator(".gl-rec-result")

    # The researcher types their model's size and leaves the Model select as it is.
    count.fill("70B")
    panel.get_by_label("Task").select_option("inference")
    panel.get_by_role("button", name="Estimate").click()
    result.get_by_text("Estimated GPU memory for a 70 B-parameter model").wait_for()
    assert "70.00 B parameters" in panel.locator('.gl-rec-part[data-part="weights"]').inner_text()
    assert "Llama 3.2 1B" not in result.inner_text() and "1.24 B" not in result.inner_text()

    # Choosing a known model clears the count, and the answer names that model.
    model.select_option("llama-3.2-1b")
    assert count.input_value() == ""
    panel.get_by_role("button", name="Estimate").click()
    result.get_by_text("Estimated GPU memory for Llama 3.2 1B, 1.24 B parameters").wait_for()
    assert "70" not in panel.locator('.gl-rec-part[data-part="weights"]').inner_text()

    # Typing a count again chooses "another model": the count is what is estimated.
    count.fill("13B")
    assert model.input_value() == ""
    panel.get_by_role("button", name="Estimate").click()
    result.get_by_text("Estimated GPU memory for a 13 B-parameter model").wait_for()
    browser_context.http_errors.check()


def test_an_admin_on_another_users_spawn_page_is_shown_that_users_profiles(hub, browser_context):
    page = browser_context.new_page()
    sign_in(page, hub.url, "admin", ADMIN_PW)
    # the admin's own page: the staff profile is theirs to start, and the panel lists it
    page.goto(f"{hub.url}/hub/spawn")
    assert page.locator('input[name="profile"][value="staff-h200"]').count() == 1
    assert "staff-h200" in _estimate_fits(page, "llama-3.2-1b", "inference")

    # ada's page, opened by the admin: ada's cards, and the panel answers for ada
    page.goto(f"{hub.url}/hub/spawn/ada")
    assert page.locator('input[name="profile"][value="staff-h200"]').count() == 0
    fits = _estimate_fits(page, "llama-3.2-1b", "inference")
    assert fits and "staff-h200" not in fits
    assert fits[0] == "h200-1g"
    browser_context.http_errors.check()


def test_a_user_cannot_ask_for_another_users_profiles(hub, browser_context):
    page = browser_context.new_page()
    sign_in(page, hub.url, "ada", ADA_PW)
    asked = page.request.get(
        f"{hub.url}/hub/gpulease/recommend/admin?model=llama-3.2-1b&task=inference",
        max_redirects=0)
    assert asked.status in (403, 404), asked.status
    own = page.request.get(
        f"{hub.url}/hub/gpulease/recommend/ada?model=llama-3.2-1b&task=inference")
    assert own.status == 200 and "staff-h200" not in own.text()
