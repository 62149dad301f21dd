"""Signal (b): connections against the admin's addresses, networks and ports, and Stratum."""

from __future__ import annotations

import pytest

from gpulease.core.policy.misuse.evidence import (
    NETWORK_ADDRESS,
    NETWORK_PORT,
    STRATUM,
    STRATUM_RULE_ID,
)
from gpulease.core.policy.misuse.network import (
    Connection,
    NetworkDenyList,
    NetworkEntry,
    match_connection,
    match_connections,
)

SUBSCRIBE = b'{"id":1,"method":"mining.subscribe","params":["cgminer/4.12"]}\n'
LIST = NetworkDenyList((
    NetworkEntry("pool-a", ("198.51.100.0/24", "2001:db8:7::/48"), description="pool A"),
    NetworkEntry("pool-b-tls", ("203.0.113.7",), ports=(443, 14433), protocol="tcp"),
    NetworkEntry("miner-ports", ports=(3333, 4444, 5555, 7777, 14444)),
))


def kinds(conn, deny=LIST):
    return [(s.kind, s.rule_id) for s in match_connection(conn, deny)]


def test_a_listed_network_matches_any_port_and_either_family():
    assert kinds(Connection("198.51.100.20", 443)) == [(NETWORK_ADDRESS, "pool-a")]
    assert kinds(Connection("2001:db8:7::15", 8443)) == [(NETWORK_ADDRESS, "pool-a")]
    # a dual-stack socket shows an IPv4 peer mapped into IPv6
    assert kinds(Connection("::ffff:198.51.100.20", 443)) == [(NETWORK_ADDRESS, "pool-a")]
    assert kinds(Connection("[2001:db8:7::15]", 1)) == [(NETWORK_ADDRESS, "pool-a")]
    assert kinds(Connection("198.51.101.20", 443)) == []


def test_an_address_with_ports_and_protocol_needs_all_three():
    assert kinds(Connection("203.0.113.7", 443)) == [(NETWORK_ADDRESS, "pool-b-tls")]
    assert kinds(Connection("203.0.113.7", 80)) == []
    assert kinds(Connection("203.0.113.7", 443, protocol="udp")) == []


def test_ports_alone_are_a_port_signal_of_their_own():
    signals = match_connection(Connection("192.0.2.10", 4444, pid=77, at=12.0), LIST)
    assert [(s.kind, s.rule_id, s.at) for s in signals] == [(NETWORK_PORT, "miner-ports", 12.0)]
    assert signals[0].detail_dict() == {"remote": "192.0.2.10", "port": "4444",
                                        "protocol": "tcp", "pid": "77"}
    both = kinds(Connection("198.51.100.1", 3333))
    assert both == [(NETWORK_ADDRESS, "pool-a"), (NETWORK_PORT, "miner-ports")]


def test_the_stratum_handshake_is_a_signal_at_any_address_and_port():
    conn = Connection("192.0.2.99", 8080, first_bytes=SUBSCRIBE, at=5.0)
    [signal] = match_connection(conn, LIST, at=6.0)
    assert (signal.kind, signal.rule_id, signal.at) == (STRATUM, STRATUM_RULE_ID, 6.0)
    assert signal.detail_dict()["method"] == "mining.subscribe"
    assert kinds(Connection("198.51.100.5", 3333, first_bytes=SUBSCRIBE)) == [
        (NETWORK_ADDRESS, "pool-a"), (NETWORK_PORT, "miner-ports"), (STRATUM, STRATUM_RULE_ID)]
    assert kinds(conn, NetworkDenyList(detect_stratum=False)) == []
    assert kinds(Connection("192.0.2.99", 8080, protocol="udp", first_bytes=SUBSCRIBE)) == []


def test_honest_traffic_is_not_on_the_list():
    honest = [
        Connection("151.101.0.223", 443, first_bytes=bytes.fromhex("16030102")),  # pypi.org
        Connection("18.164.174.72", 443),  # huggingface.co's CDN
        Connection("140.82.121.4", 22, first_bytes=b"SSH-2.0-OpenSSH_9.6\r\n"),  # github
        Connection("35.186.224.25", 443),  # wandb
        Connection("10.213.0.1", 8081,
                   first_bytes=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'),
        Connection("192.0.2.50", 53, protocol="udp"),
        Connection("not-an-address", 3334),
    ]
    assert match_connections(honest, LIST) == []
    # Selenium Grid's default port is a miner's too: a port signal (the policy warns)
    assert kinds(Connection("192.0.2.60", 4444, first_bytes=b"POST /session HTTP/1.1\r\n")) \
        == [(NETWORK_PORT, "miner-ports")]


def test_an_entry_is_checked_and_named_when_wrong():
    with pytest.raises(ValueError, match="'x': '300.1.1.1' is not an IP address or network"):
        NetworkEntry("x", ("300.1.1.1",))
    with pytest.raises(ValueError, match="'x': name addresses, ports or both"):
        NetworkEntry("x")
    with pytest.raises(ValueError, match="'x': ports must be 1-65535, not 0, 70000"):
        NetworkEntry("x", ports=(0, 70000))
    with pytest.raises(ValueError, match="'x': protocol 'icmp' is not one of tcp, udp"):
        NetworkEntry("x", ports=(1,), protocol="icmp")
    with pytest.raises(ValueError, match="ids used more than once: a"):
        NetworkDenyList((NetworkEntry("a", ports=(1,)), NetworkEntry("a", ports=(2,))))
    # a host address with host bits is its network, a bare address its /32
    assert NetworkEntry("y", "198.51.100.9/24").networks == ("198.51.100.9/24",)
    assert kinds(Connection("198.51.100.200", 1),
                 NetworkDenyList((NetworkEntry("y", "198.51.100.9/24"),))) == [
        (NETWORK_ADDRESS, "y")]


def test_a_list_from_plain_values_says_every_problem_at_once():
    with pytest.raises(ValueError) as caught:
        NetworkDenyList.from_spec([{"id": "a", "networks": ["1.2.3.4"]},
                                   {"id": "b", "networks": ["nope"]},
                                   {"id": "c", "port": [3333]}])
    said = str(caught.value)
    assert "'b': 'nope' is not an IP address" in said and "'c': unknown keys port" in said
    made = NetworkDenyList.from_spec([{"id": "a", "networks": ["1.2.3.4"], "description": "d"}])
    assert made.description_of("a") == "d"
    assert kinds(Connection("1.2.3.4", 9), made) == [(NETWORK_ADDRESS, "a")]


def test_many_single_addresses_are_looked_up_not_scanned():
    pools = NetworkDenyList(tuple(NetworkEntry(f"pool-{n}", (f"10.{n // 256}.{n % 256}.1",))
                                  for n in range(5000)))
    assert kinds(Connection("10.4.1.1", 443), pools) == [(NETWORK_ADDRESS, "pool-1025")]
    assert kinds(Connection("10.4.1.2", 443), pools) == []
