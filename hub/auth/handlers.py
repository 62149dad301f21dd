"""The sign-in pages' handlers: oauthenticator's, with refusals that say what to do.

A callback whose OAuth state is missing, foreign or expired, and a login page
whose provider cannot be reached, answer with a page that names what happened
(400, 503) instead of oauthenticator's bare errors.
"""

from __future__ import annotations

from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler
from tornado import web

STATE_MAX_AGE_S = 600  # a sign-in started longer ago than this starts again


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

