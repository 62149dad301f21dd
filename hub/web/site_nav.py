"""The one navigation bar of gpulease's pages: the hub's (home, spawn, token) and the
gpulease service's (usage, the admin pages).

Both render the same items from here, so they cannot drift: the hub's page.html loops
over `gpulease_nav.items(...)` (a template variable, hub_config), the service's base.html
over `nav_items` (hub/service/pages/usage.py). Every target is a SiteURLs URL: with users'
servers on subdomains the hub and the service are two origins, and a link between them
is absolute; on one shared origin SiteURLs gives paths.

Who sees an item is who may open its page, decided by the same rule the page applies:
the admin pages need a gpulease auditor or admin (hub/auth/caller_rights.py), read
from the viewer's scopes as both the hub (its page's `expanded_scopes`) and the service
(its login token's `scopes`) have them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulease.hub.auth.caller_rights import has_hub_admin_powers, is_gpulease_auditor
from gpulease.site_urls import SiteURLs

PRODUCT = "gpulease"

# who sees an item
EVERYONE = "everyone"  # anyone signed in
AUDITORS = "auditors"  # gpulease auditors and admins: the service's admin pages
USER_ADMINS = "user admins"  # JupyterHub's admin page (its "admin-ui" scope)

# label, the site it is on ("hub" or "service"), its path there, who sees it; in order
ITEMS: tuple[tuple[str, str, str, str], ...] = (
    ("Servers", "hub", "home", EVERYONE),
    ("Usage", "service", "usage", EVERYONE),
    ("Token", "hub", "token", EVERYONE),
    ("Profiles", "service", "admin/profiles", AUDITORS),
    ("Inventory", "service", "admin/inventory", AUDITORS),
    ("Credits", "service", "admin/credits", AUDITORS),
    ("Limits", "service", "admin/limits", AUDITORS),
    ("Reservations", "service", "admin/reservations", AUDITORS),
    ("Audit", "service", "admin/audit", AUDITORS),
    ("Report", "service", "admin/report", AUDITORS),
    ("Users", "hub", "admin", USER_ADMINS),
)


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str
    audience: str  # EVERYONE, AUDITORS or USER_ADMINS


def audiences(admin: bool, scopes: Iterable[str]) -> frozenset[str]:
    """The audiences a signed-in viewer belongs to: `admin` their hub admin flag,
    `scopes` their expanded scopes (the hub's page) or their login token's (the service).

    JupyterHub's admin page shows to "admin-ui"; the service's login token carries only
    the scopes the service asks for (hub_config's oauth_client_allowed_scopes), among them
    the hub's `admin:users`, which JupyterHub's admin role holds with "admin-ui"."""
    model: Mapping[str, Any] = {"admin": bool(admin), "scopes": frozenset(scopes or ())}
    out = {EVERYONE}
    if is_gpulease_auditor(model):
        out.add(AUDITORS)
    if "admin-ui" in model["scopes"] or has_hub_admin_powers(model):
        out.add(USER_ADMINS)
    return frozenset(out)


def all_items(urls: SiteURLs) -> list[NavItem]:
    """Every item, in order, with its absolute (or, on a shared origin, rooted) URL."""
    return [NavItem(label, urls.hub(path) if site == "hub" else urls.service(path), who)
            for label, site, path, who in ITEMS]


def nav_items(urls: SiteURLs, *, admin: bool, scopes: Iterable[str]) -> list[NavItem]:
    """The items one signed-in viewer sees, in order."""
    theirs = audiences(admin, scopes)
    return [item for item in all_items(urls) if item.audience in theirs]


@dataclass(frozen=True)
class SiteNav:
    """What both page templates need of the bar: the brand, its items, the log in and
    out links. The hub's templates get one as `gpulease_nav`, the service's as `nav`."""

    urls: SiteURLs
    product: str = PRODUCT

    @property
    def home(self) -> str:
        """Where the brand leads: the researcher's servers."""
        return self.urls.hub("home")

    @property
    def login(self) -> str:
        return self.urls.hub("login")

    @property
    def logout(self) -> str:
        return self.urls.hub("logout")

    def items(self, admin: bool, scopes: Iterable[str]) -> list[NavItem]:
        return nav_items(self.urls, admin=admin, scopes=scopes)
