"""Prometheus metrics of gpulease, on the hub's own /hub/metrics endpoint."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

BILLED_SECONDS = Counter(
    "gpulease_billed_seconds",
    "Seconds billed (to the millisecond), by profile, counted when sessions close",
    ["profile"],
)
CREDITS_SPENT = Counter(
    "gpulease_credits_spent",
    "Credits charged, by profile, counted when sessions close",
    ["profile"],
)
OPEN_SESSIONS = Gauge("gpulease_open_sessions", "Billing sessions open now")
SESSIONS_CLOSED = Counter(
    "gpulease_sessions_closed", "Billing sessions closed, by end reason", ["reason"]
)
METERING_GAPS = Counter(
    "gpulease_metering_gaps",
    "Running servers the heartbeat found without an open billing session (and opened one)",
)
CREDIT_STOPS_FAILED = Counter(
    "gpulease_credit_stops_failed",
    "Credit stops (balance or account cap) whose server still ran past kill_after, so that "
    "its processes were killed: credit enforcement not working as it should",
    ["reason"],
)
HEARTBEAT_FAILURES = Counter(
    "gpulease_heartbeat_failures", "Heartbeats that could not reach the billing database"
)


def session_closed(profile: str, reason: str, billed_ms: int, cost_ucr: int) -> None:
    BILLED_SECONDS.labels(profile=profile).inc(billed_ms / 1000)
    CREDITS_SPENT.labels(profile=profile).inc(cost_ucr / 1_000_000)
    SESSIONS_CLOSED.labels(reason=reason).inc()
