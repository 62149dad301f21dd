"""At `gpulease up`: each server's sandbox on this host, set up or said to be off, and why.

`setup` makes (or finds, after a crash) the hub's bridge, removes the
namespaces no server runs in any more, loads the hub's nftables table in one
transaction, turns IPv4 forwarding on where the egress needs it (guarded so
that the host forwards nothing else), and writes the resolver file the
namespaces get. Its `SandboxPlan` gives the spawner's settings, the address
the hub API and the service listen on, and the lines of the start banner.
`teardown` removes the table and bridge when the hub stops with its servers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpulease.core.policy.sandbox_net import (
    EGRESS,
    SandboxNet,
    SandboxNetError,
    check_egress,
    nft_ruleset,
    resolv_conf,
)
from gpulease.host import netns

T = TypeVar("T")


class SandboxSetupError(RuntimeError):
    """server_sandbox = on, and the host cannot do it."""


@dataclass(frozen=True)
class SandboxPlan:
    net: SandboxNet | None  # None: off
    lines: tuple[str, ...]
    spawner: dict = field(default_factory=dict)  # LocalGPUSpawner.sandbox
    # namespaces of servers a stopped hub left running: a refused start must leave them
    # their bridge and rules
    kept: int = 0

    @property
    def host_address(self) -> str:
        """Where the hub API and the service listen: reachable from the namespaces."""
        return self.net.host_address if self.net else "127.0.0.1"


OFF_EXPOSED = ("servers share the host's network (a server can connect to another's "
               "kernels, debugger and web apps on 127.0.0.1), /dev/shm and /tmp (what they "
               "leave there outlives them, unbilled), and see every process's command line")


def off(why: str) -> SandboxPlan:
    return SandboxPlan(None, (f"Sandbox: off ({why}): {OFF_EXPOSED}",))


def why_not(*, mode: str, is_root: bool, accounts: bool) -> str:
    """Why the sandbox cannot be on here, before touching the host ("" if it may)."""
    if mode == "off":
        return "GPULeaseHub.server_sandbox = off"
    if not is_root:
        return "the hub does not run as root"
    if not accounts:
        return ("GPULeaseHub.per_user_accounts is off: every server is one account, which "
                "a hidden /proc cannot tell apart")
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed"
    return ""


def setup(*, mode: str, tag: str, pool: str, egress: str, blocked: list[str],
          host_ports: list[int], state_root: Path, is_root: bool, accounts: bool,
          resolv_source: str = "") -> SandboxPlan:
    why = why_not(mode=mode, is_root=is_root, accounts=accounts)
    if not why:
        try:
            return _in_a_thread(_setup, tag, pool, egress, blocked, host_ports, state_root,
                                resolv_source)
        except SandboxNetError:
            raise  # a setting that cannot work: said whatever the mode
        except OSError as e:
            why = f"the host cannot make it: {e}"
    if mode == "on":
        raise SandboxSetupError(f"GPULeaseHub.server_sandbox = on, but {why}")
    return off(why)


def _setup(tag: str, pool: str, egress: str, blocked: list[str], host_ports: list[int],
           state_root: Path, resolv_source: str) -> SandboxPlan:
    check_egress(egress, blocked)  # a bad setting is said before the host is touched
    net = netns.setup_bridge(tag, pool)
    removed, kept = netns.reconcile(tag)
    try:
        netns.load_ruleset(nft_ruleset(net, host_ports=host_ports, egress=egress,
                                       extra_blocked=blocked))
    except OSError:
        if not kept:  # no sandbox after all: no bridge left behind either
            netns.remove_bridge(net)
        raise
    lines = [
        f"Sandbox: each server in a network namespace of its own on bridge {net.bridge} "
        f"({net.subnet}; servers reach the hub API and the gpulease service at "
        f"{net.host_address}, nothing else of the host), with its own IPC namespace, "
        "/dev/shm and /tmp (each the profile's memory) and a /proc without other "
        "accounts' processes",
        f"Egress: {egress} ({EGRESS[egress]})"
        + (f"; also blocked: {', '.join(blocked)}" if blocked else ""),
    ]
    if removed or kept:
        lines.append(f"Sandbox: {len(removed)} namespace(s) a stopped hub left were removed, "
                     f"{len(kept)} of servers still running kept")
    if egress == "internet":
        if netns.forwarding_on():
            if netns.guard_loaded():
                lines.append("IP forwarding: on (turned on by gpulease; nft table inet "
                             "gpulease_forward_guard keeps the host from routing anything "
                             "but servers' traffic)")
            else:
                lines.append("IP forwarding: was already on for this host (its own "
                             "setting): servers' traffic is forwarded through NAT")
        else:
            netns.turn_forwarding_on()
            lines.append("IP forwarding: turned on for this host (net.ipv4.ip_forward = 1), "
                         "for the servers' NAT; nft table inet gpulease_forward_guard drops "
                         "anything forwarded that is not a gpulease server's")
    if egress == "internet":  # the host's own addresses answer no server either
        unreachable = [*blocked, net.subnet, *netns.host_addresses()]
        resolver, said = _write_resolver(state_root, resolv_source, unreachable)
    else:
        resolver, said = "", "none: with server_egress = none, servers reach no resolver"
    lines.append(f"Sandbox DNS: {said}")
    spawner = {"tag": tag, "subnet": net.subnet, "resolv_conf": resolver}
    return SandboxPlan(net, tuple(lines), spawner, len(kept))


def _write_resolver(state_root: Path, source: str, unreachable: list[str]
                    ) -> tuple[str, str]:
    """The namespaces' /etc/resolv.conf, in the state folder (bind-mounted by root)."""
    if source:  # GPULeaseHub.sandbox_resolv_conf: a lab's own
        body, said = resolv_conf(_read(source), unreachable=unreachable)
        said = f"{said} from {source}"
    else:
        body, said = resolv_conf(_read("/etc/resolv.conf"),
                                 _read("/run/systemd/resolve/resolv.conf"), unreachable)
    if not body:
        return "", said
    folder = state_root / "sandbox"
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / "resolv.conf"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(body)
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return str(path), said


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def teardown(plan: SandboxPlan) -> None:
    """The hub stops with its servers: its table and bridge go; forwarding, where
    gpulease turned it on, goes back off with the last gpulease bridge."""
    if plan.net is None:
        return
    from gpulease.spawners.local.sandbox import close_pools

    def undo(net: SandboxNet) -> None:
        close_pools()
        netns.remove_table(net.table)
        netns.remove_bridge(net)
        netns.forwarding_off_if_last()

    _in_a_thread(undo, plan.net)


def _in_a_thread(fn: Callable[..., T], *args) -> T:
    """pyroute2's netlink sockets run an event loop of their own: never on the hub's
    (its start and cleanup run on it), so in a thread of their own, waited for."""
    with ThreadPoolExecutor(1, thread_name_prefix="gpulease-sandbox") as pool:
        return pool.submit(fn, *args).result()
