"""Sign-in through an identity provider: oauthenticator's, configured for gpulease.

`GPULeaseOIDCAuthenticator` (any OpenID Connect provider: Keycloak, Dex,
Entra ID, Google) subclasses oauthenticator's GenericOAuthenticator, and
`GPULeaseGitHubAuthenticator` its GitHubOAuthenticator. What `ProviderSignIn`
adds to both:

- names: the provider's name for someone (`username_claim`, lowercased)
  is what `allowed_users`, `admin_users` and `blocked_users` list and what
  GitHub's org checks ask about; once a login is allowed, the identity
  (issuer, subject) is given its hub name (gpulease.hub.identities) and the
  user is that name from then on;
- groups: the provider's groups are the hub's (`manage_groups`), re-read at
  every login, before every spawn, and every `auth_refresh_age` seconds on
  any request, API tokens too (`auth_refresh_strict`): someone the provider
  no longer allows, or whose tokens it revoked, loses the hub;
- a provider that cannot be reached: a login gets a 503 page saying so; a
  refresh keeps the session, until `cookie_max_age_days` after the provider
  last confirmed the identity;
- refusals of the OAuth dance (no state, a state from another browser, an
  expired one) as pages that say what happened and what to do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any
from urllib.parse import urlencode, urlsplit

from jupyterhub import orm
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.github import GitHubOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthenticator, OAuthLoginHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Bool, Float, Integer, Unicode, default

from gpulease.hub.accounts import LocalAccountStore
from gpulease.hub.audit import AuditLog
from gpulease.hub.db import open_database, utcnow
from gpulease.hub.identities import BoundIdentity, Identity, IdentityStore

IDENTITY_KEY = "gpulease_identity"  # in auth_state: the identity a hub user signed in as
STATE_MAX_AGE_S = 600  # a sign-in started longer ago than this starts again


def provider_unreachable(error: BaseException) -> bool:
    """The provider did not answer, or answered with a server error (not a refusal)."""
    if isinstance(error, HTTPClientError):
        return error.code >= 500  # 599: no response at all (timeout, connection)
    return isinstance(error, (OSError, asyncio.TimeoutError))


def _host(url: str) -> str:
    return urlsplit(url).netloc or url


class SignInCallbackHandler(OAuthCallbackHandler):
    """oauthenticator's callback, with refusals that tell a researcher what to do."""

    def get_state_cookie(self):
        if self._state_cookie is None:
            raw = self.get_secure_cookie("oauthenticator-state",
                                         max_age_days=STATE_MAX_AGE_S / 86400)
            self._state_cookie = (raw or b"").decode("utf8", "replace")
            self.clear_cookie("oauthenticator-state")
        return self._state_cookie

    def check_state(self):
        login = self.settings.get("login_url", "/hub/login")
        try:
            super().check_state()
        except web.HTTPError as e:
            if "missing from cookies" in (e.log_message or ""):
                why = (f"this sign-in was not started in this browser, or was started more than "
                       f"{STATE_MAX_AGE_S // 60} minutes ago")
            elif "mismatch" in (e.log_message or ""):
                why = "the answer from the sign-in provider belongs to another sign-in"
            else:
                why = "the answer from the sign-in provider has no state"
            raise web.HTTPError(400, f"Sign-in refused: {why}. Start again at {login}.") from None


class SignInLoginHandler(OAuthLoginHandler):
    def get(self):
        try:
            return super().get()
        except Exception as e:  # the provider's discovery document could not be read
            if isinstance(e, web.HTTPError):
                raise
            raise web.HTTPError(503, self.authenticator.unreachable_message(e)) from None


class ProviderSignIn(OAuthenticator):
    """What gpulease adds to an oauthenticator class (see the module docstring)."""

    login_handler = SignInLoginHandler
    callback_handler = SignInCallbackHandler

    db_url = Unicode(
        "",
        help="""URL of gpulease's database, which maps identities to user names.
        gpulease's hub configuration sets it.""",
    ).tag(config=True)

    provider_timeout = Float(
        10.0,
        help="""Seconds to wait for the identity provider on each request (token,
        user info, groups) before the login is refused with 503 or a refresh keeps
        the session as it is.""",
    ).tag(config=True)

    keep_session_days = Integer(
        0,
        help="""While the provider cannot be reached, a refresh keeps a session this many
        days after the provider last confirmed the identity (0: the hub's
        cookie_max_age_days). After that the user must sign in again.""",
    ).tag(config=True)

    @default("manage_groups")
    def _manage_groups_default(self):
        return True

    @default("enable_auth_state")
    def _enable_auth_state_default(self):
        return True

    @default("refresh_pre_spawn")
    def _refresh_pre_spawn_default(self):
        return True

    @default("auth_refresh_age")
    def _auth_refresh_age_default(self):
        return 300

    @default("auth_refresh_strict")
    def _auth_refresh_strict_default(self):
        # API tokens (a VS Code kernel's) are refused once the provider says no.
        return True

    @default("http_request_kwargs")
    def _http_request_kwargs_default(self):
        return {"request_timeout": self.provider_timeout, "connect_timeout": self.provider_timeout}

    # --- what each provider says about an identity -------------------------------------

    def identity_from(self, auth_state: dict[str, Any]) -> Identity:
        raise NotImplementedError

    # --- the database --------------------------------------------------------------------

    _store: IdentityStore | None = None

    @property
    def identities(self) -> IdentityStore:
        if self._store is None:
            if not self.db_url:
                raise RuntimeError(f"{type(self).__name__}.db_url is not set")
            self._store = IdentityStore(open_database(self.db_url))
        return self._store

    def _name_taken(self, name: str) -> bool:
        """Used by someone who did not come through this table: a local account, a hub
        user made by an admin or by another authenticator."""
        if LocalAccountStore(self.identities.engine).exists(name):
            return True
        db = getattr(self.parent, "db", None)
        return db is not None and orm.User.find(db, name) is not None

    # --- login -------------------------------------------------------------------------

    def provider_host(self) -> str:
        return _host(self.token_url or self.authorize_url)

    def unreachable_message(self, error: BaseException) -> str:
        return (f"The sign-in provider ({self.provider_host()}) "
                f"could not be reached ({type(error).__name__}: {error}). Nothing was "
                "changed; try again in a few minutes, and tell the hub's administrator if "
                "this goes on.")

    async def authenticate(self, handler, data=None, **kwargs):
        try:
            return await super().authenticate(handler, data, **kwargs)
        except Exception as e:
            if provider_unreachable(e):
                raise web.HTTPError(503, self.unreachable_message(e)) from None
            raise

    async def run_post_auth_hook(self, handler, authenticated):
        """Allowed: give the identity its hub name (first login) or find it."""
        identity = self.identity_from(authenticated["auth_state"])
        bound, before = await asyncio.to_thread(self.identities.bind, identity,
                                                self._name_taken)
        await asyncio.to_thread(self._audit, bound, before)
        provider_name = authenticated["name"]
        authenticated["name"] = bound.user_name
        if bound.user_name in self.admin_users or provider_name in self.admin_users:
            authenticated["admin"] = True
        authenticated["auth_state"][IDENTITY_KEY] = {
            "issuer": identity.issuer, "subject": identity.subject,
            "email": identity.email, "preferred_username": identity.preferred_username,
            "provider_name": provider_name,
        }
        if provider_name != bound.user_name:
            self.log.info("%s signed in as %s", identity.shown(), bound.user_name)
        return await super().run_post_auth_hook(handler, authenticated)

    def _audit(self, bound: BoundIdentity, before: BoundIdentity | None) -> None:
        shown = {"issuer": bound.identity.issuer, "subject": bound.identity.subject,
                 "email": bound.identity.email,
                 "preferred_username": bound.identity.preferred_username}
        if before is None:
            action, old = "identity.bind", None
        elif before.identity != bound.identity:
            action = "identity.update"
            old = {**shown, "email": before.identity.email,
                   "preferred_username": before.identity.preferred_username}
        else:
            return
        AuditLog(self.identities.engine).record(bound.user_name, action,
                                                f"user:{bound.user_name}", old, shown)

    # --- refresh -----------------------------------------------------------------------

    def _keep_days(self) -> float:
        return self.keep_session_days or getattr(self.parent, "cookie_max_age_days", 14) or 14

    async def refresh_user(self, user, handler=None, **kwargs):
        """The provider's word on `user` now: their groups, or False (sign in again)."""
        state = await user.get_auth_state() or {}
        mine = state.get(IDENTITY_KEY) or {}
        try:
            refreshed = await super().refresh_user(user, handler, **kwargs)
        except Exception as e:
            if not provider_unreachable(e):
                raise
            return await self._while_unreachable(user, mine, e)
        if not isinstance(refreshed, dict):
            return refreshed
        if mine:  # the same person: a token answers for whom it was issued to
            now = self.identity_from(refreshed["auth_state"])
            if (now.issuer, now.subject) != (mine.get("issuer"), mine.get("subject")):
                self.log.warning("Refresh for %s answered for another identity; sign in again",
                                 user.name)
                return False
        provider_name = mine.get("provider_name", refreshed["name"])
        if not await self._still_allowed(provider_name, refreshed):
            self.log.warning("%s (%s) is no longer allowed by the provider's answer",
                             user.name, provider_name)
            return False
        if user.name in self.admin_users or provider_name in self.admin_users:
            refreshed["admin"] = True
        refreshed["auth_state"][IDENTITY_KEY] = mine
        if mine:
            await asyncio.to_thread(self.identities.verified, mine["issuer"], mine["subject"])
        return refreshed

    async def _still_allowed(self, provider_name: str, auth_model: dict) -> bool:
        if provider_name in self.blocked_users:
            return False
        if self.allow_all:
            return True
        return bool(await self.check_allowed(provider_name, auth_model))

    async def _while_unreachable(self, user, mine: dict, error: BaseException):
        bound = (await asyncio.to_thread(self.identities.find, mine["issuer"], mine["subject"])
                 if mine else None)
        if bound is None:
            return False
        age = utcnow() - bound.verified_at
        if age > dt.timedelta(days=self._keep_days()):
            self.log.warning("Provider unreachable (%s) and %s last confirmed %s ago: sign in "
                             "again", error, user.name, age)
            return False
        self.log.warning("Provider unreachable (%s): keeping %s's session as it is (last "
                         "confirmed %s ago)", error, user.name, age)
        return True


class GPULeaseOIDCAuthenticator(ProviderSignIn, GenericOAuthenticator):
    """Sign in with an OpenID Connect provider (Keycloak, Dex, Entra ID, Google, ...).

    Set `oidc_issuer` and the provider's endpoints are read from its discovery
    document; or set authorize_url, token_url and userdata_url yourself."""

    oidc_issuer = Unicode(
        "",
        help="""The provider's issuer URL (its `iss`), e.g.
        https://keycloak.example.edu/realms/research. Its endpoints come from
        ISSUER/.well-known/openid-configuration, read when first needed; identities
        are (issuer, sub).""",
    ).tag(config=True)

    end_session = Bool(
        True,
        help="""Logging out of the hub also ends the provider's session, through its
        end_session_endpoint (when the discovery document has one and
        logout_redirect_url is not set).""",
    ).tag(config=True)

    _discovery: dict[str, Any] | None = None

    def discovery(self) -> dict[str, Any]:
        """The issuer's discovery document (cached once read)."""
        if self._discovery is None:
            import requests

            url = self.oidc_issuer.rstrip("/") + "/.well-known/openid-configuration"
            reply = requests.get(url, timeout=self.provider_timeout)
            reply.raise_for_status()
            self._discovery = reply.json()
        return self._discovery

    @default("login_service")
    def _login_service_default(self):
        return "your institution"

    @default("scope")
    def _scope_default(self):
        return ["openid", "profile", "email", "groups"]

    @default("username_claim")
    def _username_claim_default(self):
        return "preferred_username"

    @default("authorize_url")
    def _authorize_url_default(self):
        return self.discovery()["authorization_endpoint"] if self.oidc_issuer else ""

    @default("token_url")
    def _token_url_default(self):
        return self.discovery()["token_endpoint"] if self.oidc_issuer else ""

    @default("userdata_url")
    def _userdata_url_default(self):
        return self.discovery().get("userinfo_endpoint", "") if self.oidc_issuer else ""

    @default("logout_redirect_url")
    def _logout_redirect_url_default(self):
        if not (self.oidc_issuer and self.end_session):
            return ""
        try:
            end = self.discovery().get("end_session_endpoint", "")
        except Exception as e:
            self.log.warning("No end-session endpoint (discovery failed: %s)", e)
            return ""
        return f"{end}?{urlencode({'client_id': self.client_id})}" if end else ""

    def provider_host(self) -> str:
        # the endpoints come from discovery, which may be what could not be reached
        return _host(self.oidc_issuer) if self.oidc_issuer else super().provider_host()

    def user_info_to_username(self, user_info):
        # The preferred name when there is one, else the e-mail, else the subject: the hub
        # name is given later (run_post_auth_hook), this only names who the provider says.
        for claim in (self.username_claim, "preferred_username", "email", "sub"):
            value = user_info.get(claim) if isinstance(claim, str) else None
            if value:
                return str(value)
        return super().user_info_to_username(user_info)

    def identity_from(self, auth_state):
        info = auth_state.get(self.user_auth_state_key) or {}
        issuer = self.oidc_issuer or _id_token_issuer(auth_state.get("id_token")) or \
            f"{urlsplit(self.token_url).scheme}://{_host(self.token_url)}"
        return Identity(issuer.rstrip("/"), str(info["sub"]),
                        str(info.get("preferred_username") or ""), str(info.get("email") or ""))


def _id_token_issuer(id_token: str | None) -> str:
    if not id_token:
        return ""
    import jwt

    try:  # straight from the token endpoint over TLS: no signature check is needed
        return str(jwt.decode(id_token, options={"verify_signature": False}).get("iss", ""))
    except jwt.PyJWTError:
        return ""


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
        orgs = await self.httpfetch(
            f"{self.github_api}/user/orgs?per_page=100", "fetching organisations",
            method="GET",
            headers=self.build_userdata_request_headers(token["access_token"],
                                                        token.get("token_type", "bearer")),
            validate_cert=self.validate_server_cert)
        state["orgs"] = [o["login"] for o in orgs or []]
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
