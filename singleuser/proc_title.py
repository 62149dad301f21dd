"""A forked server's /proc/PID/cmdline and environ, made what a cold start's would be.

The kernel shows a process's command line and environment from the memory its
exec filled: for a server forked by the warm launcher, the launcher's
(`python -m gpulease.singleuser.warm_launcher 5`, its clean environment). `ps`,
an admin's tools and the researcher would see that. The launcher is started
with room in both (spawners/local/warm_start.py: ARGV_ROOM, ENV_ROOM); the child
writes its own command line (interpreter, script, arguments: what exec'ing
the script gives) and environment over them, and, while still root, moves
their ends to fit (PR_SET_MM, where the kernel lets it; elsewhere what is
past them reads as empty strings).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_MM = 35
PR_SET_MM_ARG_END = 9
PR_SET_MM_ENV_END = 11


def areas() -> tuple[int, int, int, int]:
    """arg_start, arg_end, env_start, env_end of this process (/proc/self/stat 48-51)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start = 48 - 3  # fields[0] is field 3 (state)
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[start:start + 4])
    return arg_start, arg_end, env_start, env_end


def as_bytes(argv: list[str], env: dict[str, str]) -> tuple[bytes, bytes]:
    cmdline = b"".join(os.fsencode(a) + b"\0" for a in argv)
    environ = b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())
    return cmdline, environ


def fit(cmdline: bytes, environ: bytes) -> bool:
    """As root (CAP_SYS_RESOURCE): end both areas where the new contents will end; only
    if both fit (`write` writes both or neither). Whether the kernel let it."""
    arg_start, arg_end, env_start, env_end = areas()
    if len(cmdline) > arg_end - arg_start or len(environ) > env_end - env_start:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return (libc.prctl(PR_SET_MM, PR_SET_MM_ARG_END, ctypes.c_ulong(arg_start + len(cmdline)),
                       0, 0) == 0
            and libc.prctl(PR_SET_MM, PR_SET_MM_ENV_END,
                           ctypes.c_ulong(env_start + len(environ)), 0, 0) == 0)


def name(program: str) -> None:
    """/proc/PID/comm (ps -o comm, top, pgrep) as an exec of `program` sets it."""
    PR_SET_NAME = 15  # noqa: N806 - the kernel's name
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, os.fsencode(os.path.basename(program))[:15], 0, 0, 0)


def write(cmdline: bytes, environ: bytes) -> bool:
    """Write both over the launcher's, padded with NULs; once libc no longer reads the
    old environment (os.environ was replaced). False where one does not fit."""
    arg_start, arg_end, env_start, env_end = areas()
    fits = len(cmdline) <= arg_end - arg_start and len(environ) <= env_end - env_start
    if not fits:
        return False
    for start, end, data in ((arg_start, arg_end, cmdline), (env_start, env_end, environ)):
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True
