"""Push this server's kernel and terminal state to the gpulease service, with its own token.

The idle culler never contacts a user's server: a server is user code, and
any credential sent to it could be logged by a `jupyter_server_config.py` in
the user's home. So the server tells the gpulease service instead
(`PUT .../services/gpulease/api/server-activity`), authenticated with its
own `JUPYTERHUB_API_TOKEN`; the service files what it says under the server
that token belongs to.

When to push (`push_due`, checked every `check_interval` in-process):
- at once when the state changes: a kernel started or stopped, busy or idle,
  a client attached or gone, a terminal opened or closed;
- when only the last activity moved (a kernel streaming output, typing in a
  terminal), at most every `min_gap` seconds;
- otherwise every `interval` seconds, a heartbeat that keeps the state fresh
  for the culler (which counts a push as current for a few heartbeats only).
A failed push is retried after `min_gap`, doubling with each failure up to
`interval` (a service down or refusing does not get a request a second from
every server); failures are logged once per kind, never raised.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float
from traitlets.config import LoggingConfigurable

from .activity_state import activity_key, collect, state_key
from .notices import service_url, ssl_options

PATH = "api/server-activity"
REQUEST_TIMEOUT = 5.0


@dataclass(frozen=True)
class Sent:
    """What the last push carried, and when it was tried."""

    at: float  # time.monotonic()
    state: tuple | None  # None: the last try failed
    activity: tuple | None
    failures: int = 0  # tries failed in a row


def push_due(last: Sent | None, state: tuple, activity: tuple, now: float, *,
             interval: float, min_gap: float) -> bool:
    if last is None:
        return True
    since = now - last.at
    if last.state is None:  # the previous tries failed: back off
        return since >= min(interval, min_gap * 2 ** max(0, last.failures - 1))
    if state != last.state:
        return True
    if activity != last.activity:
        return since >= min_gap
    return since >= interval


class ActivityPusher(LoggingConfigurable):
    interval = Float(60.0, help="""Seconds between pushes while nothing changes: a heartbeat
        that keeps this server's state current for the idle culler (the culler stops
        believing a push a few heartbeats old).""").tag(config=True)
    check_interval = Float(1.0, help="""Seconds between in-process looks at the kernels and
        terminals; a look that finds nothing to push costs no request.""").tag(config=True)
    min_gap = Float(5.0, help="""Least seconds between pushes made for activity alone (the
        kernels' last activity moving while output streams), and before a failed push is
        tried again (doubling while it keeps failing). A kernel starting, stopping or
        turning busy or idle is pushed at once.""").tag(config=True)

    def __init__(self, serverapp: Any, env: Mapping[str, str] = os.environ, **kwargs: Any):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        self.url = service_url(env, PATH)
        self.token = env.get("JUPYTERHUB_API_TOKEN", "")
        self.ssl = ssl_options(env)
        self.last: Sent | None = None
        self.pushes = 0
        self._error = ""
        self._task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        """Only under JupyterHub: a plain `jupyter lab` has no service to tell."""
        return bool(self.url and self.token)

    def start(self) -> None:
        if self.enabled and self._task is None:
            self.log.info("gpulease: pushing this server's kernel state to %s", self.url)
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the server must not lose its loop to this
                self.log.exception("gpulease: reading the kernels to push them failed")
            await asyncio.sleep(self.check_interval)

    async def tick(self) -> bool:
        """Push if due (see the module doc); True when a push went out and was accepted."""
        body = await collect(self.serverapp)
        state, activity, now = state_key(body), activity_key(body), time.monotonic()
        if not push_due(self.last, state, activity, now, interval=self.interval,
                        min_gap=self.min_gap):
            return False
        ok = await self._send(body)
        if ok:
            self.last = Sent(now, state, activity)
        else:
            failures = self.last.failures + 1 if self.last and self.last.state is None else 1
            self.last = Sent(now, None, None, failures)
        return ok

    async def _send(self, body: dict[str, Any]) -> bool:
        request = HTTPRequest(
            self.url, method="PUT", body=json.dumps(body),
            headers={"Authorization": f"token {self.token}",
                     "Content-Type": "application/json"},
            connect_timeout=REQUEST_TIMEOUT, request_timeout=REQUEST_TIMEOUT,
            follow_redirects=False, **self.ssl,
        )
        try:
            await AsyncHTTPClient().fetch(request)
        except Exception as e:  # noqa: BLE001 - reported, never raised
            error = (f"answered {e.code}: {_message(e)}" if isinstance(e, HTTPClientError)
                     else f"{type(e).__name__}: {e}")
            if error != self._error:
                self.log.warning("gpulease: cannot push this server's kernel state to %s (%s); "
                                 "the idle culler then judges it without its kernels",
                                 self.url, error)
            self._error = error
            return False
        if self._error:
            self.log.info("gpulease: pushing kernel state to %s works again", self.url)
        self._error = ""
        self.pushes += 1
        return True


def _message(e: HTTPClientError) -> str:
    try:
        return str(json.loads(e.response.body)["message"])[:300]
    except Exception:  # noqa: BLE001 - any unreadable answer
        return e.message or ""
