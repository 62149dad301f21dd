"""The spawn page's "Which profile does my work need?" panel (issue 48; pure rendering)."""

import re

from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.images import shipped_catalog
from gpulease.spawners.start.options_form import FormData, options_from_form, render_options_form

CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, shipped_catalog())


def test_the_panel_asks_the_hub_and_lists_every_known_model():
    html = render_options_form(FormData(profiles=[CPU, SLICE, FULL],
                                        recommend_url="/hub/gpulease/recommend"))
    panel = re.search(r'<details class="gl-recommend gpulease-recommend".*?</details>', html, re.S)
    assert panel, "no panel"
    text = panel.group(0)
    assert 'data-url="/hub/gpulease/recommend"' in text
    assert all(f'value="{key}"' in text for key in MODELS)
    for task in ("inference", "lora", "qlora", "full"):
        assert f'<option value="{task}">' in text
    # its fields have no name: the form's Start never sends them
    assert " name=" not in text
    assert 'type="button" class="btn btn-sm btn-secondary gl-rec-go"' in text
    # the panel sits above the cards
    assert html.index("gpulease-recommend") < html.index('class="gl-card gpulease-profile"')
    # the answer goes into the page as text, never as HTML
    assert "innerHTML" not in html and "textContent" in html


def test_no_model_is_chosen_for_the_researcher():
    # "another model" is the first option and chosen: a count typed with the select left
    # alone is never estimated as the first known model
    html = render_options_form(FormData(profiles=[CPU, SLICE, FULL],
                                        recommend_url="/hub/gpulease/recommend/ada"))
    select = re.search(r'<select data-field="model">(.*?)</select>', html, re.S).group(1)
    options = re.findall(r'<option value="([^"]*)"( selected)?>([^<]*)</option>', select)
    assert options[0] == ("", " selected", "another model (give its parameters)")
    assert [value for value, chosen, _ in options if chosen] == [""]
    # the answer's first line names what was estimated
    assert '"Estimated GPU memory for " + a.estimated_for' in html


def test_no_panel_without_a_url_and_its_fields_never_reach_the_options():
    assert "gpulease-recommend" not in render_options_form(FormData(profiles=[CPU]))
    assert options_from_form({"profile": ["h200-1g"], "model": ["llama-2-7b"]}) == {
        "profile": "h200-1g"}
