"""The warm launcher: a process that has imported the server and forks servers on demand.

A server's start is mostly Python importing the same modules every time
(jupyter_server, JupyterLab, JupyterHub's single-user extension: ~1.4 s of
~1.8 s, bench/click_to_kernel_profile.md). The hub starts this launcher once,
with a clean environment and no descriptor of its own but the control socket
(gpulease.spawners.local.warm_start): it is a new program, not a fork of the hub, so
nothing of the hub (secrets, tokens, database handles) is in its memory. It
imports the server's modules, says it is ready, and then only waits.

For each server the hub sends, over the control socket, one end of a fresh
socket pair and the write end of the server's output (its own log's pipe). The
launcher forks at once, hands both to the child, keeps neither, and never
reads what comes on the socket: the
child reads its own request (gpulease.singleuser.warm_child), so no server's
token ever passes through the launcher's memory and no later server can
inherit another's. The launcher writes there the pid it forked (which the hub
trusts, not anything the child says) and, when it reaps the child, its exit
status, which the hub reads as Popen's returncode.

Run as `python -m gpulease.singleuser.warm_launcher CONTROL_FD`; it ends when
the hub closes the control socket (the servers it started run on).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import threading

from gpulease import skip_rfc3987_grammar

# What every server imports before it answers, in the order it does (python -X
# importtime of a server): what fails to import here (an environment without
# JupyterLab) is imported by the server itself, as in a cold start.
WARM_MODULES = (
    "jupyter_server.serverapp",
    "jupyterhub.singleuser",
    "jupyterhub.singleuser.extension",
    "jupyterlab.labapp",
    "jupyter_server_terminals",
    "jupyter_lsp",
    "notebook_shim",
    "jupyter_server.services.kernels.kernelmanager",
    "jupyter_server.services.sessions.sessionmanager",
    "gpulease.singleuser.activity",
    "gpulease.singleuser.activity_push",
    "gpulease.singleuser.notices",
    "gpulease.singleuser.gpu_status",
    "gpulease.singleuser.ws_token",
    "gpulease.singleuser.kernel_pool",
)


def preimport() -> list[str]:
    """Import WARM_MODULES; the names that could not be imported."""
    skip_rfc3987_grammar()
    missing = []
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the server imports it (and says why) itself
            missing.append(name)
    return missing


def serve(control: socket.socket) -> tuple[int, int] | None:
    """Fork a server for each socket the hub sends; report each one's pid and exit on it.

    Returns None in the parent when the hub closes the control socket, and, in
    each forked child, the descriptors of its request socket and of its output
    (-1: none was sent; the caller runs the server with them). The parent only
    ever writes to those sockets, and never waits to: what a researcher does
    with their end cannot stop it.
    """
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    waiting = select.poll()  # not select(): the hub's descriptor number may be over 1024
    waiting.register(control, select.POLLIN)
    waiting.register(wake_r, select.POLLIN)
    children: dict[int, int] = {}  # pid -> the hub's request socket (kept to report exit)
    while True:
        try:
            ready = {fd for fd, _ in waiting.poll()}
        except InterruptedError:
            ready = set()
        if wake_r in ready:
            os.read(wake_r, 512)
        _reap(children)
        if control.fileno() not in ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(control, 16, 4)
        except OSError:
            fds, msg = [], b""
        if not msg:
            return None  # the hub is gone; the servers run on
        for extra in fds[2:]:
            os.close(extra)
        if not fds:
            continue
        output = fds[1] if len(fds) > 1 else -1
        if threading.active_count() != 1:  # a fork must copy one thread only
            _send_nowait(fds[0], {"error": "the warm launcher has threads"})
            os.close(fds[0])
            if output >= 0:
                os.close(output)
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w, control.detach(), *children.values()):
                os.close(fd)
            return fds[0], output
        if output >= 0:  # the child's alone: its log ends when the server's processes do
            os.close(output)
        # The hub trusts this pid, the launcher's (root's) word, not the child's.
        _send_nowait(fds[0], {"forked": pid})
        children[pid] = fds[0]


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is None:
            continue
        # Popen's returncode: -N for signal N. Lost if the socket is full (the hub
        # then knows the end from its pidfd) or gone (a hub restarted: it polls the pid).
        _send_nowait(fd, {"exit": os.waitstatus_to_exitcode(status)})
        os.close(fd)


def _send_nowait(fd: int, message: dict) -> None:
    sock = socket.socket(fileno=fd)
    try:
        sock.send(json.dumps(message).encode() + b"\n", socket.MSG_DONTWAIT)
    except OSError:
        pass
    finally:
        sock.detach()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    missing = preimport()
    control.sendall(json.dumps({"ready": os.getpid(), "missing": missing}).encode() + b"\n")
    forked = serve(control)
    if forked is None:
        return 0
    from gpulease.singleuser.warm_child import run_server

    return run_server(*forked)


if __name__ == "__main__":
    sys.exit(main())
