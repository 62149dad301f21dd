"""`GET api/right-sizing` (admins and auditors): per GPU profile, how busy and how oversized
its sessions of the last 30 days were, across all researchers (issue 47, item 3), to set
layouts and prices by. The admin report page shows the same table (pages/usage.py)."""

from __future__ import annotations

import asyncio

from gpulease.core.clock import utcnow
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service import right_sizing_views as rs
from gpulease.hub.service.base import BaseAPIHandler


class RightSizingHandler(BaseAPIHandler):
    async def get(self):
        self.require_auditor()
        now = utcnow()
        # every profile, disabled too: their recent sessions were billed all the same
        profiles = await asyncio.to_thread(self.ctx.profiles.list, True)
        rows = await asyncio.to_thread(rs.report_of, self.ctx.engine, profiles, now)
        window = rs.report_window(now)
        self.write_json({"since": bv.iso(window["since"]), "until": bv.iso(window["until"]),
                         "profiles": rows})


ROUTES = [(r"api/right-sizing", RightSizingHandler)]
