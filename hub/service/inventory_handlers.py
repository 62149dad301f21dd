"""Returning an out-of-service device to the pool (admins).

`POST api/inventory/{uuid}/return` `{"force": false}`: a device is out of
service when its last server stopped but processes of it could not be ended
(gpulease.spawners.quarantine). The hub returns it by itself once its cgroup
is empty; this returns it sooner. While processes are still in the cgroup
it answers 409 naming them, unless `force` is true (the admin has checked
that they cannot use the device). 404 for a device that is not out of
service. Recorded in the audit log.
"""

from __future__ import annotations

import asyncio

from tornado import web

from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.spawners.quarantine import leftover_pids


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
