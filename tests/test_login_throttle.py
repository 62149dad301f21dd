"""LoginThrottle: counting window, lockout, doubling, separate keys, pruning (clock passed in)."""

from __future__ import annotations

import pytest

from gpulease.hub.login_throttle import LoginThrottle

IP = "10.0.0.1"


def fail_times(throttle: LoginThrottle, n: int, now: float, user="alice", address=IP) -> float:
    started = 0.0
    for _ in range(n):
        started = throttle.failure(user, address, now)
    return started


def test_fresh_key_may_try():
    assert LoginThrottle().check("alice", IP, 0) == 0


def test_locks_after_max_failures_for_lockout_s():
    throttle = LoginThrottle(max_failures=3, lockout_s=60)
    assert fail_times(throttle, 2, now=100) == 0
    assert throttle.check("alice", IP, 100) == 0
    assert throttle.failure("alice", IP, 100) == 60
    assert throttle.check("alice", IP, 100) == 60
    assert throttle.check("alice", IP, 130) == 30
    assert throttle.check("alice", IP, 160) == 0


def test_failures_outside_window_do_not_count():
    throttle = LoginThrottle(max_failures=3, window_s=600)
    throttle.failure("alice", IP, 0)
    throttle.failure("alice", IP, 10)
    # The first failure has left the window: two recent ones only.
    assert throttle.failure("alice", IP, 600) == 0
    assert throttle.check("alice", IP, 600) == 0
    assert throttle.failure("alice", IP, 605) == 60


def test_lockout_doubles_up_to_max():
    throttle = LoginThrottle(max_failures=2, lockout_s=60, max_lockout_s=200)
    now = 0.0
    lockouts = []
    for _ in range(4):
        lockouts.append(fail_times(throttle, 2, now))
        now += lockouts[-1]
        assert throttle.check("alice", IP, now) == 0
    assert lockouts == [60, 120, 200, 200]


def test_right_password_refused_while_locked():
    # The throttle is consulted before the password: a success cannot be
    # recorded during a lockout, and check() keeps refusing until it ends.
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)
    assert throttle.check("alice", IP, 59) > 0
    assert throttle.check("alice", "192.0.2.9", 59) > 0  # from any address
    assert throttle.check("alice", IP, 60) == 0


def test_attempts_while_locked_do_not_extend_it():
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)
    assert fail_times(throttle, 5, now=30) == 0
    assert throttle.check("alice", IP, 60) == 0


def test_success_clears_user_key_but_not_address_key():
    throttle = LoginThrottle(max_failures=3)
    throttle.failure("alice", IP, 0)
    throttle.failure("bob", IP, 0)
    throttle.success("alice", IP, 1)
    # alice starts over; the address still holds two failures.
    assert throttle.failure("alice", "192.0.2.9", 2) == 0
    assert throttle.failure("alice", "192.0.2.9", 2) == 0
    assert throttle.failure("carol", IP, 3) == 60
    assert throttle.check("dave", IP, 3) == 60
    assert throttle.check("alice", "192.0.2.9", 3) == 0


def test_success_resets_doubling():
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0, address=None)
    throttle.success("alice", None, 60)
    assert fail_times(throttle, 2, now=61, address=None) == 60


def test_address_key_independent_of_user_key():
    throttle = LoginThrottle(max_failures=3)
    # One address guessing many names is locked, the names themselves are not.
    for i, user in enumerate(["a1", "a2", "a3"]):
        throttle.failure(user, IP, i)
    assert throttle.check("anyone", IP, 3) > 0
    assert throttle.check("a1", "192.0.2.9", 3) == 0
    # One name guessed from many addresses is locked from every address.
    for i in range(3):
        throttle.failure("victim", f"198.51.100.{i}", 10 + i)
    assert throttle.check("victim", "203.0.113.7", 13) > 0
    assert throttle.check("other", "198.51.100.0", 13) == 0


def test_missing_user_or_address_is_not_a_key():
    throttle = LoginThrottle(max_failures=1)
    throttle.failure("alice", None, 0)
    throttle.failure("", IP, 0)
    assert len(throttle) == 2  # ("user", "alice") and ("address", IP)
    assert throttle.check("", None, 0) == 0


def test_stale_keys_are_pruned_and_forgotten():
    throttle = LoginThrottle(max_failures=2, window_s=600, lockout_s=60, max_lockout_s=3600)
    fail_times(throttle, 2, now=0)
    throttle.failure("bob", "192.0.2.9", 3000)
    assert len(throttle) == 4
    throttle.prune(3599)
    assert len(throttle) == 4  # alice's lockout history is still remembered
    throttle.prune(3600)
    assert len(throttle) == 2
    # Forgotten, doubling included: the next lockout is the first again.
    assert fail_times(throttle, 2, now=3600) == 60


def test_failures_prune_on_their_own():
    throttle = LoginThrottle(max_failures=5, window_s=10, lockout_s=1, max_lockout_s=10)
    for i in range(100):
        throttle.failure(f"user{i}", f"10.0.0.{i}", float(i * 20))
    # Without pruning there would be 200 keys; each failure is stale 10 s later.
    assert len(throttle) <= 4


def test_table_is_bounded_and_keeps_locked_keys():
    throttle = LoginThrottle(max_failures=2, window_s=1e9, max_lockout_s=1e9, max_keys=50)
    fail_times(throttle, 2, now=0, user="victim", address=None)
    for i in range(500):
        throttle.failure(f"guess{i}", None, 1 + i)
    assert len(throttle) <= 50
    assert throttle.check("victim", None, 501) == 0  # lockout ended at 60...
    fail_times(throttle, 2, now=1000, user="victim", address=None)
    for i in range(500):
        throttle.failure(f"flood{i}", None, 1001 + i * 0.01)
    assert len(throttle) <= 50
    assert throttle.check("victim", None, 1010) > 0  # ...but a current one survives a flood


@pytest.mark.parametrize(
    "kwargs",
    [{"max_failures": 0}, {"window_s": 0}, {"lockout_s": 100, "max_lockout_s": 50}],
)
def test_bad_parameters_refused(kwargs):
    with pytest.raises(ValueError):
        LoginThrottle(**kwargs)
