"""GPULeaseGitHubAuthenticator: sign-in with GitHub (or GitHub Enterprise),
oauthenticator's GitHubOAuthenticator with what ProviderSignIn adds; organisations
and teams become groups."""

from __future__ import annotations

from typing import Any

from oauthenticator.github import GitHubOAuthenticator
from traitlets import default

from gpulease.hub.auth.oauth import ProviderSignIn
from gpulease.store.identities import Identity

ORGS_PER_PAGE = 100
MAX_ORG_PAGES = 10  # 1,000 organisations: more is someone's robot, not a researcher


class GPULeaseGitHubAuthenticator(ProviderSignIn, GitHubOAuthenticator):
    """Sign in with GitHub (or GitHub Enterprise: github_url). Organisations and teams
    become groups: `ORG` for a member of an organisation, `ORG:TEAM` for a team's."""

    @default("scope")
    def _scope_default(self):
        return ["read:user", "user:email", "read:org"]

    @default("populate_teams_in_auth_state")
    def _populate_teams_default(self):
        return True

    @default("auth_state_groups_key")
    def _groups_key_default(self):
        return github_groups

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


def github_groups(auth_state: dict[str, Any]) -> list[str]:
    """`ORG` per organisation, `ORG:TEAM` per team (lowercase, as GitHub's slugs)."""
    groups = {o.lower() for o in auth_state.get("orgs", [])}
    for team in auth_state.get("teams", []):
        org = team.get("organization", {}).get("login", "").lower()
        if org:
            groups.add(org)
            groups.add(f"{org}:{team['slug']}")
    return sorted(groups)
