"""systemd mode: a server never keeps the hub's supplementary groups (gid 0 under sudo).

`systemd-run --scope --uid --gid` creates the scope as root, then calls only
setresgid and setresuid before it execs the server (systemd src/run/run.c,
start_transient_scope): no setgroups, and a scope has no
SupplementaryGroups= to set. CI has no systemd, so the command and the
preexec_fn are tested as the spawner builds them, with a stand-in for
systemd-run that drops privileges exactly as that code does.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from decimal import Decimal

import pytest

from gpulease.host.unix_accounts import UnixAccount
from gpulease.spawners.local.cgroups import Limits, systemd_command
from gpulease.spawners.local.isolation import Prepared, own_groups, preexec_for

# What systemd-run --scope does after the scope exists: setresgid, setresuid, exec.
FAKE_SYSTEMD_RUN = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
cut = args.index("--")
opts, cmd = args[:cut], args[cut + 1:]
uid = gid = None
for opt in opts:
    if opt.startswith("--uid="):
        uid = int(opt.split("=", 1)[1])
    if opt.startswith("--gid="):
        gid = int(opt.split("=", 1)[1])
if gid is not None:
    os.setresgid(gid, gid, gid)
if uid is not None:
    os.setresuid(uid, uid, uid)
os.execvp(cmd[0], cmd)
"""


def nobody() -> UnixAccount:
    entry = pwd.getpwnam("nobody")
    return UnixAccount("nobody", entry.pw_uid, entry.pw_gid, "nobody")


def limits() -> Limits:
    return Limits(256 * 2**20, Decimal(1), (), ())


def test_the_systemd_preexec_sets_the_users_own_groups():
    account = nobody()
    cmd = systemd_command("gpulease-x._.t.scope", limits(), account.uid, account.gid)
    assert f"--uid={account.uid}" in cmd and f"--gid={account.gid}" in cmd
    prepared = Prepared(account, None, "gpulease-x._.t.scope", tuple(cmd))
    assert preexec_for(prepared) is not None  # before: None, groups inherited
    assert 0 not in own_groups(account) and account.gid in own_groups(account)
    # without per-user accounts (a single-user hub) there is nothing to drop to
    assert preexec_for(Prepared(None, None, "u.scope", tuple(cmd))) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another account needs root")
def test_a_server_started_through_systemd_run_carries_no_gid_0(tmp_path):
    """The hub runs as root with gid 0 among its groups, as under sudo."""
    fake = tmp_path / "systemd-run"
    fake.write_text(FAKE_SYSTEMD_RUN)
    fake.chmod(0o700)
    account = nobody()
    os.chmod(tmp_path, 0o755)
    cmd = systemd_command("gpulease-x._.t.scope", limits(), account.uid, account.gid,
                          systemd_run=str(fake))
    prepared = Prepared(account, None, "gpulease-x._.t.scope", tuple(cmd))
    server_preexec = preexec_for(prepared)

    def as_under_sudo() -> None:
        os.setgroups([0, 4])  # what `sudo gpulease up` leaves the hub with (root, adm)
        if server_preexec is not None:
            server_preexec()

    out = subprocess.run([*cmd, "/bin/cat", "/proc/self/status"], preexec_fn=as_under_sudo,
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    status = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    groups = {int(g) for g in status["Groups"].split()}
    uids = {int(u) for u in status["Uid"].split()}
    gids = {int(g) for g in status["Gid"].split()}
    assert uids == {account.uid} and gids == {account.gid}
    assert 0 not in groups, f"the server keeps the hub's groups: {sorted(groups)}"
    assert groups <= set(own_groups(account))


FAKE_SYSTEMCTL = """#!/bin/sh
# `systemctl show --property=ControlGroup --value UNIT` and `systemctl stop UNIT`
echo "$@" >> "{log}"
case "$1" in
  show) echo "{path}" ;;
esac
"""


def test_a_scope_is_emptied_through_its_cgroup_then_stopped(tmp_path, monkeypatch):
    """systemd mode's stop: where systemd says the scope lives, cgroup.kill, then `stop`."""
    from gpulease.spawners.local.cgroup_kill import remove_dirs
    from gpulease.spawners.local.isolation import cleanup
    from tests.integration.host.test_cgroup_kill import _attack_and_stop_with, _make, _mounts

    _, v2 = _mounts()
    folder = _make(v2)
    if folder is None or not (folder / "cgroup.kill").exists():
        if folder is not None:
            remove_dirs([str(folder)])
        pytest.skip("no writable cgroup v2 with cgroup.kill here (needs root): a scope's "
                    "stop through its cgroup is not checked on this host")
    log = tmp_path / "systemctl.log"
    (tmp_path / "systemctl").write_text(FAKE_SYSTEMCTL.format(
        log=log, path="/" + folder.relative_to(v2).as_posix()))
    (tmp_path / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    try:
        emptied = _attack_and_stop_with(
            folder, lambda: cleanup({"kind": "systemd", "unit": "gpulease-x._.t.scope"}))
        assert emptied.empty and emptied.how == "cgroup.kill" and emptied.dirs == (str(folder),)
        calls = log.read_text().splitlines()
        assert calls[0].startswith("show --property=ControlGroup")
        assert calls[-1] == "stop gpulease-x._.t.scope"
    finally:
        remove_dirs([str(folder)])
