"""The push ration (hub/service/push_rate.py): gpulease's own pusher is never refused, a flood is."""

from gpulease.hub.service.push_rate import PushRate


def test_one_push_a_second_is_never_refused():
    rate = PushRate()
    assert all(rate.wait_s("eve", "", float(t)) == 0 for t in range(1000))


def test_a_flood_from_one_server_is_refused_after_its_burst_and_told_when_to_retry():
    rate = PushRate()
    answers = [rate.wait_s("eve", "", 100.0) for _ in range(10)]
    assert answers[:5] == [0] * 5 and all(w >= 1 for w in answers[5:])
    assert rate.wait_s("eve", "", 101.0) == 0  # one more a second later
    assert rate.wait_s("bob", "", 100.0) == 0  # nobody else is affected


def test_many_servers_of_one_user_share_the_users_ration():
    rate = PushRate()
    answers = [rate.wait_s("eve", f"s{i}", 100.0) for i in range(40)]
    assert answers.count(0) == 20 and all(w >= 1 for w in answers[20:])
    assert rate.wait_s("bob", "s0", 100.0) == 0
