"""login_address: which address a login counts against, from the socket's peer,
X-Forwarded-For and the trusted proxies (pure; no hub)."""

from __future__ import annotations

import pytest

from gpulease.hub.auth.client_address import login_address, normalise, parse_trusted

PROXY = "127.0.0.1"  # the hub's own configurable-http-proxy
INGRESS = parse_trusted(["10.0.0.0/24", "fd00::/8"])


def test_a_peer_that_is_no_proxy_is_the_client_whatever_it_sends():
    assert login_address("192.0.2.7", "198.51.100.1", peer_is_proxy=False) == "192.0.2.7"
    assert login_address("127.0.0.1", "198.51.100.1", peer_is_proxy=False) == "127.0.0.1"
    assert login_address("192.0.2.7", None, peer_is_proxy=False) == "192.0.2.7"


def test_the_own_proxy_is_believed_for_the_entry_it_appended_only():
    # configurable-http-proxy appends the address its socket saw; what the
    # client wrote itself comes before it and is ignored.
    assert login_address(PROXY, "127.0.0.5", peer_is_proxy=True) == "127.0.0.5"
    assert login_address(PROXY, "203.0.113.9, 198.51.100.1, 127.0.0.5", True) == "127.0.0.5"
    # A client at loopback (the proxy's own address) is still that client.
    assert login_address(PROXY, "203.0.113.9, 127.0.0.1", True) == "127.0.0.1"


def test_trusted_proxies_in_front_are_walked_from_the_right():
    xff = "6.6.6.6, 203.0.113.9, 10.0.0.4, 10.0.0.7"
    assert login_address(PROXY, xff, True, INGRESS) == "203.0.113.9"
    # An Ingress connecting to the hub directly (no configurable-http-proxy).
    assert login_address("10.0.0.7", "6.6.6.6, 203.0.113.9", False, INGRESS) == "203.0.113.9"
    # Without trusted_proxies the Ingress is the client.
    assert login_address(PROXY, xff, True) == "10.0.0.7"


def test_all_hops_trusted_gives_the_leftmost():
    assert login_address(PROXY, "10.0.0.9, 10.0.0.7", True, INGRESS) == "10.0.0.9"


def test_without_header_or_with_garbage_the_last_known_hop_counts():
    assert login_address(PROXY, None, True) == PROXY
    assert login_address(PROXY, "", True) == PROXY
    assert login_address(PROXY, "evil", True) == PROXY
    assert login_address(PROXY, "203.0.113.9, not-an-ip, 10.0.0.7", True, INGRESS) == "10.0.0.7"


def test_x_real_ip_plays_no_part():
    # There is no parameter for it: tornado's remote_ip prefers it, this does not read it.
    assert "real" not in login_address.__code__.co_varnames


@pytest.mark.parametrize("text, expected", [
    ("::ffff:127.0.0.5", "127.0.0.5"),  # Node's dual-stack socket writes IPv4 so
    (" 192.0.2.1 ", "192.0.2.1"),
    ("[2001:db8::1]", "2001:db8::1"),
    ("2001:DB8:0::1", "2001:db8::1"),
    ("192.0.2.1:5678", None),
    ("unknown", None),
])  # fmt: skip
def test_normalise(text, expected):
    assert normalise(text) == expected


def test_ipv4_mapped_entries_are_the_same_client():
    assert login_address(PROXY, "::ffff:127.0.0.5", True) == "127.0.0.5"
    # ...and a mapped Ingress address is that trusted Ingress.
    assert login_address(PROXY, "203.0.113.9, ::ffff:10.0.0.7", True, INGRESS) == "203.0.113.9"


def test_parse_trusted_names_a_bad_entry():
    assert [str(n) for n in parse_trusted(["10.0.0.7", "10.0.0.0/24", "fd00::/8"])] == [
        "10.0.0.7/32", "10.0.0.0/24", "fd00::/8"]
    with pytest.raises(ValueError, match="'ingress.local' is not an IP address or CIDR"):
        parse_trusted(["10.0.0.7", "ingress.local"])
