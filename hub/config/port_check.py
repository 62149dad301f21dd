"""At `gpulease up`, before anything starts: the hub's own ports are free.

A port another program holds is found by binding it (and letting go at once),
before any secret could be sent to whatever listens there: JupyterHub, finding
something on the proxy's API port, takes it for its proxy and sends it the
proxy's token.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from pathlib import Path


def taken_ports(wanted: Iterable[tuple[str, str, int]]) -> list[str]:
    """One line per (what, host, port) that cannot be bound here, naming it."""
    problems = []
    for what, host, port in wanted:
        if not port:
            continue  # 0: a free one is picked at bind
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # As the listener itself will: a port left in TIME_WAIT is free to it.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                why = ("another program listens there" if e.errno == errno.EADDRINUSE
                       else e.strerror)
                problems.append(f"port {port} on {host}, {what}, is taken ({why})")
    return problems


def previous_proxy_runs(pid_file: str) -> bool:
    """Whether the proxy this state folder's hub started last still runs (a hub killed
    with SIGKILL leaves it): its ports are then held by our own, which JupyterHub
    stops before it starts the new one."""
    import psutil

    try:
        pid = int(Path(pid_file).read_text().strip())
        return any("configurable-http-proxy" in part for part in psutil.Process(pid).cmdline())
    except (OSError, ValueError, psutil.Error):
        return False
