"""The spawn page's profile cards (pure rendering, no hub)."""

import dataclasses
import re

from gpulease.core.capacity.cluster_availability import FREE, QUEUE, Availability
from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.images import shipped_catalog
from gpulease.spawners.start.options_form import (
    FormData,
    minutes_text,
    options_from_form,
    per_second_text,
    render_options_form,
)

CATALOG = shipped_catalog()
CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, CATALOG)
IMAGES = {i.name: i for i in CATALOG.images}
XSS = "<script>alert(1)</script>"


def form(**kwargs) -> str:
    defaults = dict(profiles=[CPU, SLICE, FULL],
                    availability={"h200-1g": Availability(3, 7, FREE),
                                  "h200-full": Availability(0, 1, QUEUE)},
                    images=IMAGES)
    return render_options_form(FormData(**{**defaults, **kwargs}))


def card(html: str, slug: str) -> str:
    match = re.search(rf'<label class="gl-card gpulease-profile" data-profile="{slug}">(.*?)'
                      r"</label>", html, re.S)
    assert match, f"no card for {slug}"
    return match.group(1)


def test_one_card_per_profile_with_gpu_cpu_memory_and_images():
    html = form()
    assert html.count('class="gl-card gpulease-profile"') == 3
    s = card(html, "h200-1g")
    assert "H200, MIG slice 1g.18gb" in s and "GPU memory: 18 GiB" in s
    assert "CPU: 4 cores" in s and "Memory: 32 GiB" in s
    assert '<select name="image_h200-1g"' in s
    assert '<option value="pytorch" selected>pytorch — ' in s
    assert '<option value="tensorrt-llm">' in s
    full = card(html, "h200-full")
    assert "H200, 1 full card" in full and "GPU memory: 141 GiB" in full
    assert "No GPU (CPU only)" in card(html, "cpu")


def test_price_per_hour_and_per_second():
    s = card(form(), "h200-1g")
    assert "1.20 credits/h" in s
    # 1.20 / 3600 = 0.000333… credits per second, billed by the millisecond
    assert "≈ 0.000333 credits/s" in s
    assert "billed by the millisecond" in s
    page = " ".join(form(balance_ucr=5_000_000).split())
    assert "per second" not in page.replace("credits per second", "")  # billing is by the ms
    assert "Billing is by the millisecond" in page
    assert per_second_text(3_600_000) == "0.001"  # exact: no ≈
    assert per_second_text(8_000_000) == "≈ 0.002222"


def test_availability_and_queue():
    html = form(waiting={"h200-1g": 2, "h200-full": 0})
    assert "3 of 7 free" in card(html, "h200-1g")
    assert "queue: 2 waiting" in card(html, "h200-1g")
    full = card(html, "h200-full")
    assert "0 of 1 free now: you will wait in the queue" in full
    assert "waiting" not in full.replace("wait in the queue", "")  # no count when none wait
    assert "Always available" in card(html, "cpu")


def test_balance_and_minutes_it_buys():
    html = form(balance_ucr=12_500_000)
    assert 'class="gpulease-balance">12.500000</strong> credits' in html
    assert "buys about 10 h 25 min on it" in card(html, "h200-1g")  # 12.5 / 1.20 h
    assert "buys about 1 h 33 min on it" in card(html, "h200-full")  # 12.5 / 8 h
    assert "buys about 125 h on it" in card(html, "cpu")
    low = form(balance_ucr=1_000_000)  # 1 credit: 7 min on the full card, min run is 10m
    assert "does not cover its minimum run (10m, 1.333334 credits)" in card(low, "h200-full")
    assert minutes_text(59) == "59 min" and minutes_text(120) == "2 h"
    assert "Free: does not use your credit" in card(
        form(profiles=[dataclasses.replace(CPU, price_per_hour_ucr=0)], balance_ucr=0), "cpu")


def test_a_profile_without_images_offers_the_catalogs_first():
    html = form(profiles=[dataclasses.replace(SLICE, images=())])
    first = CATALOG.images[0].name
    assert re.findall(r'<option value="([^"]+)"', card(html, "h200-1g")) == [first]


def test_selected_profile_and_image():
    html = form(selected="h200-full", selected_image="cuda")
    assert re.search(r'value="h200-full" checked', html)
    assert html.count(" checked") == 1
    assert '<option value="cuda" selected>' in card(html, "h200-full")
    # an unknown or missing choice checks the first card
    assert re.search(r'value="cpu" checked', form(selected="gone"))


def test_everything_from_admins_and_users_is_escaped():
    evil = dataclasses.replace(SLICE, display_name=XSS, description=XSS)
    html = form(profiles=[evil], accounts=[(f"group:{XSS}", 5)], balance_ucr=0)
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html


def test_group_accounts_offered_only_when_there_are_some():
    assert 'name="account"' not in form()
    html = form(accounts=[("group:lab", 40_000_000)], balance_ucr=1_000_000,
                selected_account="group:lab")
    assert '<option value="group:lab" selected>group:lab (40.000000 credits)</option>' in html
    assert "your own balance (1.000000 credits)" in html


def test_no_profile():
    assert "No profile is available to you" in render_options_form(FormData(profiles=[]))


def test_options_from_form():
    assert options_from_form({"profile": ["h200-1g"], "image_h200-1g": ["tensorrt-llm"],
                              "image_cpu": ["pytorch"], "account": [""]}) == {
        "profile": "h200-1g", "image": "tensorrt-llm"}
    assert options_from_form({"profile": ["cpu"], "account": ["group:lab"]}) == {
        "profile": "cpu", "account": "group:lab"}
    assert options_from_form({}) == {}


def test_a_profile_with_spot_shows_both_prices_and_what_spot_risks():
    spot_slice = dataclasses.replace(SLICE, spot_price_per_hour_ucr=400_000)
    html = form(profiles=[CPU, spot_slice, FULL], spot=frozenset({"h200-1g"}))
    s = card(html, "h200-1g")
    assert '<select name="tier_h200-1g"' in s
    assert '<option value="on-demand" selected>On demand — 1.20 credits/h</option>' in s
    assert '<option value="spot">Spot — 0.40 credits/h: may be interrupted' in s
    assert "your home is kept" in s
    assert "tier_" not in card(html, "h200-full") and "tier_" not in card(html, "cpu")
    # not in the user's spot groups: no tier choice even though the profile offers spot
    assert "tier_" not in card(form(profiles=[spot_slice]), "h200-1g")
    again = card(form(profiles=[spot_slice], spot=frozenset({"h200-1g"}), selected="h200-1g",
                      selected_tier="spot"), "h200-1g")
    assert '<option value="spot" selected>' in again
    assert options_from_form({"profile": ["h200-1g"], "tier_h200-1g": ["spot"],
                              "tier_cpu": ["on-demand"]}) == {"profile": "h200-1g",
                                                               "tier": "spot"}
