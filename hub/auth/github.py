"""GPULeaseGitHubAuthenticator: sign-in with GitHub (or GitHub Enterprise),
oauthenticator's GitHubOAuthenticator with what ProviderSignIn adds; the allowed
organisations and their teams become groups.

Anyone can make a GitHub organisation of any free name, and be its only member: an
organisation's name proves nothing unless the hub's admin named it. So only the
organisations `allowed_organizations` names (an entry `ORG` or `ORG:TEAM` names ORG)
become groups, `ORG`, and their teams, `ORG:TEAM`; every other organisation someone
belongs to is no group of theirs. A group that gives rights (`unproducible`) which no
allowed organisation or team can be refuses the hub's start (gpulease.hub.auth.rights_groups).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from oauthenticator.github import GitHubOAuthenticator
from traitlets import default

from gpulease.hub.auth.oauth import ProviderSignIn
from gpulease.store.identities import Identity

ORGS_PER_PAGE = 100
MAX_ORG_PAGES = 10  # 1,000 organisations: more is someone's robot, not a researcher
# A group GitHub can make: ORG or ORG:TEAM, as GitHub's logins and team slugs, lowercase.
_GROUP_PART = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")


class GPULeaseGitHubAuthenticator(ProviderSignIn, GitHubOAuthenticator):
    """Sign in with GitHub (or GitHub Enterprise: github_url). The allowed organisations
    and their teams become groups: `ORG` for a member of an organisation that
    `allowed_organizations` names, `ORG:TEAM` for a member of one of its teams."""

    @default("scope")
    def _scope_default(self):
        return ["read:user", "user:email", "read:org"]

    @default("populate_teams_in_auth_state")
    def _populate_teams_default(self):
        return True

    @default("auth_state_groups_key")
    def _groups_key_default(self):
        return lambda auth_state: github_groups(auth_state, group_orgs(self.allowed_organizations))

    def refused_rights_groups(self, rights: Mapping[str, Iterable[str]]) -> list[str]:
        """Why each group in `rights` (what gives it, e.g. "GPULeaseHub.admin_groups" → its
        groups) cannot be one of this hub's GitHub groups; [] when all can."""
        return unproducible(rights, group_orgs(self.allowed_organizations))

    async def update_auth_model(self, auth_model):
        auth_model = await super().update_auth_model(auth_model)
        state = auth_model["auth_state"]
        token = state["token_response"]
        headers = self.build_userdata_request_headers(token["access_token"],
                                                      token.get("token_type", "bearer"))
        logins: list[str] = []
        for page in range(1, MAX_ORG_PAGES + 1):  # GitHub gives 100 a page at most
            orgs = await self.httpfetch(
                f"{self.github_api}/user/orgs?per_page={ORGS_PER_PAGE}&page={page}",
                "fetching organisations", method="GET", headers=headers,
                validate_cert=self.validate_server_cert) or []
            logins += [o["login"] for o in orgs if o.get("login") not in logins]
            if len(orgs) < ORGS_PER_PAGE:
                break
        state["orgs"] = logins
        return auth_model

    def identity_from(self, auth_state):
        info = auth_state.get(self.user_auth_state_key) or {}
        return Identity(self.github_url.rstrip("/"), str(info["id"]), str(info.get("login") or ""),
                        str(info.get("email") or ""))


def group_orgs(allowed_organizations: Iterable[str]) -> frozenset[str]:
    """The organisations whose groups count (lowercase): each entry's ORG, `ORG` or `ORG:TEAM`."""
    return frozenset(str(e).split(":", 1)[0].strip().lower() for e in allowed_organizations
                     if str(e).split(":", 1)[0].strip())


def github_groups(auth_state: dict[str, Any], orgs: Iterable[str]) -> list[str]:
    """`ORG` per organisation in `orgs`, `ORG:TEAM` per team of one (lowercase, as GitHub's
    slugs); organisations not in `orgs`, and their teams, are left out."""
    allowed = {o.lower() for o in orgs}
    groups = {o.lower() for o in auth_state.get("orgs", []) if o.lower() in allowed}
    for team in auth_state.get("teams", []):
        org = str(team.get("organization", {}).get("login", "")).lower()
        slug = str(team.get("slug", "")).lower()
        if org in allowed and slug:
            groups.add(org)
            groups.add(f"{org}:{slug}")
    return sorted(groups)


def producible(group: str, orgs: frozenset[str]) -> bool:
    """Whether `group` is one GitHub sign-in can give: an organisation of `orgs`, or a
    team of one (ORG:TEAM), spelled as github_groups spells them."""
    org, colon, team = group.partition(":")
    return (org in orgs and _GROUP_PART.match(org) is not None
            and (not colon or _GROUP_PART.match(team) is not None))


def unproducible(rights: Mapping[str, Iterable[str]], orgs: frozenset[str]) -> list[str]:
    """One line per group of `rights` (where it is configured → its groups) that no allowed
    organisation or team can produce: naming it, where it gives rights, and what is allowed."""
    shown_orgs = ", ".join(sorted(orgs)) or "none: allowed_organizations is empty"
    problems = []
    for where, groups in rights.items():
        for group in sorted(set(groups)):
            if not producible(group, orgs):
                problems.append(
                    f"{where} names the group {group!r}, which GitHub sign-in never gives: "
                    "only the organisations GPULeaseGitHubAuthenticator.allowed_organizations "
                    f"names ({shown_orgs}) become groups, as ORG or ORG:TEAM (lowercase), and "
                    "anyone can make a GitHub organisation of another name. Name an allowed "
                    "organisation or one of its teams, or allow the organisation.")
    return problems
