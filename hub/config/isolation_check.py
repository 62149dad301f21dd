"""At `gpulease up`: which isolation this host gives, said plainly, and checked before any spawn.

`decide` turns the hub's account, its options and the host's cgroup
mechanism into an `IsolationPlan`: the spawner's settings and the lines of
the start banner. `unreachable` lists what a per-user account could not
reach (the Python environment servers run with, the homes folder), so that
the hub refuses to start with the folder to fix instead of failing every
spawn later. (What the hub does first so that the defaults are reachable:
gpulease.hub.config.server_env and gpulease.host.state.default_state_root.)
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpulease.host.scripts import shebang_interpreter
from gpulease.host.unix_accounts import UnixAccountPolicy, blocking_dir
from gpulease.singleuser import SERVER_SCRIPT
from gpulease.spawners.local.cgroups import Mechanism


@dataclass(frozen=True)
class IsolationPlan:
    is_root: bool
    unix_accounts: bool
    policy: UnixAccountPolicy
    mechanism: Mechanism
    hub_account: str
    device_nodes: dict = field(default_factory=dict)

    @property
    def accounts_line(self) -> str:
        if self.unix_accounts:
            return (f"Users: each runs as their own Unix account ({self.policy.prefix}NAME, "
                    f"uid {self.policy.uid_min}-{self.policy.uid_max}); homes are 0700")
        why = ("GPULeaseHub.per_user_accounts is off" if self.is_root
               else "the hub does not run as root")
        return (f"Users: single-user or trusted-group setup ({why}): servers run as "
                f"{self.hub_account}, no isolation between users")

    def banner(self) -> list[str]:
        return [self.accounts_line, self.mechanism.describe()]

    def settings(self) -> dict:
        """HubSettings.isolation: the spawner's options, and what api/inventory shows."""
        return {
            "unix_accounts": self.unix_accounts,
            "unix_prefix": self.policy.prefix,
            "unix_uid_min": self.policy.uid_min,
            "unix_uid_max": self.policy.uid_max,
            "unix_hub_id": self.policy.hub_id,
            "adopt_unmarked_accounts": self.policy.adopt_unmarked,
            "resource_limits": self.mechanism.kind,
            "device_control": self.mechanism.devices,
            "device_nodes": dict(self.device_nodes),
            "accounts": self.accounts_line,
            "limits": self.mechanism.describe(),
        }


def decide(*, is_root: bool, per_user_accounts: bool, policy: UnixAccountPolicy,
           mechanism: Mechanism, hub_account: str, device_nodes: dict | None = None
           ) -> IsolationPlan:
    return IsolationPlan(is_root=is_root, unix_accounts=is_root and per_user_accounts,
                         policy=policy, mechanism=mechanism, hub_account=hub_account,
                         device_nodes=dict(device_nodes or {}))


def server_env_paths(local_envs: Iterable[str | None]) -> list[tuple[str, str, bool]]:
    """(what, resolved path, needs execute) a server's account must reach, per environment."""
    out: list[tuple[str, str, bool]] = []
    for env in sorted({e or "" for e in local_envs}):
        bindir = Path(env) / "bin" if env else Path(sys.executable).parent
        script = bindir / SERVER_SCRIPT
        label = f"the server environment {env or sys.prefix}"
        out.append((label, os.path.realpath(script), True))
        interpreter = shebang_interpreter(script)
        if interpreter:
            out.append((label + " (its Python)", os.path.realpath(interpreter), True))
        if not env:  # gpulease's own: the interpreter's library and gpulease's code
            out.append((label + " (the standard library)",
                        os.path.realpath(sysconfig.get_paths()["stdlib"]), False))
            import jupyterhub

            import gpulease.hub
            for mod in (jupyterhub, gpulease.hub):
                out.append((label + f" ({mod.__name__})",
                            os.path.realpath(Path(mod.__file__).parent), False))
    return out


def unreachable(paths: Iterable[tuple[str, str, bool]]) -> list[str]:
    """One line per path a per-user account cannot reach, naming the folder in the way."""
    problems = []
    for what, path, execute in paths:
        blocked = blocking_dir(path, execute=execute)
        if blocked is None:
            continue
        where, mode = blocked
        why = "does not exist" if mode == 0 else f"is mode {mode:o}"
        problems.append(f"{what}: {path} — {where} {why}, so no other account can reach it")
    return problems


def reachability_error(problems: list[str], state_root: str) -> str:
    return (
        "servers run as per-user Unix accounts (the hub runs as root), but these accounts "
        "cannot reach what a server needs:\n" + "\n".join(problems) + "\n"
        "Fix: put image environments (a catalog's local_env) and --GPULeaseHub.server_env, "
        "when set, where every account can read them (not under /root or another 0700 home; "
        "left empty, gpulease's own environment is copied into the state folder when out of "
        f"their reach); put the state folder ({state_root}) where every account can pass (its "
        "parents need o+x; left unset, as root it goes to /var/lib/gpulease when they cannot "
        "pass into the current folder); or, for a trusted group, run with "
        "--GPULeaseHub.per_user_accounts=False (servers then run as the hub's account, with "
        "no isolation between users)."
    )
