"""What keeps one local server away from the others: its account, its limits, its devices.

LocalGPUSpawner calls `prepare` before a server starts (the Unix account,
the home handed to it, the cgroup with the profile's CPU, memory and device
nodes), passes `preexec_for` to Popen (join the cgroup, then drop to the
user's uid and own groups, between fork and exec) and `cleanup` when the
server stops: it ends everything in the cgroup and says whether it is empty
(a server's devices are released only then: gpulease.spawners.local.quarantine).
`hub_secrets` lists the values that must never reach a server's
environment (gpulease.spawners.local.process_spec.filter_server_env drops them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cache
from pathlib import Path

from jupyterhub.spawner import set_user_setuid

from gpulease.host.state import StateDir
from gpulease.host.unix_accounts import (
    UnixAccount,
    UnixAccountPolicy,
    ensure_unix_account,
    own_home,
)
from gpulease.singleuser.sandbox import enter as enter_sandbox
from gpulease.spawners.local.cgroup_kill import Emptied, cgroup_pids, empty_cgroup
from gpulease.spawners.local.cgroups import (
    CgroupError,
    CgroupPlan,
    HostReader,
    Limits,
    apply_plan,
    join_plan,
    plan_v1,
    plan_v2,
    remove_plan,
    systemd_command,
    unit_name,
)
from gpulease.spawners.local.device_holders import end_holders, exclusive_nodes
from gpulease.spawners.local.devices import (
    allowed_nodes,
    node_id,
    node_paths,
    nvml_device_map,
    rules_for,
)

log = logging.getLogger(__name__)

# Environment variables of the hub that hold secrets (never a server's business).
SECRET_ENV = ("CONFIGPROXY_AUTH_TOKEN", "JPY_COOKIE_SECRET", "JUPYTERHUB_CRYPT_KEY",
              "GPULEASE_ADMIN_PASSWORD", "GPULEASE_SMTP_PASSWORD", "GPULEASE_TOKEN",
              "GPULEASE_DB_URL", "JUPYTERHUB_COOKIE_SECRET")


@dataclass(frozen=True)
class IsolationSettings:
    unix_accounts: bool
    policy: UnixAccountPolicy
    limits: str  # "systemd" | "cgroup2" | "cgroup1" | "none"
    devices: bool
    device_nodes: Mapping[str, Sequence[str]]
    state_root: str
    nvml: bool  # the inventory comes from NVML: map devices to nodes through it


@dataclass(frozen=True)
class Prepared:
    account: UnixAccount | None
    plan: CgroupPlan | None  # the cgroup folders (cgroup1/cgroup2), to join and remove
    unit: str  # the systemd scope's name ("" without systemd)
    cmd_prefix: tuple[str, ...]  # systemd-run ... -- (empty otherwise)
    # The GPU nodes only this server's devices have, and its uid: whoever holds
    # them open outside the cgroup at the stop is ended too (device_holders).
    holding: dict = field(default_factory=dict)

    def state(self) -> dict:
        if self.plan is None and not self.unit:
            return {}
        return {"kind": self.plan.kind if self.plan else "systemd", "unit": self.unit,
                "dirs": list(self.plan.dirs) if self.plan else [], **self.holding}


def hub_tag(state_root: str) -> str:
    """Tells apart the cgroups of two hubs (two state folders) on one host."""
    return hashlib.sha256(state_root.encode()).hexdigest()[:8]


@cache
def _nvml_map() -> dict[str, list[str]]:
    return nvml_device_map()


def device_map(s: IsolationSettings) -> dict[str, list[str]]:
    """UUID → nodes: NVML's on a real host, the configured map over it."""
    base = dict(_nvml_map()) if s.nvml else {}
    base.update({k: list(v) for k, v in s.device_nodes.items()})
    return base


def prepare(s: IsolationSettings, hub_user: str, server: str, home: Path, cpu: Decimal,
            memory_bytes: int, device_uuids: Sequence[str]) -> Prepared:
    """Account, home and limits of one server, before it starts (blocking: run in a thread)."""
    account = None
    if s.unix_accounts:
        account = ensure_unix_account(hub_user, s.policy, home)
        own_home(home, account)
    if s.limits == "none":
        return Prepared(account, None, "", ())
    paths: tuple[str, ...] = ()
    if s.devices:
        paths, unknown = node_paths(tuple(device_uuids), device_map(s))
        if unknown:
            log.warning("no device nodes known for %s: the server %s/%s can open none of them "
                        "(LocalGPUSpawner.device_nodes maps declared devices)",
                        ", ".join(unknown), hub_user, server)
    rules = rules_for(allowed_nodes(paths)) if s.devices else ()
    holding = _holding(s, paths, device_uuids, account)
    limits = Limits(memory_bytes, cpu, rules, paths)
    unit = unit_name(account.name if account else hub_user, server, hub_tag(s.state_root))
    if s.limits == "systemd":
        scope = f"gpulease-{unit}.scope"
        prefix = systemd_command(scope, limits, account.uid if account else None,
                                 account.gid if account else None)
        return Prepared(account, None, scope, tuple(prefix), holding)
    facts = HostReader().facts()
    if s.limits == "cgroup2":
        plan = plan_v2(facts.v2 or "/sys/fs/cgroup", unit, limits)
    else:
        plan = plan_v1(facts.v1, unit, limits, s.devices,
                       freezer=facts.v1.get("freezer") in facts.writable)
    # A stale cgroup of this very server (a killed hub, a stop that could not
    # empty it): what is left in it must not join the new run and its devices.
    stale = remove_plan(plan, wait_s=2.0)
    if not stale.empty:
        raise CgroupError(
            f"the processes of this server's last run cannot be ended ({stale.describe()}); "
            "it can start again once they are gone (an admin sees them in `gpulease inventory`)")
    apply_plan(plan)
    return Prepared(account, plan, "", (), holding)


def _holding(s: IsolationSettings, paths: Sequence[str], uuids: Sequence[str],
             account: UnixAccount | None) -> dict:
    """What `cleanup` looks for outside the cgroup: this server's own GPU nodes, by id."""
    if not paths:
        return {}
    ids = [list(i) for i in map(node_id, exclusive_nodes(paths, device_map(s), uuids)) if i]
    if not ids:
        return {}
    return {"uid": account.uid if account else None, "device_nodes": ids}


def preexec_for(prepared: Prepared, sandbox: dict | None = None) -> Callable[[], None] | None:
    """Between fork and exec: join the cgroup (as root), enter the sandbox
    (gpulease.singleuser.sandbox), then become the user."""
    dirs = prepared.plan.dirs if prepared.plan else ()
    # With systemd, systemd-run creates the scope as root and drops privileges itself.
    become = (set_user_setuid(prepared.account.name, chdir=False)
              if prepared.account and not prepared.cmd_prefix else None)
    groups = (own_groups(prepared.account)
              if prepared.account and prepared.cmd_prefix else None)
    if not dirs and become is None and groups is None and sandbox is None:
        return None

    def preexec() -> None:
        if dirs:
            join_plan(dirs)
        if sandbox is not None:
            enter_sandbox(sandbox)
        if groups is not None:
            # systemd-run --scope never calls setgroups: without this the
            # server would keep the hub's supplementary groups (gid 0 under
            # sudo). Still root here, so systemd-run can make its scope; an
            # error aborts the start (Popen raises) rather than run with them.
            os.setgroups(groups)
        if become is not None:
            become()

    return preexec


def own_groups(account: UnixAccount) -> list[int]:
    """The account's own groups (as initgroups would give it), never gid 0."""
    return [g for g in os.getgrouplist(account.name, account.gid) if g != 0]


def cleanup(state: dict, wait_s: float = 5.0) -> Emptied | None:
    """End everything in a stopped server's cgroup, then remove it (or stop its scope).

    Returns what it came to (None: the server had no cgroup); `.empty` says
    whether its devices may go to someone else.
    """
    if not state:
        return None
    if state.get("kind") == "systemd":
        emptied = _cleanup_scope(state, wait_s)
    else:
        emptied = remove_plan(CgroupPlan(state["kind"], state.get("unit", ""),
                                         tuple(state.get("dirs", ())), ()), wait_s)
    emptied = _end_holders(state, emptied)
    if emptied.killed:
        log.info("cgroup of %s: %s", state.get("unit"), emptied.describe())
    return emptied


def end_everything(state: dict) -> Emptied | None:
    """`cleanup` that never raises: an error leaves what is in the cgroup to decide.

    A stop must end with an answer to "may its devices go?": when ending the
    cgroup fails (a folder gone odd, systemctl failing), what is still in it
    says; a scope whose folder is unknown counts as not empty.
    """
    try:
        return cleanup(state)
    except (OSError, subprocess.SubprocessError) as e:
        log.error("cannot end the processes of cgroup %s: %s", state.get("unit"), e)
        dirs = tuple(state.get("dirs", ()))
        left = tuple(sorted(cgroup_pids(dirs))) if dirs else (-1,)
        return Emptied(state.get("kind", ""), state.get("unit", ""), dirs, f"an error ({e})",
                       0, left, found=len(left))


def _end_holders(state: dict, emptied: Emptied) -> Emptied:
    """Descriptors on the server's GPU nodes passed out of its cgroup die with it."""
    holding = {k: state[k] for k in ("uid", "device_nodes") if k in state}
    if not holding.get("device_nodes"):
        return emptied
    killed, left = end_holders(holding["device_nodes"], holding.get("uid"))
    if killed or left:
        log.warning("%s: %d process(es) outside the cgroup held its GPU nodes open (%d "
                    "kill(s)); still holding: %s", state.get("unit"), killed + len(left),
                    killed, ", ".join(map(str, left)) or "none")
    how = emptied.how + (f", and {killed} holder(s) of its GPU nodes outside it"
                         if killed or left else "")
    return replace(emptied, how=how, killed=emptied.killed + killed,
                   left=tuple(sorted({*emptied.left, *left})), holding=holding,
                   found=emptied.found + killed + len(left))


def _cleanup_scope(state: dict, wait_s: float) -> Emptied:
    """A systemd scope: kill through its cgroup (as for the others), then stop the unit."""
    unit = state["unit"]
    dirs = tuple(state.get("dirs") or scope_dirs(unit))
    emptied = empty_cgroup("systemd", unit, dirs, wait_s) if dirs else None
    subprocess.run(["systemctl", "stop", unit], capture_output=True, timeout=30)
    if emptied is None:  # systemd would not say where the scope lives: its stop must do
        return Emptied("systemd", unit, (), "systemctl stop", 0, ())
    left = tuple(sorted(cgroup_pids(dirs)))
    return Emptied("systemd", unit, dirs, emptied.how, emptied.killed, left,
                   found=emptied.found)


def scope_dirs(unit: str) -> tuple[str, ...]:
    """Where a running scope's cgroup is (cgroup v2, else v1's name=systemd hierarchy)."""
    try:
        done = subprocess.run(["systemctl", "show", "--property=ControlGroup", "--value", unit],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    path = done.stdout.strip()
    if done.returncode != 0 or not path.startswith("/"):
        return ()
    facts = HostReader().facts()
    root = facts.v2 or facts.v1.get("name=systemd")
    return (f"{root}{path}",) if root else ()


def hub_secrets(state: StateDir) -> set[str]:
    """Values a server must never see: the hub's secret files and secret environment."""
    values = {os.environ[k] for k in SECRET_ENV if os.environ.get(k)}
    for path in (state.cookie_secret_file, state.private / "proxy_token",
                 state.private / "cli_token"):
        try:
            text = path.read_bytes()
        except OSError:
            continue
        values.add(text.decode(errors="replace").strip())
        values.add(text.hex())  # JupyterHub reads a cookie secret file as hex or raw bytes
    return {v for v in values if len(v) >= 8}
