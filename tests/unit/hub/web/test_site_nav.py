"""One site, without a hub: who sees which item of the navigation bar, its URLs, and both
templates (the hub's and the service's) rendering the same bar
(tests/e2e/test_site_nav.py compares them on a real hub).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub._data import DATA_FILES_PATH
from tornado.template import Loader

from gpulease.hub.auth.caller_rights import ADMIN_SCOPE, AUDIT_SCOPE, HUB_ADMIN_SCOPE
from gpulease.hub.config.hub_config import SERVICE_NAME
from gpulease.hub.service import hub_static
from gpulease.hub.web.site_nav import PRODUCT, SiteNav, nav_items
from gpulease.site_urls import SiteURLs
from tests.support.pages import AUDIT_PAGES, EVERYONE, bar

ROOT = Path(__file__).resolve().parents[4]
SUBDOMAINS = SiteURLs("http://localhost:8000/", "http://localhost:8000")
SHARED = SiteURLs("/")
ACCESS = f"access:services!service={SERVICE_NAME}"


# expanded scopes, as a hub page has them (JupyterHub's roles: user, admin)
RESEARCHER = {"self", "read:users:name!user=ada", ACCESS}
HUB_ADMIN = {"admin-ui", HUB_ADMIN_SCOPE, "admin:servers", ADMIN_SCOPE, AUDIT_SCOPE, ACCESS}


def labels(items) -> list[str]:
    return [item.label for item in items]


def test_a_researcher_sees_servers_usage_and_token():
    assert labels(nav_items(SUBDOMAINS, admin=False, scopes=RESEARCHER)) == EVERYONE


def test_an_auditor_sees_the_admin_pages_but_not_jupyterhubs_users_page():
    items = nav_items(SUBDOMAINS, admin=False, scopes=RESEARCHER | {AUDIT_SCOPE})
    assert labels(items) == EVERYONE + AUDIT_PAGES


def test_an_admin_sees_everything_in_one_order():
    everything = EVERYONE + AUDIT_PAGES + ["Users"]
    assert labels(nav_items(SUBDOMAINS, admin=True, scopes=HUB_ADMIN)) == everything
    # the service's login token: only the scopes the service asks for (no admin-ui)
    service_token = {HUB_ADMIN_SCOPE, ADMIN_SCOPE, AUDIT_SCOPE, ACCESS}
    assert labels(nav_items(SUBDOMAINS, admin=True, scopes=service_token)) == everything


def test_an_admins_narrowed_token_is_no_admin_in_the_bar():
    """As on the pages (caller_rights): the admin flag alone opens nothing."""
    assert labels(nav_items(SUBDOMAINS, admin=True, scopes={"read:users"})) == EVERYONE


def test_links_are_absolute_across_origins_and_rooted_on_one():
    urls = {i.label: i.url for i in nav_items(SUBDOMAINS, admin=True, scopes=HUB_ADMIN)}
    assert urls["Servers"] == "http://localhost:8000/hub/home"
    assert urls["Token"] == "http://localhost:8000/hub/token"
    assert urls["Users"] == "http://localhost:8000/hub/admin"
    assert urls["Usage"] == "http://gpulease--service.localhost:8000/services/gpulease/usage"
    assert urls["Report"] == \
        "http://gpulease--service.localhost:8000/services/gpulease/admin/report"
    shared = {i.label: i.url for i in nav_items(SHARED, admin=True, scopes=HUB_ADMIN)}
    assert shared["Servers"] == "/hub/home"
    assert shared["Audit"] == "/services/gpulease/admin/audit"


def render_hub_page(urls: SiteURLs, admin: bool, scopes: set[str]) -> str:
    """hub/templates/page.html as JupyterHub renders it (its loader, template_vars)."""
    jupyterhub_templates = str(Path(DATA_FILES_PATH) / "templates")
    env = Environment(autoescape=True, loader=ChoiceLoader([
        PrefixLoader({"templates": FileSystemLoader([jupyterhub_templates])}, "/"),
        FileSystemLoader([str(ROOT / "hub" / "templates"), jupyterhub_templates]),
    ]))
    user = SimpleNamespace(name="ada", admin=admin, json_escaped_name="ada",
                           spawner=SimpleNamespace(options_form=""))
    return env.get_template("page.html").render(
        base_url="/hub/", prefix="/", user=user, static_url=lambda path, **_kw: path,
        login_url="/hub/login", logout_url="/hub/logout", services=[],
        parsed_scopes={s: {} for s in scopes}, expanded_scopes=scopes, xsrf_token="x",
        gpulease_banner=None, gpulease_nav=SiteNav(urls))


def render_service_page(urls: SiteURLs, admin: bool, scopes: set[str]) -> str:
    """The service's base.html with the namespace PageHandler gives it."""
    nav = SiteNav(urls)
    template = Loader(str(ROOT / "hub" / "service" / "templates")).load("base.html")
    return template.generate(
        nav=nav, nav_items=nav.items(admin, scopes), user_name="ada",
        hub_stylesheet="/services/gpulease/" + hub_static.STYLESHEET_LINK).decode()


@pytest.mark.parametrize("urls", [SUBDOMAINS, SHARED], ids=["subdomains", "shared-origin"])
@pytest.mark.parametrize("admin, scopes", [(False, RESEARCHER), (True, HUB_ADMIN)],
                         ids=["researcher", "admin"])
def test_both_templates_render_the_same_bar(urls, admin, scopes):
    hub_bar = bar(render_hub_page(urls, admin, scopes))
    service_bar = bar(render_service_page(urls, admin, scopes))
    assert hub_bar == service_bar
    assert hub_bar["brand"] == (PRODUCT, urls.hub("home"))
    assert hub_bar["items"] == [(i.label, i.url) for i in nav_items(urls, admin=admin,
                                                                      scopes=scopes)]


def test_the_hub_pages_title_is_the_product():
    assert "<title>gpulease</title>" in render_hub_page(SUBDOMAINS, False, RESEARCHER)


def test_the_service_serves_the_stylesheet_and_all_it_imports():
    """A JupyterHub upgrade that imports other files fails here, not as a 404 in a page."""
    static = hub_static.HUB_STATIC
    for name in hub_static.FILES:
        assert (static / name).is_file(), name
    needed = {hub_static.STYLESHEET}
    for css in [n for n in hub_static.FILES if n.endswith(".css")]:
        text = (static / css).read_text()
        refs = re.findall(r'@import\s*"([^"]+)"', text)
        refs += [u for u in re.findall(r'url\("?([^")]+)"?\)', text) if not u.startswith("data:")]
        for ref in refs:
            resolved = PurePosixPath(css).parent / ref
            parts: list[str] = []
            for part in resolved.parts:
                parts = parts[:-1] if part == ".." else [*parts, part]
            needed.add("/".join(parts))
    assert needed == set(hub_static.FILES)


def test_the_static_route_serves_those_files_only():
    route = re.compile(hub_static.ROUTE + "$")
    for name in hub_static.FILES:
        assert route.fullmatch(f"static/{name}"), name
    for other in ("static/js/home.js", "static/css/../../templates/page.html",
                  "static/favicon.ico", "static/css/style.min.css.map"):
        assert not route.fullmatch(other), other
