"""The network of the embedded box's server sandboxes, decided as plain values.

Each server runs in a network namespace of its own (gpulease.host.netns makes
them). Its one interface is a veth whose host end sits on the hub's bridge as an
*isolated* port: the bridge forwards nothing between two servers, only between a
server and the host. The host's address on the bridge is where a server reaches
the hub API and the gpulease service, and nothing else of the host; what it may
reach outside is the egress setting (`EGRESS`). This module says which
addresses, names and nftables rules that is; it touches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# What a server may reach beyond the host (GPULeaseHub.server_egress).
EGRESS = {
    "internet": "other networks, through NAT, but never the host's own ports, another "
                "server or the cloud metadata address",
    "none": "nothing beyond the hub API and the gpulease service",
}
# Never reachable from a server, whatever the egress: the cloud metadata service
# (its credentials are the machine's) and the rest of IPv4 link-local.
ALWAYS_BLOCKED = ("169.254.0.0/16",)
# Where every server listens, in its own namespace (no other server can take it).
SERVER_PORT = 8888
# Interface names: the bridge glbr<tag>, a server's host end glv<tag><n> (Linux allows 15).
BRIDGE_PREFIX = "glbr"
VETH_PREFIX = "glv"
TABLE_PREFIX = "gpulease_"
# The table that keeps a host gpulease made a router from routing anything else.
FORWARD_GUARD_TABLE = "gpulease_forward_guard"
MAX_SERVERS = 250  # per hub: the host ends of one /24 (.2 to .251)
# Connections one server may have tracked at once through the host's NAT: the host's
# connection-tracking table (262,144 entries by default) is shared by the whole box,
# and a full one drops every new connection on it (the proxy's, SSH).
CONNTRACK_PER_SERVER = 4096
# What a server's refused connection gets: an answer at once (its code fails fast,
# saying so), never a silent drop it waits out. Inbound from outside is dropped.
REJECT = "reject with icmpx admin-prohibited"


class SandboxNetError(ValueError):
    """A sandbox network setting that cannot work, said with what is allowed."""


@dataclass(frozen=True)
class SandboxNet:
    """One hub's bridge and the addresses of its servers' namespaces."""

    tag: str  # gpulease.spawners.local.isolation.hub_tag: two hubs on a host differ
    subnet: str  # a /24, e.g. "10.213.0.0/24"

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.tag}"

    @property
    def table(self) -> str:
        return f"{TABLE_PREFIX}{self.tag}"

    @property
    def host_address(self) -> str:
        """The host's address on the bridge: the hub API and the service listen here."""
        return str(ipaddress.ip_network(self.subnet).network_address + 1)

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def address(self, index: int) -> str:
        """The address of the namespace numbered `index` (0 .. MAX_SERVERS-1)."""
        if not 0 <= index < MAX_SERVERS:
            raise SandboxNetError(f"server namespace number {index} is outside 0-"
                                  f"{MAX_SERVERS - 1}")
        return str(ipaddress.ip_network(self.subnet).network_address + 2 + index)

    def veth(self, index: int) -> str:
        return f"{VETH_PREFIX}{self.tag}{index}"

    def netns_name(self, index: int) -> str:
        return f"{self.tag}-{index}"


def index_of(netns_name: str, tag: str) -> int | None:
    """The number in one of this hub's namespace names; None for another's."""
    head, sep, number = netns_name.partition("-")
    if not sep or head != tag or not number.isdigit():
        return None
    index = int(number)
    return index if index < MAX_SERVERS else None


def next_index(taken: Iterable[int], after: int) -> int | None:
    """The next free number after `after`, round the ring: a number just freed is used
    last, so that no new server gets the address of a namespace still being torn down."""
    used = set(taken)
    for step in range(1, MAX_SERVERS + 1):
        candidate = (after + step) % MAX_SERVERS
        if candidate not in used:
            return candidate
    return None


def choose_subnet(pool: str, in_use: Sequence[str], own: str | None = None) -> str:
    """The /24 of `pool` this hub's bridge takes: its own from before (a hub restart
    keeps its running servers' addresses), else the first that overlaps nothing the
    host routes already."""
    try:
        network = ipaddress.ip_network(pool)
    except ValueError:
        raise SandboxNetError(f"GPULeaseHub.sandbox_network {pool!r} is not an IPv4 network "
                              "(e.g. 10.213.0.0/16)") from None
    if network.version != 4 or network.prefixlen > 24:
        raise SandboxNetError(f"GPULeaseHub.sandbox_network {pool!r} must be an IPv4 network "
                              "of /24 or larger (each hub takes a /24 of it)")
    if own:
        return own
    busy = [ipaddress.ip_network(n, strict=False) for n in in_use]
    for candidate in network.subnets(new_prefix=24):
        if not any(candidate.overlaps(b) for b in busy):
            return str(candidate)
    raise SandboxNetError(f"every /24 of GPULeaseHub.sandbox_network {pool} is in use on this "
                          "host: choose another private range")


def nft_ruleset(net: SandboxNet, *, host_ports: Sequence[int], egress: str,
                extra_blocked: Sequence[str] = ()) -> str:
    """The hub's nftables table, whole: loaded in one transaction (`nft -f`), which
    replaces the table a previous hub left (after a crash) atomically.

    - input: a server reaches the host only on `host_ports` at the bridge address
      (the hub API, the gpulease service), and answers to what the host asked;
      anything else it tries is rejected at once (`REJECT`); nothing but the host
      itself reaches the bridge's address (another machine routing to it is dropped);
    - output: the host opens connections to a server on its HTTP port only (the
      proxy's and the hub's requests);
    - forward: per `egress`; never to link-local (metadata) or `extra_blocked`, never
      between two servers (the isolated bridge ports already forbid it at layer 2),
      never IPv6, and at most CONNTRACK_PER_SERVER connections tracked per server;
    - postrouting: what leaves for other networks is masqueraded.
    """
    blocked = ", ".join([*ALWAYS_BLOCKED, *check_egress(egress, extra_blocked)])
    br, table = net.bridge, net.table
    ports = ", ".join(str(p) for p in sorted(set(host_ports)))
    forward = (f'        iifname "{br}" accept\n' if egress == "internet" else "")
    return (
        f"table inet {table}\n"
        f"delete table inet {table}\n"
        f"table inet {table} {{\n"
        "    set tracked {\n"
        "        type ipv4_addr; flags dynamic; size 65535;\n"
        "    }\n"
        "    chain input {\n"
        "        type filter hook input priority filter; policy accept;\n"
        # the hub API and the service listen at the bridge's address: reachable from the
        # host and its servers, never from another machine that routes to it
        f'        ip daddr {net.host_address} iifname != {{ "{br}", "lo" }} drop\n'
        f'        iifname "{br}" ct state established,related accept\n'
        f'        iifname "{br}" ip daddr {net.host_address} tcp dport {{ {ports} }} accept\n'
        f'        iifname "{br}" {REJECT}\n'
        "    }\n"
        "    chain output {\n"
        "        type filter hook output priority filter; policy accept;\n"
        f'        oifname "{br}" ct state established,related accept\n'
        f'        oifname "{br}" tcp dport {SERVER_PORT} accept\n'
        f'        oifname "{br}" {REJECT}\n'
        "    }\n"
        "    chain forward {\n"
        "        type filter hook forward priority filter; policy accept;\n"
        f'        oifname "{br}" ct state established,related accept\n'
        f'        oifname "{br}" drop\n'
        f'        iifname "{br}" ct state new add @tracked '
        f'{{ ip saddr ct count over {CONNTRACK_PER_SERVER} }} {REJECT}\n'
        f'        iifname "{br}" meta nfproto ipv6 {REJECT}\n'
        f'        iifname "{br}" ip daddr {{ {blocked} }} {REJECT}\n'
        f'        iifname "{br}" ip daddr {net.subnet} {REJECT}\n'
        f"{forward}"
        f'        iifname "{br}" {REJECT}\n'
        "    }\n"
        "    chain postrouting {\n"
        "        type nat hook postrouting priority srcnat; policy accept;\n"
        # what the servers send out, forwarded: never the host's own traffic, which
        # leaves from the bridge's address too (the proxy's to the hub API on it)
        f'        iifname "{br}" oifname != "{br}" ip saddr {net.subnet} masquerade\n'
        "    }\n"
        "}\n"
    )


def forward_guard_ruleset() -> str:
    """Loaded when gpulease turned IP forwarding on: the host forwards nothing that
    neither comes from nor goes to a gpulease bridge (it was no router before)."""
    return (
        f"table inet {FORWARD_GUARD_TABLE}\n"
        f"delete table inet {FORWARD_GUARD_TABLE}\n"
        f"table inet {FORWARD_GUARD_TABLE} {{\n"
        "    chain forward {\n"
        "        type filter hook forward priority filter; policy accept;\n"
        f'        iifname != "{BRIDGE_PREFIX}*" oifname != "{BRIDGE_PREFIX}*" drop\n'
        "    }\n"
        "}\n"
    )


def check_egress(egress: str, extra_blocked: Iterable[str]) -> list[str]:
    """The egress setting checked, and the extra blocked networks normalised."""
    if egress not in EGRESS:
        raise SandboxNetError(f"GPULeaseHub.server_egress {egress!r} is not one of: "
                              + ", ".join(sorted(EGRESS)))
    return _checked_networks(extra_blocked)


def _checked_networks(networks: Iterable[str]) -> list[str]:
    out = []
    for n in networks:
        try:
            out.append(str(ipaddress.IPv4Network(n, strict=False)))
        except ValueError:
            raise SandboxNetError(f"GPULeaseHub.server_egress_blocked: {n!r} is not an IPv4 "
                                  "address or network (e.g. 10.0.0.0/8)") from None
    return out


def resolv_conf(host_text: str, upstream_text: str = "",
                unreachable: Sequence[str] = ()) -> tuple[str, str]:
    """A resolver configuration that works inside a server's namespace, and a line for
    the hub's start that says where it points.

    The host's own file often names a resolver on loopback (systemd-resolved's
    127.0.0.53), which a namespace's loopback does not have: then systemd-resolved's
    upstream list (`upstream_text`, /run/systemd/resolve/resolv.conf) is used. A
    resolver in `unreachable` (networks no server may reach: link-local, where a
    cloud's metadata server answers DNS too, and the admin's blocked ones) is left
    out and named, rather than handed to servers that then fail without a word.
    """
    blocked = [ipaddress.ip_network(n, strict=False)
               for n in (*ALWAYS_BLOCKED, *unreachable)]
    left_out: list[str] = []
    for text, source in ((host_text, "the host's"), (upstream_text, "systemd-resolved's")):
        servers = [s for s in _nameservers(text) if not _is_loopback(s)]
        left_out += [s for s in servers if _within(s, blocked)]
        servers = [s for s in servers if not _within(s, blocked)]
        if servers:
            options = [ln for ln in text.splitlines()
                       if ln.split()[:1] in (["search"], ["options"])]
            body = "".join(f"nameserver {s}\n" for s in servers) + "".join(
                f"{ln}\n" for ln in options)
            return body, f"{source} resolvers ({', '.join(servers)})" + _left_out(left_out)
    if left_out:
        return "", ("none: the host's resolvers are where servers may not reach"
                    + _left_out(left_out) + "; set GPULeaseHub.sandbox_resolv_conf")
    return "", "none: the host's resolvers are on its loopback, which servers cannot reach"


def _left_out(servers: Sequence[str]) -> str:
    return (f"; left out, as servers may not reach them: {', '.join(servers)}"
            if servers else "")


def _within(address: str, networks: Sequence) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return True
    return any(ip.version == n.version and ip in n for n in networks)


def _nameservers(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            out.append(words[1])
    return out


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return True  # unparseable: not something a namespace could use
