"""Each local server's sandbox, from the hub's side: its network namespace, taken ready.

Namespaces are made ahead, a few at a time, by a thread (gpulease.host.netns:
about 25 ms of netlink each), so that a start only takes one: the sandbox adds
no netlink or nftables call to the spawn path. The server's process enters it
itself, as root, before it becomes the researcher (gpulease.singleuser.sandbox):
the spec below says with what. A stop drops the namespace's name; the kernel
frees it with the last process of the server.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulease.core.policy.sandbox_net import SandboxNet, next_index
from gpulease.host import netns

log = logging.getLogger(__name__)

READY = 2  # namespaces kept made ahead: two starts at once take none from the spawn path


@dataclass(frozen=True)
class Sandbox:
    """One server's network namespace: its name, file and address."""

    index: int
    name: str
    path: str
    address: str

    def state(self) -> dict:
        return {"index": self.index, "name": self.name, "path": self.path,
                "address": self.address}

    @classmethod
    def from_state(cls, state: dict) -> Sandbox:
        return cls(int(state["index"]), state["name"], state["path"], state["address"])


def enter_spec(sandbox: Sandbox, *, memory_bytes: int, resolv_conf: str,
               needed: Iterable[str] = ()) -> dict:
    """What gpulease.singleuser.sandbox.enter is given: /dev/shm and /tmp each as large
    as the profile's memory (PyTorch's DataLoader and NCCL want a large /dev/shm; the
    memory cgroup bounds both together); of the paths the server needs (its home and
    state folder, its environment, its device nodes), those under /tmp, which its own
    /tmp would hide otherwise."""
    under_tmp = sorted({p for p in (os.path.realpath(q) for q in needed if q)
                        if p.startswith("/tmp/")})
    keep = [p for p in under_tmp  # a path inside another kept one comes with it
            if not any(p.startswith(k + "/") for k in under_tmp if k != p)]
    return {"netns": sandbox.path, "shm_bytes": memory_bytes, "tmp_bytes": memory_bytes,
            "resolv_conf": resolv_conf, "keep_in_tmp": keep}


def source_root() -> str:
    """Where the server's own gpulease code is read from: the checkout of an editable
    install (its package folders are mapped from there), else the installed package."""
    import gpulease.singleuser

    return str(Path(gpulease.singleuser.__file__).resolve().parent.parent)


class NamespacePool:
    """This hub's namespaces: made ahead, taken by starts, dropped at stops."""

    def __init__(self, net: SandboxNet, ready: int = READY, background: bool = True) -> None:
        self.net = net
        self.ready_target = ready
        self.background = background  # False: take() refills nothing (tests fill by hand)
        self._lock = threading.Lock()
        self._ready: list[Sandbox] = []
        self._taken: set[int] = set()
        self._making: set[int] = set()
        self._last = -1
        self._filling = False
        self._closed = False

    def adopt(self, sandbox: Sandbox) -> None:
        """A server still running from before a hub restart keeps its namespace."""
        with self._lock:
            self._taken.add(sandbox.index)

    def _reserve(self) -> int:
        with self._lock:
            used = {*self._taken, *self._making, *(s.index for s in self._ready)}
            index = next_index(used, self._last)
            if index is None:
                raise netns.NetnsError(0, f"all {len(used)} server namespaces of this hub "
                                          "are in use")
            self._last = index
            self._making.add(index)
            return index

    def _make(self) -> Sandbox:
        index = self._reserve()
        try:
            path = netns.create_netns(self.net, index)
        finally:
            with self._lock:
                self._making.discard(index)
        return Sandbox(index, self.net.netns_name(index), str(path), self.net.address(index))

    def take(self) -> Sandbox:
        """A ready namespace (made now if none is: blocking, run in a thread)."""
        with self._lock:
            sandbox = self._ready.pop(0) if self._ready else None
            if sandbox is not None:
                self._taken.add(sandbox.index)
        if sandbox is None:
            sandbox = self._make()
            with self._lock:
                self._taken.add(sandbox.index)
        self.fill_in_background()
        return sandbox

    def drop(self, sandbox: Sandbox) -> None:
        """A stopped server's namespace: its name removed (blocking). Never raises: a
        name that cannot be removed is logged and its number kept out of use (its file
        is still there), and the server's stop goes on. That happens when /run/netns was
        bound onto itself after the namespace was made (`ip netns add` does so where
        /run/netns is no mount point yet, as do CNI plugins): the namespace's mount is
        then hidden under the bind, and unlinking its file fails with EBUSY."""
        try:
            netns.remove_netns(sandbox.name)
        except OSError as e:
            log.error("cannot remove the network namespace %s of a stopped server (its "
                      "number stays out of use): %s", sandbox.name, e)
            return
        with self._lock:
            self._taken.discard(sandbox.index)

    def fill(self) -> None:
        """Make namespaces until `ready_target` are ready (blocking)."""
        while True:
            with self._lock:
                if self._closed or len(self._ready) + len(self._making) >= self.ready_target:
                    return
            try:
                made = self._make()
            except OSError as e:
                log.error("cannot make a server namespace ahead: %s", e)
                return
            with self._lock:
                if self._closed:
                    netns.remove_netns(made.name)
                    return
                self._ready.append(made)

    def fill_in_background(self) -> None:
        with self._lock:
            if self._filling or self._closed or not self.background:
                return
            self._filling = True

        def run() -> None:
            try:
                self.fill()
            finally:
                with self._lock:
                    self._filling = False

        threading.Thread(target=run, name="gpulease-netns-fill", daemon=True).start()

    def close(self) -> None:
        """The hub stops: the namespaces made ahead go (servers' own at their stops)."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        for sandbox in ready:
            netns.remove_netns(sandbox.name)


_pools: dict[tuple[str, str], NamespacePool] = {}
_pools_lock = threading.Lock()


def pool_for(tag: str, subnet: str) -> NamespacePool:
    """The hub process's one pool for its bridge."""
    with _pools_lock:
        pool = _pools.get((tag, subnet))
        if pool is None:
            pool = _pools[(tag, subnet)] = NamespacePool(SandboxNet(tag, subnet))
        return pool


def close_pools() -> None:
    """The hub stops: every pool's namespaces made ahead go."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
