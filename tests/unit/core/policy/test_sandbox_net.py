"""The sandboxes' network as plain values: addresses, names, the subnet, the rules, DNS."""

from __future__ import annotations

import pytest

from gpulease.core.policy.sandbox_net import (
    MAX_SERVERS,
    REJECT,
    SERVER_PORT,
    SandboxNet,
    SandboxNetError,
    choose_subnet,
    forward_guard_ruleset,
    index_of,
    next_index,
    nft_ruleset,
    resolv_conf,
)

NET = SandboxNet("0a1b2c3d", "10.213.4.0/24")


def test_names_fit_linux_interface_names_and_addresses_follow_the_number():
    assert NET.bridge == "glbr0a1b2c3d" and len(NET.bridge) <= 15
    assert len(NET.veth(MAX_SERVERS - 1)) <= 15
    assert NET.host_address == "10.213.4.1"
    assert NET.address(0) == "10.213.4.2"
    assert NET.address(MAX_SERVERS - 1) == "10.213.4.251"
    with pytest.raises(SandboxNetError, match="outside 0-249"):
        NET.address(MAX_SERVERS)
    assert index_of(NET.netns_name(7), NET.tag) == 7
    assert index_of(NET.netns_name(7), "ffffffff") is None  # another hub's
    assert index_of("0a1b2c3d-x", NET.tag) is None


def test_a_number_just_freed_is_taken_last():
    assert next_index({0, 1}, after=1) == 2
    assert next_index({2}, after=1) == 3  # 0 and 1 were freed just now: not yet
    assert next_index(set(range(MAX_SERVERS)) - {5}, after=200) == 5
    assert next_index(range(MAX_SERVERS), after=0) is None


def test_the_subnet_is_a_free_24_of_the_pool_or_the_hubs_own():
    assert choose_subnet("10.213.0.0/16", []) == "10.213.0.0/24"
    assert choose_subnet("10.213.0.0/16", ["10.213.0.1/24", "10.0.0.0/8"][:1]) == "10.213.1.0/24"
    assert choose_subnet("10.213.0.0/16", ["10.213.0.0/24"], own="10.213.9.0/24") == \
        "10.213.9.0/24"
    with pytest.raises(SandboxNetError, match="every /24"):
        choose_subnet("10.213.0.0/24", ["10.0.0.0/8"])
    with pytest.raises(SandboxNetError, match="not an IPv4 network"):
        choose_subnet("ten", [])
    with pytest.raises(SandboxNetError, match="/24 or larger"):
        choose_subnet("10.213.0.0/25", [])


def test_the_rules_let_a_server_reach_the_hub_ports_only_and_the_host_its_http_port_only():
    rules = nft_ruleset(NET, host_ports=[8081, 40123], egress="internet")
    assert rules.startswith("table inet gpulease_0a1b2c3d\ndelete table inet gpulease_0a1b2c3d\n")
    assert 'iifname "glbr0a1b2c3d" ip daddr 10.213.4.1 tcp dport { 8081, 40123 } accept' in rules
    assert f'iifname "glbr0a1b2c3d" {REJECT}' in rules.split("chain output")[0]  # the rest
    assert f'oifname "glbr0a1b2c3d" {REJECT}' in rules.split("chain forward")[0]
    assert f'oifname "glbr0a1b2c3d" tcp dport {SERVER_PORT} accept' in rules
    forward = rules.split("chain forward")[1].split("chain postrouting")[0]
    # the metadata address and other servers are dropped before egress is accepted
    assert forward.index("169.254.0.0/16") < forward.index('iifname "glbr0a1b2c3d" accept')
    assert forward.index(f"ip daddr 10.213.4.0/24 {REJECT}") < forward.index(
        'iifname "glbr0a1b2c3d" accept')
    # only what is forwarded from servers: the host's own traffic from the bridge's
    # address (the proxy's to the hub API there) keeps its source
    assert ('iifname "glbr0a1b2c3d" oifname != "glbr0a1b2c3d" ip saddr 10.213.4.0/24 '
            'masquerade') in rules


def test_no_egress_means_nothing_is_forwarded_from_a_server():
    rules = nft_ruleset(NET, host_ports=[8081], egress="none",
                        extra_blocked=["192.168.0.0/16", "10.1.2.3"])
    forward = rules.split("chain forward")[1].split("chain postrouting")[0]
    assert 'iifname "glbr0a1b2c3d" accept' not in forward
    assert forward.rstrip().endswith(f'iifname "glbr0a1b2c3d" {REJECT}\n    }}')
    assert "192.168.0.0/16" in forward and "10.1.2.3/32" in forward


def test_bad_egress_settings_name_what_is_allowed():
    with pytest.raises(SandboxNetError, match="server_egress 'some' is not one of: internet"):
        nft_ruleset(NET, host_ports=[1], egress="some")
    with pytest.raises(SandboxNetError, match="server_egress_blocked: 'intranet'"):
        nft_ruleset(NET, host_ports=[1], egress="none", extra_blocked=["intranet"])


def test_the_forward_guard_drops_what_no_gpulease_bridge_takes_part_in():
    assert 'iifname != "glbr*" oifname != "glbr*" drop' in forward_guard_ruleset()


def test_a_resolver_on_the_hosts_loopback_is_replaced_by_its_upstream():
    stub = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lab.example\n"
    upstream = "nameserver 192.0.2.53\nnameserver ::1\n"
    body, said = resolv_conf(stub, upstream)
    assert body == "nameserver 192.0.2.53\n"
    assert "systemd-resolved's" in said
    body, said = resolv_conf("nameserver 10.255.255.53\nsearch lab.example\n")
    assert body == "nameserver 10.255.255.53\nsearch lab.example\n"
    assert said == "the host's resolvers (10.255.255.53)"
    body, said = resolv_conf(stub, "")
    assert body == "" and "cannot reach" in said


def test_a_resolver_servers_may_not_reach_is_left_out_and_named():
    # a cloud's metadata server answers DNS at a link-local address; a lab's blocked range
    body, said = resolv_conf("nameserver 169.254.169.254\nnameserver 10.1.2.3\n"
                             "nameserver 192.0.2.53\n", unreachable=["10.0.0.0/8"])
    assert body == "nameserver 192.0.2.53\n"
    assert said == ("the host's resolvers (192.0.2.53); left out, as servers may not reach "
                    "them: 169.254.169.254, 10.1.2.3")
    body, said = resolv_conf("nameserver 169.254.169.254\n")
    assert body == "" and "169.254.169.254" in said and "sandbox_resolv_conf" in said
