"""What the client of bench/billing.py sees of a named server's life, on the millisecond.

  start    From the moment the start's POST is sent, the client looks among the
           hub's descendants for the server's process (its environment names the
           user and server, and JUPYTERHUB_SERVICE_URL its own address); the
           kernel's record of when that process was made (/proc/PID/stat
           starttime, to its clock tick: 10 ms) is the client's start, the
           server's launch, from which its code can run. It then polls the
           server's own address (`.../user/U/S/api`) every POLL_S; its first
           HTTP answer (the "answer lag" after the launch) and the first 200 of
           `/user/U/S/api/status` through the proxy, polled once the POST is
           answered (JupyterHub's wait_up and the route: the "proxy lag"), are
           shown as information.
  end      The moment the server's process is seen ended by the client, on its
           pidfd (readable once all its threads ended; /proc polling every
           POLL_S without pidfds), watched from the moment the stop's DELETE
           is sent: billing ends when the last of
           the server ended (the bench's servers leave nothing running). The
           DELETE's answer (204: JupyterHub answers once the spawner's stop
           returned and its own bookkeeping is done) comes after it, shown as
           "bookkeeping", as information. A 202 (slower than
           slow_stop_timeout) then polls the user model until the server is
           gone, and the run is flagged.
  removal  A stopped named server is then removed (DELETE with {"remove": true}),
           as a client does, so that a user's named_server_limit_per_user (5)
           is never reached; the billing sessions stay in gpulease's table.
"""

from __future__ import annotations

import http.client
import os
import select
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests

from bench.procs import descendants
from gpulease.site_urls import SiteURLs, loopback_session

POLL_S = 0.005  # the client's polling of the server's own port (the hub's: 10 ms)
PROXY_POLL_S = 0.01  # through the proxy, once the start's POST is answered
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
START_BODY = {"user_options": {"profile": "cpu"}}


class Aborted(Exception):
    """Ctrl-C (or a failed sibling) asked the worker threads to stop."""


@dataclass
class Run:
    """One server's life as the client saw it (wall-clock Unix times, seconds)."""

    server: str
    length_s: float
    post_sent: float = 0.0
    pid: int = 0  # the server's process
    launched: float = 0.0  # its process made (the kernel's starttime, to 10 ms)
    first_answer: float = 0.0  # first answer on the server's own port
    exited: float = 0.0  # its process seen ended
    proxy_ready: float = 0.0  # first 200 through the proxy
    stop_done: float = 0.0  # DELETE answered 204 (or, slow stop, seen gone)
    slow_stop: bool = False  # DELETE answered 202: stop_done comes from polling

    @property
    def client_ms(self) -> float:
        return ((self.exited or self.stop_done) - self.launched) * 1000

    @property
    def answer_lag_ms(self) -> float:
        """From the launch to the first answer: billed, as the server's code ran."""
        return (self.first_answer - self.launched) * 1000

    @property
    def bookkeeping_ms(self) -> float:
        """From the process's end to the DELETE's answer: JupyterHub's part of a stop."""
        return (self.stop_done - self.exited) * 1000 if self.exited else 0.0

    @property
    def proxy_lag_ms(self) -> float:
        return (self.proxy_ready - self.first_answer) * 1000


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from every one of its threads."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids.extend(int(k) for k in (task / "children").read_text().split())
        except OSError:
            continue
    return kids


def _environ(pid: int) -> dict[bytes, bytes]:
    """The environment `pid` was exec'd with ({} if it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def server_process(hub_pid: int, user: str, server: str,
                   deep: bool = False) -> tuple[int, dict[bytes, bytes]]:
    """The pid and environment of the hub's child that runs user/server ((0, {}) if
    none yet).

    Between fork and exec the child still has the hub's environment; it is
    found once it runs the server's command. `deep`: all descendants, for a
    server started through a wrapper process."""
    want = {b"JUPYTERHUB_USER": user.encode(), b"JUPYTERHUB_SERVER_NAME": server.encode()}
    for pid in descendants(hub_pid) if deep else _children(hub_pid):
        env = _environ(pid)
        if all(env.get(k) == v for k, v in want.items()) and b"JUPYTERHUB_SERVICE_URL" in env:
            return pid, env
    return 0, {}


def process_started(pid: int) -> float:
    """When process `pid` was made (wall clock, seconds): the kernel's starttime, in
    clock ticks since boot (10 ms), moved onto the wall clock through CLOCK_BOOTTIME,
    the clock it is counted on."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def watch_end(run: Run, stop: threading.Event) -> threading.Thread:
    """A thread that sets run.exited when the server's process ends: its pidfd turns
    readable once every thread of it has ended (/proc shows its main thread a
    zombie while the others still run: ~10-20 ms early for JupyterLab); /proc
    polling where pidfds are missing."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(run.pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                while not stop.is_set():
                    if select.select([fd], [], [], 0.5)[0]:
                        run.exited = time.time()
                        return
            finally:
                os.close(fd)
            return
        while not stop.is_set():
            if _ended(run.pid):
                run.exited = time.time()
                return
            time.sleep(POLL_S)

    thread = threading.Thread(target=watch, name=f"end-{run.server}", daemon=True)
    thread.start()
    return thread


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` gave an HTTP answer (any status). A refused connection on
    loopback costs microseconds, so polling every few ms is cheap."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path)
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class Client:
    """Starts, stops and removes named servers of one user, timing what it sees."""

    def __init__(self, hub_url: str, hub_pid: int, user: str, token: str,
                 abort: threading.Event, urls: SiteURLs) -> None:
        self.hub_url, self.hub_pid, self.user = hub_url, hub_pid, user
        self.token, self.abort = token, abort
        self.urls = urls  # the user's servers are on an origin of their own

    def session(self) -> requests.Session:
        s = loopback_session()  # USER.localhost is loopback, resolver or not
        s.headers["Authorization"] = f"token {self.token}"
        return s

    def _server_api(self, name: str) -> str:
        return f"{self.hub_url}/hub/api/users/{self.user}/servers/{name}"

    def _check(self, posted: Future, name: str, deadline: float) -> None:
        if self.abort.is_set():
            raise Aborted
        if posted.done() and posted.result().status_code not in (201, 202):
            r = posted.result()
            raise RuntimeError(f"start {name}: {r.status_code} {r.text}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: not up after {READY_TIMEOUT_S} s")

    def start(self, run: Run) -> None:
        """Start the server; return at its first 200 through the proxy, the start
        answered, with run.first_answer and run.proxy_ready set."""
        name, deadline = run.server, time.monotonic() + READY_TIMEOUT_S
        # The POST is answered only once the spawn completed (route added), so it
        # runs in a thread of its own while this one watches; sessions are not shared.
        with self.session() as poster, self.session() as http, ThreadPoolExecutor(1) as pool:
            run.post_sent = time.time()
            posted = pool.submit(poster.post, self._server_api(name), json=START_BODY,
                                 timeout=READY_TIMEOUT_S)
            tries, env = 0, {}
            while not env:
                self._check(posted, name, deadline)
                run.pid, env = server_process(self.hub_pid, self.user, name,
                                              deep=tries % 20 == 19)
                tries += 1
                if not env:
                    time.sleep(POLL_S)
            run.launched = process_started(run.pid)
            own = env[b"JUPYTERHUB_SERVICE_URL"].decode().rstrip("/") + "/api"
            while not answers(own):
                self._check(posted, name, deadline)
                time.sleep(POLL_S)
            run.first_answer = time.time()
            # The proxy is polled only once the POST is answered (JupyterHub answers
            # once it added the route): each miss before that is a page the hub
            # renders on its event loop, the very loop that is timing this session's
            # start and the others' starts and ends.
            posted.result()
            self._check(posted, name, deadline)
            status = self.urls.server(self.user, name, "api/status")
            while True:
                self._check(posted, name, deadline)
                try:
                    if http.get(status, allow_redirects=False, timeout=10).status_code == 200:
                        run.proxy_ready = time.time()
                        break
                except requests.RequestException:
                    pass
                time.sleep(PROXY_POLL_S)

    def stop(self, run: Run) -> None:
        """Stop the server; run.exited is when its process was seen ended, run.stop_done
        when the DELETE was answered 204 (a 202: when the hub no longer lists the
        server, and run.slow_stop)."""
        done = threading.Event()
        watcher = watch_end(run, done) if run.pid else None
        try:
            self._stop(run)
        finally:
            if watcher is not None:
                watcher.join(STOP_TIMEOUT_S)
            done.set()
        if watcher is not None and not run.exited:
            raise RuntimeError(f"stop {run.server}: answered, but its process {run.pid} runs")

    def _stop(self, run: Run) -> None:
        with self.session() as http:
            r = http.delete(self._server_api(run.server), timeout=STOP_TIMEOUT_S)
            answered = time.time()
            if r.status_code == 204:
                run.stop_done = answered
                return
            if r.status_code != 202:
                raise RuntimeError(f"stop {run.server}: {r.status_code} {r.text}")
            run.slow_stop = True
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline:
                model = http.get(f"{self.hub_url}/hub/api/users/{self.user}", timeout=30).json()
                if run.server not in model.get("servers", {}):
                    run.stop_done = time.time()
                    return
                if self.abort.wait(POLL_S):
                    raise Aborted
            raise TimeoutError(f"{run.server}: still listed {STOP_TIMEOUT_S} s after its stop")

    def remove(self, name: str) -> None:
        """Remove the stopped named server (JupyterHub deletes its record)."""
        with self.session() as http:
            r = http.delete(self._server_api(name), json={"remove": True}, timeout=STOP_TIMEOUT_S)
            if r.status_code != 204:
                raise RuntimeError(f"remove {name}: {r.status_code} {r.text}")
            model = http.get(f"{self.hub_url}/hub/api/users/{self.user}",
                             params={"include_stopped_servers": "1"}, timeout=30).json()
            if name in model.get("servers", {}):
                raise RuntimeError(f"remove {name}: answered 204 but still listed")
