from decimal import Decimal

import pytest
import yaml

from gpulease.core.shown import shown
from gpulease.core.units import (
    MAX_UCR,
    credits_text,
    format_credits,
    format_duration,
    format_quantity,
    json_loads,
    load_yaml,
    load_yaml_file,
    parse_cpu,
    parse_credits,
    parse_duration,
    parse_quantity,
    rate_cost,
)

# --- durations -------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1h30m15s", 5415),
    ("0", 0), (0, 0), ("0s", 0), ("90m", 5400), ("2h15s", 7215),
])
def test_parse_duration_accepts(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", [
    "", "10", 10, 3600, "1d", "30m2h", "1.5h", "-5m", " 5m", "5m ", "h", "m", "1H",
    True, False, None, 1.5, Decimal("0"), [], "0h0", "99999999999h",
])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError) as info:
        parse_duration(bad, "min_run")
    message = str(info.value)
    assert message.startswith("min_run: ")
    assert shown(bad) in message  # as the file wrote it, never a Python repr
    if "too long" not in message:
        assert "durations look like 90s, 30m, 2h, 1h30m or 0" in message


@pytest.mark.parametrize("seconds, text", [
    (0, "0"), (5400, "1h30m"), (90, "1m30s"), (7200, "2h"), (5415, "1h30m15s"), (59, "59s"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", [-1, 1.0, True, "60"])
def test_format_duration_rejects(bad):
    with pytest.raises(ValueError):
        format_duration(bad)


# --- quantities ------------------------------------------------------------------


@pytest.mark.parametrize("text, n", [
    ("32Gi", 32 * 2**30), ("512Mi", 512 * 2**20), ("1Ki", 1024), ("2Ti", 2 * 2**40),
    ("1Pi", 2**50), ("8G", 8 * 10**9), ("1k", 1000), ("3M", 3 * 10**6), ("1T", 10**12),
    ("1P", 10**15), ("12345", 12345), (12345, 12345), ("1.5Gi", 3 * 2**29), ("0", 0),
    (Decimal("2048"), 2048),
])
def test_parse_quantity_accepts(text, n):
    assert parse_quantity(text) == n


@pytest.mark.parametrize("bad", [
    "", "32GB", "32gi", "32 Gi", "-1Gi", -1, "1.5", "0.1k" + "1", "1e9", "Gi", True, None,
    1.5, "100m", "1.0000000001Ki", Decimal("1.5"),
])
def test_parse_quantity_rejects(bad):
    with pytest.raises(ValueError) as info:
        parse_quantity(bad)
    assert shown(bad) in str(info.value)


@pytest.mark.parametrize("n, text", [
    (32 * 2**30, "32Gi"), (8 * 10**9, "8G"), (1000, "1k"), (1024, "1Ki"), (0, "0"), (1, "1"),
    (1023, "1023"), (3 * 2**29, "1536Mi"),
])
def test_format_quantity(n, text):
    assert format_quantity(n) == text
    assert parse_quantity(text) == n


# --- cpu -------------------------------------------------------------------------


@pytest.mark.parametrize("value, cores", [
    (4, Decimal(4)), ("0.5", Decimal("0.5")), ("500m", Decimal("0.5")),
    (Decimal("1.25"), Decimal("1.25")), ("2", Decimal(2)),
])
def test_parse_cpu(value, cores):
    assert parse_cpu(value) == cores


@pytest.mark.parametrize("bad", [0, "0", "0m", -1, "-1", "0.0001", 1.5, True, "", "4 cores"])
def test_parse_cpu_rejects(bad):
    with pytest.raises(ValueError):
        parse_cpu(bad)


# --- credits ---------------------------------------------------------------------


@pytest.mark.parametrize("value, ucr", [
    ("1.2", 1_200_000), ("1.20", 1_200_000), ("0.000001", 1), ("12", 12_000_000),
    (12, 12_000_000), (Decimal("1.2"), 1_200_000), ("-3.5", -3_500_000), ("+2", 2_000_000),
    ("0", 0), ("1.2000000", 1_200_000), (Decimal("1E+3"), 1_000_000_000),
    ("9223372036854.775807", MAX_UCR), ("-9223372036854.775807", -MAX_UCR),
])
def test_parse_credits_accepts(value, ucr):
    assert parse_credits(value) == ucr


@pytest.mark.parametrize("bad", [
    "1.0000001", Decimal("0.0000001"), "", " 1", "1,5", "1e3", "1E3", "NaN", "inf",
    Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), True, False, None, [1],
    "9223372036854.775808", 2**63, Decimal("1E+999999"), Decimal("1E-999999"), "1_000",
    ".5", "1.", "0x10", "1.00000000000000000000000000001",
])
def test_parse_credits_rejects(bad):
    with pytest.raises(ValueError):
        parse_credits(bad)


def test_parse_credits_refuses_float_saying_why():
    with pytest.raises(ValueError, match="float"):
        parse_credits(1.2)


def test_format_credits():
    assert format_credits(12_500_000) == "12.500000"
    assert format_credits(0) == "0.000000"
    assert format_credits(-500_000) == "-0.500000"
    assert format_credits(1) == "0.000001"
    assert credits_text(1_200_000) == "1.2"
    assert credits_text(8_000_000) == "8"
    assert credits_text(0) == "0"
    assert credits_text(-1) == "-0.000001"
    for ucr in (1, 999_999, 1_000_000, -7_654_321, MAX_UCR):
        assert parse_credits(format_credits(ucr)) == ucr
        assert parse_credits(credits_text(ucr)) == ucr


@pytest.mark.parametrize("seconds, rate, cost", [
    (3600, 1_200_000, 1_200_000), (1, 1_200_000, 334), (0, 8_000_000, 0),
    (1, 1, 1), (3601, 3600, 3601), (7200, 3_600_000, 7_200_000), (1, 0, 0),
])
def test_rate_cost_rounds_up(seconds, rate, cost):
    assert rate_cost(seconds, rate) == cost


def test_rate_cost_is_exact_for_huge_values():
    # A float would lose the last µcr here.
    assert rate_cost(10**9 + 1, 10**12 + 7) == -(-(10**9 + 1) * (10**12 + 7) // 3600)


def test_rate_cost_rejects_negative():
    with pytest.raises(ValueError):
        rate_cost(-1, 10)


# --- exact loaders ---------------------------------------------------------------


def test_load_yaml_keeps_decimals_exact():
    data = load_yaml("a: 1.20\nb: '1.20'\nc: 0.1\nd: 3\ne: -2.50\nf: 1_000.5\n")
    assert data["a"] == Decimal("1.20") and str(data["a"]) == "1.20"
    assert data["b"] == "1.20"
    assert data["c"] == Decimal("0.1")
    assert data["d"] == 3 and isinstance(data["d"], int)
    assert str(data["e"]) == "-2.50"
    assert data["f"] == Decimal("1000.5")
    assert parse_credits(data["a"]) == 1_200_000
    assert not any(isinstance(v, float) for v in data.values())


def test_load_yaml_special_floats_are_decimal_and_refused_as_credits():
    data = load_yaml("a: .inf\nb: -.Inf\nc: .nan\nd: 1:30.5\n")
    assert data["a"] == Decimal("Infinity") and data["b"] == Decimal("-Infinity")
    assert data["c"].is_nan()
    assert data["d"] == Decimal("90.5")
    for key in "abc":
        with pytest.raises(ValueError):
            parse_credits(data[key])


def test_load_yaml_keeps_every_digit():
    data = load_yaml("a: 1.00000000000000000000000000001\n")
    assert str(data["a"]) == "1.00000000000000000000000000001"
    with pytest.raises(ValueError):
        parse_credits(data["a"])


def test_load_yaml_refuses_duplicate_keys():
    with pytest.raises(yaml.YAMLError, match="duplicate key 'price'"):
        load_yaml("price: 1\nprice: 2\n")


def test_load_yaml_is_safe():
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']\n")


def test_load_yaml_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("price: 1.20\n", encoding="utf-8")
    assert load_yaml_file(path) == {"price": Decimal("1.20")}
    assert load_yaml_file(str(path)) == {"price": Decimal("1.20")}


def test_json_loads_reads_numbers_exactly():
    data = json_loads('{"a": 1.2, "b": 3, "c": "1.2", "d": 1e3}')
    assert data == {"a": Decimal("1.2"), "b": 3, "c": "1.2", "d": Decimal("1e3")}
    assert parse_credits(data["a"]) == 1_200_000
    assert parse_credits(data["d"]) == 1_000_000_000
    assert json_loads(b'[0.1]') == [Decimal("0.1")]


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}'])
def test_json_loads_refuses_nan_and_infinity(text):
    with pytest.raises(ValueError):
        json_loads(text)


def test_json_loads_refuses_nesting_past_the_recursion_limit_as_a_value_error():
    """A RecursionError was no ValueError: the service's body check let it through (500)."""
    with pytest.raises(ValueError, match="nests arrays or objects deeper"):
        json_loads("[" * 100_000 + "]" * 100_000)
    assert json_loads("[" * 100 + "]" * 100) is not None
