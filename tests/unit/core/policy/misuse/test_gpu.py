"""Signal (c): the GPU at full while no client used the server, from outside readings."""

from __future__ import annotations

import pytest

from gpulease.core.policy.misuse.evidence import GPU_RULE_ID, GPU_UNATTENDED
from gpulease.core.policy.misuse.gpu import (
    GpuReading,
    GpuRule,
    GpuWatch,
    observe_gpu,
    unattended_full_gpu,
    unattended_gpu,
)

MIN = 60.0
RULE = GpuRule()  # 90 %, an hour, gaps up to 5 minutes


def readings(start_min, end_min, percent, every_s=60.0):
    """One reading a minute (the culler's) at `percent` (a number or f(minute))."""
    out, t = [], start_min * MIN
    while t <= end_min * MIN:
        p = percent(t / MIN) if callable(percent) else percent
        out.append(GpuReading(t, p))
        t += every_s
    return out


def test_a_miner_nobody_uses_is_seen_once_both_have_lasted_the_hour():
    full = readings(0, 61, 99.0)
    signal = unattended_full_gpu(full, None, started_at=0.0, now=61 * MIN)
    assert (signal.kind, signal.rule_id, signal.source) == (GPU_UNATTENDED, GPU_RULE_ID, "c")
    assert signal.detail_dict() == {"gpu_full_since_s_ago": "3660",
                                    "no_client_since_s_ago": "3660", "mean_percent": "99.0"}
    assert unattended_full_gpu(full, None, 0.0, now=59 * MIN) is None


def test_honest_training_with_its_researcher_there_is_not_seen():
    full = readings(0, 300, 97.0)
    # the tab polls through the proxy every few seconds while open
    assert unattended_full_gpu(full, last_client_at=300 * MIN - 5, started_at=0.0,
                               now=300 * MIN) is None


def test_a_job_started_from_a_cell_is_seen_an_hour_after_its_researcher_left():
    full = readings(0, 600, 98.0)
    left = 25 * MIN  # ran the cell, watched the first epochs, closed the tab
    assert unattended_full_gpu(full, left, 0.0, now=left + 59 * MIN) is None
    assert unattended_full_gpu(full, left, 0.0, now=left + 61 * MIN) is not None


def test_serving_and_a_throttled_card_are_not_full():
    load = readings(0, 600, lambda m: 40 + 55 * ((m // 7) % 2))  # bursts of requests
    assert unattended_full_gpu(load, None, 0.0, now=600 * MIN) is None
    half = readings(0, 600, 50.0)  # a miner throttled to hide
    assert unattended_full_gpu(half, None, 0.0, now=600 * MIN) is None


def test_a_dip_or_a_gap_starts_the_run_again_and_a_stale_run_says_nothing():
    dip = readings(0, 90, lambda m: 20.0 if m == 45 else 99.0)
    assert unattended_full_gpu(dip, None, 0.0, now=90 * MIN) is None
    assert unattended_full_gpu(dip, None, 0.0, now=106 * MIN) is None  # stale: 16 min late
    gap = readings(0, 40, 99.0) + readings(50, 100, 99.0)  # the culler down 10 minutes
    assert unattended_full_gpu(gap, None, 0.0, now=100 * MIN) is None
    assert unattended_full_gpu(gap, None, 0.0, now=111 * MIN) is None
    short_gap = readings(0, 40, 99.0) + readings(44, 70, 99.0)
    assert unattended_full_gpu(short_gap, None, 0.0, now=70 * MIN) is not None


def test_the_watch_follows_one_reading_at_a_time():
    watch = GpuWatch()
    watch = observe_gpu(watch, GpuReading(0.0, 95.0))
    watch = observe_gpu(watch, GpuReading(60.0, 91.0))
    assert watch == GpuWatch(0.0, 60.0, 2, 186.0)
    assert observe_gpu(watch, GpuReading(120.0, 89.9)) == GpuWatch(None, 120.0)
    assert observe_gpu(watch, GpuReading(1000.0, 99.0)) == GpuWatch(1000.0, 1000.0, 1, 99.0)
    assert unattended_gpu(GpuWatch(), None, 0.0, 1e6) is None
    # a later client request counts from when it came, the start where none came
    long_run = GpuWatch(0.0, 7200.0, 121, 121 * 99.0)
    assert unattended_gpu(long_run, 7000.0, 0.0, 7200.0) is None
    assert unattended_gpu(long_run, None, 5000.0, 7200.0) is None
    assert unattended_gpu(long_run, None, 0.0, 7200.0) is not None


def test_the_thresholds_are_settable_and_checked():
    rule = GpuRule(busy_percent=80.0, sustained_s=10 * MIN)
    assert unattended_full_gpu(readings(0, 11, 85.0), None, 0.0, 11 * MIN, rule) is not None
    for bad in ({"busy_percent": 0}, {"busy_percent": 101}, {"sustained_s": 0},
                {"max_gap_s": -1}):
        with pytest.raises(ValueError):
            GpuRule(**bad)
