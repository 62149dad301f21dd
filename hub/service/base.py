"""BaseAPIHandler: the one base of the gpulease service's handlers.

JSON in and out, every error in the gpulease error format (a Refusal's
body, rendered here and nowhere else), who is calling and what they may do,
and every call to the hub's REST API (`hub_call`: the hub's refusals and
its absence made gpulease's refusals).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from jupyterhub.services.auth import HubOAuthenticated
from sqlalchemy.exc import DataError, SQLAlchemyError
from tornado import web
from tornado.escape import url_escape
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.log import gen_log

from gpulease.core.refusal import Refusal
from gpulease.core.units import json_loads
from gpulease.hub.auth.caller_rights import (
    ADMIN_SCOPE,
    AUDIT_SCOPE,
    HUB_ADMIN_SCOPE,
    is_gpulease_admin,
    is_gpulease_auditor,
)
from gpulease.hub.service.errors import APIError
from gpulease.spawners.context import GPULeaseContext

NUL_REFUSED = "text may not contain the NUL character (\\u0000)"


def nul_field(value: Any) -> str | None:
    """Where the first string (or key) holding NUL is in a JSON value, like
    `user_options.profile` or `profiles[2].groups[0]` ("body" for the whole);
    None when none does. PostgreSQL cannot store NUL in text."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # no recursion: the value may nest as deep as json allowed
        path, item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return path or "body"
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                here = f"{path}.{key}" if path else str(key)
                if "\x00" in str(key):
                    return here
                stack.append((here, inner))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
    return None


class BaseAPIHandler(HubOAuthenticated, web.RequestHandler):
    """JSON in and out; every error in the gpulease error format."""

    def initialize(self, ctx: GPULeaseContext, hub_api_url: str, hub_api_token: str) -> None:
        self.ctx = ctx
        self.hub_api_url = hub_api_url.rstrip("/")
        self.hub_api_token = hub_api_token

    def check_xsrf_cookie(self):
        # Only a request a token authenticated skips the check, never one that
        # merely has an Authorization header: a browser behind a Basic-auth
        # proxy sends `Basic ...` with every request, cross-site posts too, and
        # `token garbage` falls back to the cookie. Identifying the caller first
        # sets HubAuth's `_token_authenticated`, which HubAuth's own check
        # (super) honours; a cookie login is checked against `_xsrf`.
        if not hasattr(self, "_cached_hub_user"):
            self.get_current_user()
        return super().check_xsrf_cookie()

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")

    # --- who is calling --------------------------------------------------------

    def caller(self) -> dict[str, Any]:
        model = self.get_current_user()
        if not model:
            raise APIError(403, "Authentication required: send a hub API token "
                                "(Authorization: token ...) or log in to the hub")
        return model

    # The rule is the token's scopes, never the owner's admin flag alone
    # (caller_rights): a hub admin's narrowed or server token is no admin here.
    def is_admin(self) -> bool:
        return is_gpulease_admin(self.caller())

    def is_auditor(self) -> bool:
        return is_gpulease_auditor(self.caller())

    def require_admin(self) -> None:
        if not self.is_admin():
            raise APIError(403, f"This needs a gpulease admin: a token with the {ADMIN_SCOPE} "
                                f"scope, or a hub admin's token with {HUB_ADMIN_SCOPE} (a "
                                "narrowed token or a server's own token is not one)")

    def require_auditor(self) -> None:
        if not self.is_auditor():
            raise APIError(403, f"This needs a gpulease admin or auditor ({AUDIT_SCOPE})")

    # --- bodies and errors ------------------------------------------------------

    def json_body(self) -> Any:
        # Only a caller's body is read: a stranger gets 403, not the parser's
        # work (up to 1 MiB) and its answers about what the body should be.
        self.caller()
        if not self.request.body:
            raise APIError(400, "A JSON body is required")
        try:
            body = json_loads(self.request.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"The body is not valid JSON: {e}") from None
        field = nul_field(body)
        if field is not None:
            raise APIError(400, f"{field}: {NUL_REFUSED}", [{"field": field,
                                                              "message": NUL_REFUSED}])
        return body

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        # Path arguments (name None) reach the database as they are; query
        # arguments have control characters replaced by tornado itself.
        text = super().decode_argument(value, name)
        if name is None and "\x00" in text:
            raise APIError(400, f"The path has %00: {NUL_REFUSED}",
                           [{"field": "path", "message": NUL_REFUSED}])
        return text

    def log_exception(self, typ, value, tb) -> None:
        # A refusal is an answer, not a fault: one warning line, as tornado logs an HTTPError.
        if isinstance(value, Refusal):
            gen_log.warning("%d %s: %s", value.status, self._request_summary(), value.message)
        else:
            super().log_exception(typ, value, tb)

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, DataError):
            # The database refused a value (too long for its column, say): the
            # request's fault, not an outage. The checks before it should name it.
            status_code = 400
            self.set_status(400)
            first = str(getattr(exc, "orig", exc)).splitlines()[0][:200]
            message, errors = f"A value of this request cannot be stored: {first}", []
        elif isinstance(exc, SQLAlchemyError):
            status_code = 503
            self.set_status(503)
            message, errors = ("gpulease's database cannot be reached; running servers are "
                               "not affected. Try again in a minute."), []
        elif isinstance(exc, Refusal):  # every refusal, from the core or from a handler
            status_code = exc.status
            self.set_status(status_code)
            for name, value in exc.headers.items():
                self.set_header(name, value)
            self.finish(json.dumps(exc.body()))
            return
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message, errors = exc.log_message % exc.args if exc.args else exc.log_message, []
        elif status_code >= 500:
            message, errors = "Internal error in the gpulease service; see its log", []
        else:
            message, errors = self._reason, []
        self.finish(json.dumps({"status": status_code, "message": message, "errors": errors}))

    # --- talking to the hub ----------------------------------------------------

    async def hub_api(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> Any:
        """The hub's REST API with the service's token (or `headers`' own): its JSON
        answer; HTTPClientError for an answer that is an error, OSError when the hub
        cannot be reached. Handlers call `hub_call`, which turns both into refusals."""
        request = HTTPRequest(
            f"{self.hub_api_url}{path}",
            method=method,
            headers={"Authorization": f"token {self.hub_api_token}",
                     "Content-Type": "application/json", **(headers or {})},
            body=json.dumps(body) if body is not None else (None if method == "GET" else ""),
            allow_nonstandard_methods=True,
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body) if response.body else None

    async def hub_call(self, method: str, path: str, body: Any = None, *, doing: str,
                       answers: Mapping[int, Callable[[str], Refusal | None]] | None = None,
                       headers: dict[str, str] | None = None) -> Any:
        """`hub_api`, with the hub's refusals made gpulease's: an error status in
        `answers` is what its function makes of the hub's message (a Refusal is
        raised; None is returned as the answer: "absent is fine"); any other, and
        a hub that does not answer, is a 502 saying the hub did not `doing`."""
        try:
            return await self.hub_api(method, path, body, headers)
        except HTTPClientError as e:
            message = hub_message(e)
            answer = (answers or {}).get(e.code)
            if answer is not None:
                refusal = answer(message)
                if refusal is None:
                    return None
                raise refusal from None
            raise Refusal(f"The hub did not {doing}: {message}", status=502) from None
        except OSError as e:  # refused, reset, unresolvable: the hub is down or restarting
            raise Refusal(f"The hub did not {doing}: it cannot be reached ({e}); try again "
                          "in a minute", status=502) from None

    async def hub_user(self, name: str, field: str = "user", missing: int = 404) -> dict:
        """The hub's model of user `name` (with stopped servers); `missing` when unknown."""
        return await self.hub_call(
            "GET", f"/users/{url_escape(name, plus=False)}?include_stopped_servers=1",
            doing=f"answer about user {name}",
            answers={404: lambda _: Refusal.of_field(field, f"unknown user {name}", missing)})


def hub_message(e: HTTPClientError) -> str:
    """The message of the hub's error answer (its JSON "message"), else the error itself."""
    try:
        return str(json.loads(e.response.body).get("message") or e)
    except Exception:  # no JSON body (a proxy's page, a timeout)
        return str(e)


class RootHandler(BaseAPIHandler):
    """The service's root: the hub checks it is up; people and scripts see what it is."""

    def get(self):
        from gpulease import __version__

        self.write_json({"service": "gpulease", "version": __version__, "api": "api/"})


class NotFoundHandler(BaseAPIHandler):
    def prepare(self):
        raise APIError(404, f"No such gpulease API path: {self.request.path}")
