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

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from jupyter_server.utils import url_path_join

from .notices import CachedAnswerHandler, CachedServiceAnswer, service_url, ssl_options

# Shorter than the 5 s poll, so that one tab sees each new reading (every 10 s) within
# a poll or two; long enough that many tabs make one request.
CACHE_SECONDS = 3.0
TOP_FIELDS = ("user", "server", "account", "profile", "rate_per_hour", "cost_so_far",
              "balance", "runway_s", "runway_by", "as_of", "history_step_s")
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
    if isinstance(payload.get("now"), str):  # the service's clock, which the history is on
        out["now"] = payload["now"]
    return out


@dataclass
class GpuStatusSource(CachedServiceAnswer):
    """The service's answer for this server, passed through (notices.py's cache)."""

    cache_seconds: float = CACHE_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> GpuStatusSource:
        return cls(url=gpu_url(env), token=env.get("JUPYTERHUB_API_TOKEN", ""),
                   server_name=env.get("JUPYTERHUB_SERVER_NAME", ""),
                   ssl_options=ssl_options(env))

    def shaped(self, payload: Any) -> dict[str, Any]:
        return passed_through(payload)

    def succeeded(self, shaped: dict[str, Any]) -> dict[str, Any]:
        return shaped


class GpuStatusHandler(CachedAnswerHandler):
    """This server's GPU and cost, for its owner's browser (every open tab asks every 5 s)."""


def setup_handlers(serverapp: Any, env: Mapping[str, str] = os.environ) -> GpuStatusSource:
    source = GpuStatusSource.from_env(env)
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], "gpulease", "gpu")
    web_app.add_handlers(".*$", [(route, GpuStatusHandler, {"source": source})])
    serverapp.log.info("gpulease: GPU status at %s from %s", route, source.url or "(no hub)")
    return source
