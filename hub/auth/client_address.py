"""Which address a login came from, given who connected to the hub.

Tornado's `request.remote_ip` (JupyterHub runs it with `xheaders=True`) is
taken from a client's own `X-Real-Ip` or `X-Forwarded-For` header whenever one
is sent, and configurable-http-proxy passes those through. A login throttle
keyed on it can be evaded with a fresh header per try, and pointed at anyone
else's address. Here the address is worked out from the hops that are known:

- the hub's peer, the socket's own address, which no header can change;
- if that peer is a proxy (the hub's own configurable-http-proxy, or one of
  `trusted_proxies`), the last `X-Forwarded-For` entry is what that proxy
  appended: the address the proxy's own socket saw;
- that address, while it is one of `trusted_proxies` (an Ingress or load
  balancer in front), is itself a proxy: the entry left of it is what it
  appended, and so on.

Everything further left was written by a client and is ignored, and so is
`X-Real-Ip`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def normalise(text: str) -> str | None:
    """`text` as a canonical IP address (IPv4-mapped IPv6 unmapped), None if it is none.

    Node (and so configurable-http-proxy) writes IPv4 clients of a dual-stack
    socket as `::ffff:192.0.2.1`; the same client must be the same key.
    """
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def parse_trusted(entries: Iterable[str]) -> tuple[Network, ...]:
    """`trusted_proxies` entries (addresses or CIDR ranges) as networks.

    ValueError naming the first entry that is neither.
    """
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"trusted_proxies entry {entry!r} is not an IP address or CIDR range "
                "(e.g. 10.0.0.7, 10.0.0.0/24, fd00::/8)"
            ) from None
    return tuple(networks)


def is_trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip in network for network in trusted)


def login_address(
    peer: str,
    forwarded_for: str | None,
    peer_is_proxy: bool,
    trusted: tuple[Network, ...] = (),
) -> str:
    """The address a login is counted against.

    `peer` is the hub's socket peer (already normalised), `forwarded_for` the
    request's X-Forwarded-For (all its lines, comma-joined), `peer_is_proxy`
    whether the peer is the hub's own proxy, and `trusted` the proxies in
    front of it.
    """
    if not (peer_is_proxy or is_trusted(peer, trusted)):
        return peer
    hop = peer
    entries = forwarded_for.split(",") if forwarded_for else []
    for entry in reversed(entries):
        appended = normalise(entry)
        if appended is None:
            # A proxy appends the address its socket saw, never garbage: the
            # hop that handed this over is the last one known.
            return hop
        hop = appended
        if not is_trusted(hop, trusted):
            return hop
    return hop
