"""The idle culler's decision rules, as pure functions over plain data."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpulease.idle_culler.policy import (
    KEEP,
    MAX_RUNTIME_WARN,
    STOP_MAX_RUNTIME,
    SUSPEND,
    WARN,
    ServerMemory,
    decide,
    observe,
)
from gpulease.idle_culler.signals import KernelState, ServerSnapshot, default_warn_before

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def snap(**kw) -> ServerSnapshot:
    """A GPU server started at T0, 30 min idle timeout, every signal read and quiet since T0."""
    base = dict(
        user="ada", server="", profile="h200-1g", started=T0, hub_last_activity=T0,
        kernels=(KernelState("k1", "idle", T0, 0),), terminals_last_activity=None,
        cpu_percent=0.5, gpu_percent=0.0, gpu_source="gpm", has_gpu=True,
        idle_timeout_s=1800, max_runtime_s=0, warn_before_s=300,
    )
    base.update(kw)
    return ServerSnapshot(**base)


def run(snapshot: ServerSnapshot, minutes: float, memory: ServerMemory | None = None,
        seen: datetime = T0):
    """Observe the snapshot at `seen` (first sight) and again at T0+minutes, then decide."""
    now = T0 + timedelta(minutes=minutes)
    memory = observe(memory, replace(snapshot, cpu_percent=None, gpu_percent=None), seen)
    memory = observe(memory, snapshot, now)
    return decide(snapshot, memory, now)


def test_all_quiet_warns_then_suspends_at_the_right_times():
    s = snap()
    assert run(s, 24.9).action == KEEP
    d = run(s, 25)
    assert d.action == WARN
    assert d.deadline == T0 + 30 * MIN
    assert d.idle_since == T0
    assert run(s, 29.9).action == WARN
    d = run(s, 30)
    assert d.action == SUSPEND
    assert d.idle_for_s == 1800
    assert set(d.signals) == {"hub", "kernels", "terminals", "cpu", "gpu"}


def test_warn_before_is_at_most_half_the_timeout():
    assert default_warn_before(1800) == 300
    assert default_warn_before(60) == 30
    assert default_warn_before(0) == 0
    s = snap(idle_timeout_s=60)
    assert run(s, 0.49).action == KEEP
    assert run(s, 0.5).action == WARN


@pytest.mark.parametrize("signal", ["busy kernel", "kernel activity", "terminal", "cpu", "gpu",
                                    "hub"])
def test_each_signal_alone_keeps_a_server_alive(signal):
    now_ish = T0 + 40 * MIN
    s = snap()
    if signal == "busy kernel":  # training with no browser attached
        s = replace(s, kernels=(KernelState("k1", "busy", T0, 0),))
    elif signal == "kernel activity":
        s = replace(s, kernels=(KernelState("k1", "idle", now_ish, 0),
                                KernelState("k2", "idle", T0, 0)))
    elif signal == "terminal":
        s = replace(s, terminals_last_activity=now_ish)
    elif signal == "cpu":
        s = replace(s, cpu_percent=95.0)
    elif signal == "gpu":
        s = replace(s, gpu_percent=60.0)
    elif signal == "hub":
        s = replace(s, hub_last_activity=now_ish)
    d = run(s, 45)
    assert d.action == KEEP, d
    # The quiet reference server is suspended at the same time.
    assert run(snap(), 45).action == SUSPEND


def test_cpu_seen_busy_earlier_counts_until_the_timeout_from_then():
    memory = observe(None, snap(), T0)
    memory = observe(memory, snap(cpu_percent=80.0), T0 + 20 * MIN)
    d = decide(snap(), memory, T0 + 45 * MIN)
    assert d.action == WARN
    assert d.idle_since == T0 + 20 * MIN
    assert decide(snap(), memory, T0 + 50 * MIN).action == SUSPEND


def test_gpu_memory_held_without_compute_is_not_activity():
    # A loaded model holds GPU memory; the GPU signal is compute utilisation only.
    d = run(snap(gpu_percent=0.0, gpu_source="nvml"), 30)
    assert d.action == SUSPEND
    assert d.signals["gpu"].startswith("0.0% compute via nvml")


def test_thresholds_are_strict_and_configurable():
    s = snap(cpu_percent=10.0, gpu_percent=5.0)
    assert run(s, 30).action == SUSPEND  # at the threshold is not above it
    memory = observe(None, s, T0 + 30 * MIN, cpu_threshold=5.0)
    assert decide(s, memory, T0 + 30 * MIN, cpu_threshold=5.0).action == KEEP


def test_unknown_signals_are_listed_and_not_counted():
    s = snap(gpu_percent=None, gpu_source="GPM not supported on this GPU",
             terminals_error="timeout after 5s")
    d = run(s, 30)
    assert d.action == SUSPEND
    assert d.signals["gpu"] == "unknown: GPM not supported on this GPU"
    assert d.signals["terminals"] == "unknown: timeout after 5s"


def test_without_kernels_and_cpu_a_server_is_never_suspended():
    s = snap(kernels=None, kernels_error="HTTP 599: timeout", cpu_percent=None,
             cpu_error="no pid in the server's state")
    for minutes in (25, 30, 600):
        d = run(s, minutes)
        assert d.action == KEEP, d
    assert "neither kernels nor CPU" in run(s, 600).reason
    assert run(s, 600).signals["kernels"] == "unknown: HTTP 599: timeout"
    # Either one alone confirms.
    assert run(replace(s, cpu_percent=0.0), 30).action == SUSPEND
    assert run(replace(s, kernels=()), 30).action == SUSPEND


def test_cluster_shape_unknown_cpu_is_never_quiet_and_gpu_or_kernels_decide():
    """No metrics server: the CPU is unknown, says why, and counts neither as activity
    nor as quiet. Idle pushed kernels and an idle DCGM reading suspend at the timeout,
    as they would with a quiet CPU; a busy GPU keeps; and a GPU server whose GPU is
    unknown too (Prometheus down) is not suspended, nor warned, however long: kernels
    do not see a training script started from a terminal in the background."""
    why = "no metrics server: the cluster does not serve metrics.k8s.io/v1beta1"
    s = snap(cpu_percent=None, cpu_error=why, gpu_source="dcgm")
    d = run(s, 30)
    assert d.action == SUSPEND and d.signals["cpu"] == f"unknown: {why}"
    assert d.idle_since == T0 and d.reason == "idle for 1800s (timeout 1800s)"
    assert run(replace(s, gpu_percent=80.0), 600).reason == "active now: gpu"
    blind = replace(s, gpu_percent=None, gpu_source="Prometheus at http://p:9090: refused")
    for minutes in (25, 30, 600):
        assert run(blind, minutes).action == KEEP
    d = run(blind, 600)
    assert d.reason.endswith("not suspending: neither GPU nor CPU could be read")
    assert d.signals["gpu"] == "unknown: Prometheus at http://p:9090: refused"
    # A server without a GPU has only its CPU to see such a process: the rule of
    # kernels-or-CPU applies, and idle kernels suspend it.
    assert run(replace(blind, has_gpu=False), 30).action == SUSPEND
    # Nothing the server pushed, and a GPU unread: its hub activity alone does not confirm.
    plain = replace(blind, kernels=None, hub_activity_only=True, kernels_error="not pushed")
    assert run(plain, 600).action == KEEP


def test_a_server_that_pushes_no_kernel_state_is_judged_on_hub_activity_and_says_so():
    """No gpulease.singleuser in the image: the hub's activity alone confirms (with CPU
    unknown too, e.g. the cluster shape), and the decision names the fallback."""
    s = snap(kernels=None, kernels_error="no state pushed", hub_activity_only=True,
             cpu_percent=None, cpu_error="no CPU source configured", has_gpu=False)
    assert run(s, 20).action == KEEP
    d = run(s, 30)
    assert d.action == SUSPEND
    assert d.signals["kernels"] == "not pushed: hub activity only; no state pushed"
    assert d.signals["terminals"] == "not pushed: hub activity only"
    assert run(replace(s, hub_last_activity=T0 + 15 * MIN), 30).action == KEEP


def test_culler_restart_never_makes_a_busy_server_look_idle():
    # The server has run 10 hours; the hub saw nothing for hours and its kernel
    # went quiet long ago, but a script burns CPU. The culler restarts now and
    # its first CPU sample is not ready yet (None), then reads 0.0% by chance.
    restart = T0 + 10 * 60 * MIN
    s = snap(kernels=(), cpu_percent=None, cpu_error="first sample", gpu_percent=None)
    memory = observe(None, s, restart)
    assert decide(s, memory, restart).action == KEEP
    quiet = replace(s, cpu_percent=0.0)
    memory = observe(memory, quiet, restart + MIN)
    d = decide(quiet, memory, restart + MIN)
    assert d.action == KEEP
    assert d.idle_since == restart
    # Only a full timeout of quiet after the restart suspends it.
    assert decide(quiet, memory, restart + 30 * MIN).action == SUSPEND


def test_a_new_server_of_the_same_name_gets_fresh_memory():
    memory = observe(None, snap(cpu_percent=90.0), T0)
    later = T0 + 120 * MIN
    restarted = snap(started=later, hub_last_activity=None, kernels=())
    memory = observe(memory, restarted, later)
    assert memory.started == later and memory.cpu_active_at is None


def test_max_runtime_stops_a_busy_server_and_warns_first():
    s = snap(max_runtime_s=3600, kernels=(KernelState("k1", "busy", T0, 1),), cpu_percent=400.0)
    assert run(s, 54).action == KEEP
    d = run(s, 55)
    assert d.action == MAX_RUNTIME_WARN
    assert d.deadline == T0 + 60 * MIN
    d = run(s, 60)
    assert d.action == STOP_MAX_RUNTIME


def test_max_runtime_wins_over_idle():
    s = snap(max_runtime_s=1800)
    d = run(s, 30)
    assert d.action == STOP_MAX_RUNTIME
    d = run(snap(max_runtime_s=1500), 25)
    assert d.action == STOP_MAX_RUNTIME


def test_idle_timeout_zero_never_suspends():
    s = snap(idle_timeout_s=0)
    for minutes in (25, 30, 10_000):
        assert run(s, minutes).action == KEEP
    assert "never" in run(s, 100).reason


def test_admins_are_not_exempt():
    # There is no admin field: the rules see profiles and signals only.
    d = run(snap(user="admin"), 30)
    assert d.action == SUSPEND


def test_cpu_only_server_lists_no_gpu():
    d = run(snap(has_gpu=False, gpu_percent=None, gpu_source="none"), 30)
    assert d.action == SUSPEND
    assert d.signals["gpu"] == "no gpu"


def test_starting_kernel_counts_as_busy_and_signals_describe_values():
    s = snap(kernels=(KernelState("k1", "starting", None, 2),), cpu_percent=3.25)
    d = run(s, 40)
    assert d.action == KEEP
    assert d.signals["kernels"] == "1 kernel(s), 1 busy, 2 client(s)"
    assert d.signals["cpu"] == "3.2% of one core (threshold 10%)"
    assert "kernels" in d.reason


def test_a_server_started_while_watched_counts_idle_from_its_start():
    culler_start = T0
    new = snap(started=T0 + timedelta(seconds=10))
    fresh = observe(None, new, T0 + timedelta(seconds=40), watching_since=culler_start)
    assert fresh.first_seen == new.started
    # found running at a culler (re)start: counted from first sight only
    found = observe(None, snap(started=T0 - timedelta(hours=1)), T0 + timedelta(seconds=40),
                    watching_since=culler_start)
    assert found.first_seen == T0 + timedelta(seconds=40)


def test_a_kernel_shut_down_between_two_pushes_still_counts_as_activity():
    """A script through the REST API that starts a kernel, runs a cell and shuts it down
    within one of the server's looks leaves no kernel in any push: the server's record of
    any kernel's last activity, pushed beside the list, is what keeps its use counted."""
    used = T0 + 20 * MIN
    s = snap(kernels=(), kernels_last_activity=used)
    assert run(s, 45).action == WARN and run(s, 45).idle_since == used
    assert run(s, 50).action == SUSPEND
    assert "none running, last activity 2025-03-03T09:20:00Z" in run(s, 45).signals["kernels"]
    # without it (a server that does not push it) the same server was idle since its start
    assert run(snap(kernels=()), 45).action == SUSPEND
