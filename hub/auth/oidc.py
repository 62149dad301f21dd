"""GPULeaseOIDCAuthenticator: sign-in with any OpenID Connect provider (Keycloak, Dex,
Entra ID, Google), oauthenticator's GenericOAuthenticator with what ProviderSignIn adds."""

from __future__ import annotations

import contextvars
from typing import Any
from urllib.parse import urlencode, urlsplit

from oauthenticator.generic import GenericOAuthenticator
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Bool, Unicode, default

from gpulease.hub.auth.oauth import ProviderSignIn, provider_host_of
from gpulease.store.identities import Identity

# The ID token stored at the last login or refresh, in the refresh being made now.
_STORED_ID_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "gpulease_stored_id_token", default=None)


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
        # Read from the ID token, groups are fresh only in a new one, which a refresh gets
        # with the refresh token that offline_access asks for.
        offline = ["offline_access"] if self.userdata_from_id_token else []
        return ["openid", "profile", "email", "groups", *offline]

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
        return provider_host_of(self.oidc_issuer) if self.oidc_issuer else super().provider_host()

    async def refresh_user(self, user, handler=None, **kwargs):
        # With userdata_from_id_token, who someone is and their groups are read from the
        # ID token: a refresh must get a fresh one with the refresh token (token_to_user
        # refuses the stored one), or a removed group would stay until it expires.
        state = await user.get_auth_state() or {}
        stored = (state.get("token_response") or {}).get("id_token")
        mark = _STORED_ID_TOKEN.set(stored if self.userdata_from_id_token
                                    and state.get("refresh_token") else None)
        try:
            return await super().refresh_user(user, handler, **kwargs)
        finally:
            _STORED_ID_TOKEN.reset(mark)

    async def token_to_user(self, token_info):
        if not self.userdata_from_id_token:
            return await super().token_to_user(token_info)
        stored = _STORED_ID_TOKEN.get()
        if stored is not None and token_info.get("id_token") == stored:
            raise HTTPClientError(401, "the stored ID token is not read again: the refresh "
                                       "token gets a fresh one")
        try:
            return await super().token_to_user(token_info)
        except web.HTTPError as e:
            # oauthenticator's message holds the whole token: not for the log
            if "Unable to decode id token" in (e.log_message or ""):
                raise HTTPClientError(401, "the ID token has expired or is not for this "
                                           "client") from None
            raise

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
            f"{urlsplit(self.token_url).scheme}://{provider_host_of(self.token_url)}"
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

