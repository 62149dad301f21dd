"""Researchers' own servers: POST api/servers, PUT api/me/default-profile."""

from __future__ import annotations

from tornado import web

# (path relative to the service prefix, handler class); app.make_app mounts them.
ROUTES: list[tuple[str, type[web.RequestHandler]]] = []
