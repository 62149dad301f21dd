"""Notices API of the gpulease service: api/notices and api/me/notifications.

- `POST api/notices` (admins; the idle culler and the credit enforcer hold
  custom:gpulease:admin) stores a notice and notifies its user by their choice,
  in the background: the answer does not wait for a mail server.
- `DELETE api/notices?user=&server=&kind=` clears open notices: admins for
  anyone (activity cancelled a suspend), users their own (dismiss).
- `GET api/notices` the caller's open notices (admins and auditors: `?user=`).
- `GET/PUT api/me/notifications` each user's channel: none, email, webhook.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from jupyterhub.utils import url_path_join

from gpulease.core.refusal import Refusal
from gpulease.hub.servers.notifier import Notifier, tell
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.billing_views import iso, parse_time
from gpulease.hub.service.errors import APIError
from gpulease.store.notices import CHANNELS, KINDS, Notice, NoticeStore

log = logging.getLogger("gpulease.service")
_background: set[asyncio.Task] = set()


def notice_view(n: Notice) -> dict[str, Any]:
    return {"id": n.id, "user": n.user, "server": n.server, "kind": n.kind,
            "message": n.message, "deadline": iso(n.deadline), "created": iso(n.created)}


class NoticeHandler(BaseAPIHandler):
    def initialize(self, backends: Mapping[str, Notifier], **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.backends = backends

    @property
    def store(self) -> NoticeStore:
        return NoticeStore(self.ctx.engine)

    async def run(self, fn, *args, **kwargs) -> Any:
        """Call a store function in a thread (its NoticeErrors are 400s as they are)."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    def own_name(self) -> str:
        me = self.caller()
        if me.get("kind", "user") != "user":
            raise Refusal.of_field("user", f"{me.get('name')} is a service, with no notices "
                                       "of its own: pass ?user=NAME")
        return me["name"]

    def available(self) -> list[str]:
        return [c for c in CHANNELS if c == "none" or c in self.backends]


class NoticesHandler(NoticeHandler):
    async def get(self):
        user = self.get_argument("user", None)
        if user is None:
            user = self.own_name()
        elif user != self.caller()["name"] and not self.is_auditor():
            raise APIError(403, "Only gpulease admins and auditors may see another user's "
                                "notices")
        server = self.get_argument("server", None)
        items = await self.run(self.store.active, user, server)
        self.write_json({"notices": [notice_view(n) for n in items]})

    async def post(self):
        self.require_admin()
        body = self.json_body()
        allowed = {"user", "server", "kind", "message", "deadline"}
        if not isinstance(body, dict) or set(body) - allowed:
            raise APIError(400, 'The body must be {"user", "server", "kind", "message", '
                                '"deadline"} (deadline: ISO 8601 UTC, or null)')
        raw = body.get("deadline")
        if raw is not None and not isinstance(raw, str):
            raise Refusal.of_field("deadline", "deadline must be an ISO 8601 timestamp or null")
        deadline = parse_time(raw, "deadline")  # PeriodError: a 400 naming deadline
        notice = await self.run(self.store.post, body.get("user"), body.get("server", ""),
                                body.get("kind"), body.get("message"), deadline)
        notify = not notice.replaced  # told already when this replaced an open notice
        if notify:
            tell(self.store, self.backends, notice)
        self.write_json({**notice_view(notice), "notified": notify}, 201)

    async def delete(self):
        user = self.get_argument("user", None)
        if user is None:
            user = self.own_name()
        elif user != self.caller()["name"]:
            self.require_admin()
        server = self.get_argument("server", None)
        kind = self.get_argument("kind", None)
        kinds = [k for k in kind.split(",") if k] if kind else None
        if kinds is not None and set(kinds) - set(KINDS):
            raise Refusal.of_field("kind", f"unknown kind in {kind!r}; allowed: {', '.join(KINDS)}")
        cleared = await self.run(self.store.clear, user, server, kinds)
        self.write_json({"cleared": cleared})


class MyNotificationsHandler(NoticeHandler):
    async def get(self):
        prefs = await self.run(self.store.get_prefs, self.own_name())
        self.write_json({"channel": prefs.channel, "address": prefs.address,
                         "available": self.available()})

    async def put(self):
        user = self.own_name()
        body = self.json_body()
        if not isinstance(body, dict) or set(body) - {"channel", "address"}:
            raise APIError(400, 'The body must be {"channel": "email"|"webhook"|"none", '
                                '"address": "..."}')
        if "channel" not in body:
            raise Refusal.of_field("channel", f"channel is required: one of {', '.join(CHANNELS)}")
        channel = body["channel"]
        if channel in CHANNELS and channel not in self.available():
            what = "no webhook" if channel == "webhook" else "no mail server (SMTP)"
            message = (f"The admin has configured {what}, so {channel!r} cannot be chosen; "
                       f"available: {', '.join(self.available())}")
            raise Refusal.of_field("channel", message, 409)
        prefs = await self.run(self.store.set_prefs, user, channel, body.get("address", ""))
        self.write_json({"channel": prefs.channel, "address": prefs.address,
                         "available": self.available()})


def notice_routes(prefix: str, args: dict[str, Any],
                  backends: Mapping[str, Notifier]) -> list[tuple[str, type, dict[str, Any]]]:
    """The notices routes, with the notification backends configured (backends_from_env)."""
    kwargs = {**args, "backends": backends}
    return [
        (url_path_join(prefix, "api/notices"), NoticesHandler, kwargs),
        (url_path_join(prefix, "api/me/notifications"), MyNotificationsHandler, kwargs),
    ]
