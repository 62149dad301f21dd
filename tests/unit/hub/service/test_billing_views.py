"""Pure shaping of the billing API and pages: money text, times, CSV, the spend chart."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re

import pytest

from gpulease.hub.cli.billing import format_usage_table
from gpulease.hub.service import billing_views as bv
from gpulease.store.billing_reports import to_csv

SESSION = {
    "user": "alice", "server": "", "profile": "h200-1g", "tier": "spot", "account": "user:alice",
    "started": dt.datetime(2025, 3, 1, 10, 0, 0),
    "ended": dt.datetime(2025, 3, 1, 10, 0, 31, 250000),
    "billed_seconds": 32, "billed_ms": 31_250, "cost": 10_417, "end_reason": "idle",
}


def test_money_is_a_six_decimal_string():
    assert bv.money(12_500_000) == "12.500000"
    assert bv.money(1) == "0.000001"
    assert bv.money(-2_000_001) == "-2.000001"
    assert bv.money(0) == "0.000000"


def test_session_view_writes_z_times_and_money_strings():
    view = bv.session_view(SESSION)
    assert view["started"] == "2025-03-01T10:00:00Z"
    assert view["ended"] == "2025-03-01T10:00:31.250Z"
    assert view["cost"] == "0.010417" and view["billed_seconds"] == 32
    assert view["billed_ms"] == 31_250
    running = bv.session_view({**SESSION, "ended": None, "end_reason": None})
    assert running["ended"] is None and running["end_reason"] is None
    aware = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert bv.iso(aware) == "2025-03-01T10:00:00Z"


def test_usage_view_totals():
    view = bv.usage_view([SESSION, SESSION], {"billed_seconds": 64, "billed_ms": 62_500,
                                              "cost": 20_834})
    assert view["totals"] == {"billed_seconds": 64, "billed_ms": 62_500, "cost": "0.020834"}
    assert len(view["sessions"]) == 2


def test_usage_csv_has_the_json_columns_and_values():
    view = bv.usage_view([SESSION], {"billed_seconds": 32, "billed_ms": 31_250,
                                     "cost": 10_417})
    rows = list(csv.reader(io.StringIO(to_csv(bv.csv_rows(view["sessions"]),
                                              bv.USAGE_COLUMNS))))
    assert rows[0] == ["user", "server", "profile", "tier", "account", "started", "ended",
                       "billed_seconds", "billed_ms", "cost", "end_reason", "reservation",
                       "gpu_mean_activity", "gpu_peak_activity", "gpu_peak_memory_bytes",
                       "gpu_source"]
    assert rows[1] == ["alice", "", "h200-1g", "spot", "user:alice", "2025-03-01T10:00:00Z",
                       "2025-03-01T10:00:31.250Z", "32", "31250", "0.010417", "idle", "",
                       "", "", "", ""]  # no GPU reading: empty cells
    reserved = bv.usage_view([{**SESSION, "tier": "reserved", "reservation": 7}], {
        "billed_seconds": 32, "billed_ms": 31_250, "cost": 0})
    line = list(csv.reader(io.StringIO(to_csv(bv.csv_rows(reserved["sessions"]),
                                              bv.USAGE_COLUMNS))))[1]
    assert line[3] == "reserved" and line[11] == "7"


def test_a_sessions_gpu_figures_in_json_csv_and_the_page():
    read = {**SESSION, "gpu_mean_activity": 41.3, "gpu_peak_activity": 97.0,
            "gpu_peak_memory_bytes": 3 * 2**30, "gpu_source": "nvml"}
    view = bv.usage_view([read, SESSION], {"billed_seconds": 64, "billed_ms": 62_500,
                                           "cost": 20_834})
    assert view["sessions"][0]["gpu"] == {"mean_activity": 41.3, "peak_activity": 97.0,
                                          "peak_memory_bytes": 3 * 2**30, "source": "nvml"}
    assert view["sessions"][1]["gpu"] == {"mean_activity": None, "peak_activity": None,
                                          "peak_memory_bytes": None, "source": None}
    line = list(csv.reader(io.StringIO(to_csv(bv.csv_rows(view["sessions"]),
                                              bv.USAGE_COLUMNS))))[1]
    assert line[-4:] == ["41.3", "97.0", str(3 * 2**30), "nvml"]
    assert bv.gpu_cells(view["sessions"][0]["gpu"]) == ("41.3 %", "97.0 %", "3.00 GiB")
    assert bv.gpu_cells(view["sessions"][1]["gpu"]) == ("no reading",) * 3


def test_report_rows_and_totals():
    rows = bv.report_view([
        {"key": "alice", "sessions": 2, "billed_seconds": 10, "billed_ms": 9_001, "cost": 1},
        {"key": "bob", "sessions": 1, "billed_seconds": 5, "billed_ms": 4_999,
         "cost": 1_999_999}])
    assert rows[1]["cost"] == "1.999999" and rows[1]["billed_ms"] == 4_999
    assert bv.report_totals(rows) == {"sessions": 3, "billed_seconds": 15, "billed_ms": 14_000,
                                      "cost": "2.000000"}
    assert bv.report_totals([]) == {"sessions": 0, "billed_seconds": 0, "billed_ms": 0,
                                    "cost": "0.000000"}


def test_balance_view_low_and_minutes_left():
    ok = bv.balance_view("alice", 10_000_000, {"user:alice": 10_000_000, "group:lab": 5},
                         {"cpu": 6000, "h200-1g": 500, "free": None}, 10)
    assert ok["balance"] == "10.000000" and ok["low"] is False
    assert ok["minutes_left"] == {"cpu": 6000, "h200-1g": 500}  # free profiles left out
    assert ok["accounts"] == [{"account": "user:alice", "balance": "10.000000"},
                              {"account": "group:lab", "balance": "0.000005"}]
    assert bv.balance_view("a", 10, {}, {"h200-full": 9}, 10)["low"] is True
    assert bv.balance_view("a", 0, {}, {}, 10)["low"] is True  # nothing left at all
    assert bv.balance_view("a", 1, {}, {"cpu": 10}, 10)["low"] is False


@pytest.mark.parametrize("text, expected", [
    ("2025-03-01", dt.datetime(2025, 3, 1)),
    ("2025-03-01T10:00:00Z", dt.datetime(2025, 3, 1, 10)),
    ("2025-03-01T12:00:00+02:00", dt.datetime(2025, 3, 1, 10)),
    ("2025-03-01T10:00:00", dt.datetime(2025, 3, 1, 10)),
    (None, None), ("", None),
])
def test_parse_time(text, expected):
    assert bv.parse_time(text, "since") == expected


@pytest.mark.parametrize("since, until, field", [
    ("yesterday", None, "since"), ("2025-13-01", None, "since"),
    (None, "2025-02-30", "until"), ("2025-03-02", "2025-03-01", "until"),
    ("2025-03-01", "2025-03-01", "until"),
    # An OverflowError converting to UTC was a 500 (api/usage, api/audit, notices, pages)
    ("0001-01-01T00:00:00+01:00", None, "since"), (None, "9999-12-31T23:59:59-01:00", "until"),
])
def test_parse_period_refuses(since, until, field):
    with pytest.raises(bv.PeriodError) as e:
        bv.parse_period(since, until)
    assert e.value.field == field


def test_month_bounds():
    assert bv.month_start(dt.datetime(2025, 12, 31, 23, 59)) == dt.datetime(2025, 12, 1)
    assert bv.next_month(dt.datetime(2025, 12, 1)) == dt.datetime(2026, 1, 1)
    assert bv.next_month(dt.datetime(2025, 1, 1)) == dt.datetime(2025, 2, 1)


def test_daily_series_fills_gaps():
    first = dt.date(2025, 3, 1)
    series = bv.daily_series([(dt.date(2025, 3, 3), 7), (dt.date(2025, 3, 3), 1)], first, 4)
    assert series == [(dt.date(2025, 3, 1), 0), (dt.date(2025, 3, 2), 0),
                      (dt.date(2025, 3, 3), 8), (dt.date(2025, 3, 4), 0)]


def test_chart_has_one_titled_bar_per_day():
    first = dt.date(2025, 3, 1)
    series = bv.daily_series([(dt.date(2025, 3, 2), 1_500_000)], first, 30)
    svg = bv.spend_chart_svg(series)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<rect") == 30
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert len(titles) == 30
    assert titles[1] == "2025-03-02: 1.500000 credits"
    assert titles[0] == "2025-03-01: 0.000000 credits"
    heights = [float(h) for h in re.findall(r'class="bar"[^>]* height="([0-9.]+)"', svg)]
    assert max(heights) == heights[1] and heights[0] < 1


def test_chart_escapes_its_text():
    class Odd(dt.date):  # a date whose text is markup: the chart must escape it
        def isoformat(self):
            return "<script>alert(1)</script>&"

    svg = bv.spend_chart_svg([(Odd(2025, 3, 1), 5)])
    assert "<script>" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in svg


def test_empty_chart_is_valid():
    svg = bv.spend_chart_svg([])
    assert svg.startswith("<svg") and "<rect" not in svg


def test_cli_usage_table():
    data = bv.usage_view([SESSION, {**SESSION, "server": "big", "ended": None,
                                    "end_reason": None}],
                         {"billed_seconds": 64, "billed_ms": 62_500, "cost": 20_834})
    lines = format_usage_table(data).splitlines()
    assert lines[0].split()[:3] == ["user", "server", "profile"]
    assert "(default)" in lines[1] and "idle" in lines[1] and " 31.250 " in lines[1]
    assert "running" in lines[2]
    assert lines[-1].split()[0] == "total" and lines[-1].split()[-2:] == ["62.500", "0.020834"]


def test_credit_rows_leave_out_charges_newest_first():
    t = dt.datetime(2025, 3, 1)
    entries = [
        {"id": 1, "kind": "grant", "amount_ucr": 5_000_000, "note": "<b>hi</b>",
         "account": "user:a", "created_at": t},
        {"id": 2, "kind": "charge", "amount_ucr": -3, "note": "cpu 3s",
         "account": "user:a", "created_at": t + dt.timedelta(hours=1)},
        {"id": 3, "kind": "adjustment", "amount_ucr": -1, "note": "fix",
         "account": "user:a", "created_at": t + dt.timedelta(hours=2)},
    ]
    rows = bv.credit_rows(entries)
    assert [r["kind"] for r in rows] == ["adjustment", "grant"]
    assert rows[1] == {"created": "2025-03-01T00:00:00Z", "kind": "grant", "amount": "5.000000",
                       "note": "<b>hi</b>", "account": "user:a"}
