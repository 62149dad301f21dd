"""`GET {base_url}gpulease/gpu`: this server's GPU and cost, for JupyterLab's status bar.

The notebook server asks the gpulease service (`GET .../services/gpulease/api/me/gpu
?server=NAME`) with its own API token (`JUPYTERHUB_API_TOKEN`), as notices.py does:
the browser never talks to the service, so this keeps working where the service has
an origin of its own (per-user origins, a subdomain host). The service gives a
server's own token that server only, and this handler is `@web.authenticated`, so
only this server's owner (the hub's OAuth, as for every handler of the server) gets in.

The answer is kept `CACHE_SECONDS` (every open tab polls every 5 s: one request to
the service for all of them) and passed through with only the documented fields
(docs/rest-api.yml `MyGpu`). A failure is never an error to the browser: 200 with
`{"server", "error", "now"}`, so the status bar says what went wrong.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .notices import REQUEST_TIMEOUT, describe, service_url, ssl_options

# Shorter than the 5 s poll, so that one tab sees each new reading (every 10 s) within
# a poll or two; long enough that many tabs make one request.
CACHE_SECONDS = 3.0
TOP_FIELDS = ("user", "server", "account", "profile", "rate_per_hour", "cost_so_far",
              "balance", "runway_s", "as_of")
READING_FIELDS = ("activity", "memory_used_bytes", "memory_total_bytes", "source", "why", "at")
HISTORY_FIELDS = ("at", "activity", "memory_used_bytes")


def gpu_url(env: Mapping[str, str]) -> str | None:
    """The service's `api/me/gpu` for this server (`JUPYTERHUB_SERVER_NAME`, "" the default)."""
    base = service_url(env, "api/me/gpu")
    if base is None:
        return None
    return f"{base}?{urlencode({'server': env.get('JUPYTERHUB_SERVER_NAME', '')})}"


def passed_through(payload: Any) -> dict[str, Any]:
    """The documented fields of the service's answer, and nothing else; ValueError when
    it is not the documented shape (a proxy's page, another version's answer)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("history"), list):
        raise ValueError("the gpulease service answered without a `history` list")
    out = {k: payload.get(k) for k in TOP_FIELDS}
    reading = payload.get("reading")
    out["reading"] = ({k: reading.get(k) for k in READING_FIELDS}
                      if isinstance(reading, dict) else None)
    out["history"] = [{k: r.get(k) for k in HISTORY_FIELDS}
                      for r in payload["history"] if isinstance(r, dict)]
    return out


@dataclass
class GpuStatusSource:
    """Fetches and caches the service's answer; one request in flight at a time."""

    url: str | None
    token: str
    server_name: str
    ssl_options: dict[str, str] = field(default_factory=dict)
    cache_seconds: float = CACHE_SECONDS
    _at: float = field(default=-1e9, init=False)
    _result: dict[str, Any] = field(default_factory=dict, init=False)
    _inflight: asyncio.Future | None = field(default=None, init=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> GpuStatusSource:
        return cls(url=gpu_url(env), token=env.get("JUPYTERHUB_API_TOKEN", ""),
                   server_name=env.get("JUPYTERHUB_SERVER_NAME", ""),
                   ssl_options=ssl_options(env))

    async def get(self) -> dict[str, Any]:
        if time.monotonic() - self._at < self.cache_seconds:
            return self._result
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._refresh())
        inflight = self._inflight
        try:
            # shielded: a tab that goes away does not cancel the others' request
            return await asyncio.shield(inflight)
        finally:
            if inflight.done() and self._inflight is inflight:
                self._inflight = None

    async def _refresh(self) -> dict[str, Any]:
        try:
            result = await self._fetch()
        except Exception as e:  # noqa: BLE001 - any failure is reported, never raised
            # kept for the cache too: a service that is down is not asked by every tab
            result = {"server": self.server_name, "error": describe(e, self.url)}
        result["now"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._result, self._at = result, time.monotonic()
        return result

    async def _fetch(self) -> dict[str, Any]:
        if not self.url:
            raise LookupError("no gpulease service URL (GPULEASE_SERVICE_URL is not set)")
        if not self.token:
            raise LookupError("no API token (JUPYTERHUB_API_TOKEN is not set)")
        request = HTTPRequest(
            self.url,
            headers={"Authorization": f"token {self.token}", "Accept": "application/json"},
            connect_timeout=REQUEST_TIMEOUT,
            request_timeout=REQUEST_TIMEOUT,
            follow_redirects=False,
            **self.ssl_options,
        )
        response = await AsyncHTTPClient().fetch(request)
        return passed_through(json.loads(response.body))


class GpuStatusHandler(APIHandler):
    """This server's GPU and cost, for its owner's browser.

    Polling it is not activity (as notices.py): every open tab asks every 5 s, and
    counting that would keep an idle server, and its bill, running.
    """

    _track_activity = False

    def initialize(self, source: GpuStatusSource) -> None:
        self.source = source

    @web.authenticated
    async def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(await self.source.get()))


def setup_handlers(serverapp: Any, env: Mapping[str, str] = os.environ) -> GpuStatusSource:
    source = GpuStatusSource.from_env(env)
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], "gpulease", "gpu")
    web_app.add_handlers(".*$", [(route, GpuStatusHandler, {"source": source})])
    serverapp.log.info("gpulease: GPU status at %s from %s", route, source.url or "(no hub)")
    return source
