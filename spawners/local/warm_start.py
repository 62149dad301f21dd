"""The hub's side of warm starts: the launcher process, and a forked server as a Popen.

`WarmLauncher` starts gpulease.singleuser.warm_launcher as a new program (not
a fork of the hub) with the interpreter a server would run, a clean
environment, stdin on /dev/null, and no descriptor but one end of a control
socket pair. `spawn` sends it the other end of a fresh socket pair per
server, with the write end of the server's output (its own log's pipe,
gpulease.host.server_logs): the forked child puts that on its stdout and
stderr before anything of the researcher's runs, so no server writes to the
hub's (which the launcher inherits). The child reads its request on the
socket, answers with its pid or why it could not become the server, and the
launcher later writes its exit status there. `WarmChild`
(spawners/local/warm_process.py) reads that as Popen's `poll` and `wait` do, so
LocalGPUSpawner's stop, exit watch and billing treat both kinds of start alike.

One launcher per interpreter, kept here for the hub's life: the default
environment's is started with the hub (`prestart`); another image's the first
time one of its servers starts (that server starts cold).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpulease.core.clock import utcnow
from gpulease.host.scripts import shebang_interpreter
from gpulease.spawners.local.warm_process import WarmChild, launcher_child, read_answer, read_exit

log = logging.getLogger(__name__)

LAUNCHER_MODULE = "gpulease.singleuser.warm_launcher"
READY_TIMEOUT_S = 60.0  # the launcher's imports, on a slow disk and a busy box
ANSWER_TIMEOUT_S = 30.0  # a forked child's pid, or why it failed
EXIT_TIMEOUT_S = 5.0  # the status of a child the launcher reaped before the hub looked
RETRY_AFTER_S = 300.0  # a launcher that failed is started again after this long
ARGV_ROOM = 16 * 1024  # bytes a forked server's command line may take in /proc
ENV_ROOM = 120 * 1024  # ... and its environment (one string: under MAX_ARG_STRLEN)


class WarmUnavailable(Exception):
    """No launcher to fork from (off, not ready, gone): the server starts cold."""


class WarmStartError(Exception):
    """The forked child could not become the server (a cgroup, an account): the start fails."""


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
            # Room in its command line and environment that each forked server
            # writes its own over (gpulease.singleuser.proc_title).
            self.proc = subprocess.Popen(
                [self.python, "-m", LAUNCHER_MODULE, str(theirs.fileno()), " " * ARGV_ROOM],
                env={**self.env, "GPULEASE_WARM_ROOM": "-" * ENV_ROOM}, cwd="/",
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), close_fds=True,
                start_new_session=True)
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
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()  # not ready in time, or stuck: not left running as root
                self.proc.wait()
        self._ready.set()

    def ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout) and not self.failure

    def spawn(self, request: dict, output: int | None = None,
              wait_ready: float = READY_TIMEOUT_S) -> WarmChild:
        """Fork a server whose stdout and stderr are `output` (None: /dev/null; it stays
        the caller's to close). Blocking: run it in a thread."""
        if not self.ready(wait_ready):
            raise WarmUnavailable(self.failure or "the warm launcher is still starting")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        asked = utcnow()
        try:
            with self._lock:
                if self.proc is None or self.proc.poll() is not None or self._control is None:
                    self._fail(f"the warm launcher ended (status {self.proc and self.proc.poll()})")
                    raise WarmUnavailable(self.failure)
                socket.send_fds(self._control, [b"s"], [theirs.fileno(),
                                                        *([] if output is None else [output])])
        except OSError as e:
            ours.close()
            self._fail(f"the warm launcher cannot be reached ({e})")
            raise WarmUnavailable(self.failure) from None
        finally:
            theirs.close()
        try:
            ours.sendall(json.dumps(request).encode())
            ours.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the child ended at once: its answer, if any, says why
        answer = read_answer(ours, ANSWER_TIMEOUT_S)
        if "forked" not in answer:
            ours.close()
            self._fail(answer.get("error") or "the warm launcher did not fork within "
                       f"{ANSWER_TIMEOUT_S:.0f} s")
            raise WarmUnavailable(self.failure)
        try:
            pidfd = launcher_child(int(answer["forked"]), self.pid)
        except (OSError, ValueError) as e:
            child = self._ended_before_seen(answer, ours, request, asked)
            if child is None:
                raise WarmStartError(str(answer.get("error") or
                                         f"the forked server is gone ({e})")) from None
            return child
        child = WarmChild(int(answer["forked"]), pidfd, ours, list(request["argv"]))
        child.launched_at = in_cgroup_moment(answer.get("in_cgroup"), asked)
        if "error" in answer:
            child.kill()
            child.close()
            raise WarmStartError(str(answer["error"]))
        if "ready" not in answer:  # slow, or dead: never left running unknown to the hub
            child.kill()
            child.close()
            raise WarmUnavailable(f"the forked server was not ready within "
                                  f"{ANSWER_TIMEOUT_S:.0f} s")
        return child

    @staticmethod
    def _ended_before_seen(answer: dict, ours: socket.socket, request: dict,
                           asked: datetime) -> WarmChild | None:
        """A server that became ready, ran, ended and was reaped by the launcher before
        the hub opened its pidfd (a command that exits at once): the launcher's word on
        its exit status, as Popen would give it. None (and the socket closed) if it was
        never ready or no status came: the start failed."""
        try:
            if "error" in answer or "ready" not in answer:
                return None
            code = answer.get("exit")
            if not isinstance(code, int) or isinstance(code, bool):
                code = read_exit(ours, EXIT_TIMEOUT_S)
            if code is None:
                return None
            child = WarmChild.already_ended(int(answer["forked"]), code, list(request["argv"]))
            child.launched_at = in_cgroup_moment(answer.get("in_cgroup"), asked)
            return child
        finally:
            ours.close()

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


def in_cgroup_moment(reported: object, asked: datetime) -> datetime:
    """When the forked server joined its cgroup (UTC): the time the child reported as it
    did (still root, nothing of the researcher's run yet), within [the fork's request,
    now]; now when it said nothing usable (a launcher of an older gpulease)."""
    now = utcnow()
    if isinstance(reported, (int, float)) and not isinstance(reported, bool):
        try:
            moment = datetime.fromtimestamp(float(reported), UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            return now
        return min(max(moment, asked), now)
    return now


def launcher_for(python: str, make_env: Callable[[], dict[str, str]]
                 ) -> tuple[WarmLauncher, bool]:
    """The launcher of this interpreter, and whether it was there before this call;
    `make_env` (its environment, read from the hub's secrets to leave them out) is
    called only when a launcher is started, not at every server's start.

    One that failed is tried again (a new process) at most every RETRY_AFTER_S:
    an environment whose imports fail must not cost a process at every start.
    """
    launcher = _launchers.get(python)
    if launcher is not None and (
            not launcher.failure or time.monotonic() - launcher.failed_at < RETRY_AFTER_S):
        return launcher, True
    launcher = _launchers[python] = WarmLauncher(python, make_env())
    launcher.start()
    return launcher, False


def close_all() -> None:
    for launcher in _launchers.values():
        launcher.close()
    _launchers.clear()


def root_would_run_others_code(interpreter: str) -> str:
    """Why a launcher (root, when the hub is) must not run this environment: a part of
    it that an account other than root may change. Before warm starts an image's
    environment only ever ran as researchers; the launcher imports from it as root.
    Checked: the interpreter, the environment's folder, bin/ and lib/python*/
    (site-packages with them). "" when all are root's and writable by no other."""
    if os.geteuid() != 0:
        return ""  # the launcher runs as the hub's own account: nothing to gain
    prefix = Path(interpreter).parent.parent
    paths = [Path(interpreter), Path(os.path.realpath(interpreter)), prefix, prefix / "bin",
             *prefix.glob("lib/python3*"), *prefix.glob("lib/python3*/site-packages")]
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid != 0 or st.st_mode & 0o022:
            return (f"{path} may be changed by an account other than root (owner uid "
                    f"{st.st_uid}, mode {stat.filemode(st.st_mode)}), and the warm launcher "
                    "runs its environment as root")
    return ""


SCRIPT_ENTRY = "from gpulease.singleuser.launch import main"  # what the forked child runs


def check_script(script: str) -> tuple[str | None, str]:
    """The interpreter a server's script runs with, and why a launcher may not fork it
    ("" if it may): the child runs gpulease.singleuser.launch in-process, so the script
    must be that console script, and its environment one only root may change."""
    interpreter = shebang_interpreter(Path(script))
    try:
        with open(script, "rb") as f:
            head = f.read(4096).decode(errors="replace")
    except OSError:
        head = ""
    if interpreter and SCRIPT_ENTRY not in head:
        return interpreter, f"{script} is not gpulease's own server script"
    if interpreter and len(head.partition("\n")[0].split()) > 1:
        return interpreter, f"{script} passes its interpreter options (#!... -s): a fork has none"
    return interpreter, root_would_run_others_code(interpreter or "")
