"""`GET {base_url}gpulease/notices`: this server's notices from the gpulease hub service.

The notebook server asks the gpulease service (`GET .../services/gpulease/api/notices`)
with its own API token (`JUPYTERHUB_API_TOKEN`, granted
`access:services!service=gpulease` through `Spawner.server_token_scopes`), keeps
the answer for `CACHE_SECONDS` so that many open tabs make one request, and keeps
only the notices of this server (`JUPYTERHUB_SERVER_NAME`, "" for the default one).

A failure to reach the service is never an error to the browser: the answer is
200 with an empty list and an `error` field saying what went wrong.
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

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

SERVICE_NAME = "gpulease"
CACHE_SECONDS = 10.0
REQUEST_TIMEOUT = 5.0
NOTICE_FIELDS = ("server", "kind", "message", "deadline", "created")


def notices_url(env: Mapping[str, str]) -> str | None:
    """Where the gpulease service's notices endpoint is, from the server's environment:
    `GPULEASE_NOTICES_URL` (the endpoint itself), else under `GPULEASE_SERVICE_URL`."""
    if env.get("GPULEASE_NOTICES_URL"):
        return env["GPULEASE_NOTICES_URL"]
    return service_url(env, "api/notices")


def service_url(env: Mapping[str, str], path: str) -> str | None:
    """`path` of the gpulease service, under `GPULEASE_SERVICE_URL`: the service's own
    address, set by the spawner (gpulease.hub.config.hub_config). Never guessed from the hub's
    URLs: under a subdomain host the service has an origin of its own."""
    if env.get("GPULEASE_SERVICE_URL"):
        return url_path_join(env["GPULEASE_SERVICE_URL"], path)
    return None


def ssl_options(env: Mapping[str, str]) -> dict[str, str]:
    """With internal_ssl the hub hands the server a client certificate."""
    ssl = {}
    for key, env_key in (("client_key", "JUPYTERHUB_SSL_KEYFILE"),
                         ("client_cert", "JUPYTERHUB_SSL_CERTFILE"),
                         ("ca_certs", "JUPYTERHUB_SSL_CLIENT_CA")):
        if env.get(env_key):
            ssl[key] = env[env_key]
    return ssl


def for_server(payload: Any, server_name: str) -> list[dict[str, Any]]:
    """The well-formed notices of `payload` that belong to `server_name`."""
    if not isinstance(payload, dict) or not isinstance(payload.get("notices"), list):
        raise ValueError("the gpulease service answered without a `notices` list")
    out = []
    for notice in payload["notices"]:
        if not isinstance(notice, dict) or not isinstance(notice.get("message"), str):
            continue
        if (notice.get("server") or "") != server_name:
            continue
        out.append({k: notice.get(k) for k in NOTICE_FIELDS} | {"server": server_name})
    return out


@dataclass
class CachedServiceAnswer:
    """One answer of the gpulease service for this server, asked with the server's own
    token and kept `cache_seconds` (every open tab polls: one request for all of them),
    one request in flight at a time. A failure is an answer too (`failed`), cached as
    well: a service that is down is not asked by every tab. Subclasses say how a good
    answer is read (`shaped`, ValueError when it is not the documented shape) and shown
    (`succeeded`)."""

    url: str | None
    token: str
    server_name: str
    ssl_options: dict[str, str] = field(default_factory=dict)
    cache_seconds: float = CACHE_SECONDS
    _at: float = field(default=-1e9, init=False)
    _result: dict[str, Any] = field(default_factory=dict, init=False)
    _inflight: asyncio.Future | None = field(default=None, init=False)

    def shaped(self, payload: Any) -> Any:
        raise NotImplementedError

    def succeeded(self, shaped: Any) -> dict[str, Any]:
        raise NotImplementedError

    def failed(self, why: str) -> dict[str, Any]:
        return {"server": self.server_name, "error": why}

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
            result = self.succeeded(await self._fetch())
        except Exception as e:  # noqa: BLE001 - any failure is reported, never raised
            result = self.failed(describe(e, self.url))
        # The service's clock where it said (the times it answered are on it), else ours.
        result.setdefault("now", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._result, self._at = result, time.monotonic()
        return result

    async def _fetch(self) -> Any:
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
        return self.shaped(json.loads(response.body))


class CachedAnswerHandler(APIHandler):
    """A CachedServiceAnswer for the server's own browser (or any authenticated client).

    Polling it is not activity: JupyterLab asks from every open tab, and counting that
    would keep an idle server, and its bill, running as long as a tab stays open.
    """

    _track_activity = False

    def initialize(self, source: CachedServiceAnswer) -> None:
        self.source = source

    @web.authenticated
    async def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(await self.source.get()))


@dataclass
class NoticesSource(CachedServiceAnswer):
    """The notices of this server: an empty list with the error when they cannot be had."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> NoticesSource:
        return cls(url=notices_url(env), token=env.get("JUPYTERHUB_API_TOKEN", ""),
                   server_name=env.get("JUPYTERHUB_SERVER_NAME", ""), ssl_options=ssl_options(env))

    def shaped(self, payload: Any) -> list[dict[str, Any]]:
        return for_server(payload, self.server_name)

    def succeeded(self, shaped: list[dict[str, Any]]) -> dict[str, Any]:
        return {"server": self.server_name, "notices": shaped}

    def failed(self, why: str) -> dict[str, Any]:
        return {"server": self.server_name, "notices": [], "error": why}


def describe(e: Exception, url: str | None) -> str:
    if isinstance(e, HTTPClientError):
        return f"the gpulease service answered {e.code} ({url})"
    if isinstance(e, LookupError):
        return str(e)
    if isinstance(e, ValueError):
        return f"unreadable answer from the gpulease service ({url}): {e}"
    return f"cannot reach the gpulease service ({url}): {e.__class__.__name__}: {e}"


class NoticesHandler(CachedAnswerHandler):
    """The notices of this server (JupyterLab asks every 30 s from every open tab)."""


def setup_handlers(serverapp, env: Mapping[str, str] = os.environ) -> NoticesSource:
    source = NoticesSource.from_env(env)
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], "gpulease", "notices")
    web_app.add_handlers(".*$", [(route, NoticesHandler, {"source": source})])
    serverapp.log.info("gpulease: notices at %s from %s", route, source.url or "(no hub)")
    return source
