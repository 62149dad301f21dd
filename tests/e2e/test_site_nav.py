"""One site, on a real hub: the navigation bar on a hub page and on a service page is the
same, item for item, for a researcher, an auditor and an admin, and the service's pages
load the hub's stylesheet (hub/web/site_nav.py, hub/templates/page.html, the service's
base.html, hub/service/hub_static.py; tests/unit/hub/web/test_site_nav.py holds the rule and
both templates rendered without a hub).
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

import pytest

from gpulease.hub.service import hub_static
from gpulease.hub.web.site_nav import PRODUCT
from tests.support.hubproc import ADMIN_PW, HubOptions, password_of
from tests.support.pages import AUDIT_PAGES, EVERYONE, bar

# --- a real hub ---------------------------------------------------------------------------



@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(args=['--GPULeaseHub.auditor_groups=["auditors"]'],
                      users=["ada", "audrey"], groups={"auditors": ["audrey"]})


@pytest.mark.e2e
@pytest.mark.parametrize("who, expected", [
    ("ada", EVERYONE),
    ("audrey", EVERYONE + AUDIT_PAGES),
    ("admin", EVERYONE + AUDIT_PAGES + ["Users"]),
])
def test_a_hub_page_and_a_service_page_share_the_bar(hub, who, expected):
    browser = hub.login_form(who, ADMIN_PW if who == "admin" else password_of(who))
    assert browser.login_status == 302
    pages = {}
    for url in (hub.urls.hub("home"), hub.urls.hub("token"), hub.urls.service("usage")):
        page = browser.get(url, timeout=30)
        assert page.status_code == 200, (url, page.text[:300])
        pages[url] = bar(page.text)
        assert re.search(rf"<title>\s*{PRODUCT}", page.text), url
    first, *others = pages.values()
    assert all(other == first for other in others), pages
    assert [label for label, _ in first["items"]] == expected
    assert first["brand"] == (PRODUCT, hub.urls.hub("home"))
    # absolute across origins: the service is on a subdomain of its own
    targets = dict(first["items"])
    assert targets["Usage"] == hub.urls.service("usage")
    assert targets["Servers"] == hub.urls.hub("home")


@pytest.mark.e2e
def test_the_service_pages_load_the_hubs_stylesheet(hub):
    browser = hub.login_form("ada", password_of("ada"))
    page = browser.get(hub.urls.service("usage"), timeout=30)
    link = re.search(r'<link rel="stylesheet" href="([^"]+)">', page.text).group(1)
    assert "'self'" in page.headers["Content-Security-Policy"].split("style-src")[1]
    assert "script-src" not in page.headers["Content-Security-Policy"]
    css = browser.get(urljoin(page.url, link), timeout=30)
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")
    assert css.content == (hub_static.HUB_STATIC / hub_static.STYLESHEET).read_bytes()
    assert "max-age" in css.headers.get("Cache-Control", "")
    hub_css = browser.get(hub.urls.hub(f"static/{hub_static.STYLESHEET}"), timeout=30)
    assert hub_css.content == css.content  # the same bytes the hub serves
