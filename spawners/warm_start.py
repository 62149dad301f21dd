"""The hub's side of warm starts: the launcher process, and a forked server as a Popen.

`WarmLauncher` starts gpulease.singleuser.warm_launcher as a new program (not
a fork of the hub) with the interpreter a server would run, a clean
environment, stdin on /dev/null, and no descriptor but one end of a control
socket pair. `spawn` sends it the other end of a fresh socket pair per
server; the forked child reads its request there, answers with its pid or why
it could not become the server, and the launcher later writes its exit status
there. `WarmChild` reads that as Popen's `poll` and `wait` do, so
LocalGPUSpawner's stop, exit watch and billing treat both kinds of start alike.

One launcher per interpreter, kept here for the hub's life: the default
environment's is started with the hub (`prestart`); another image's the first
time one of its servers starts (that server starts cold).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import threading
import time

log = logging.getLogger(__name__)

LAUNCHER_MODULE = "gpulease.singleuser.warm_launcher"
READY_TIMEOUT_S = 60.0  # the launcher's imports, on a slow disk and a busy box
ANSWER_TIMEOUT_S = 30.0  # a forked child's pid, or why it failed
RETRY_AFTER_S = 300.0  # a launcher that failed is started again after this long


class WarmUnavailable(Exception):
    """No launcher to fork from (off, not ready, gone): the server starts cold."""


class WarmStartError(Exception):
    """The forked child could not become the server (a cgroup, an account): the start fails."""


class WarmChild:
    """A server forked by the launcher, seen as a subprocess.Popen of the hub's."""

    def __init__(self, pid: int, sock: socket.socket, args: list[str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._sock = sock
        self._buffer = b""
        self._orphaned = False  # the launcher went away: only the pid tells
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._consume()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen.wait. The lock is held only to read what has arrived, never while
        waiting: the hub's event loop polls the same child."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            step = 0.5 if left is None else min(left, 0.5)
            if self._orphaned:
                time.sleep(min(step, 0.1))
                continue
            try:
                ready = select.poll()
                ready.register(self._sock, select.POLLIN)
                ready.poll(step * 1000)
            except (OSError, ValueError):  # closed meanwhile by a poll that saw the end
                pass
        return self.returncode  # type: ignore[return-value]

    def _consume(self) -> None:
        """Read what the launcher wrote, without waiting (the lock is held)."""
        if self._orphaned:
            self._check_pid()
            return
        try:
            chunk = self._sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the launcher ended before this server: it was reparented
            self._orphaned = True
            self._sock.close()
            self._check_pid()
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
                code = int(message["exit"])
            except (ValueError, KeyError, TypeError):
                continue  # only the launcher writes here, and only that
            self.returncode = code
            self._sock.close()

    def _check_pid(self) -> None:
        """Gone, or a zombie nobody reaps (an init that does not): ended, status unknown
        (0, as JupyterHub's own pid check says of a process it lost)."""
        try:
            stat = open(f"/proc/{self.pid}/stat").read()  # noqa: SIM115 - read at once
        except OSError:
            stat = ""
        if not stat or stat.rsplit(")", 1)[-1].split()[0] == "Z":
            self.returncode = 0

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.returncode is not None:
            self._sock.close()


class WarmLauncher:
    def __init__(self, python: str, env: dict[str, str]):
        self.python = python
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.missing: list[str] = []
        self.failure = ""  # why it is not usable, once it is not
        self.failed_at = 0.0  # time.monotonic() of that
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._control: socket.socket | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [self.python, "-m", LAUNCHER_MODULE, str(theirs.fileno())],
                env=self.env, cwd="/", stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                close_fds=True, start_new_session=True)
        except OSError as e:
            ours.close()
            self._fail(f"cannot run {self.python}: {e}")
            return
        finally:
            theirs.close()
        self._control = ours
        threading.Thread(target=self._await_ready, name="gpulease-warm-launcher",
                         daemon=True).start()

    def _await_ready(self) -> None:
        control = self._control
        assert control is not None
        control.settimeout(READY_TIMEOUT_S)
        try:
            line = control.makefile("rb").readline()
            message = json.loads(line) if line else {}
        except (OSError, ValueError) as e:
            message = {"failed": str(e)}
        control.settimeout(None)
        if "ready" not in message:
            self._fail(f"the warm launcher did not start ({message.get('failed') or 'it ended'}"
                       "; its error is in the hub's log)")
            return
        self.pid = int(message["ready"])
        self.missing = list(message.get("missing") or ())
        log.info("warm launcher %d ready (%s)%s", self.pid, self.python,
                 f"; not imported ahead: {', '.join(self.missing)}" if self.missing else "")
        self._ready.set()

    def _fail(self, why: str) -> None:
        if not self.failure:
            self.failure, self.failed_at = why, time.monotonic()
            log.error("warm starts are unavailable for %s: %s; servers start cold",
                      self.python, why)
        self._ready.set()

    def ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout) and not self.failure

    def spawn(self, request: dict, wait_ready: float = READY_TIMEOUT_S) -> WarmChild:
        """Fork a server (blocking: run in a thread)."""
        if not self.ready(wait_ready):
            raise WarmUnavailable(self.failure or "the warm launcher is still starting")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                if self.proc is None or self.proc.poll() is not None or self._control is None:
                    self._fail(f"the warm launcher ended (status {self.proc and self.proc.poll()})")
                    raise WarmUnavailable(self.failure)
                socket.send_fds(self._control, [b"s"], [theirs.fileno()])
        except OSError as e:
            ours.close()
            self._fail(f"the warm launcher cannot be reached ({e})")
            raise WarmUnavailable(self.failure) from None
        finally:
            theirs.close()
        try:
            ours.sendall(json.dumps(request).encode())
            ours.shutdown(socket.SHUT_WR)
            ours.settimeout(ANSWER_TIMEOUT_S)
            line = b""
            while not line.endswith(b"\n"):
                chunk = ours.recv(4096)
                if not chunk:
                    break
                line += chunk
            ours.settimeout(None)
            answer = json.loads(line) if line else {}
        except (OSError, ValueError) as e:
            ours.close()
            raise WarmStartError(f"the forked server did not answer ({e})") from None
        if "pid" not in answer:
            ours.close()
            raise WarmStartError(answer.get("error") or "the forked server ended at once")
        return WarmChild(int(answer["pid"]), ours, list(request["argv"]))

    def close(self) -> None:
        """End the launcher (the servers it forked run on)."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_launchers: dict[str, WarmLauncher] = {}


def launcher_for(python: str, env: dict[str, str]) -> tuple[WarmLauncher, bool]:
    """The launcher of this interpreter, and whether it was there before this call.

    One that failed is tried again (a new process) at most every RETRY_AFTER_S:
    an environment whose imports fail must not cost a process at every start.
    """
    launcher = _launchers.get(python)
    if launcher is not None and (
            not launcher.failure or time.monotonic() - launcher.failed_at < RETRY_AFTER_S):
        return launcher, True
    launcher = _launchers[python] = WarmLauncher(python, env)
    launcher.start()
    return launcher, False


def close_all() -> None:
    for launcher in _launchers.values():
        launcher.close()
    _launchers.clear()
