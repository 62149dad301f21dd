"""Sign-in through an identity provider: oauthenticator's, configured for gpulease.

`GPULeaseOIDCAuthenticator` (hub/auth/oidc.py: any OpenID Connect provider:
Keycloak, Dex, Entra ID, Google) subclasses oauthenticator's
GenericOAuthenticator, and `GPULeaseGitHubAuthenticator` (hub/auth/github.py)
its GitHubOAuthenticator. What `ProviderSignIn` adds to both:

- names: the provider's name for someone (`username_claim`, lowercased)
  is what `allowed_users`, `admin_users` and `blocked_users` list and what
  GitHub's org checks ask about — never a hub name, and JupyterHub makes no
  hub user of them; once a login is allowed, the identity (issuer, subject)
  is given its hub name (gpulease.store.identities) and the user is that name
  from then on;
- groups: the provider's groups (entries that are not group names left out)
  are the hub's (`manage_groups`), re-read at
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
import contextvars
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce
from inspect import isawaitable
from typing import Any
from urllib.parse import urlsplit

from jupyterhub import orm
from jupyterhub.auth import Authenticator
from oauthenticator.oauth2 import OAuthenticator
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Float, Integer, Unicode, default

from gpulease.core.clock import utcnow
from gpulease.hub.auth.handlers import SignInCallbackHandler, SignInLoginHandler
from gpulease.store.accounts import LocalAccountStore
from gpulease.store.audit import AuditLog
from gpulease.store.db import open_database
from gpulease.store.identities import BoundIdentity, Identity, IdentityStore, base_name

IDENTITY_KEY = "gpulease_identity"  # in auth_state: the identity a hub user signed in as
MAX_GROUP_NAME = 255  # JupyterHub's groups.name column
# Why the provider's token endpoint could not be used, in the refresh being made now.
_TOKEN_ENDPOINT_DOWN: contextvars.ContextVar[BaseException | None] = contextvars.ContextVar(
    "gpulease_token_endpoint_down", default=None)


def provider_groups(raw: object) -> list[str]:
    """The group names in a provider's groups claim: one string is one group (not its
    letters); entries that are not non-empty printable strings of at most 255 characters
    without surrounding spaces (null, numbers, nested lists) are left out."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, (list, tuple, set)):
        return []
    return sorted({g for g in raw if isinstance(g, str) and g and g == g.strip()
                   and g.isprintable() and len(g) <= MAX_GROUP_NAME})


def provider_unreachable(error: BaseException) -> bool:
    """The provider did not answer, or answered with a server error (not a refusal)."""
    if isinstance(error, HTTPClientError):
        return error.code >= 500  # 599: no response at all (timeout, connection)
    return isinstance(error, (OSError, asyncio.TimeoutError))


def provider_host_of(url: str) -> str:
    """The host (and port) of a provider URL, as messages name the provider."""
    return urlsplit(url).netloc or url


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

    def _hub_names_like(self, stem: str) -> frozenset[str]:
        """Hub users whose names start with `stem` (every candidate name of an identity
        does), read on the event loop: JupyterHub's database session is not for threads."""
        db = getattr(self.parent, "db", None)
        if db is None:
            return frozenset()
        rows = db.query(orm.User.name).filter(orm.User.name.like(f"{stem}%")).all()
        return frozenset(name for (name,) in rows)

    def _name_taken(self, name: str, hub_names: frozenset[str]) -> bool:
        """Used by someone who did not come through this table: a local account, a hub
        user made by an admin or by another authenticator."""
        return name in hub_names or LocalAccountStore(self.identities.engine).exists(name)

    # --- login -------------------------------------------------------------------------

    def provider_host(self) -> str:
        return provider_host_of(self.token_url or self.authorize_url)

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
            if isinstance(e, HTTPClientError):  # the provider refused the code: 400 invalid_grant
                login = handler.settings.get("login_url", "/hub/login") if handler else ""
                raise web.HTTPError(
                    400, f"Sign-in refused: the sign-in provider ({self.provider_host()}) did "
                         "not accept this sign-in's code (HTTP "
                         f"{e.code}): it was used already, has expired, or was issued to "
                         f"another site. Start again at {login or '/hub/login'}.") from None
            raise

    async def get_token_info(self, handler, params):
        try:
            return await super().get_token_info(handler, params)
        except Exception as e:
            if provider_unreachable(e):  # a refresh then keeps the session (refresh_user)
                _TOKEN_ENDPOINT_DOWN.set(e)
            raise

    async def get_user_groups(self, auth_state: dict) -> set[str]:
        """The provider's groups (auth_state_groups_key), as provider_groups reads them."""
        key = self.auth_state_groups_key
        if callable(key):
            raw = key(auth_state)
            raw = await raw if isawaitable(raw) else raw
        else:
            try:
                raw = reduce(dict.get, key.split("."), auth_state)
            except TypeError:  # a part of the key is not a mapping
                raw = None
        groups = provider_groups(raw)
        if raw is not None and len(groups) != len(raw if isinstance(raw, list) else [raw]):
            self.log.warning("Left out group claim entries that are not group names: %r",
                             [g for g in (raw if isinstance(raw, list) else [raw])
                              if g not in groups])
        return set(groups)

    def add_user(self, user):
        # oauthenticator's adds hub names to allowed_users (allow_existing_users); here that
        # set holds the provider's names, which a hub name must never match by accident.
        return Authenticator.add_user(self, user)

    @contextmanager
    def provider_names_aside(self) -> Iterator[None]:
        """While JupyterHub starts: its init_users and init_role_assignment make an (admin)
        hub user of every name in admin_users and allowed_users. Here those list people as
        the provider names them, who get hub names of their own at their first login: a
        hub user made under a provider's name would take that name from its owner (who
        would sign in as NAME-2) and could be given to someone else. So JupyterHub sees
        both empty; they are normalised as it would."""
        admins = {self.normalize_username(n) for n in self.admin_users}
        allowed = {self.normalize_username(n) for n in self.allowed_users}
        self.admin_users, self.allowed_users = set(), set()
        try:
            yield
        finally:
            self.admin_users = admins
            self.allowed_users = allowed | admins if allowed else allowed

    async def run_post_auth_hook(self, handler, authenticated):
        """Allowed: give the identity its hub name (first login) or find it."""
        identity = self.identity_from(authenticated["auth_state"])
        hub_names = self._hub_names_like(base_name(identity))
        bound, before = await asyncio.to_thread(
            self.identities.bind, identity, lambda name: self._name_taken(name, hub_names))
        await asyncio.to_thread(self._audit, bound, before)
        provider_name = authenticated["name"]
        authenticated["name"] = bound.user_name
        # admin_users lists the provider's names, never hub names: a hub name is derived
        # from what someone calls themselves ('boss.' is given 'boss').
        if provider_name in self.admin_users:
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
        _TOKEN_ENDPOINT_DOWN.set(None)
        try:
            refreshed = await super().refresh_user(user, handler, **kwargs)
        except Exception as e:
            if not provider_unreachable(e):
                raise
            return await self._while_unreachable(user, mine, e)
        down = _TOKEN_ENDPOINT_DOWN.get()
        if refreshed is False and down is not None:  # the refresh token could not be used
            return await self._while_unreachable(user, mine, down)
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
        if provider_name in self.admin_users:
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
