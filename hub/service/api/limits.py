"""Per-user and per-group GPU limits API (api/limits/...).

- `GET api/limits`: admins and auditors see every limit; anyone else the
  limits that apply to them (their own and their groups').
- `GET api/limits/{user:NAME|group:NAME}`: one subject (nulls: no limit).
- `PUT api/limits/{user:NAME|group:NAME}` `{"max_gpus": N|null, "max_slices": N|null}`:
  admins; a field left out keeps its value, null removes that limit. Recorded
  in the audit log.
"""

from __future__ import annotations

import asyncio

from tornado import web

from gpulease.core.policy.limits import Limit, parse_limit_body, parse_subject
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError


def limit_view(limit: Limit) -> dict:
    return {"subject": limit.subject, **limit.as_dict()}


class LimitsHandler(BaseAPIHandler):
    async def get(self):
        model = self.caller()
        table = await asyncio.to_thread(self.ctx.limits.all)
        if not self.is_auditor():
            mine = {f"user:{model['name']}"} | {f"group:{g}" for g in model.get("groups") or []}
            table = {s: lim for s, lim in table.items() if s in mine}
        self.write_json({"limits": [limit_view(lim) for lim in table.values()]})


class LimitHandler(BaseAPIHandler):
    def _subject(self, subject: str) -> str:
        return parse_subject(subject)  # LimitError (a Refusal) names the rule of subjects

    async def get(self, subject: str):
        model = self.caller()  # a stranger is told nothing, the rule of subjects neither
        subject = self._subject(subject)
        mine = {f"user:{model['name']}"} | {f"group:{g}" for g in model.get("groups") or []}
        if subject not in mine and not self.is_auditor():
            raise APIError(403, "Only gpulease admins and auditors may see others' limits")
        limit = await asyncio.to_thread(self.ctx.limits.get, subject)
        self.write_json(limit_view(limit or Limit(subject)))

    async def put(self, subject: str):
        self.require_admin()
        subject = self._subject(subject)
        values = parse_limit_body(self.json_body())
        _, after = await asyncio.to_thread(self.ctx.limits.set, subject, values,
                                           actor=self.caller()["name"], audit=self.ctx.audit)
        self.write_json(limit_view(after))


# (path relative to the service prefix, handler class); app.make_app mounts them.
ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/limits", LimitsHandler),
    # Any segment: a subject that is not user:NAME or group:NAME is a 400 naming the
    # rule (LimitHandler._subject), and a client that writes the colon as %3A is heard.
    (r"api/limits/([^/]+)", LimitHandler),
]
