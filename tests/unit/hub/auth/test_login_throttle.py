"""LoginThrottle: window, lockout per name-and-address and per address, only a delay
for a name failed from elsewhere, doubling, pruning (clock passed in)."""

from __future__ import annotations

import random

import pytest

from gpulease.hub.auth.login_throttle import MAX_DELAY_S, LoginThrottle, Recorded, Verdict

IP = "10.0.0.1"
OTHER = "192.0.2.9"


def fail_times(throttle: LoginThrottle, n: int, now: float, user="alice", address=IP) -> Recorded:
    started = Recorded()
    for _ in range(n):
        started = throttle.failure(user, address, now)
    return started


def test_fresh_key_may_try_at_once():
    assert LoginThrottle().check("alice", IP, 0) == Verdict()
    assert not Verdict().refused


def test_locks_the_name_from_the_failing_address_for_lockout_s():
    throttle = LoginThrottle(max_failures=3, lockout_s=60)
    assert fail_times(throttle, 2, now=100) == Recorded()
    assert throttle.check("alice", IP, 100) == Verdict()
    assert throttle.failure("alice", IP, 100).lockout_s == 60
    assert throttle.check("alice", IP, 100) == Verdict(refuse_s=60, delay_s=MAX_DELAY_S)
    assert throttle.check("alice", IP, 130).refuse_s == 30
    assert throttle.check("alice", IP, 160) == Verdict()


def test_another_address_is_only_delayed_never_refused():
    throttle = LoginThrottle(max_failures=3, lockout_s=60)
    started = fail_times(throttle, 3, now=0)
    assert started == Recorded(lockout_s=60, slowdown_s=60)
    # The right password still works from elsewhere, after at most a second.
    assert throttle.check("alice", OTHER, 1) == Verdict(delay_s=MAX_DELAY_S)
    assert throttle.check("alice", OTHER, 60) == Verdict()  # the slowdown passes too
    assert throttle.check("alice", IP, 59).refused


def test_no_spray_from_other_addresses_refuses_the_name_where_it_logged_in():
    # Whatever other addresses do with a name, from an address it has logged
    # in from it is at most delayed, by at most MAX_DELAY_S.
    rng = random.Random(7)
    throttle = LoginThrottle(max_failures=3, lockout_s=10, max_lockout_s=100)
    throttle.success("alice", OTHER, 0)
    attackers = [f"198.51.100.{i}" for i in range(20)]
    delayed = 0
    for step in range(2000):
        now = step * 0.5
        throttle.failure("alice", rng.choice(attackers), now)
        verdict = throttle.check("alice", OTHER, now)
        assert not verdict.refused and not verdict.wait
        assert 0 <= verdict.delay_s <= MAX_DELAY_S
        delayed += verdict.delay_s > 0
        throttle.success("alice", OTHER, now)  # the owner's try ends
    assert delayed > 1000  # and the spray does slow the name down


def test_failures_outside_window_do_not_count():
    throttle = LoginThrottle(max_failures=3, window_s=600)
    throttle.failure("alice", IP, 0)
    throttle.failure("alice", IP, 10)
    # The first failure has left the window: two recent ones only.
    assert throttle.failure("alice", IP, 600) == Recorded()
    assert throttle.check("alice", IP, 600) == Verdict()
    assert throttle.failure("alice", IP, 605).lockout_s == 60


def test_lockout_doubles_up_to_max():
    throttle = LoginThrottle(max_failures=2, lockout_s=60, max_lockout_s=200)
    now = 0.0
    lockouts = []
    for _ in range(4):
        lockouts.append(fail_times(throttle, 2, now).lockout_s)
        now += lockouts[-1]
        assert throttle.check("alice", IP, now) == Verdict()
    assert lockouts == [60, 120, 200, 200]


def test_right_password_refused_from_the_failing_address_while_locked():
    # The throttle is consulted before the password: a success cannot be
    # recorded during a lockout, and check() keeps refusing until it ends.
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)
    assert throttle.check("alice", IP, 59).refused
    assert not throttle.check("alice", OTHER, 59).refused
    assert throttle.check("alice", IP, 60) == Verdict()


def test_attempts_while_locked_do_not_extend_it():
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)
    assert fail_times(throttle, 5, now=30) == Recorded()
    assert throttle.check("alice", IP, 60) == Verdict()


def test_delayed_failures_still_count_for_their_own_address():
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)  # alice slowed everywhere
    # From OTHER the tries are delayed, and their failures lock OTHER out too.
    assert throttle.check("alice", OTHER, 1).delay_s == MAX_DELAY_S
    assert fail_times(throttle, 2, now=1, address=OTHER).lockout_s == 60
    assert throttle.check("alice", OTHER, 2).refused


def test_success_clears_the_names_keys_but_not_the_address_key():
    throttle = LoginThrottle(max_failures=3)
    throttle.failure("alice", IP, 0)
    throttle.failure("alice", IP, 0)
    throttle.failure("bob", IP, 0)  # IP: three failures, locked
    assert throttle.check("carol", IP, 1).refused
    throttle.success("alice", OTHER, 1)
    throttle.success("alice", IP, 1)
    # alice starts over, from IP too once the address lock ends...
    assert throttle.check("alice", OTHER, 2) == Verdict()
    assert fail_times(throttle, 2, now=2, address=OTHER) == Recorded()
    # ...but the address itself stays locked for every name.
    assert throttle.check("dave", IP, 3).refused


def test_success_resets_doubling():
    throttle = LoginThrottle(max_failures=2, lockout_s=60)
    fail_times(throttle, 2, now=0)
    throttle.success("alice", IP, 60)
    assert fail_times(throttle, 2, now=61, address=OTHER).lockout_s == 60


def test_address_key_locks_every_name_from_that_address_only():
    throttle = LoginThrottle(max_failures=3)
    # One address guessing many names is locked, the names themselves are not.
    for i, user in enumerate(["a1", "a2", "a3"]):
        throttle.failure(user, IP, i)
    assert throttle.check("anyone", IP, 3).refused
    assert throttle.check("a1", OTHER, 3) == Verdict()
    # One name guessed from many addresses is slowed, never locked, elsewhere.
    for i in range(3):
        throttle.failure("victim", f"198.51.100.{i}", 10 + i)
    assert throttle.check("victim", "203.0.113.7", 13) == Verdict(delay_s=MAX_DELAY_S)
    assert throttle.check("other", "198.51.100.0", 13) == Verdict()


def test_empty_name_counts_only_for_the_address():
    throttle = LoginThrottle(max_failures=1)
    throttle.failure("", IP, 0)
    assert len(throttle) == 1  # ("address", IP)
    assert throttle.check("", IP, 0).refused
    assert throttle.check("", OTHER, 0) == Verdict()


def test_stale_keys_are_pruned_and_forgotten():
    throttle = LoginThrottle(max_failures=2, window_s=600, lockout_s=60, max_lockout_s=3600)
    fail_times(throttle, 2, now=0)
    throttle.failure("bob", OTHER, 3000)
    assert len(throttle) == 6  # three keys each
    throttle.prune(3659)
    assert len(throttle) == 6  # alice's lockout history is still remembered
    throttle.prune(3660)  # quiet for max_lockout_s past the end of her lockout at 60
    assert len(throttle) == 3
    # Forgotten, doubling included: the next lockout is the first again.
    assert fail_times(throttle, 2, now=3660).lockout_s == 60


def test_failures_prune_on_their_own():
    throttle = LoginThrottle(max_failures=5, window_s=10, lockout_s=1, max_lockout_s=10)
    for i in range(100):
        throttle.failure(f"user{i}", f"10.0.0.{i}", float(i * 20))
    # Without pruning there would be 300 keys; each failure is stale 10 s later.
    assert len(throttle) <= 6


def test_table_is_bounded_and_keeps_locked_keys():
    throttle = LoginThrottle(max_failures=2, window_s=1e9, max_lockout_s=1e9, max_keys=50)
    fail_times(throttle, 2, now=0, user="victim", address=IP)
    for i in range(500):
        throttle.failure(f"guess{i}", f"10.9.{i // 250}.{i % 250}", 1 + i)
    assert len(throttle) <= 50
    assert throttle.check("victim", IP, 501) == Verdict()  # lockout ended at 60...
    fail_times(throttle, 2, now=1000, user="victim", address=IP)
    for i in range(500):
        throttle.failure(f"flood{i}", f"10.8.{i // 250}.{i % 250}", 1001 + i * 0.01)
    assert len(throttle) <= 50
    assert throttle.check("victim", IP, 1010).refused  # ...but a current one survives a flood


@pytest.mark.parametrize(
    "kwargs",
    [{"max_failures": 0}, {"window_s": 0}, {"lockout_s": 100, "max_lockout_s": 50},
     {"delay_s": 1.5}, {"delay_s": -1}],
)  # fmt: skip
def test_bad_parameters_refused(kwargs):
    with pytest.raises(ValueError):
        LoginThrottle(**kwargs)


# --- a security review, as a stranger: many addresses at once against one name ---


def test_many_addresses_at_once_guess_a_name_no_faster_than_one():
    # Before, each of 50 concurrent tries waited its second in parallel: 50
    # password checks a second, 290 in a minute against a real hub.
    throttle = LoginThrottle(max_failures=5, lockout_s=60)
    for i in range(5):
        throttle.failure("alice", f"198.51.100.{i}", 0)  # the name is now slowed
    verdicts = [throttle.check("alice", f"203.0.113.{i}", 1) for i in range(50)]
    checked = [v for v in verdicts if not v.refused]
    # One check a second, in turn; tries whose turn is further than 10 s are refused.
    assert [v.delay_s for v in checked] == [float(n) for n in range(1, 11)]
    assert all(v.busy and v.delay_s == MAX_DELAY_S for v in verdicts if v.refused)
    assert len(checked) == 10


def test_turns_space_out_with_each_lockout_of_the_name():
    throttle = LoginThrottle(max_failures=2, lockout_s=60, max_lockout_s=240)
    spacing = []
    now = 0.0
    for k in range(4):
        # The name's next lockout (60, 120, 240, 240 s), from fresh addresses.
        started = fail_times(throttle, 2, now, address=f"198.51.100.{k}")
        first = throttle.check("alice", f"203.0.113.{2 * k}", now).delay_s
        second = throttle.check("alice", f"203.0.113.{2 * k + 1}", now).delay_s
        spacing.append(second - first)
        now += started.slowdown_s
    assert spacing == [1.0, 2.0, 4.0, 4.0]


def test_where_the_name_logged_in_it_waits_no_turn_and_a_success_lifts_nothing_else():
    throttle = LoginThrottle(max_failures=3, lockout_s=60)
    throttle.success("alice", OTHER, 0)
    fail_times(throttle, 3, now=1)
    for i in range(20):
        throttle.check("alice", f"203.0.113.{i}", 2)  # the turns are taken
    assert throttle.check("alice", OTHER, 2) == Verdict(delay_s=MAX_DELAY_S)
    assert throttle.check("alice", "192.0.2.77", 2).busy
    throttle.success("alice", OTHER, 2.5)  # the owner logs in...
    assert throttle.check("alice", "192.0.2.78", 2.5).busy  # ...the guessing stays slowed


def test_an_ipv6_subscriber_counts_as_one_address():
    throttle = LoginThrottle(max_failures=3)
    for i in range(3):
        throttle.failure(f"name{i}", f"2001:db8:1:2::{i + 1:x}", i)
    assert throttle.check("anyone", "2001:db8:1:2:ffff::9", 3).refused  # the same /64
    assert throttle.check("anyone", "2001:db8:1:3::1", 3) == Verdict()  # the next one
    assert throttle.check("anyone", "10.0.0.9", 3) == Verdict()


def test_a_lockout_of_max_lockout_s_does_not_reset_the_doubling():
    # Before, a key was stale max_lockout_s after its last failure: exactly when a
    # lockout of max_lockout_s ended, so the next lockout was the first (60 s) again.
    # (As with the defaults, window 600 s and max_lockout 3600 s: the window is shorter.)
    throttle = LoginThrottle(max_failures=2, window_s=100, lockout_s=60, max_lockout_s=240)
    now, lockouts = 0.0, []
    for _ in range(5):
        lockouts.append(fail_times(throttle, 2, now).lockout_s)
        now += lockouts[-1]
        throttle.prune(now)
    assert lockouts == [60, 120, 240, 240, 240]


def test_tries_at_once_from_one_address_cannot_outrun_the_count():
    # Before, 100 tries sent at once all passed check() before the first failure
    # was recorded: against a real hub 91 passwords were checked, 5 allowed.
    throttle = LoginThrottle(max_failures=5)
    verdicts = [throttle.check("alice", IP, 0) for _ in range(100)]
    admitted = [v for v in verdicts if not v.wait and not v.refused]
    assert len(admitted) == 5 and all(v.wait for v in verdicts[5:])
    for _ in range(5):
        throttle.failure("alice", IP, 1)  # the five end: wrong
    assert throttle.check("alice", IP, 1).refused  # locked out: the waiting ones too


def test_tries_at_once_from_many_addresses_take_turns_before_the_name_locks():
    throttle = LoginThrottle(max_failures=5)
    verdicts = [throttle.check("alice", f"203.0.113.{i}", 0) for i in range(50)]
    # Five are checked at once; the rest could make the fifth failure: they take turns.
    assert [v.delay_s for v in verdicts[:5]] == [0.0] * 5
    assert [v.delay_s for v in verdicts[5:15]] == [float(n) for n in range(1, 11)]
    assert all(v.busy for v in verdicts[15:])


def test_a_try_in_flight_ends_with_its_verdict_or_abandoned():
    throttle = LoginThrottle(max_failures=2, window_s=10, lockout_s=1, max_lockout_s=10)
    for _ in range(2):
        assert throttle.check("alice", IP, 0) == Verdict()
    assert throttle.check("alice", IP, 0).wait
    throttle.abandon("alice", IP)
    throttle.success("alice", IP, 0)
    assert throttle.check("alice", IP, 0) == Verdict()
    throttle.prune(1000)
    assert len(throttle) == 3  # its keys stay while it is in flight
    throttle.failure("alice", IP, 1000)
    throttle.prune(2000)
    assert len(throttle) == 0


def test_a_client_known_to_have_logged_in_as_the_name_waits_no_turn_from_anywhere():
    throttle = LoginThrottle(max_failures=3)
    fail_times(throttle, 3, now=0)
    for i in range(20):
        throttle.check("alice", f"203.0.113.{i}", 1)  # the turns are taken
    assert throttle.check("alice", "192.0.2.50", 1).busy
    assert throttle.check("alice", "192.0.2.50", 1, known=True) == Verdict(delay_s=MAX_DELAY_S)
