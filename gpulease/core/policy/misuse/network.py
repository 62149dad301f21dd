"""Signal (b): a server's outbound connections against the admin's list of addresses,
networks and ports, and the plain Stratum V1 handshake in their first bytes.

The scan (the hub's, in the server's own network namespace or from Falco in the
cluster shape) reports each connection the server opened: the remote address and
port, the protocol, the pid where known, and, for a TCP connection, the first bytes
it sent where they were captured. This module matches them:

- a `NetworkEntry` names addresses and networks (CIDRs; a single address is its /32
  or /128), ports, or both, optionally one protocol. It matches a connection whose
  address is in one of its networks (or it names none) and whose port is one of its
  ports (or it names none). An entry with addresses is a NETWORK_ADDRESS signal: the
  pool's own address is strong evidence, and the only one a TLS pool leaves. An entry
  with ports alone is a NETWORK_PORT signal: miners' usual ports (3333, 4444, 5555,
  7777, 14444 ...) are also other software's (Selenium Grid listens on 4444, Flower
  on 5555), so the shipped policy only warns on it (`decision.MisusePolicy`);
- the payload's first bytes are read for the Stratum handshake (`stratum`): a STRATUM
  signal, whatever the address and port.

IPv4 addresses mapped into IPv6 (`::ffff:203.0.113.7`, as a dual-stack socket shows
them) match the IPv4 entries. Names are not resolved here: a pool known by its name is
listed by the addresses it resolves to (the hub's job to refresh). A signal names the
entry by its id only; its description is for admins.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulease.core.policy.misuse.evidence import (
    NETWORK_ADDRESS,
    NETWORK_PORT,
    STRATUM,
    STRATUM_RULE_ID,
    Signal,
    check_entry_id,
    description_of,
    entries_from_spec,
)
from gpulease.core.policy.misuse.stratum import StratumRules, stratum_handshake

PROTOCOLS = ("tcp", "udp")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Connection:
    """One outbound connection of a server, as the scan saw it."""

    remote: str  # the remote address, IPv4 or IPv6
    port: int  # the remote port
    protocol: str = "tcp"  # "tcp" or "udp"
    at: float = 0.0  # when it was opened (or first seen)
    pid: int | None = None  # the process that opened it, where known
    first_bytes: bytes = b""  # what it sent first, where captured (TCP only)


@dataclass(frozen=True)
class NetworkEntry:
    """One entry of the network list, with the admin's description."""

    id: str
    networks: tuple[str, ...] = ()  # addresses and CIDRs: "203.0.113.7", "198.51.100.0/24"
    ports: tuple[int, ...] = ()
    protocol: str | None = None  # "tcp", "udp", or None for either
    description: str = ""  # for admins only: never in a signal, an error or a page of users
    _parsed: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_entry_id(self.id, "network list entry")
        networks = (self.networks,) if isinstance(self.networks, str) else tuple(self.networks)
        ports = tuple(self.ports)
        object.__setattr__(self, "networks", networks)
        object.__setattr__(self, "ports", ports)
        if not networks and not ports:
            raise ValueError(f"network list entry {self.id!r}: name addresses, ports or both")
        parsed = []
        for text in networks:
            try:
                parsed.append(ipaddress.ip_network(str(text).strip(), strict=False))
            except ValueError:
                raise ValueError(f"network list entry {self.id!r}: {text!r} is not an IP "
                                 "address or network (e.g. 203.0.113.7, 198.51.100.0/24)"
                                 ) from None
        object.__setattr__(self, "_parsed", tuple(parsed))
        bad = [p for p in ports if isinstance(p, bool) or not isinstance(p, int)
               or not 1 <= p <= 65535]
        if bad:
            raise ValueError(f"network list entry {self.id!r}: ports must be 1-65535, not "
                             f"{', '.join(map(repr, bad))}")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"network list entry {self.id!r}: protocol {self.protocol!r} is "
                             f"not one of {', '.join(PROTOCOLS)}")

    @property
    def kind(self) -> str:
        """The signal it gives: NETWORK_ADDRESS where it names addresses, else NETWORK_PORT."""
        return NETWORK_ADDRESS if self.networks else NETWORK_PORT

    def matches(self, address: IPAddress, port: int, protocol: str) -> bool:
        if self.protocol is not None and protocol != self.protocol:
            return False
        if self.ports and port not in self.ports:
            return False
        return not self._parsed or any(address in n for n in self._parsed)


@dataclass(frozen=True)
class NetworkDenyList:
    """The admin's network entries and the Stratum rules."""

    entries: tuple[NetworkEntry, ...] = ()
    stratum: StratumRules = StratumRules()
    detect_stratum: bool = True
    # Entries by each single address they name (a pool list is mostly those), and the
    # positions of the others (networks wider than one address, ports alone): a
    # connection is checked against its address's entries and those only.
    _by_address: dict[IPAddress, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _others: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        object.__setattr__(self, "entries", entries)
        ids = [e.id for e in entries]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"network list: ids used more than once: {', '.join(twice)}")
        by_address: dict[IPAddress, list[int]] = {}
        others = []
        for n, entry in enumerate(entries):
            hosts = [net for net in entry._parsed if net.num_addresses == 1]
            for net in hosts:
                by_address.setdefault(net.network_address, []).append(n)
            if len(hosts) < len(entry._parsed) or not entry._parsed:
                others.append(n)
        object.__setattr__(self, "_by_address", {a: tuple(dict.fromkeys(ns))
                                                 for a, ns in by_address.items()})
        object.__setattr__(self, "_others", tuple(others))

    @classmethod
    def from_spec(cls, items: Iterable[Mapping[str, object]], **options) -> NetworkDenyList:
        """A list from plain values (an admin's file or API body): every problem in one
        ValueError, each naming its entry."""
        known = {"id", "networks", "ports", "protocol", "description"}
        return cls(entries_from_spec(items, NetworkEntry, known, "network list"), **options)

    def description_of(self, entry_id: str) -> str:
        """An entry's description, for the admins' incident page."""
        return description_of(self.entries, entry_id)


def _address(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def match_connection(conn: Connection, deny: NetworkDenyList, at: float | None = None
                     ) -> list[Signal]:
    """The signals of one connection: each list entry it matches, then Stratum."""
    when = conn.at if at is None else at
    detail = (("remote", conn.remote), ("port", str(conn.port)), ("protocol", conn.protocol),
              *((("pid", str(conn.pid)),) if conn.pid is not None else ()))
    found = []
    address = _address(conn.remote)
    if address is not None:
        candidates = sorted({*deny._by_address.get(address, ()), *deny._others})
        for n in candidates:
            entry = deny.entries[n]
            if entry.matches(address, conn.port, conn.protocol):
                found.append(Signal(entry.kind, entry.id, when, detail))
    if deny.detect_stratum and conn.protocol == "tcp" and conn.first_bytes:
        match = stratum_handshake(conn.first_bytes, deny.stratum)
        if match is not None:
            found.append(Signal(STRATUM, STRATUM_RULE_ID, when,
                                (*detail, ("method", match.method))))
    return found


def match_connections(conns: Sequence[Connection], deny: NetworkDenyList,
                      at: float | None = None) -> list[Signal]:
    """The signals of all of a server's connections, in their order."""
    return [s for conn in conns for s in match_connection(conn, deny, at)]
