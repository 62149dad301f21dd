"""Servers' own logs on this machine: the capture of a start, and reading a log back.

    <state>/logs/               0750, the hub's account (root where servers run as
    <state>/logs/servers/       per-user accounts): no server's account can enter
    <state>/logs/servers/<user>/<server>.log   0640 (and .1, .2 ... rotated)

`capture` makes, for one start, a pipe whose write end becomes the server's
stdout and stderr (never the hub's, which a server could otherwise write into
or truncate) and starts its log writer (gpulease.host.server_log_writer) on the
read end, in a session of its own: the writer outlives a restart of the hub, as
the server does, and ends when the last of the server's processes has closed
the pipe. The hub closes its own copy of the write end as soon as the server
has it (`Capture.launched`), or the writer would never see the end.

`read_log` and `read_tail` read a log back for the people it is shown to
(gpulease.core.server_log.shown_text takes out what a terminal would obey).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpulease.core.server_log import LOGS_FOLDER, Rotation, log_path, shown_tail, tail

FOLDER_MODE = 0o750
WRITER_MODULE = "gpulease.host.server_log_writer"
# What the writer keeps of the hub's environment: enough to find its interpreter's
# modules, none of the hub's secrets.
WRITER_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL")


class ServerLogError(RuntimeError):
    """A server's log cannot be made or read as it must be."""


def logs_root(state_root: Path) -> Path:
    return state_root.joinpath(*LOGS_FOLDER)


def _own_folder(path: Path) -> None:
    """`path` a folder of the hub's account, FOLDER_MODE, no link (made if missing)."""
    try:
        path.mkdir(mode=FOLDER_MODE, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise ServerLogError(f"cannot make the servers' log folder {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ServerLogError(f"{path} is not a folder (a link?): servers' logs are kept in "
                             "folders of the hub's own; move it away")
    if st.st_uid != os.geteuid():
        raise ServerLogError(f"{path} belongs to uid {st.st_uid}, not the hub's account "
                             f"(uid {os.geteuid()}): servers' logs must be out of their reach")
    if stat.S_IMODE(st.st_mode) != FOLDER_MODE:
        os.chmod(path, FOLDER_MODE)


def prepare_folder(state_root: Path, user: str, server: str) -> Path:
    """The path of this server's log, its folders made and checked (ServerLogError)."""
    try:
        path = Path(log_path(state_root, user, server))
    except ValueError as e:
        raise ServerLogError(str(e)) from None
    for folder in (state_root / LOGS_FOLDER[0], logs_root(state_root), path.parent):
        _own_folder(folder)
    return path


@dataclass
class Capture:
    """One start's output: `write_fd` is to be the server's fd 1 and 2."""

    path: Path
    write_fd: int
    writer: subprocess.Popen
    _ended: threading.Event = field(default_factory=threading.Event)

    def launched(self) -> None:
        """The server holds the write end (or never will): the hub lets go of its copy."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def wait_written(self, timeout: float) -> bool:
        """Blocking: wait until the writer has written everything and ended (every process
        of the server closed its output); False after `timeout` seconds (a process left
        running holds it: what came so far is written all the same)."""
        return self._ended.wait(timeout)

    def tail(self) -> str:
        """The end of this start's output, as shown (gpulease.core.server_log.shown_tail)."""
        try:
            return shown_tail(_read_end(self.path, 64 * 1024))
        except OSError:
            return ""


def capture(state_root: Path, user: str, server: str, rule: Rotation,
            python: str = sys.executable) -> Capture:
    """Start capturing one start's output (see the module doc); ServerLogError if not."""
    path = prepare_folder(state_root, user, server)
    read_fd, write_fd = os.pipe()  # both close-on-exec: each is handed on on purpose only
    try:
        writer = subprocess.Popen(
            [python, "-m", WRITER_MODULE, str(path), str(rule.max_bytes), str(rule.keep)],
            stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
            env={k: os.environ[k] for k in WRITER_ENV if k in os.environ},
            close_fds=True, start_new_session=True)
    except OSError as e:
        os.close(write_fd)
        raise ServerLogError(f"cannot start the log writer of {path}: {e}") from None
    finally:
        os.close(read_fd)
    done = Capture(path, write_fd, writer)

    def reap() -> None:  # the hub's child: waited for, never left a zombie
        writer.wait()
        done._ended.set()

    threading.Thread(target=reap, name="gpulease-server-log", daemon=True).start()
    return done


def _read_end(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of a file, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_log(state_root: Path, user: str, server: str, lines: int | None,
             limit: int) -> bytes | None:
    """A server's current log (this start's, or its last start's): its last `lines` lines
    (None: all), at most its last `limit` bytes; None when it has none. ValueError for a
    name outside the rules."""
    path = Path(log_path(state_root, user, server))
    try:
        data = _read_end(path, limit)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ServerLogError(f"cannot read {path}: {e.strerror}") from None
    if lines is not None:
        data = tail(data, lines, limit)
    return data


def _log_files(folder: Path, name: str) -> list[str]:
    """The files of one server's log in its user's folder: `name` and `name`.N."""
    try:
        found = os.listdir(folder)
    except FileNotFoundError:
        return []
    numbers = (f[len(name) + 1:] for f in found)
    return [f for f, n in zip(found, numbers, strict=True)
            if f == name or (f.startswith(f"{name}.") and n.isascii() and n.isdigit())]


def remove_logs(state_root: Path, user: str, server: str) -> int:
    """Remove a server's log and its rotated files, when the server itself is deleted (a
    named server removed, a user deleted): how many were. A server's log is bounded, but
    a user's are not unless a deleted server's go with it (create, start, delete, again).
    Its user's folder goes too once empty. ValueError for a name outside the rules."""
    path = Path(log_path(state_root, user, server))
    folder = path.parent
    removed = 0
    for found in _log_files(folder, path.name):
        try:
            os.unlink(folder / found)
            removed += 1
        except FileNotFoundError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass  # another server's logs are in it, or it was never made
    return removed


def rename_logs(state_root: Path, user: str, old: str, new: str) -> int:
    """A server renamed: its log files take the new name (what was left under that name
    removed first), so that none stays behind under a name no server has. How many moved.
    ValueError for a name outside the rules."""
    source, target = Path(log_path(state_root, user, old)), Path(log_path(state_root, user, new))
    moving = _log_files(source.parent, source.name)
    if not moving:
        return 0
    remove_logs(state_root, user, new)
    for found in moving:
        os.rename(source.parent / found, target.parent / (target.name + found[len(source.name):]))
    return len(moving)
