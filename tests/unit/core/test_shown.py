"""Error messages name wrong values as they were written, never as Python reprs."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from gpulease.core.billing.rules import BillingError, parse_account
from gpulease.core.model.catalog import CatalogError, parse_catalog
from gpulease.core.model.profiles import ProfileError, parse_profile
from gpulease.core.policy.limits import LimitError, parse_limit_body
from gpulease.core.policy.options import OptionsRefused, _values
from gpulease.core.shown import kind_of, shown
from gpulease.core.units import json_loads, parse_credits, parse_duration, parse_quantity
from gpulease.images import shipped_catalog
from gpulease.store.notices import NoticeError, validate_prefs

# What Python prints and a JSON or YAML author never wrote.
PYTHON_REPR = re.compile(r"None|True\b|False\b|Decimal\(|\{'|\['|got (?:list|dict|int|str|float)\b")


def test_shown_speaks_json_and_yaml():
    assert shown(None) == "null (no value)"
    assert shown(True) == "true" and shown(False) == "false"
    assert shown(5) == "the number 5" and shown(Decimal("1.1234567")) == "the number 1.1234567"
    assert shown("soon") == "'soon'"
    assert shown("a\nb") == "'a\\nb'"
    assert shown("x" * 100).endswith("…'") and len(shown("x" * 100)) < 70
    assert shown([1, 2]) == "a list of 2 items" and shown({"a": 1}) == "a mapping"
    assert kind_of([]) == "a list" and kind_of(None) == "null (no value)"


def _message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc)


@pytest.mark.parametrize("call", [
    lambda: parse_credits(Decimal("1.1234567")),
    lambda: parse_credits(None),
    lambda: parse_credits(Decimal("Infinity")),
    lambda: parse_duration(Decimal("1.5"), "min_run"),
    lambda: parse_duration(None),
    lambda: parse_quantity(Decimal("1.5")),
    lambda: parse_quantity([1]),
    lambda: parse_account(None),
    lambda: _values({"profile": None}),
    lambda: _values({"image": 5}),
    lambda: _values(["cpu"]),
    lambda: parse_limit_body({"max_gpus": "2"}),
    lambda: parse_limit_body({"max_slices": Decimal("1.5")}),
    lambda: validate_prefs(None, ""),
    lambda: parse_catalog({"images": [["pytorch"]]}),
])
def test_messages_about_wrong_values_show_no_python_repr(call):
    with pytest.raises((ValueError, BillingError, OptionsRefused, LimitError, NoticeError,
                        CatalogError)) as err:
        call()
    message = _message(err.value)
    assert not PYTHON_REPR.search(message), message


def test_a_profile_file_with_wrong_kinds_of_values_is_told_in_its_own_words():
    body = json_loads('{"slug": "x", "display_name": null, "cpu": 1, "memory": "1Gi", '
                      '"images": ["pytorch"], "price_per_hour": -1.5, "enabled": "yes", '
                      '"gpu": ["H200"], "groups": "lab"}')

    with pytest.raises(ProfileError) as err:
        parse_profile(body, shipped_catalog())
    text = "; ".join(f"{e.field}: {e.message}" for e in err.value.errors)
    assert "display_name: is required: a non-empty string (got null (no value))" in text
    assert "price_per_hour: must not be negative, got the number -1.5" in text
    assert "enabled: must be true or false, got 'yes'" in text
    assert "got a list of 1 item" in text and "got 'lab'" in text
    assert not PYTHON_REPR.search(text), text


def test_declared_inventory_names_an_unquoted_driver_as_written(tmp_path):
    from gpulease.core.model.inventory import InventoryError, load_declared_inventory

    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - name: n\n    gpus:\n      - {model: H200, memory: 141Gi, "
                    "driver: 580.159}\n")
    with pytest.raises(InventoryError) as err:
        load_declared_inventory(path)
    assert "driver: the number 580.159 must be a quoted string" in str(err.value)
    assert not PYTHON_REPR.search(str(err.value))
