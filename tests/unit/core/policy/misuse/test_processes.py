"""Signal (a): processes against the admin's deny list of hashes and patterns."""

from __future__ import annotations

import pytest

from gpulease.core.policy.misuse.evidence import PROCESS_HASH, PROCESS_PATTERN
from gpulease.core.policy.misuse.processes import (
    ProcessDenyList,
    ProcessEntry,
    ProcessRecord,
    match_process,
    match_processes,
)
from tests.unit.core.policy.misuse.samples import DENY, HONEST, XMRIG_SHA, sha


def test_a_listed_binary_is_caught_under_any_name_and_path():
    renamed = ProcessRecord(4242, "/home/ada/.cache/torch/kernels/python3", XMRIG_SHA,
                            ("python3", "train.py", "--epochs", "100"))
    [signal] = match_process(renamed, DENY, at=1000.0)
    assert (signal.kind, signal.rule_id, signal.at, signal.source) == (
        PROCESS_HASH, "xmrig-6.21.0", 1000.0, "a")
    assert signal.detail_dict() == {
        "pid": "4242", "exe": "/home/ada/.cache/torch/kernels/python3",
        "cmdline": "python3 train.py --epochs 100", "sha256": XMRIG_SHA}


def test_a_hash_is_compared_in_either_case_and_an_unreadable_one_never_matches():
    upper = ProcessRecord(1, "/tmp/x", XMRIG_SHA.upper(), ("x",))
    assert [s.rule_id for s in match_process(upper, DENY, 0.0)] == ["xmrig-6.21.0"]
    assert match_process(ProcessRecord(1, None, None, ("x",)), DENY, 0.0) == []


def test_a_miner_under_its_own_name_matches_every_entry_it_meets_once_each():
    named = ProcessRecord(7, "/home/ada/xmrig", XMRIG_SHA,
                          ("./xmrig", "-o", "stratum+tcp://pool.example:3333", "-u", "WALLET",
                           "--donate-level", "1", "--cuda"))
    found = match_process(named, DENY, 5.0)
    assert [(s.kind, s.rule_id) for s in found] == [
        (PROCESS_HASH, "xmrig-6.21.0"), (PROCESS_PATTERN, "stratum-url"),
        (PROCESS_PATTERN, "miner-names"), (PROCESS_PATTERN, "donate-level"),
        (PROCESS_PATTERN, "miner-exe")]
    assert found[4].detail_dict()["matched_in"] == "exe"


def test_a_rebuilt_binary_is_caught_only_by_what_its_command_line_says():
    rebuilt = ProcessRecord(8, "/home/ada/bin/worker", sha("rebuilt"),
                            ("worker", "-o", "STRATUM+SSL://pool.example:443"))
    assert [s.rule_id for s in match_process(rebuilt, DENY, 0.0)] == ["stratum-url"]
    quiet = ProcessRecord(9, "/home/ada/bin/worker", sha("rebuilt"), ("worker", "-c", "c.json"))
    assert match_process(quiet, DENY, 0.0) == []


def test_honest_processes_never_match():
    assert match_processes(HONEST, DENY, 0.0) == []


def test_case_is_ignored_unless_an_entry_says_otherwise():
    record = ProcessRecord(1, "/x", None, ("XMRIG", "-c", "c.json"))
    assert [s.rule_id for s in match_process(record, DENY, 0.0)] == ["miner-names"]
    exact = ProcessDenyList((ProcessEntry("exact", pattern="xmrig", ignore_case=False),))
    assert match_process(record, exact, 0.0) == []


def test_a_command_line_is_searched_up_to_the_lists_bound():
    padded = ProcessRecord(1, "/x", None, ("worker", "a" * 100, "stratum+tcp://p:1"))
    short = ProcessDenyList(DENY.entries, max_cmdline_chars=50)
    assert match_process(padded, short, 0.0) == []
    assert [s.rule_id for s in match_process(padded, DENY, 0.0)] == ["stratum-url"]


def test_a_bad_pattern_is_a_value_error_naming_its_entry():
    with pytest.raises(ValueError, match=r"entry 'broken': pattern '\(xmrig' is not a regular "
                                         r"expression: missing \)"):
        ProcessEntry("broken", pattern="(xmrig")
    with pytest.raises(ValueError, match="entry 'empty': pattern must be a non-empty"):
        ProcessEntry("empty", pattern="")


def test_an_entry_is_a_hash_or_a_pattern_with_a_valid_id_and_target():
    with pytest.raises(ValueError, match="'short': sha256 must be 64 hexadecimal digits"):
        ProcessEntry("short", sha256="abc")
    with pytest.raises(ValueError, match="'both': give either sha256 or pattern"):
        ProcessEntry("both", sha256=XMRIG_SHA, pattern="x")
    with pytest.raises(ValueError, match="'neither': give either"):
        ProcessEntry("neither")
    with pytest.raises(ValueError, match="id 'Bad Id'"):
        ProcessEntry("Bad Id", pattern="x")
    with pytest.raises(ValueError, match="target 'argv' is not one of cmdline, exe"):
        ProcessEntry("t", pattern="x", target="argv")
    assert ProcessEntry("h", sha256=" " + XMRIG_SHA.upper() + "\n").sha256 == XMRIG_SHA


def test_ids_are_unique_in_a_list():
    with pytest.raises(ValueError, match="ids used more than once: a"):
        ProcessDenyList((ProcessEntry("a", pattern="x"), ProcessEntry("a", pattern="y")))


def test_a_list_from_plain_values_says_every_problem_at_once():
    with pytest.raises(ValueError) as caught:
        ProcessDenyList.from_spec([
            {"id": "ok", "pattern": "xmrig"},
            {"id": "bad-re", "pattern": "[a-"},
            {"id": "typo", "patern": "x"},
            "not a mapping",
            {"id": "bad-hash", "sha256": "zz"},
        ])
    said = str(caught.value)
    assert "'bad-re': pattern '[a-' is not a regular expression" in said
    assert "'typo': unknown keys patern" in said
    assert "entry #4: must be a mapping" in said
    assert "'bad-hash': sha256 must be 64" in said
    assert "'ok'" not in said
    made = ProcessDenyList.from_spec([{"id": "ok", "pattern": "xmrig", "description": "d"}])
    assert made.description_of("ok") == "d"


def test_a_signal_never_carries_the_entrys_pattern_hash_or_description():
    record = ProcessRecord(7, "/home/ada/w", XMRIG_SHA, ("w", "-o", "stratum+tcp://p:3333"))
    for signal in match_process(record, DENY, 0.0):
        shown = repr(signal)
        entry = next(e for e in DENY.entries if e.id == signal.rule_id)
        assert entry.description not in shown
        assert entry.pattern is None or entry.pattern not in shown
    # The hash shown is the process's own (which equals the entry's only when it matched).
    assert DENY.description_of("stratum-url") == "a pool URL on the command line"
