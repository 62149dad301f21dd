"""What keeps one local server away from the others: its account, its limits, its devices.

LocalGPUSpawner calls `prepare` before a server starts (the Unix account,
the home handed to it, the cgroup with the profile's CPU, memory and device
nodes), passes `preexec_for` to Popen (join the cgroup, then drop to the
user's uid, between fork and exec) and `cleanup` when the server stops.
`hub_secrets` lists the values that must never reach a server's
environment (gpulease.spawners.process_spec.filter_server_env drops them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path

from jupyterhub.spawner import set_user_setuid

from gpulease.hub.state import StateDir
from gpulease.hub.unix_accounts import (
    UnixAccount,
    UnixAccountPolicy,
    ensure_unix_account,
    own_home,
)
from gpulease.spawners.cgroups import (
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
from gpulease.spawners.devices import allowed_nodes, node_paths, nvml_device_map, rules_for

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

    def state(self) -> dict:
        if self.plan is None and not self.unit:
            return {}
        return {"kind": self.plan.kind if self.plan else "systemd", "unit": self.unit,
                "dirs": list(self.plan.dirs) if self.plan else []}


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
    limits = Limits(memory_bytes, cpu, rules, paths)
    unit = unit_name(account.name if account else hub_user, server, hub_tag(s.state_root))
    if s.limits == "systemd":
        prefix = systemd_command(f"gpulease-{unit}", limits, account.uid if account else None,
                                 account.gid if account else None)
        return Prepared(account, None, f"gpulease-{unit}.scope", tuple(prefix))
    facts = HostReader().facts()
    if s.limits == "cgroup2":
        plan = plan_v2(facts.v2 or "/sys/fs/cgroup", unit, limits)
    else:
        plan = plan_v1(facts.v1, unit, limits, s.devices)
    remove_plan(plan, wait_s=1.0)  # a stale cgroup of this server from a killed hub
    apply_plan(plan)
    return Prepared(account, plan, "", ())


def preexec_for(prepared: Prepared) -> Callable[[], None] | None:
    """Between fork and exec: join the cgroup (as root), then become the user."""
    dirs = prepared.plan.dirs if prepared.plan else ()
    # With systemd, systemd-run creates the scope as root and drops privileges itself.
    become = (set_user_setuid(prepared.account.name, chdir=False)
              if prepared.account and not prepared.cmd_prefix else None)
    if not dirs and become is None:
        return None

    def preexec() -> None:
        if dirs:
            join_plan(dirs)
        if become is not None:
            become()

    return preexec


def cleanup(state: dict) -> None:
    """Remove a stopped server's cgroup (killing anything left in it) or stop its scope."""
    if not state:
        return
    if state.get("kind") == "systemd":
        subprocess.run(["systemctl", "stop", state["unit"]], capture_output=True, timeout=30)
        return
    killed = remove_plan(CgroupPlan(state["kind"], state.get("unit", ""),
                                    tuple(state.get("dirs", ())), ()))
    if killed:
        log.info("killed %d processes left in the cgroup of %s", len(killed), state.get("unit"))


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
