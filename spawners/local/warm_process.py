"""A server forked by the warm launcher, seen by the hub as a subprocess.Popen.

The hub holds a pidfd of the server (opened once the launcher said which pid it
forked, and checked to be the launcher's child) and its end of the server's
socket, on which the launcher writes the exit status when it reaps it. The
pidfd says when the process ends, whatever happens to the socket (a launcher
that ended, a status it could not write); the status, when it came, is
Popen's returncode, else 0 (as JupyterHub says of a process it lost). A server
that ended and was reaped before the hub could open its pidfd is known by that
status alone (`WarmChild.already_ended`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from datetime import datetime

import psutil

ANSWER_LIMIT = 64 * 1024  # what the hub reads, at most, before a server is running


class WarmChild:
    def __init__(self, pid: int, pidfd: int, sock: socket.socket | None, args: list[str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.launched_at: datetime | None = None  # joined its cgroup (UTC): billed from here
        self._pidfd = pidfd
        self._sock: socket.socket | None = sock
        self._buffer = b""
        self._lock = threading.Lock()

    @classmethod
    def already_ended(cls, pid: int, returncode: int, args: list[str]) -> WarmChild:
        """A server that ended, and was reaped, before the hub could open its pidfd (a
        command that exits at once): the status the launcher wrote is its returncode."""
        child = cls(pid, -1, None, args)
        child.returncode = returncode
        return child

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._look()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen.wait. The lock is held only to look, never while waiting: the hub's
        event loop polls the same child."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            try:
                ended = select.poll()
                ended.register(self._pidfd, select.POLLIN)
                ended.poll(500 if left is None else min(left, 0.5) * 1000)
            except (OSError, ValueError):  # closed meanwhile by a poll that saw the end
                pass
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        """SIGKILL through the pidfd: never another process that took its pid."""
        with self._lock:
            if self.returncode is None and self._pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except OSError:
                    pass

    def pidfd(self) -> int | None:
        """A pidfd of this very process (the caller's to close), None once it ended: the
        launcher reaps it at once, so its pid alone may soon name another process."""
        with self._lock:
            return os.dup(self._pidfd) if self._pidfd >= 0 else None

    def close(self) -> None:
        """Let go of the pidfd and the socket (a start that failed after the fork)."""
        with self._lock:
            self._close_sock()
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1

    def _look(self) -> None:
        """Whether it ended (the pidfd), and its status if the launcher wrote it."""
        self._read_status()
        if self.returncode is not None:
            return
        gone = select.poll()
        gone.register(self._pidfd, select.POLLIN)
        if gone.poll(0):
            time.sleep(0.01)  # the launcher reaps at once, then writes: give it that
            self._read_status()
            self._end(0 if self.returncode is None else self.returncode)

    def _read_status(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            chunk = sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the launcher ended: the pidfd alone tells
            self._close_sock()
            return
        self._buffer = (self._buffer + chunk)[-ANSWER_LIMIT:]
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                code = int(json.loads(line)["exit"])
            except (ValueError, KeyError, TypeError):
                continue  # only the launcher writes here, and only that
            self._end(code)
            return

    def _end(self, code: int) -> None:
        self.returncode = code
        self._close_sock()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def _close_sock(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # closed as it is seen to end


def read_answer(sock: socket.socket, timeout: float) -> dict:
    """The launcher's {"forked": pid} and the child's {"ready"} or {"error"}, merged:
    what came within `timeout` seconds in all, and at most ANSWER_LIMIT bytes."""
    deadline = time.monotonic() + timeout
    answer: dict = {}
    data = b""
    while not ("forked" in answer and ("ready" in answer or "error" in answer)):
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > ANSWER_LIMIT:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
        *lines, data = data.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                answer = {**message, **answer}  # the first word on each key holds
    sock.settimeout(None)
    return answer


def read_exit(sock: socket.socket, timeout: float) -> int | None:
    """The exit status the launcher writes when it reaps a server, if it comes within
    `timeout` seconds; None if the socket ends or says something else first."""
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) <= ANSWER_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except OSError:
            return None
        finally:
            sock.settimeout(None)
        if not chunk:
            return None
        data += chunk
        *lines, data = data.split(b"\n")
        for line in lines:
            try:
                return int(json.loads(line)["exit"])
            except (ValueError, KeyError, TypeError):
                continue
    return None


def launcher_child(pid: int, launcher_pid: int) -> int:
    """A pidfd of `pid`, once it is checked to be the launcher's child; OSError if not."""
    pidfd = os.pidfd_open(pid)
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.Error:
        parent = -1
    if parent != launcher_pid:
        os.close(pidfd)
        raise OSError(f"process {pid} is not the warm launcher's child")
    return pidfd
