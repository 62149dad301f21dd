"""Shapes of the billing API and pages, as pure functions over plain data.

Money leaves as decimal strings of credits with 6 decimals ("12.500000"),
times as ISO 8601 UTC with `Z`. Period bounds come in as a date (YYYY-MM-DD,
midnight UTC) or a timestamp; `since` is inclusive and `until` exclusive.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from gpulease.core.clock import iso_z
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import label_of
from gpulease.core.units import format_credits
from gpulease.store import billing_reports

USAGE_COLUMNS = billing_reports.USAGE_COLUMNS
REPORT_COLUMNS = ["key", "sessions", "billed_seconds", "billed_ms", "cost"]
REPORT_GROUPS = tuple(billing_reports.GROUP_BY)


class PeriodError(Refusal, ValueError):
    """A period or time that is not one (400), naming its field."""

    def __init__(self, field: str, message: str):
        super().__init__(message, [(field, message)])


def iso(value: dt.datetime | str | None) -> str | None:
    """ISO 8601 UTC with `Z` for a naive-UTC or aware datetime; None stays None."""
    if value is None or isinstance(value, str):
        return value
    return iso_z(value)


def parse_time(text: str | None, field: str) -> dt.datetime | None:
    """Naive UTC from "2025-01-31" (midnight UTC) or an ISO timestamp ("...Z", offsets)."""
    if text is None or text == "":
        return None
    value = text.strip()
    try:
        if len(value) == 10:
            return dt.datetime.combine(dt.date.fromisoformat(value), dt.time())
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise PeriodError(field, f"{text!r} is not a date (YYYY-MM-DD) or an ISO 8601 "
                                 "timestamp (2025-01-31T12:00:00Z)") from None
    if parsed.tzinfo is not None:
        try:
            parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
        except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
            raise PeriodError(field, f"{text!r} is out of range: in UTC it is before year 1 "
                                     "or after year 9999") from None
    return parsed


def parse_period(since: str | None, until: str | None) -> tuple[dt.datetime | None,
                                                                dt.datetime | None]:
    start, end = parse_time(since, "since"), parse_time(until, "until")
    if start is not None and end is not None and end <= start:
        raise PeriodError("until", "until must be later than since (since is inclusive, "
                                   "until exclusive)")
    return start, end


MAX_USAGE_DAYS = 366


def usage_period(since: str | None, until: str | None, now: dt.datetime,
                 max_days: int = MAX_USAGE_DAYS) -> tuple[dt.datetime, dt.datetime]:
    """The period of a usage query: a bound left out is the current UTC month's (since:
    its first day; until: the first day of the next month), and it spans at most
    `max_days` days, so that no query reads the whole history at once."""
    start, end = parse_time(since, "since"), parse_time(until, "until")
    this_month = month_start(now)
    defaulted = []
    if start is None:
        start = this_month
        defaulted.append(f"since, left out, is {iso(start)} (the current UTC month's first day)")
    if end is None:
        end = next_month(this_month)
        defaulted.append(f"until, left out, is {iso(end)} (the next UTC month's first day)")
    field = "until" if until or not since else "since"
    said = f" ({'; '.join(defaulted)})" if defaulted else ""
    if end <= start:
        raise PeriodError(field, f"until must be later than since (since is inclusive, until "
                                 f"exclusive){said}")
    if end - start > dt.timedelta(days=max_days):
        days = -(-(end - start) // dt.timedelta(days=1))
        raise PeriodError(field, f"A usage query spans at most {max_days} days; since "
                                 f"{iso(start)} to until {iso(end)} is {days} days{said}. Ask "
                                 "for a shorter period, e.g. a month or a year at a time.")
    return start, end


def month_start(now: dt.datetime) -> dt.datetime:
    return dt.datetime(now.year, now.month, 1)


def next_month(start: dt.datetime) -> dt.datetime:
    return dt.datetime(start.year + start.month // 12, start.month % 12 + 1, 1)


def safe_filename(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def money(ucr: int) -> str:
    return format_credits(int(ucr))


def session_view(s: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "user": s["user"],
        "server": s["server"],
        "profile": s["profile"],
        "tier": s["tier"],
        "reservation": s.get("reservation"),
        "account": s["account"],
        "started": iso(s["started"]),
        "ended": iso(s.get("ended")),
        "billed_seconds": int(s["billed_seconds"]),
        "billed_ms": int(s["billed_ms"]),
        "cost": money(s["cost"]),
        "end_reason": s.get("end_reason"),
        "gpu": gpu_view(s),
    }


def gpu_view(s: Mapping[str, Any]) -> dict[str, Any]:
    """What the session's GPU did, from the culler's readings (None: no reading)."""
    return {"mean_activity": s.get("gpu_mean_activity"),
            "peak_activity": s.get("gpu_peak_activity"),
            "peak_memory_bytes": s.get("gpu_peak_memory_bytes"),
            "source": s.get("gpu_source")}


def csv_rows(views: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Session views for CSV: the `gpu` object as its flat gpu_* columns (USAGE_COLUMNS)."""
    rows = []
    for v in views:
        gpu = v.get("gpu") or {}
        rows.append({**v, "gpu_mean_activity": gpu.get("mean_activity"),
                     "gpu_peak_activity": gpu.get("peak_activity"),
                     "gpu_peak_memory_bytes": gpu.get("peak_memory_bytes"),
                     "gpu_source": gpu.get("source")})
    return rows


NO_READING = "no reading"


def gpu_cells(gpu: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """The usage page's three GPU cells: mean activity, peak activity, peak memory."""
    gpu = gpu or {}
    mean, peak, memory = (gpu.get("mean_activity"), gpu.get("peak_activity"),
                          gpu.get("peak_memory_bytes"))
    return (NO_READING if mean is None else f"{mean:.1f} %",
            NO_READING if peak is None else f"{peak:.1f} %",
            NO_READING if memory is None else f"{memory / 2**30:.2f} GiB")


def usage_view(sessions: Iterable[Mapping[str, Any]], totals: Mapping[str, int]) -> dict:
    return {
        "sessions": [session_view(s) for s in sessions],
        "totals": {"billed_seconds": int(totals["billed_seconds"]),
                   "billed_ms": int(totals["billed_ms"]), "cost": money(totals["cost"])},
    }


def report_view(rows: Iterable[Mapping[str, Any]], by: str = "") -> list[dict[str, Any]]:
    """The report's rows; grouped by tier, each with its tier's label (its Tier record's,
    gpulease/core/tiers.py)."""
    return [
        {"key": r["key"], "sessions": int(r["sessions"]),
         "billed_seconds": int(r["billed_seconds"]), "billed_ms": int(r["billed_ms"]),
         "cost": money(r["cost"]), **({"label": label_of(r["key"])} if by == "tier" else {})}
        for r in rows
    ]


def report_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals of already-shaped report rows (cost as credit strings)."""
    return {
        "sessions": sum(int(r["sessions"]) for r in rows),
        "billed_seconds": sum(int(r["billed_seconds"]) for r in rows),
        "billed_ms": sum(int(r["billed_ms"]) for r in rows),
        "cost": money(sum(_ucr(r["cost"]) for r in rows)),
    }


def _ucr(text: str) -> int:
    whole, _, frac = text.lstrip("-").partition(".")
    value = int(whole) * 1_000_000 + int((frac + "000000")[:6])
    return -value if text.startswith("-") else value


def entry_view(entry: Mapping[str, Any], balance_ucr: int) -> dict[str, Any]:
    return {
        "id": entry["id"],
        "account": entry["account"],
        "kind": entry["kind"],
        "amount": money(entry["amount_ucr"]),
        "note": entry.get("note", ""),
        "actor": entry.get("actor", ""),
        "created": iso(entry.get("created")),
        "balance": money(balance_ucr),
    }


def credit_rows(entries: Iterable[Mapping[str, Any]], limit: int = 20) -> list[dict[str, Any]]:
    """Grants and adjustments (not per-session charges), newest first, for the usage page."""
    rows = [e for e in entries if e["kind"] != "charge"]
    rows.sort(key=lambda e: (e["created_at"], e["id"]), reverse=True)
    return [{"created": iso(e["created_at"]), "kind": e["kind"],
             "amount": money(e["amount_ucr"]), "note": e.get("note") or "",
             "account": e["account"]} for e in rows[:limit]]


def balance_view(
    user: str,
    personal_ucr: int,
    accounts: Mapping[str, int],
    minutes: Mapping[str, int | None],
    low_minutes: int,
) -> dict[str, Any]:
    """`api/balance`: `minutes` maps each usable profile to minutes left (None: free)."""
    minutes_left = {slug: m for slug, m in minutes.items() if m is not None}
    low = personal_ucr <= 0 or any(m < low_minutes for m in minutes_left.values())
    return {
        "user": user,
        "balance": money(personal_ucr),
        "accounts": [{"account": a, "balance": money(b)} for a, b in accounts.items()],
        "low": low,
        "minutes_left": minutes_left,
    }


def daily_series(points: Iterable[tuple[dt.date, int]], first: dt.date,
                 days: int) -> list[tuple[dt.date, int]]:
    """One (date, µcr) per day from `first`, zero where nothing was spent."""
    spent: dict[dt.date, int] = {}
    for day, ucr in points:
        key = day.date() if isinstance(day, dt.datetime) else day
        spent[key] = spent.get(key, 0) + int(ucr)
    return [(first + dt.timedelta(days=i), spent.get(first + dt.timedelta(days=i), 0))
            for i in range(days)]


def spend_chart_svg(series: Sequence[tuple[dt.date, int]], width: int = 720,
                    height: int = 180) -> str:
    """Inline SVG: one bar per day, each titled "YYYY-MM-DD: N credits" (escaped)."""
    pad_bottom, pad_top = 20, 10
    plot = height - pad_bottom - pad_top
    top = max((ucr for _, ucr in series), default=0) or 1
    step = width / max(len(series), 1)
    bar = max(step * 0.8, 1.0)
    title_total = money(sum(ucr for _, ucr in series))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="100%" '
        f'aria-label={quoteattr(f"Spend per day, {title_total} credits in all")}>',
        f'<line x1="0" y1="{height - pad_bottom}" x2="{width}" y2="{height - pad_bottom}" '
        'class="axis"/>',
    ]
    for i, (day, ucr) in enumerate(series):
        h = round(plot * max(ucr, 0) / top, 2) if ucr > 0 else 0
        x = round(i * step + (step - bar) / 2, 2)
        y = round(height - pad_bottom - h, 2)
        title = escape(f"{day.isoformat()}: {money(ucr)} credits")
        parts.append(
            f'<rect class="bar" x="{x}" y="{y}" width="{round(bar, 2)}" height="{max(h, 0.5)}">'
            f"<title>{title}</title></rect>"
        )
    if series:
        for day, anchor, x in ((series[0][0], "start", 0), (series[-1][0], "end", width)):
            parts.append(f'<text x="{x}" y="{height - 5}" text-anchor="{anchor}" '
                         f'class="label">{escape(day.isoformat())}</text>')
    parts.append("</svg>")
    return "".join(parts)
