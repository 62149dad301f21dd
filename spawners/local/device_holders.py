"""Descriptors and mappings of a stopped server's GPU nodes held outside its cgroup.

The devices cgroup checks a device node when it is *opened*, never when an
open descriptor is used. A server that holds a GPU node open can pass the
descriptor (SCM_RIGHTS over a Unix socket in the shared home) to a process
of another of the same researcher's servers, a CPU-only one, or of a second
account they control; with the driver's control nodes passed too, and an
LD_PRELOAD that answers libcuda's open() with them, CUDA runs there. Ending
the GPU server's cgroup does not touch that process: it goes on using the
GPU after the server is stopped, unbilled, while the device is handed to
the next tenant.

So before a device goes back, everything that holds one of its *own*
nodes (the full GPU's `/dev/nvidiaN`, a MIG device's capability nodes; not
a node it shares with other devices, such as a MIG device's parent GPU) is
found by reading every process's `/proc/PID/fd` and `/proc/PID/map_files` (a
process that maps a node and closes its descriptor keeps the device through the
mapping: the driver's memory and doorbells stay reachable), for each of its threads
(`/proc/TID/`: a thread can keep a descriptor table of its own, or run on after the
main thread has ended, which empties /proc/PID's) and the files registered with each
io_uring it holds (its fdinfo), and those that belong to a
tenant (the stopped server's own account, or any process inside a gpulease
server's cgroup) are SIGKILLed. The driver's own daemons and the hub (root,
or outside every gpulease cgroup) are left alone. A holder that cannot be
ended keeps the device out of service like a cgroup that cannot be emptied
(gpulease.spawners.local.quarantine).
"""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

NodeId = tuple[str, int, int]  # ("c" | "b", major, minor)


def exclusive_nodes(mine: Sequence[str], device_map: Mapping[str, Sequence[str]],
                    my_uuids: Iterable[str]) -> tuple[str, ...]:
    """The nodes of `mine` that no other device of the map has (a MIG parent GPU is shared)."""
    own = set(my_uuids)
    shared = {p for uuid, nodes in device_map.items() if uuid not in own for p in nodes}
    return tuple(p for p in mine if p not in shared)


def is_tenant(uid: int, cgroup_text: str, leaving_uid: int | None) -> bool:
    """Whether a holder is tenant code that may be killed (never root, never a system daemon)."""
    if uid == 0:
        return False
    if leaving_uid is not None and uid == leaving_uid:
        return True
    # Inside any gpulease server's cgroup (v1/v2 folder `gpulease/...`, systemd `gpulease-...`).
    return any("/gpulease/" in line or ("/gpulease-" in line and line.endswith(".scope"))
               for line in cgroup_text.splitlines())


def _fd_node(path: str) -> NodeId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return "c", os.major(st.st_rdev), os.minor(st.st_rdev)
    if stat.S_ISBLK(st.st_mode):
        return "b", os.major(st.st_rdev), os.minor(st.st_rdev)
    return None


def _ring_files(fdinfo: str) -> list[str]:
    """The files registered with the io_uring whose /proc/PID/fdinfo/N is `fdinfo`: they
    stay held once their descriptors are closed, and IORING_OP_FIXED_FD_INSTALL gives
    one back as a descriptor ("UserFiles:" then "  INDEX: PATH" lines)."""
    try:
        with open(fdinfo, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    _, found, rest = text.partition("\nUserFiles:")
    paths = []
    for line in rest.splitlines()[1:] if found else ():
        index, colon, path = line.strip().partition(": ")
        if not (colon and index.isdigit()):
            break
        paths.append(path)
    return paths


def _holds(folder: str, nodes: set[NodeId]) -> bool | None:
    """Whether an entry of `folder` (a process's fd/ or map_files/) is one of `nodes`, or
    (fd/) an io_uring holding one; None when the folder cannot be read or is empty (the
    process is gone, a kernel thread, a main thread that has ended)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return None
    if not entries:
        return None  # no mappings: a kernel thread, or a main thread that has ended
    for e in entries:
        if _fd_node(f"{folder}/{e}") in nodes:
            return True
        if folder.endswith("/fd") and _link(f"{folder}/{e}") == "anon_inode:[io_uring]" and any(
                _fd_node(p) in nodes for p in _ring_files(f"{folder}info/{e}")):
            return True
    return False


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _threads(pid: int, proc: str) -> list[int]:
    """`pid` and its other threads: a thread may have a descriptor table of its own
    (unshare(CLONE_FILES)), and once the main thread has ended (SYS_exit) /proc/PID/fd
    and map_files are empty while the others run on; /proc/TID/ shows each thread's."""
    try:
        tids = [int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit()]
    except OSError:
        tids = []
    return [pid] + [t for t in tids if t != pid]


def _holder(pid: int, proc: str, nodes: set[NodeId]) -> bool:
    """Whether process `pid` holds one of `nodes`: a descriptor of any of its threads, or
    a mapping (its threads share one address space: read through another thread's only
    when the main thread's shows none, as once that thread has ended)."""
    if _holds(f"{proc}/{pid}/fd", nodes):
        return True
    maps = _holds(f"{proc}/{pid}/map_files", nodes)
    if maps:
        return True
    return any(_holds(f"{proc}/{tid}/fd", nodes)
               or (maps is None and _holds(f"{proc}/{tid}/map_files", nodes))
               for tid in _threads(pid, proc)[1:])


def holders(nodes: set[NodeId], proc: str = "/proc") -> dict[int, int]:
    """pid → real uid of every process with an open descriptor on one of `nodes`, or a
    mapping of one (map_files: readable by root only, as the hub runs)."""
    found: dict[int, int] = {}
    if not nodes:
        return found
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        if _holder(pid, proc, nodes):
            uid = _real_uid(pid, proc)
            if uid is not None:
                found[pid] = uid
    return found


def _real_uid(pid: int, proc: str) -> int | None:
    """The process's real uid: whose it is. Not /proc/PID's owner, its effective uid,
    which is root's while a tenant's descriptor sits in a setuid program it ran."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
        return os.stat(f"{proc}/{pid}").st_uid
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_text(pid: int, proc: str) -> str:
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return ""


def end_holders(node_ids: Iterable[Sequence], leaving_uid: int | None, wait_s: float = 3.0,
                *, proc: str = "/proc", kill: Callable[[int, int], None] = os.kill,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> tuple[int, tuple[int, ...]]:
    """SIGKILL the tenant processes holding `node_ids`; (kills sent, tenant holders left)."""
    nodes = {(str(k), int(a), int(b)) for k, a, b in node_ids}
    deadline = clock() + wait_s
    killed = 0
    while True:
        left = sorted(pid for pid, uid in holders(nodes, proc).items()
                      if is_tenant(uid, _cgroup_text(pid, proc), leaving_uid))
        if not left or clock() >= deadline:
            return killed, tuple(left)
        for pid in left:
            try:
                kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        sleep(0.05)
