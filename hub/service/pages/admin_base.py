"""The base of the admin pages: who may see them, who may post, and the forms' CSRF check.

Reading (GET) needs a gpulease auditor or admin; changing (POST) an admin.
Auditors get the same pages without any form.

CSRF: the pages log in with the HubOAuth cookie, which a browser sends with
any cross-site form post. We use JupyterHub's own XSRF scheme rather than a
second one: every form carries `_xsrf` (`{% module xsrf_form_html() %}`,
whose value is HubAuthenticated.xsrf_token: signed with the service's cookie
secret and bound to this login's session and token). HubOAuth already refuses
cookie authentication on a POST whose `_xsrf` does not match; `check_form_token` (from `prepare`)
checks it once more, explicitly, so that a missing or stale token is a clear
403 ("reload the page") rather than a puzzling "not logged in". The app keeps
tornado's own `xsrf_cookies=False`: the JSON API is called with tokens in the
Authorization header, which a browser never adds by itself, and
BaseAPIHandler.check_xsrf_cookie skips those. No JavaScript is needed, so
the CSP stays without any script source.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tornado import web

from gpulease.core.refusal import Refusal
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.pages.forms import refusal_by_input
from gpulease.hub.service.pages.usage import PageHandler


class AdminPage(PageHandler):
    """A page of the admin section (GET: auditors and admins; POST: admins)."""

    def get_template_namespace(self) -> dict[str, Any]:
        ns = super().get_template_namespace()
        # Only the signed-in admin sees forms; an error page for an anonymous
        # caller must render without asking who is calling.
        ns.update(can_edit=bool(ns.get("user_name")) and self.is_admin())
        return ns

    def prepare(self) -> None:
        if self.request.method == "POST":
            self.check_form_token()

    def check_form_token(self) -> None:
        try:
            self.check_xsrf_cookie()
        except web.HTTPError:
            raise APIError(403, "This form's security token is missing or stale (it is tied "
                                "to your login). Reload the page and submit it again.") from None

    def viewer(self) -> dict[str, Any]:
        """GET (after @web.authenticated): an auditor or admin."""
        self.require_auditor()
        return self.caller()

    def editor(self) -> str:
        """POST: an admin; returns the name the audit log records."""
        self.require_admin()
        return self.caller()["name"]

    def form(self) -> dict[str, list[str]]:
        """The posted form as text values (tornado keeps them as bytes)."""
        return {name: [v.decode("utf-8", "replace") for v in values]
                for name, values in self.request.body_arguments.items()}

    async def dispatch_form(self, field: str,
                            handlers: Mapping[str, Callable[[], Awaitable[None]]]) -> None:
        """A page with several forms: run the handler the posted `field` names; a value
        it does not know is a 400 naming the ones it does."""
        chosen = self.get_body_argument(field, "")
        handler = handlers.get(chosen)
        if handler is None:
            raise APIError(400, f"{field} must be {' or '.join(handlers)}, got {chosen!r}")
        await handler()

    async def submit(self, form: str, values: Mapping[str, str],
                     act: Callable[[], Awaitable[str]], status: int | None = None) -> None:
        """Every admin form's one way through a post: run `act`, which saves and returns
        the page to see next (post/redirect/get); a refusal (not a 5xx) shows the form
        `form` again with what was typed and the refusal's messages by input, with
        `status` (default: the refusal's own)."""
        try:
            target = await act()
        except Refusal as e:
            if e.status >= 500:
                raise
            await self.show(form, dict(values), refusal_by_input(e), status or e.status)
            return
        self.see_other(target)

    async def show(self, form: str, values: dict[str, str], errors: dict[str, list[str]],
                   status: int) -> None:
        """The page again with one form's values and errors (each page with forms)."""
        raise NotImplementedError(f"{type(self).__name__} has no forms")

    def see_other(self, path: str) -> None:
        """Post/redirect/get: a reload after saving does not post the form again."""
        prefix = self.settings.get("gpulease_prefix", "/services/gpulease/")
        self.redirect(prefix + path, status=303)
