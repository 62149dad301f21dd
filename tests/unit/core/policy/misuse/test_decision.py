"""The decision: signals combined into one action by the policy, with their evidence."""

from __future__ import annotations

import pytest

from gpulease.core.policy.misuse.decision import (
    ABUSE_END_REASON,
    LOCK,
    NONE,
    RESEARCHER_MESSAGE,
    SUSPEND,
    WARN,
    MisusePolicy,
    decide,
)
from gpulease.core.policy.misuse.evidence import (
    GPU_RULE_ID,
    GPU_UNATTENDED,
    KINDS,
    NETWORK_ADDRESS,
    NETWORK_PORT,
    PROCESS_HASH,
    PROCESS_PATTERN,
    STRATUM,
    STRATUM_RULE_ID,
    Signal,
)
from gpulease.core.policy.misuse.gpu import GpuReading, unattended_full_gpu
from gpulease.core.policy.misuse.network import (
    Connection,
    NetworkDenyList,
    NetworkEntry,
    match_connections,
)
from gpulease.core.policy.misuse.processes import match_processes
from tests.unit.core.policy.misuse.samples import DENY, HONEST

GPU = Signal(GPU_UNATTENDED, GPU_RULE_ID, 100.0, (("mean_percent", "99.0"),))
HASH = Signal(PROCESS_HASH, "xmrig-6.21.0", 50.0, (("pid", "7"), ("exe", "/home/ada/w")))
PATTERN = Signal(PROCESS_PATTERN, "stratum-url", 50.0, (("pid", "7"),))
ADDRESS = Signal(NETWORK_ADDRESS, "pool-a", 60.0, (("remote", "198.51.100.4"),))
PORT = Signal(NETWORK_PORT, "miner-ports", 60.0, (("remote", "192.0.2.1"), ("port", "4444")))
STRAT = Signal(STRATUM, STRATUM_RULE_ID, 61.0, (("method", "login"),))


def test_each_kind_has_its_shipped_action():
    policy = MisusePolicy()
    assert {s.kind: decide("ada", "", [s], 100.0, policy).action
            for s in (GPU, HASH, PATTERN, ADDRESS, PORT, STRAT)} == {
        GPU_UNATTENDED: WARN, PROCESS_HASH: SUSPEND, PROCESS_PATTERN: SUSPEND,
        NETWORK_ADDRESS: SUSPEND, NETWORK_PORT: WARN, STRATUM: LOCK}
    assert decide("ada", "", [], 100.0).action == NONE


def test_the_gpu_alone_only_warns_and_no_policy_can_make_it_stop():
    for action in (SUSPEND, LOCK):
        with pytest.raises(ValueError, match="the GPU signal may only warn"):
            MisusePolicy(gpu_unattended=action)
        with pytest.raises(ValueError, match="the GPU signal may only warn"):
            MisusePolicy(by_entry={GPU_RULE_ID: action})
    decision = decide("ada", "", [GPU, GPU], 100.0, MisusePolicy(lock_after_stops=1))
    assert decision.action == WARN and not decision.stops and decision.end_reason is None
    assert decide("ada", "", [GPU], 100.0, MisusePolicy(gpu_unattended=NONE)).action == NONE


def test_a_stop_rests_on_a_process_or_network_signal_and_records_what_it_used():
    decision = decide("ada", "train", [GPU, PORT, ADDRESS], 120.0)
    assert decision.action == SUSPEND and decision.stops and not decision.locks
    assert decision.end_reason == ABUSE_END_REASON == "abuse"
    assert decision.kinds == (NETWORK_ADDRESS, NETWORK_PORT, GPU_UNATTENDED)
    assert [s.rule_id for s in decision.signals] == ["pool-a", "miner-ports", GPU_RULE_ID]
    assert decision.evidence() == {
        "action": SUSPEND, "user": "ada", "server": "train", "at": 120.0,
        "end_reason": "abuse",
        "kinds": [NETWORK_ADDRESS, NETWORK_PORT, GPU_UNATTENDED],
        "signals": [
            {"kind": NETWORK_ADDRESS, "source": "b", "rule_id": "pool-a", "at": 60.0,
             "detail": {"remote": "198.51.100.4"}},
            {"kind": NETWORK_PORT, "source": "b", "rule_id": "miner-ports", "at": 60.0,
             "detail": {"remote": "192.0.2.1", "port": "4444"}},
            {"kind": GPU_UNATTENDED, "source": "c", "rule_id": GPU_RULE_ID, "at": 100.0,
             "detail": {"mean_percent": "99.0"}}]}


def test_stratum_locks_and_comes_first_in_the_evidence():
    decision = decide("ada", "", [GPU, HASH, STRAT], 100.0)
    assert decision.action == LOCK and decision.stops and decision.locks
    assert [s.kind for s in decision.signals] == [STRATUM, PROCESS_HASH, GPU_UNATTENDED]


def test_an_accounts_second_abuse_stop_locks_it():
    assert decide("ada", "", [HASH], 1.0, prior_abuse_stops=0).action == SUSPEND
    second = decide("ada", "", [HASH], 1.0, prior_abuse_stops=1)
    assert second.action == LOCK and second.prior_abuse_stops == 1
    assert decide("ada", "", [HASH], 1.0, MisusePolicy(lock_after_stops=0),
                  prior_abuse_stops=9).action == SUSPEND
    assert decide("ada", "", [HASH], 1.0, MisusePolicy(lock_after_stops=1)).action == LOCK
    # a warning is no stop, however many came before
    assert decide("ada", "", [PORT], 1.0, prior_abuse_stops=5).action == WARN


def test_actions_are_set_per_kind_and_per_entry():
    policy = MisusePolicy(network_port=NONE, process_hash=LOCK,
                          by_entry={"pool-a": WARN, "miner-ports": SUSPEND})
    assert decide("a", "", [HASH], 1.0, policy).action == LOCK
    assert decide("a", "", [ADDRESS], 1.0, policy).action == WARN
    port_off = MisusePolicy(network_port=NONE)
    decision = decide("a", "", [PORT, GPU], 1.0, port_off)
    assert decision.action == WARN and decision.kinds == (GPU_UNATTENDED,)  # PORT not used
    assert decide("a", "", [PORT], 1.0, policy).action == SUSPEND
    with pytest.raises(ValueError, match="misuse policy stratum: 'kill' is not one of"):
        MisusePolicy(stratum="kill")
    with pytest.raises(ValueError, match=r"by_entry\['x'\]: 'stop' is not one of"):
        MisusePolicy(by_entry={"x": "stop"})
    with pytest.raises(ValueError, match="lock_after_stops"):
        MisusePolicy(lock_after_stops=-1)
    assert set(KINDS) <= set(vars(MisusePolicy()))


def test_what_a_researcher_is_shown_names_no_entry_signal_or_address():
    everything = [GPU, HASH, PATTERN, ADDRESS, PORT, STRAT]
    for signals in ([HASH], [PATTERN], [ADDRESS], [STRAT], everything):
        decision = decide("ada", "", signals, 1.0)
        message = decision.researcher_message
        assert message == RESEARCHER_MESSAGE[decision.action] and message
        for s in everything:
            assert s.rule_id not in message and s.kind not in message
            for _, value in s.detail:
                assert value not in message
        assert "stratum" not in message.lower() and "pool" not in message.lower()
    assert decide("ada", "", [PORT], 1.0).researcher_message == ""  # a warning is for admins
    assert "may not start" in \
        RESEARCHER_MESSAGE[LOCK]


def test_honest_servers_are_never_stopped_end_to_end():
    """An unattended training job: honest processes, ordinary connections (one to
    Selenium Grid's port, a miner's too), the GPU at full with nobody there."""
    net = NetworkDenyList((NetworkEntry("pool-a", ("198.51.100.0/24",)),
                           NetworkEntry("miner-ports", ports=(3333, 4444, 5555))))
    conns = [Connection("151.101.0.223", 443, at=10.0, first_bytes=bytes.fromhex("160301")),
             Connection("192.0.2.60", 4444, at=20.0, first_bytes=b"POST /session HTTP/1.1\r\n"),
             Connection("10.213.0.1", 8081, at=30.0,
                        first_bytes=b'{"jsonrpc":"2.0","id":1,"method":"initialize"}')]
    gpu = unattended_full_gpu([GpuReading(t * 60.0, 98.0) for t in range(200)], 600.0, 0.0,
                              199 * 60.0)
    signals = [*match_processes(HONEST, DENY, 100.0), *match_connections(conns, net), gpu]
    decision = decide("ada", "", [s for s in signals if s is not None], 199 * 60.0,
                      prior_abuse_stops=3)
    assert decision.action == WARN and not decision.stops
    assert decision.kinds == (NETWORK_PORT, GPU_UNATTENDED)
