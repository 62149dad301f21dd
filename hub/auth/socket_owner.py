"""Which local user owns the other end of a TCP connection (Linux, /proc/net/tcp).

The hub's own configurable-http-proxy connects from loopback, and so does
every process on the machine, users' servers included. What tells them apart
is who owns the connecting socket: the proxy is the hub's child, running as
the hub's user; servers run as their users' own accounts. Linux lists every
TCP socket of the network namespace with its owner's uid in /proc/net/tcp and
/proc/net/tcp6, as identd reads it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpulease.hub.auth.client_address import normalise

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
ESTABLISHED = "01"

Endpoint = tuple[str, int]


def _address(field: str) -> Endpoint | None:
    # "0100007F:1F90": the address as the kernel's 32-bit words in host byte
    # order, then the port in hex.
    hex_ip, _, hex_port = field.partition(":")
    words = [int(hex_ip[i : i + 8], 16) for i in range(0, len(hex_ip), 8)]
    family = socket.AF_INET if len(words) == 1 else socket.AF_INET6
    ip = normalise(socket.inet_ntop(family, struct.pack(f"={len(words)}I", *words)))
    return (ip, int(hex_port, 16)) if ip else None


def connections(text: str) -> Iterator[tuple[Endpoint, Endpoint, int]]:
    """(local, remote, uid) of each established socket in a /proc/net/tcp{,6} text."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[3] != ESTABLISHED:
            continue
        local, remote = _address(fields[1]), _address(fields[2])
        if local and remote:
            yield local, remote, int(fields[7])


def _needle(endpoint: Endpoint) -> str:
    # How the kernel writes `endpoint` (see _address). An IPv4 address mapped
    # into IPv6 (tcp6) ends in the same word, so this finds those lines too.
    ip, port = endpoint
    packed = socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def owner_uid(local: Endpoint, remote: Endpoint | None, texts: Iterable[str]) -> int | None:
    """The uid owning the socket bound to `local` and connected to `remote` (any, if None)."""
    needle = _needle(local)
    for text in texts:
        # A busy host lists thousands of sockets (TIME_WAIT ones too): only the
        # few lines that contain the address are parsed.
        lines = [line for line in text.splitlines() if needle in line]
        for this, other, uid in connections("\n" + "\n".join(lines)):
            if this == local and (remote is None or other == remote):
                return uid
    return None


def read_tables() -> list[str] | None:
    """The texts of /proc/net/tcp and tcp6; None where neither can be read (not Linux)."""
    texts = []
    for table in TABLES:
        try:
            texts.append(table.read_text())
        except OSError:
            continue
    return texts or None


# --- the hub side: tornado requests ------------------------------------------


def _endpoint(address: Any) -> Endpoint | None:
    if isinstance(address, tuple) and len(address) >= 2:
        ip = normalise(str(address[0]))
        if ip is not None:
            return ip, int(address[1])
    return None


def peer_and_local(request: Any) -> tuple[Endpoint | None, Endpoint | None]:
    """The hub connection's peer (tornado keeps the socket's own address there,
    whatever headers say) and the hub's end of it."""
    connection = getattr(request, "connection", None)
    peer = _endpoint(getattr(getattr(connection, "context", None), "address", None))
    sock = getattr(getattr(connection, "stream", None), "socket", None)
    try:
        local = _endpoint(sock.getsockname()) if sock is not None else None
    except OSError:
        local = None
    return peer, local


class ProxyPeers:
    """Whether a connection to the hub comes from the hub's own proxy.

    configurable-http-proxy is the hub's child: its socket to the hub belongs
    to the hub's user, while users' servers, which connect from loopback too,
    run as their own accounts. Reading the socket tables costs milliseconds
    (tens on a host with thousands of sockets), so it is done off the event
    loop, once per connection: the proxy keeps its connections to the hub
    open, and tornado keeps one request context per connection.
    """

    def __init__(self, log: Any) -> None:
        self.log = log
        self._known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulease-peer")
        self._warned = False

    async def is_own_proxy(self, request: Any, peer: Endpoint, local: Endpoint | None) -> bool:
        context = getattr(getattr(request, "connection", None), "context", None)
        try:
            return self._known[context]
        except (KeyError, TypeError):
            pass
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self._reader, self._decide, peer, local)
        try:
            self._known[context] = answer
        except TypeError:
            pass  # not weakly referenceable: decided again next time
        return answer

    def _decide(self, peer: Endpoint, local: Endpoint | None) -> bool:
        tables = read_tables()
        if tables is None:
            # No /proc/net/tcp (not Linux): loopback is all that can be told.
            if not self._warned:
                self._warned = True
                self.log.warning("Cannot read /proc/net/tcp: trusting X-Forwarded-For "
                                 "from every loopback peer for login throttling")
            return ipaddress.ip_address(peer[0]).is_loopback
        return owner_uid(peer, local, tables) == os.geteuid()


class ProxyHosts:
    """Whether a peer is the hub's own proxy running elsewhere: at an address one of
    `hosts` resolves to (the Helm chart's proxy pod, behind a headless Service whose
    name resolves to the ready proxy pods' addresses). A proxy pod's address changes
    when it is replaced, so names are resolved again after `ttl_s`."""

    def __init__(self, hosts: Iterable[str], ttl_s: float = 30.0, log: Any = None) -> None:
        self.hosts = tuple(hosts)
        self.ttl_s = ttl_s
        self.log = log
        self._addresses: frozenset[str] = frozenset()
        self._resolved_at = float("-inf")

    async def has(self, peer: str, now: float) -> bool:
        if not self.hosts:
            return False
        if now - self._resolved_at >= self.ttl_s or peer not in self._addresses:
            if now - self._resolved_at >= min(self.ttl_s, 1.0):  # at most once a second
                self._addresses = await self._resolve()
                self._resolved_at = now
        return peer in self._addresses

    async def _resolve(self) -> frozenset[str]:
        loop = asyncio.get_running_loop()
        found: set[str] = set()
        for host in self.hosts:
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as e:
                if self.log is not None:
                    self.log.warning("proxy_hosts: cannot resolve %s (%s)", host, e)
                continue
            found.update(a for a in (normalise(i[4][0]) for i in infos) if a)
        return frozenset(found)
