"""Per-user Unix accounts: names, uids, whether an account is ours, reachability (pure)."""

from __future__ import annotations

import os
import pwd
import stat
from types import SimpleNamespace

import pytest

from gpulease.host.scripts import shebang_interpreter
from gpulease.host.unix_accounts import (
    GECOS_MARK,
    UnixAccountError,
    UnixAccountPolicy,
    account_problem,
    blocking_dir,
    choose_uid,
    gecos,
    gecos_owner,
    unix_name,
)
from gpulease.hub.config.isolation_check import decide, unreachable
from gpulease.spawners.local.cgroups import Mechanism


def test_plain_names_get_the_prefix():
    assert unix_name("ada") == "gl-ada"
    assert unix_name("bob-2_x", "lab-") == "lab-bob-2_x"


def test_unsafe_or_long_names_are_cut_and_hashed_without_collisions():
    dotted, underscored = unix_name("a.b"), unix_name("a_b")
    assert dotted != underscored and dotted.startswith("gl-a_b-")
    long = unix_name("x" * 32)
    assert len(long) == 32 and long.startswith("gl-xxx")
    assert unix_name("x" * 32) == long  # stable
    assert unix_name("x" * 31 + "y") != long
    email = unix_name("Ada@Lab.org")
    assert all(c.isalnum() or c in "_-" for c in email) and email == email.lower()


def test_uid_is_stable_in_range_and_skips_taken_ids():
    uid = choose_uid("gl-ada", set(), 61000, 64999)
    assert 61000 <= uid <= 64999 and choose_uid("gl-ada", set(), 61000, 64999) == uid
    assert choose_uid("gl-ada", {uid}, 61000, 64999) != uid
    assert choose_uid("gl-ada", {5, 6}, 5, 7) == 7
    with pytest.raises(UnixAccountError, match="no free uid"):
        choose_uid("gl-ada", {5, 6, 7}, 5, 7)


def test_policy_refuses_bad_prefix_and_range():
    with pytest.raises(UnixAccountError, match="prefix"):
        UnixAccountPolicy(prefix="Bad!")
    with pytest.raises(UnixAccountError, match="range"):
        UnixAccountPolicy(uid_min=10, uid_max=5)


HUB = "0123456789abcdef"
OTHER_HUB = "fedcba9876543210"


def _entry(uid=61001, gid=61001, gecos=GECOS_MARK + "ada hub " + HUB, name="gl-ada"):
    return pwd.struct_passwd((name, "x", uid, gid, gecos, "/h", "/bin/bash"))


def test_only_accounts_made_by_gpulease_for_that_user_are_used():
    policy = UnixAccountPolicy(hub_id=HUB)
    assert account_problem(_entry(), "ada", policy) == ""
    assert "not made by gpulease" in account_problem(_entry(gecos="Ada L"), "ada", policy)
    assert "not made by gpulease" in account_problem(_entry(gecos=gecos("bob", HUB)), "ada",
                                                     policy)
    assert "outside" in account_problem(_entry(uid=1000), "ada", policy)
    assert "uid or gid 0" in account_problem(_entry(uid=0), "ada", policy)


def test_the_gecos_field_records_the_hub_user_and_the_hub():
    assert gecos("ada", HUB) == f"gpulease user ada hub {HUB}"
    assert gecos_owner(gecos("ada", HUB)) == ("ada", HUB)
    assert gecos_owner("gpulease user ada") == ("ada", "")  # made before hub ids
    assert gecos_owner("Ada Lovelace") is None


def test_an_account_another_hub_made_is_refused_naming_the_account_and_that_hub():
    problem = account_problem(_entry(gecos=gecos("ada", OTHER_HUB)), "ada",
                              UnixAccountPolicy(hub_id=HUB, adopt_unmarked=True))
    assert "gl-ada" in problem and OTHER_HUB in problem and "another gpulease hub" in problem
    assert "unix_account_prefix" in problem  # the way out


def test_an_account_with_no_hub_recorded_is_adopted_only_where_the_admin_says_so():
    unmarked = _entry(gecos=GECOS_MARK + "ada")
    problem = account_problem(unmarked, "ada", UnixAccountPolicy(hub_id=HUB))
    assert "gl-ada" in problem and "records no hub" in problem
    assert "GPULeaseHub.adopt_unmarked_accounts" in problem
    assert account_problem(unmarked, "ada", UnixAccountPolicy(hub_id=HUB, adopt_unmarked=True)) == ""


def _fake_host(monkeypatch, entry):
    from gpulease.host import unix_accounts as ua
    calls: list[list[str]] = []
    monkeypatch.setattr(ua, "_run", calls.append)
    monkeypatch.setattr(ua, "_lookup", lambda name: entry)
    monkeypatch.setattr(ua, "_expired", lambda name: True)
    return ua, calls


def test_an_adopted_account_records_this_hub_and_the_adoption_is_logged(monkeypatch, tmp_path,
                                                                         caplog):
    ua, calls = _fake_host(monkeypatch, _entry(gecos=GECOS_MARK + "ada"))
    policy = UnixAccountPolicy(hub_id=HUB, adopt_unmarked=True)
    with caplog.at_level("WARNING", logger=ua.__name__):
        account = ua.ensure_unix_account("ada", policy, tmp_path)
    assert account.uid == 61001
    assert calls == [["usermod", "--comment", f"gpulease user ada hub {HUB}", "gl-ada"]]
    assert "Adopted Unix account gl-ada" in caplog.text and HUB in caplog.text
    ua, calls = _fake_host(monkeypatch, _entry(gecos=GECOS_MARK + "ada"))
    with pytest.raises(UnixAccountError, match="records no hub"):
        ua.ensure_unix_account("ada", UnixAccountPolicy(hub_id=HUB), tmp_path)
    assert calls == []  # refused: nothing changed


def test_an_account_this_hub_makes_records_its_id(monkeypatch, tmp_path):
    ua, calls = _fake_host(monkeypatch, None)
    made: dict = {}

    def run(cmd):
        calls.append(cmd)
        if cmd[0] == "useradd":
            made["entry"] = _entry(gecos=cmd[cmd.index("--comment") + 1], uid=61000, gid=61000)
    monkeypatch.setattr(ua, "_run", run)
    monkeypatch.setattr(ua, "_lookup", lambda name: made.get("entry"))
    monkeypatch.setattr(ua, "_group_gid", lambda name: 61000)
    monkeypatch.setattr(ua, "_taken_ids", lambda: set())
    ua.ensure_unix_account("ada", UnixAccountPolicy(hub_id=HUB), tmp_path)
    useradd = next(c for c in calls if c[0] == "useradd")
    assert useradd[useradd.index("--comment") + 1] == f"gpulease user ada hub {HUB}"
    with pytest.raises(UnixAccountError, match=f"another gpulease hub, {HUB}"):
        ua.ensure_unix_account("ada", UnixAccountPolicy(hub_id=OTHER_HUB), tmp_path)


def test_the_hub_id_is_random_kept_in_private_and_checked(tmp_path):
    from gpulease.host.state import StateError, hub_id, prepare_state_dir
    state = prepare_state_dir(tmp_path / "s", homes=False)
    first = hub_id(state)
    assert len(first) == 16 and hub_id(state) == first
    assert (state.private / "hub_id").stat().st_mode & 0o077 == 0
    assert hub_id(prepare_state_dir(tmp_path / "t", homes=False)) != first
    (state.private / "hub_id").write_text("x hub y:z\n")
    with pytest.raises(StateError, match="not a hub id"):
        hub_id(state)


def test_a_hub_id_file_that_is_bytes_or_a_link_is_refused_naming_it(tmp_path):
    from gpulease.host.state import StateError, hub_id, prepare_state_dir
    state = prepare_state_dir(tmp_path / "s", homes=False)
    path = state.private / "hub_id"
    path.write_bytes(b"\xff\xfe\x00garbage")  # a disk's garbage: not UTF-8
    with pytest.raises(StateError, match=f"{path} holds .*not a hub id"):
        hub_id(state)
    path.unlink()
    elsewhere = tmp_path / "elsewhere"
    path.symlink_to(elsewhere)  # dangling: the id would be written through it
    with pytest.raises(StateError, match=f"{path} is a symbolic link"):
        hub_id(state)
    assert not elsewhere.exists()


def _modes(table):
    def stat_of(path):
        if path not in table:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_mode=table[path])
    return stat_of


def test_blocking_dir_names_the_first_folder_no_other_account_can_pass():
    d, f = stat.S_IFDIR, stat.S_IFREG
    table = {"/": d | 0o755, "/root": d | 0o700, "/root/env": d | 0o755,
             "/root/env/python": f | 0o755, "/opt": d | 0o755, "/opt/py": f | 0o750}
    assert blocking_dir("/root/env/python", _modes(table)) == ("/root", 0o700)
    assert blocking_dir("/opt/py", _modes(table), execute=True) == ("/opt/py", 0o750)
    assert blocking_dir("/opt", _modes(table)) is None
    assert blocking_dir("/opt/missing", _modes(table)) == ("/opt/missing", 0)


def test_unreachable_lines_name_path_and_mode(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    os.chmod(hidden, 0o700)
    (hidden / "x").write_text("")
    os.chmod(tmp_path, 0o755)
    problems = unreachable([("the thing", str(hidden / "x"), False)])
    if any(stat.S_IMODE(os.stat(p).st_mode) & 0o001 == 0 for p in map(str, tmp_path.parents)):
        assert problems  # an outer folder already blocks: still reported
    else:
        assert problems == [f"the thing: {hidden / 'x'} — {hidden} is mode 700, so no other "
                            "account can reach it"]


def test_shebang(tmp_path):
    script = tmp_path / "s"
    script.write_text("#!/opt/env/bin/python -E\nprint()\n")
    assert shebang_interpreter(script) == "/opt/env/bin/python"
    script.write_text("print()\n")
    assert shebang_interpreter(script) is None


def test_the_start_banner_says_what_holds():
    none = Mechanism("none", False, "the hub does not run as root")
    plan = decide(is_root=False, per_user_accounts=True, policy=UnixAccountPolicy(),
                  mechanism=none, hub_account="lab")
    assert not plan.unix_accounts
    assert "single-user or trusted-group setup" in plan.accounts_line
    assert "servers run as lab, no isolation between users" in plan.accounts_line
    assert "not enforced on this host" in plan.banner()[1]
    root = decide(is_root=True, per_user_accounts=True, policy=UnixAccountPolicy(),
                  mechanism=Mechanism("cgroup1", True, "v1"), hub_account="root")
    assert root.unix_accounts and "own Unix account" in root.accounts_line
    settings = root.settings()
    assert settings["resource_limits"] == "cgroup1" and settings["device_control"] is True
    off = decide(is_root=True, per_user_accounts=False, policy=UnixAccountPolicy(),
                 mechanism=none, hub_account="root")
    assert "per_user_accounts is off" in off.accounts_line


def test_server_runs_under_its_unix_name_without_allow_root():
    from pathlib import Path

    from gpulease.spawners.local.process_spec import build_process_spec

    spec = build_process_spec(user="ada", home=Path("/s/homes/ada"), device_uuids=(),
                              local_env=None, run_as_uid=61234, profile_slug="cpu",
                              image_name="pytorch", unix_user="gl-ada")
    assert spec.env["USER"] == spec.env["LOGNAME"] == "gl-ada"
    assert spec.env["HOME"] == "/s/homes/ada" and "--allow-root" not in spec.cmd


def test_a_locked_passwd_file_is_waited_out_not_failed_at_once(monkeypatch, tmp_path):
    """Servers started at once make accounts at once; useradd fails at once on the lock."""
    from gpulease.host import unix_accounts as ua
    made: dict[str, object] = {}
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> None:
        calls.append(cmd)
        if cmd[0] == "useradd" and len([c for c in calls if c[0] == "useradd"]) < 3:
            raise ua.UnixAccountError("useradd: cannot lock /etc/passwd; try again later.")
        if cmd[0] == "useradd":
            made["entry"] = pwd.struct_passwd((cmd[-1], "x", 61000, 61000,
                                               cmd[cmd.index("--comment") + 1], str(tmp_path),
                                               "/bin/sh"))
    monkeypatch.setattr(ua, "_run", run)
    monkeypatch.setattr(ua, "_lookup", lambda name: made.get("entry"))
    monkeypatch.setattr(ua, "_group_gid", lambda name: 61000)
    monkeypatch.setattr(ua, "_taken_ids", lambda: set())
    monkeypatch.setattr(ua, "_expired", lambda name: True)
    slept: list[float] = []
    account = ua.ensure_unix_account("alice", ua.UnixAccountPolicy(hub_id=HUB), tmp_path,
                                     sleep=slept.append)
    assert account.uid == 61000
    assert slept == [0.05, 0.1]  # two waits, then the third useradd got the lock
