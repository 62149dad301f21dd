"""Failed starts API (api/failed-starts): what the rationing of failed starts counts.

- `GET api/failed-starts[?user=NAME]`: the failed starts still counted (within
  `GPULeaseHub.failed_start_window`, not cleared), each with its profile, time and
  why, and per user and profile until when starts are refused. Admins and
  auditors see anyone's; anyone else only their own.
- `DELETE api/failed-starts/{NAME}[?profile=SLUG]`: admins forgive a user's
  counted failed starts (of one profile, or all): their starts are no longer
  refused. Recorded in the audit log (`failed_starts.clear`), as is each
  rationing gpulease decided (`failed_starts.rationed`).
"""

from __future__ import annotations

import asyncio
from itertools import groupby

from tornado import web

from gpulease.core.clock import iso_z, utcnow
from gpulease.core.model.profiles import SLUG
from gpulease.core.policy.user_names import name_problem
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.store.failed_starts import FailedStarts, rationed_until


def checked_user(name: str) -> str:
    """A user name from the request, or a 400 naming the rule (no such user can exist)."""
    problem = name_problem(name)
    if problem:
        raise Refusal.of_field("user", problem)
    return name


def checked_profile(slug: str | None) -> str | None:
    if slug is not None and not SLUG.fullmatch(slug):
        raise Refusal.of_field("profile", f"profile {shown(slug)} is not a profile slug: "
                               "lowercase letters, digits and '-', at most 63 characters")
    return slug


class FailedStartsHandler(BaseAPIHandler):
    def _store(self) -> FailedStarts:
        return FailedStarts(self.ctx.engine, self.settings["gpulease_failed_start_rule"])

    async def get(self):
        model = self.caller()
        user = self.get_query_argument("user", None) or model["name"]
        if user != model["name"]:
            checked_user(user)
        if user != model["name"] and not self.is_auditor():
            raise APIError(403, "Only gpulease admins and auditors may see others' failed starts")
        store = self._store()
        now = utcnow()
        counted = await asyncio.to_thread(store.counted, user, None, now)
        paused = []
        for profile, group in groupby(sorted(counted, key=lambda f: f.profile),
                                      key=lambda f: f.profile):
            until = rationed_until([f.at for f in group], now, store.rule)
            if until is not None:
                paused.append({"profile": profile, "until": iso_z(until)})
        self.write_json({
            "user": user, "limit": store.rule.limit, "window_seconds": store.rule.window_s,
            "failed_starts": [{"server": f.server, "profile": f.profile, "at": iso_z(f.at),
                               "why": f.why} for f in counted],
            "paused": paused,
        })


class FailedStartsOfUserHandler(BaseAPIHandler):
    async def delete(self, user: str):
        self.require_admin()
        user = checked_user(user)
        profile = checked_profile(self.get_query_argument("profile", None) or None)
        cleared = await asyncio.to_thread(FailedStarts(self.ctx.engine).clear, user,
                                          self.caller()["name"], profile)
        self.write_json({"user": user, "profile": profile, "cleared": cleared})


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/failed-starts", FailedStartsHandler),
    (r"api/failed-starts/([^/]+)", FailedStartsOfUserHandler),
]
