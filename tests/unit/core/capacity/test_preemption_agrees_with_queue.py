"""plan_preemptions against the queue's own pass (gpulease/core/capacity/queue.py plan), at random.

Once every chosen victim and every server still being preempted (not `unneeded`)
has gone, the queue's own pass gives the devices of every victim to a waiting
start (nobody is preempted for nothing) and starts each start a preemption is for, and no server whose preemption is taken
back held a device that pass would have given to a start that still waits.
(Found by an attack: the queue's best fit placed a start elsewhere than planned,
and preemptions counted on devices the queue kept for an earlier, blocked start.)
"""

import random

import pytest

from gpulease.core.capacity.preemption import SpotHolding, plan_preemptions
from gpulease.core.capacity.queue import Waiting, plan
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory


def _case(rng: random.Random):
    nodes = {f"n{i}": rng.choice([1, 2, 4]) for i in range(rng.randint(1, 3))}
    inventory = parse_declared_inventory(
        {"nodes": [{"name": n, "gpus": [{"model": "H200"}] * count}
                   for n, count in nodes.items()]}, "t")
    held, spot, leaving = set(), [], {}
    for node, count in nodes.items():
        cards = [f"GPU-declared-{node}-{i}" for i in range(count)]
        rng.shuffle(cards)
        while cards and rng.random() < 0.9:
            take, cards = cards[:rng.choice([1, 1, 2])], cards[len(cards[:0]):]
            cards = cards[len(take):]
            roll, key = rng.random(), f"s{len(spot) + len(leaving)}-{node}"
            if roll < 0.45:
                spot.append(SpotHolding(key, node, frozenset(take), float(rng.randrange(9))))
                held |= set(take)
            elif roll < 0.6:
                leaving[key] = frozenset(take)
            else:
                held |= set(take)
    waiting = [(f"w{i}", DeviceRequest("H200", count=rng.choice([1, 1, 2, 3, 4])))
               for i in range(rng.randint(1, 4))]
    return inventory, held, spot, leaving, waiting


@pytest.mark.parametrize("seed", range(6))
def test_no_spot_server_is_preempted_for_nothing(seed):
    rng = random.Random(seed)
    bad = []
    for trial in range(400):
        inventory, held, spot, leaving, waiting = _case(rng)
        got = plan_preemptions(waiting, inventory, held, spot, leaving)
        devices_of = {h.key: h.devices for h in spot}
        victims = [v for _, p in got.chosen for v in p.victims]
        assert len(victims) == len(set(victims)) and not set(victims) & set(leaving)
        freed = set().union(*(p.freed for _, p in got.chosen))
        unneeded = set().union(*(leaving[k] for k in got.unneeded)) if got.unneeded else set()
        # after the grace period: the victims and kept leaving servers gone, the
        # servers whose preemption was taken back still running
        queue = [Waiting(k, r) for k, r in waiting]
        after = plan(queue, inventory, (held - freed) | unneeded)
        used = set().union(*(set(p.uuids) for _, p in after.start))
        for victim in victims:
            if not devices_of[victim] & used:
                bad.append(("preempted for nothing", trial, victim))
        started = {k for k, _ in after.start}
        for key, _ in got.chosen:  # the start its researcher is told of does start
            if key not in started:
                bad.append(("preempted for a start that still waits", trial, key))
        wider = plan(queue, inventory, held - freed)
        for key, placement in wider.start:
            if key not in started and set(placement.uuids) & unneeded:
                bad.append(("withdrew what a start needed", trial, key))
    assert not bad, bad[:3]
