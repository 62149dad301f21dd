"""Notices through the gpulease service: JupyterLab, the hub's pages, mail and webhook.

The culler only says what happened; the gpulease service stores the notice
(the JupyterLab extension and the hub banner read it) and notifies the user
the way they chose. A notice that cannot be delivered is logged and never
stops a suspend.
"""

from __future__ import annotations

import logging
from urllib.parse import urlencode

from gpulease.core.notices import render
from gpulease.idle_culler.hubapi import HubClient, HubError
from gpulease.idle_culler.policy import MAX_RUNTIME_WARN, STOP_MAX_RUNTIME, Decision

log = logging.getLogger("gpulease.culler")


def _iso_z(when) -> str | None:
    return when.replace(tzinfo=None).isoformat(timespec="seconds") + "Z" if when else None


class ServiceNotices:
    def __init__(self, hub: HubClient):
        self.hub = hub
        self.url = f"{hub.public_url}/services/gpulease/api/notices"

    async def _post(self, user: str, server: str, kind: str, decision: Decision) -> None:
        minutes = decision.idle_for_s / 60 if decision.idle_for_s else None
        _, text = render(kind, user, server, None, minutes, decision.deadline)
        body = {"user": user, "server": server, "kind": kind, "message": text,
                "deadline": _iso_z(decision.deadline)}
        try:
            await self.hub.request("POST", self.url, body)
        except (HubError, OSError) as e:
            log.warning("could not post the %s notice of %s/%s: %s", kind, user, server, e)

    async def warn(self, user: str, server: str, decision: Decision) -> None:
        kind = "max_runtime_warning" if decision.action == MAX_RUNTIME_WARN else "idle_warning"
        await self._post(user, server, kind, decision)

    async def cancel(self, user: str, server: str) -> None:
        query = urlencode({"user": user, "server": server,
                           "kind": "idle_warning,max_runtime_warning"})
        try:
            await self.hub.request("DELETE", f"{self.url}?{query}")
        except (HubError, OSError) as e:
            log.warning("could not clear the warnings of %s/%s: %s", user, server, e)

    async def suspended(self, user: str, server: str, decision: Decision) -> None:
        stopped = decision.action == STOP_MAX_RUNTIME
        await self._post(user, server, "max_runtime_stopped" if stopped else "suspended",
                         decision)
