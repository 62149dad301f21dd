"""api/inventory: the devices and who holds them (GET), and an admin's return of a device
held by a server that is gone (POST api/inventory/return).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tornado import web

from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.views import cluster_inventory_view, inventory_view
from gpulease.spawners.local.quarantine import leftover_pids
from gpulease.store.sessions import SessionLedger


async def current_inventory(handler: BaseAPIHandler) -> dict[str, Any]:
    """GET api/inventory's answer (the admin page shows the same): the embedded shape's
    devices, or in the cluster shape (a ClusterSource in the settings) the cluster form."""
    queue = await asyncio.to_thread(handler.ctx.queue.rows)
    source = handler.settings.get("gpulease_cluster")
    if source is not None:  # 502/503 refusals naming the cause when it cannot be listed
        listed = await source.listed()
        return cluster_inventory_view(listed.inventory, listed.at, source.namespace, queue)
    held = await asyncio.to_thread(handler.ctx.assignments.held)
    isolation = handler.settings.get("gpulease_isolation", {})
    open_sessions = await asyncio.to_thread(SessionLedger(handler.ctx.engine).open_sessions)
    tiers = {(s.user, s.server): s.tier for s in open_sessions}
    active = await asyncio.to_thread(handler.ctx.reservations.active)
    return inventory_view(handler.ctx.inventory, held, queue, isolation, tiers, active)


class InventoryHandler(BaseAPIHandler):
    async def get(self):
        self.require_auditor()
        self.write_json(await current_inventory(self))

class ReturnDeviceHandler(BaseAPIHandler):
    async def post(self, uuid: str):
        self.require_admin()
        body = self.json_body() if self.request.body else {}
        if not isinstance(body, dict) or set(body) - {"force"}:
            raise APIError(400, 'The body must be {"force": false} or empty')
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise APIError(400, "force must be true or false",
                           [{"field": "force", "message": "must be true or false"}])
        records = await asyncio.to_thread(self.ctx.assignments.out_of_service)
        record = records.get(uuid)
        if record is None:
            raise APIError(404, f"Device {uuid} is not out of service "
                                f"(out of service now: {', '.join(records) or 'none'})")
        left = await asyncio.to_thread(leftover_pids, record)
        if left and not force:
            where = ", ".join(record.cgroup.get("dirs") or ()) or record.cgroup.get("unit", "")
            raise APIError(409, f"Device {uuid} is kept by {len(left)} process(es) of "
                                f"{record.user}/{record.server or '(default)'} still in its "
                                f"cgroup ({where}): pids {', '.join(map(str, left[:20]))}. "
                                "End them, or pass force to return it anyway")
        actor = self.caller()["name"]
        returned = await asyncio.to_thread(self.ctx.assignments.return_to_service, uuid,
                                           f"admin:{actor}")
        if returned is None:  # returned by itself meanwhile
            raise APIError(404, f"Device {uuid} is not out of service any more")
        before = {"state": "out_of_service", "user": record.user, "server": record.server,
                  "detail": record.detail, "pids_left": left}
        await asyncio.to_thread(self.ctx.audit.record, actor, "inventory.return",
                                f"device:{uuid}", before, {"state": "free", "forced": force})
        self.write_json({"uuid": uuid, "state": "free", "forced": force, "pids_left": left})


# (path relative to the service prefix, handler class); app.make_app mounts them.
ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/inventory/([^/]+)/return", ReturnDeviceHandler),
]
