"""A server's process enters its sandbox: its own network, IPC, /dev/shm, /tmp and /proc.

Called in the server's process while it is still root, after it joined its
cgroup and before it becomes the researcher (gpulease.singleuser.warm_child for
a warm start, the spawner's preexec for a cold one), so that nothing of the
researcher's ever runs outside it:

- the network namespace the hub prepared (gpulease.host.netns): its own loopback,
  one address on the hub's bridge, nothing of another server's;
- a new IPC namespace: System V segments, semaphores and message queues of its
  own, freed by the kernel with the last of its processes;
- a new mount namespace (mounts from the host still propagate in, none out) with
  a tmpfs on /dev/shm and on /tmp, each bounded in size; their pages are charged
  to the memory cgroup of the process that writes them, the server's, and they
  are gone when the last process of the server is;
- /proc mounted again with hidepid=invisible: another account's processes (other
  researchers', the hub's) are not listed, their command lines unreadable;
- /var/tmp and /run/lock of its own too, an empty /run/netns (no other server's
  namespace to open), and a cgroup namespace with the cgroup file systems mounted
  again: its own cgroups only;
- no_new_privs: no setuid program or file capability raises its rights;
- the hub's resolver file for namespaces over /etc/resolv.conf (the host's may
  name a resolver on its own loopback).

Only the standard library: this runs in every server environment.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MS_RDONLY = 1


class SandboxError(OSError):
    """The server could not enter its sandbox: it must not start outside it."""


def enter(spec: dict) -> None:
    """`spec`: netns (path), shm_bytes, tmp_bytes, resolv_conf (path or ""), keep_in_tmp
    (paths under /tmp the server needs, seen in its /tmp as on the host)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(spec["netns"], os.O_RDONLY | os.O_CLOEXEC)
    try:
        _call(libc.setns(fd, CLONE_NEWNET), "join its network namespace")
    finally:
        os.close(fd)
    _call(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "make its mount and IPC namespaces")
    # Host mounts (a dataset mounted later) still reach it; none of its own go back.
    _mount(libc, None, "/", None, MS_REC | MS_SLAVE, None)
    resolv = spec.get("resolv_conf") or ""
    if resolv:  # first: the file may be under /tmp, hidden once /tmp is its own
        target = os.path.realpath("/etc/resolv.conf")  # often a link into /run
        _mount(libc, resolv, target, None, MS_BIND, None)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    nosuid = MS_NOSUID | MS_NODEV
    _mount(libc, "tmpfs", "/dev/shm", "tmpfs", nosuid,
           f"size={int(spec['shm_bytes'])},mode=1777")
    _private_tmp(libc, int(spec["tmp_bytes"]), spec.get("keep_in_tmp") or ())
    # the host's other folders every account may write: its own too, gone with it
    for shared, size in (("/var/tmp", int(spec["tmp_bytes"])), ("/run/lock", 4 << 20)):
        if os.path.isdir(shared):
            _mount(libc, "tmpfs", shared, "tmpfs", nosuid, f"size={size},mode=1777")
    if os.path.isdir("/run/netns"):  # no other server's namespace to open and keep alive
        _mount(libc, "tmpfs", "/run/netns", "tmpfs", nosuid | MS_NOEXEC, "size=4k,mode=755")
    _private_cgroups(libc)
    _mount(libc, "proc", "/proc", "proc", nosuid | MS_NOEXEC, "hidepid=invisible")
    # No setuid program or file capability raises the researcher's rights from here
    # on (su, mount, a helper with cap_net_admin): its account's, and no more.
    _call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def _private_cgroups(libc) -> None:
    """A cgroup namespace rooted at the server's own cgroups (joined just before), and
    the cgroup hierarchies mounted again in it: the server sees its own limits and
    usage, never another server's cgroups, names or processes."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4]
            fstype, _source, options = (right.split() + ["", ""])[:3]
            if fstype in ("cgroup", "cgroup2") and point.startswith("/sys/fs/cgroup"):
                mounts.append((point, fstype, options))
    if not mounts:
        return
    _call(libc.unshare(CLONE_NEWCGROUP), "make its cgroup namespace")
    _mount(libc, "tmpfs", "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           "mode=755")
    for point, fstype, options in sorted(mounts):
        os.makedirs(point, exist_ok=True)
        data = ",".join(o for o in options.split(",") if o not in ("rw", "ro"))
        _mount(libc, fstype, point, fstype, MS_NOSUID | MS_NODEV | MS_NOEXEC, data or None)


def _private_tmp(libc, size: int, keep) -> None:
    """A tmpfs on /tmp; the paths under /tmp the server needs (a state folder, its
    environment, device nodes kept there) bound back in at their places."""
    old = os.open("/tmp", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _mount(libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={size},mode=1777")
        for path in keep:
            rel = os.path.relpath(path, "/tmp")
            if rel.startswith(".."):
                continue
            source = f"/proc/self/fd/{old}/{rel}"
            if not os.path.lexists(source):
                continue
            target = os.path.join("/tmp", rel)
            if os.path.isdir(source):
                os.makedirs(target, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            _mount(libc, source, target, None, MS_BIND | MS_REC, None)
    finally:
        os.close(old)


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None) -> None:
    _call(libc.mount(_c(source), _c(target), _c(fstype), flags, _c(data)), f"mount {target}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"cannot {what}: {os.strerror(err)}")
