"""Admin pages: profiles editor, inventory, credits, caps and limits, reservations, audit log.

Server-rendered HTML with plain forms (no JavaScript, so the CSP allows no
script at all); see admin_base.py for who may see and post, and for the CSRF
protection of the forms. The editor lives in profiles.py, credits
and limits in credits.py, reservations in reservations.py;
this module has the read-only pages and mounts them all.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

from tornado import web

from gpulease.hub.service.api.audit import parse_audit_query
from gpulease.hub.service.api.inventory import current_inventory
from gpulease.hub.service.pages import credits, profiles, reservations
from gpulease.hub.service.pages import forms as af
from gpulease.hub.service.pages.admin_base import AdminPage

AUDIT_PAGE = 50
AUDIT_FILTERS = ("since", "until", "actor", "target", "action")


class InventoryPage(AdminPage):
    @web.authenticated
    async def get(self):
        self.viewer()
        # The same view as GET api/inventory (InventoryHandler), queue included.
        view = await current_inventory(self)
        if view["shape"] == "cluster":
            self.render("admin_inventory_cluster.html", view=view,
                        nodes=af.cluster_node_tables(view), queue=af.queue_rows(view))
            return
        rows = af.inventory_rows(view)
        self.render("admin_inventory.html", rows=rows, counts=af.inventory_counts(rows),
                    queue=af.queue_rows(view), has_queue="queue" in view,
                    source=view.get("label") or view.get("source") or "")


class AuditPage(AdminPage):
    @web.authenticated
    async def get(self):
        self.viewer()
        args = {name: (self.get_argument(name, "") or "").strip() for name in AUDIT_FILTERS}
        query = parse_audit_query({**args, "limit": str(AUDIT_PAGE),
                                   "offset": str(af.parse_offset(self.get_argument("offset",
                                                                                   None)))})
        entries, total = await asyncio.to_thread(
            self.ctx.audit.entries, since=query.since, until=query.until, actor=query.actor,
            target=query.target, action=query.action, limit=query.limit, offset=query.offset)
        paging = af.Paging(query.offset, query.limit, total)
        kept = {k: v for k, v in args.items() if v}

        def page_url(offset: int | None) -> str:
            return "" if offset is None else "?" + urlencode({**kept, "offset": offset})

        self.render("admin_audit.html", rows=[af.audit_row(e) for e in entries],
                    filters=args, paging=paging, prev_url=page_url(paging.prev_offset),
                    next_url=page_url(paging.next_offset))


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"admin/inventory", InventoryPage),
    (r"admin/audit", AuditPage),
    *profiles.ROUTES,
    *credits.ROUTES,
    *reservations.ROUTES,
]
