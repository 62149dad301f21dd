"""bench/tiers.py's simulation runs gpulease's own queue and preemption: a short run
keeps its invariants (the simulation asserts no device is handed out twice and only
spot servers are preempted, once each)."""

from bench.tiers_sim import DAY, HOUR, cluster, simulate, trace


def test_a_short_run_with_and_without_spot():
    warmup, days = 2 * HOUR, 0.3
    inventory = cluster()
    outcomes = {}
    for spot_load in (0.0, 0.8):
        on_demand, spot = trace(7, days, 0.9, 0.2, spot_load, warmup)
        outcomes[spot_load] = simulate(
            inventory, sorted(on_demand + spot, key=lambda r: r.arrived), 120, warmup, days)
    without, with_spot = outcomes[0.0], outcomes[0.8]
    assert without.preempted == 0 and without.spot_started == 0
    assert with_spot.spot_started > 0 and with_spot.preempted > 0
    for out in (without, with_spot):
        assert 0 < out.gpu_s <= 64 * days * DAY
    assert with_spot.gpu_s > without.gpu_s
    # the same on-demand trace: every measured on-demand request has a wait in both runs
    assert len(with_spot.on_demand_waits) == len(without.on_demand_waits)
