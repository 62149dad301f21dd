"""hub/web/origins.py, plan_origins: which origins `gpulease up` serves, decided without a hub."""

from __future__ import annotations

import pytest

from gpulease.hub.web.origins import SHARED_ORIGIN_WARNING, OriginError, plan_origins

BASE = dict(scheme="http", ip="127.0.0.1", port=8000, base_url="/", subdomain_host="",
            public_url="", allow_shared_origin=False, cluster=False)


def plan(**kw):
    return plan_origins(**{**BASE, **kw})


def test_one_box_on_loopback_gets_subdomains_of_localhost():
    p = plan(port=8123)
    assert p.subdomain_host == "http://localhost:8123"
    assert p.public_url == "http://localhost:8123/"
    assert not p.cookie_host_prefix and not p.warning


def test_the_base_url_is_in_the_public_url():
    assert plan(base_url="/gpu/").public_url == "http://localhost:8000/gpu/"


@pytest.mark.parametrize("ip", ["0.0.0.0", "::", "10.1.2.3", ""])
def test_beyond_loopback_without_a_domain_is_refused(ip):
    with pytest.raises(OriginError, match="--subdomain-host https://gpu.example.org"):
        plan(ip=ip)


def test_the_cluster_always_needs_a_domain():
    with pytest.raises(OriginError, match="the cluster's proxy"):
        plan(cluster=True)


def test_a_named_domain_with_https_gets_host_prefixed_cookies():
    p = plan(ip="0.0.0.0", subdomain_host="https://GPU.example.org")
    assert p.subdomain_host == "https://gpu.example.org"
    assert p.public_url == "https://gpu.example.org/"
    assert p.cookie_host_prefix


def test_a_domain_without_a_scheme_is_https():
    assert plan(subdomain_host="gpu.example.org").subdomain_host == "https://gpu.example.org"


def test_the_opt_out_shares_the_origin_and_says_so():
    p = plan(ip="0.0.0.0", allow_shared_origin=True)
    assert p.subdomain_host == "" and p.warning == SHARED_ORIGIN_WARNING


@pytest.mark.parametrize("bad, why", [
    ("https://10.0.0.5", "IP address"),
    ("https://gpu.example.org/hub", "more than a scheme, host and port"),
    ("ftp://gpu.example.org", "expected https://DOMAIN"),
    ("https://", "expected https://DOMAIN"),
])
def test_a_bad_subdomain_host_names_what_is_allowed(bad, why):
    with pytest.raises(OriginError, match=why):
        plan(subdomain_host=bad)


@pytest.mark.parametrize("given, kept", [
    ("http://gpu.test:80", "http://gpu.test"), ("https://gpu.example.org:443",
                                                "https://gpu.example.org"),
    ("https://gpu.example.org:8443", "https://gpu.example.org:8443"),
    ("https://GPU.Example.org.", "https://gpu.example.org")])
def test_a_host_is_written_as_browsers_send_it(given, kept):
    # a kept ":443" would never equal a browser's Host, and the hub would redirect to itself
    assert plan(subdomain_host=given).subdomain_host == kept


def test_the_default_port_on_one_box():
    assert plan(port=80).subdomain_host == "http://localhost"
    assert plan(port=443, scheme="https").subdomain_host == "https://localhost"


@pytest.mark.parametrize("ip", ["127.0.0.2", "::1"])
def test_other_loopback_addresses_are_refused_naming_the_way_out(ip):
    # browsers and gpulease's clients reach *.localhost at 127.0.0.1: nothing listens there
    with pytest.raises(OriginError, match="use --ip 127.0.0.1"):
        plan(ip=ip)


def test_a_plain_http_domain_is_warned_about():
    assert "__Host-" in plan(subdomain_host="http://gpu.test").warning
    assert plan(subdomain_host="http://localhost:8000").warning == ""
    assert plan(subdomain_host="https://gpu.test").warning == ""
