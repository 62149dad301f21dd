"""CPU, memory and device limits of local servers, through cgroups.

A profile's `cpu` and `memory` are enforced by the kernel where the host
lets the hub: through a systemd transient scope when systemd is the init
system (systemd owns the cgroup tree there), else directly in a writable
cgroup hierarchy — v2 (memory and cpu controllers), or v1's separate `cpu`
and `memory` hierarchies (plus `devices` for device control). Elsewhere the
hub says at start that limits are not enforced on this host.

Pure parts: reading the host's description (`parse_mounts`), choosing the
mechanism (`choose_mechanism`), what to write where for one server
(`plan_v1`, `plan_v2`) and the systemd-run command (`systemd_command`). The
adapter (`HostReader`, `apply_plan`, `join_plan`, `remove_plan`) does the
file writes; `join_plan` runs in the server's process between fork and exec,
as root, before the process drops to the user's uid, so every child of the
server is born inside the limits. `remove_plan` ends everything in a
stopped server's cgroups (cgroup.kill, the v1 freezer, or kill rounds:
gpulease.spawners.local.cgroup_kill) before it removes them.

Names (`unit_name`) are unambiguous across every pair of user and server
names: one tenant's start or stop never touches another's cgroup or unit.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from gpulease.spawners.local.cgroup_kill import Emptied, empty_cgroup, remove_dirs
from gpulease.spawners.local.devices import DeviceRule

PARENT = "gpulease"  # our folder at the top of each hierarchy
CPU_PERIOD_US = 100_000
MECHANISMS = ("auto", "systemd", "cgroup2", "cgroup1", "none")
UNIT_MAX = 120  # "gpulease-" + name + ".scope" stays far below systemd's 255
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class HostFacts:
    """What decides the mechanism; read by HostReader, written by hand in tests."""

    is_root: bool
    pid1: str = ""  # /proc/1/comm
    systemd_run: str | None = None  # path of systemd-run, if installed
    v1: dict[str, str] = field(default_factory=dict)  # controller -> mount point
    v2: str | None = None  # mount point of the cgroup2 hierarchy
    v2_controllers: frozenset[str] = frozenset()  # what the v2 root can hand down
    writable: frozenset[str] = frozenset()  # mount points where the hub could make its folder


@dataclass(frozen=True)
class Mechanism:
    kind: str  # "systemd" | "cgroup2" | "cgroup1" | "none"
    devices: bool  # whether device nodes are restricted too
    detail: str  # where, or why not

    @property
    def limits(self) -> bool:
        return self.kind != "none"

    def describe(self) -> str:
        """One line for the start banner, the log and `gpulease inventory`."""
        if not self.limits:
            return f"CPU/memory limits: not enforced on this host ({self.detail})"
        devices = ("GPU device nodes restricted per server" if self.devices else
                   "GPU device nodes NOT restricted (no cgroup device control here; "
                   "CUDA_VISIBLE_DEVICES alone is no isolation)")
        return f"CPU/memory limits: enforced by {self.kind} ({self.detail}); {devices}"


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu: Decimal  # cores
    devices: tuple[DeviceRule, ...] = ()  # allowed device nodes; empty: no device control
    device_paths: tuple[str, ...] = ()  # the same by path (systemd's DeviceAllow)


@dataclass(frozen=True)
class Write:
    path: str
    value: str
    optional: bool = False  # skipped when the file does not exist (memsw without swap accounting)


@dataclass(frozen=True)
class CgroupPlan:
    """One server's cgroup(s): folders to make and join, values to write, in order."""

    kind: str
    unit: str
    dirs: tuple[str, ...]
    writes: tuple[Write, ...]


def parse_mounts(text: str) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> mount point, v2 mount point) from /proc/self/mounts."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        _, point, fstype, options = parts[:4]
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup":
            for opt in options.split(","):
                # freezer: stopping a server ends what keeps forking (cgroup_kill);
                # name=systemd: where systemd tracks its scopes without cgroup v2.
                if opt in ("cpu", "cpuacct", "memory", "devices", "pids", "cpuset", "freezer",
                           "name=systemd"):
                    v1.setdefault(opt, point)
    return v1, v2


def choose_mechanism(facts: HostFacts, wanted: str = "auto") -> Mechanism:
    """The first usable of systemd, cgroup v2, cgroup v1; `wanted` narrows it (or 'none')."""
    if wanted not in MECHANISMS:
        raise ValueError(f"resource_limits must be one of {', '.join(MECHANISMS)}, not {wanted!r}")
    if wanted == "none":
        return Mechanism("none", False, "turned off by GPULeaseHub.resource_limits")
    if not facts.is_root:
        return Mechanism("none", False, "the hub does not run as root")
    reasons = []
    if wanted in ("auto", "systemd"):
        if facts.pid1 == "systemd" and facts.systemd_run:
            return Mechanism("systemd", True, "a transient scope per server, DevicePolicy=closed")
        reasons.append(f"PID 1 is {facts.pid1 or 'unknown'}, not systemd"
                       if facts.pid1 != "systemd" else "systemd-run is not installed")
    if wanted in ("auto", "cgroup2"):
        if facts.v2 and {"memory", "cpu"} <= facts.v2_controllers and facts.v2 in facts.writable:
            # Device control on v2 is a BPF program; gpulease only gets one through systemd.
            return Mechanism("cgroup2", False, f"{facts.v2}/{PARENT}")
        if facts.v2:
            reasons.append(f"cgroup v2 at {facts.v2} has no writable memory and cpu controllers")
    if wanted in ("auto", "cgroup1"):
        mem, cpu = facts.v1.get("memory"), facts.v1.get("cpu")
        if mem and cpu and mem in facts.writable and cpu in facts.writable:
            dev = facts.v1.get("devices")
            devices = bool(dev and dev in facts.writable)
            frz = facts.v1.get("freezer")
            names = ["memory", "cpu", *(["devices"] if devices else []),
                     *(["freezer"] if frz and frz in facts.writable else [])]
            return Mechanism("cgroup1", devices, "v1 controllers " + ", ".join(names)
                             + f" under {os.path.dirname(mem)}/*/{PARENT}")
        reasons.append("no writable cgroup v1 memory and cpu hierarchies")
    return Mechanism("none", False, "; ".join(reasons) or f"{wanted} is not available")


def _escape(text: str) -> str:
    """[a-z0-9-] as is, every other UTF-8 byte as `_xx`: one text, one result, no '.'."""
    return "".join(c if c in _PLAIN else "".join(f"_{b:02x}" for b in c.encode())
                   for c in text)


def unit_name(unix_user: str, server: str, tag: str) -> str:
    """A cgroup/unit name for one server; `tag` tells hubs on one host apart.

    `USER.SERVER.TAG`, each part escaped (`_escape`): '.' appears in no
    escaped part, so the parts are read back unambiguously and two servers
    never share a name (user `ab` with server `c-default` and user `ab-c`'s
    default server differ). The default server is `_`, which no escaped name
    is (an escape is always `_` and two hex digits). Valid as a systemd unit
    name and as a cgroup folder name; a name longer than UNIT_MAX keeps the
    user's part and a 128-bit hash of the whole (one '.', so never equal to
    an unhashed name).
    """
    full = f"{_escape(unix_user)}.{_escape(server) if server else '_'}.{_escape(tag)}"
    if len(full) <= UNIT_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:32]
    return f"{_escape(unix_user)[:UNIT_MAX - len(digest) - 1]}.{digest}"


def cpu_quota_us(cpu: Decimal, period: int = CPU_PERIOD_US) -> int:
    return max(1000, math.ceil(cpu * period))


def plan_v1(v1: dict[str, str], unit: str, limits: Limits, devices: bool,
            freezer: bool = False) -> CgroupPlan:
    """`freezer`: also a folder in v1's freezer hierarchy, so a stop can freeze, then kill."""
    mem = f"{v1['memory']}/{PARENT}/{unit}"
    cpu = f"{v1['cpu']}/{PARENT}/{unit}"
    dirs = [mem] + ([cpu] if cpu != mem else [])
    writes = [
        Write(f"{mem}/memory.limit_in_bytes", str(limits.memory_bytes)),
        # memory + swap at the same bound: swap is no way around the limit
        Write(f"{mem}/memory.memsw.limit_in_bytes", str(limits.memory_bytes), optional=True),
        Write(f"{mem}/memory.swappiness", "0", optional=True),
        Write(f"{cpu}/cpu.cfs_period_us", str(CPU_PERIOD_US)),
        Write(f"{cpu}/cpu.cfs_quota_us", str(cpu_quota_us(limits.cpu))),
    ]
    if devices and "devices" in v1:
        dev = f"{v1['devices']}/{PARENT}/{unit}"
        if dev not in dirs:
            dirs.append(dev)
        writes.append(Write(f"{dev}/devices.deny", "a"))
        writes += [Write(f"{dev}/devices.allow", rule.v1()) for rule in limits.devices]
    if freezer and "freezer" in v1:
        frz = f"{v1['freezer']}/{PARENT}/{unit}"
        if frz not in dirs:
            dirs.append(frz)
    return CgroupPlan("cgroup1", unit, tuple(dirs), tuple(writes))


def plan_v2(root: str, unit: str, limits: Limits) -> CgroupPlan:
    folder = f"{root}/{PARENT}/{unit}"
    writes = (
        Write(f"{root}/cgroup.subtree_control", "+memory +cpu"),
        Write(f"{root}/{PARENT}/cgroup.subtree_control", "+memory +cpu"),
        Write(f"{folder}/memory.max", str(limits.memory_bytes)),
        Write(f"{folder}/memory.swap.max", "0", optional=True),
        Write(f"{folder}/cpu.max", f"{cpu_quota_us(limits.cpu)} {CPU_PERIOD_US}"),
    )
    return CgroupPlan("cgroup2", unit, (folder,), writes)


def systemd_command(unit: str, limits: Limits, uid: int | None, gid: int | None,
                    systemd_run: str = "systemd-run") -> list[str]:
    """The prefix that runs a server in its own transient scope, as the user.

    systemd-run itself drops to `uid`/`gid` after creating the scope, so the
    server's preexec_fn must not (systemd-run needs root to create it). In
    --scope mode systemd-run only calls setresgid/setresuid: it never calls
    setgroups, and a scope has no SupplementaryGroups= to set. So the
    supplementary groups of the hub (gid 0 under sudo) would pass to the
    server: isolation.preexec_for sets the user's own groups before
    systemd-run runs (root keeps its uid, so it may still make the scope).
    """
    cmd = [systemd_run, "--scope", "--quiet", "--collect", f"--unit={unit}",
           "-p", f"MemoryMax={limits.memory_bytes}", "-p", "MemorySwapMax=0",
           "-p", f"CPUQuota={math.ceil(limits.cpu * 100)}%",
           "-p", "DevicePolicy=closed"]
    for path in limits.device_paths:
        cmd += ["-p", f"DeviceAllow={path} rw"]
    if uid is not None:
        cmd += [f"--uid={uid}", f"--gid={gid}"]
    return [*cmd, "--"]


# --- adapters ----------------------------------------------------------------------


class HostReader:
    """Reads HostFacts from /proc and /sys (making the hub's own cgroup folder on the way)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc

    def facts(self) -> HostFacts:
        is_root = os.geteuid() == 0
        try:
            pid1 = Path(self.proc, "1", "comm").read_text().strip()
        except OSError:
            pid1 = ""
        try:
            v1, v2 = parse_mounts(Path(self.proc, "self", "mounts").read_text())
        except OSError:
            v1, v2 = {}, None
        controllers: frozenset[str] = frozenset()
        if v2:
            try:
                controllers = frozenset(Path(v2, "cgroup.controllers").read_text().split())
            except OSError:
                pass
        writable = set()
        if is_root:
            wanted = {v1.get(c) for c in ("memory", "cpu", "devices", "freezer")}
            if v2 and {"memory", "cpu"} <= controllers:
                wanted.add(v2)
            for point in sorted(p for p in wanted if p):
                if _make_parent(point):
                    writable.add(point)
        return HostFacts(is_root=is_root, pid1=pid1, systemd_run=shutil.which("systemd-run"),
                         v1=v1, v2=v2, v2_controllers=controllers, writable=frozenset(writable))


def _make_parent(point: str) -> bool:
    try:
        os.makedirs(f"{point}/{PARENT}", exist_ok=True)
        return True
    except OSError:
        return False


class CgroupError(RuntimeError):
    pass


def apply_plan(plan: CgroupPlan) -> None:
    """Create the server's cgroup folders and write its limits (before the server starts)."""
    for folder in plan.dirs:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise CgroupError(f"cannot create cgroup {folder}: {e}") from None
    for w in plan.writes:
        if w.optional and not os.path.exists(w.path):
            continue
        try:
            with open(w.path, "w") as f:
                f.write(w.value)
        except OSError as e:
            if w.optional:
                continue
            raise CgroupError(f"cannot write {w.value!r} to {w.path}: {e}") from None


def join_plan(dirs: tuple[str, ...]) -> None:
    """Move the calling process into the cgroups (between fork and exec, still root)."""
    pid = str(os.getpid())
    for folder in dirs:
        with open(f"{folder}/cgroup.procs", "w") as f:
            f.write(pid)


def remove_plan(plan: CgroupPlan, wait_s: float = 5.0) -> Emptied:
    """End everything in the server's cgroups (cgroup_kill), then remove them if empty."""
    emptied = empty_cgroup(plan.kind, plan.unit, plan.dirs, wait_s)
    if emptied.empty:
        remove_dirs(plan.dirs)
    return emptied
