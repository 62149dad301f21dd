"""One server's log writer: `python -m gpulease.host.server_log_writer PATH MAX_BYTES KEEP`.

Its stdin is the read end of the pipe that is the server's stdout and stderr
(gpulease.host.server_logs starts it). It appends what comes to PATH, rotating
by gpulease.core.server_log's rule, and ends at end of file: when the last of
the server's processes has closed the pipe. It runs as the hub's account (root
when servers run as per-user accounts), in a session of its own, outside the
server's cgroup, so a researcher can neither signal it nor end it with their
server, and it outlives a restart of the hub as the server does.

It never stops reading before the end: a writer that ended while the server
still wrote would make each of the server's writes fail (EPIPE). A file it
cannot write (a full disk) costs that output, never the server. Imports are
few: it starts with every server.
"""

from __future__ import annotations

import os
import signal
import stat
import sys

from gpulease.core.server_log import Rotation, renames

CHUNK = 64 * 1024  # at most MIN_MAX_BYTES: one read always fits in a fresh file
FILE_MODE = 0o640  # the hub's account writes; its group (admins) reads; nobody else


def open_log(path: str) -> int:
    """The log file for appending, made FILE_MODE if new; never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)
    if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
        os.fchmod(fd, FILE_MODE)  # the umask narrowed it, or an older file was wider
    return fd


def rotate(path: str, keep: int) -> None:
    """One rotation of `path` (gpulease.core.server_log.renames); a part that is not
    there is skipped."""
    folder, name = os.path.split(path)
    removed, moves = renames(name, keep)
    for old, new in ((removed, None), *moves):
        if old is None:
            continue
        try:
            if new is None:
                os.unlink(os.path.join(folder, old))
            else:
                os.rename(os.path.join(folder, old), os.path.join(folder, new))
        except FileNotFoundError:
            pass


def still_at(path: str, fd: int) -> bool:
    """Whether `fd` is the file at `path` now (another writer of the same server, left
    running by a process of an earlier start, may have rotated it away)."""
    try:
        here, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _open_or_none(path: str) -> int:
    """`open_log`, or -1 where the file cannot be made now (a disk with no space or inode
    left): the output that comes meanwhile is dropped, and the next chunk tries again."""
    try:
        return open_log(path)
    except OSError:
        return -1


def _rotate_or_not(path: str, keep: int) -> None:
    try:
        rotate(path, keep)
    except OSError:
        pass  # kept as it is: the next file is appended to it (bounded all the same)


def run(source: int, path: str, rule: Rotation) -> int:
    """Copy `source` to the log until its end; the bytes it could not keep. No file it
    cannot make or write ends it: it reads on to the end whatever the disk does."""
    try:
        if os.stat(path, follow_symlinks=False).st_size > 0:
            _rotate_or_not(path, rule.keep)  # each start begins a file of its own
    except OSError:
        pass
    fd = _open_or_none(path)
    written, dropped = (os.fstat(fd).st_size if fd >= 0 else 0), 0
    while True:
        try:
            data = os.read(source, CHUNK)
        except InterruptedError:
            continue
        if not data:
            break
        if fd < 0:  # no file yet: room may have come back
            fd = _open_or_none(path)
            written = os.fstat(fd).st_size if fd >= 0 else 0
        if fd >= 0 and written + len(data) > rule.max_bytes:
            if not still_at(path, fd):  # not ours to rotate: kept to its bound, no further
                dropped += len(data)
                continue
            os.close(fd)
            _rotate_or_not(path, rule.keep)
            fd, written = _open_or_none(path), 0
            if fd >= 0:
                written = os.fstat(fd).st_size  # a rotation that failed left it in place
        if fd < 0 or written + len(data) > rule.max_bytes:
            dropped += len(data)
            continue
        try:
            os.write(fd, data)
            written += len(data)
        except OSError:
            dropped += len(data)  # a full disk: the server runs on, its output is lost
    if fd >= 0:
        os.close(fd)
    return dropped


def drain(source: int) -> None:
    """Read `source` to its end, keeping nothing: what the writer does if it fails in a
    way `run` did not foresee, so that the server's writes never fail (EPIPE, SIGPIPE)."""
    while True:
        try:
            if not os.read(source, CHUNK):
                return
        except InterruptedError:
            continue


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m gpulease.host.server_log_writer PATH MAX_BYTES KEEP",
              file=sys.stderr)
        return 2
    # Ended only by the end of its input (or SIGKILL): the hub's Ctrl-C, a hang-up or a
    # stray SIGTERM must not break every write of a running server.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)
    os.umask(0o027)
    try:
        run(0, args[0], Rotation(int(args[1]), int(args[2])))
    except Exception:
        drain(0)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
