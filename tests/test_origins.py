"""hub/origins.plan_origins: which origins `gpulease up` serves, decided without a hub."""

from __future__ import annotations

import pytest

from gpulease.hub.origins import SHARED_ORIGIN_WARNING, OriginError, plan_origins

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
