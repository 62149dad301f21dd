"""How long a running server's money lasts (the status bar's runway): gpulease.core.billing.rules."""

from gpulease.core.billing.rules import runway, runway_s


def test_runway_is_the_earlier_of_the_balance_and_the_cap():
    hour = 1_000_000  # 1 credit an hour
    assert runway_s(2 * hour, hour) == 7200
    # Two researchers' sessions on one account: it runs down twice as fast.
    assert runway_s(2 * hour, 2 * hour) == 3600
    # A member's cap left of half a credit at their own 1/h: 30 minutes, before the balance.
    assert runway_s(10 * hour, 2 * hour, cap_left_ucr=hour // 2, own_rate_ucr=hour) == 1800
    assert runway_s(-5, hour) == 0 and runway_s(5, 0) is None
    assert runway_s(hour, hour, cap_left_ucr=-1, own_rate_ucr=hour) == 0


def test_runway_says_what_runs_out_first():
    hour = 1_000_000
    assert runway(2 * hour, hour) == (7200, "balance")
    assert runway(10 * hour, 2 * hour, cap_left_ucr=hour // 2, own_rate_ucr=hour) == (1800, "cap")
    assert runway(5, 0) == (None, None)
