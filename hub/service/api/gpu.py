"""What a server's GPU does, and what it costs: the culler's readings in, the status bar's out.

- `PUT api/gpu-readings` `{"servers": [{"user", "server", "started", "activity",
  "memory_used_bytes", "memory_total_bytes", "source", "why"}], "interval_s"}` —
  gpulease admins (the idle culler), as `GET api/server-activity`. Each reading is
  folded into its server's open session, unless it was read for an earlier run of
  the server (gpulease/store/gpu_stats.py), in one transaction, and kept an hour in
  memory with that session (hub/service/gpu_readings.py). 204;
  400 naming every bad field, nothing kept; 403 for anyone else; 413 over the
  service's 1 MiB; 429 with `Retry-After` beyond the push ration, before the
  body is read.
- `GET api/me/gpu[?server=NAME]` — a researcher's own token (any of their
  servers, NAME defaulting to "") or a server's own token (`JUPYTERHUB_API_TOKEN`:
  that server only): the open session's profile, rate, cost so far, the
  balance of the account it bills and how long that lasts (`runway`), the
  latest reading of this session (nulls with why once stale) and its last hour, a
  point a minute. Never another user's (`user=` naming
  someone else is 403, admins included: this is the researcher's own view).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from math import ceil

from tornado import web

from gpulease.core.refusal import Refusal
from gpulease.hub.service.activity_store import PushError, server_of
from gpulease.hub.service.billing_views import iso
from gpulease.hub.service.body_limit import MAX_BODY_BYTES
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.gpu_readings import (
    CHART_STEP_S,
    MAX_NAME,
    GpuReadings,
    parse_readings,
    reading_view,
)
from gpulease.hub.service.push_rate import PushRate
from gpulease.hub.service.runway import cost_view
from gpulease.hub.service.streamed_push import StreamedPush, TokenIdentified
from gpulease.store.gpu_stats import fold_readings

# The culler pushes once a pass, in chunks of at most 5,000 servers: 200,000
# servers are 40 pushes, which the burst takes; a runaway loop is held to 5 a second.
PUSH_BURST = 50.0
PUSH_PER_S = 5.0


class GpuHandler(TokenIdentified):
    """Shared: the readings held in memory, and the caller identified without blocking
    (every server's status bar asks, and pushes come from the culler)."""

    @property
    def readings(self) -> GpuReadings:
        return self.settings.setdefault(
            "gpulease_gpu_readings",
            GpuReadings(step_s=self.settings.get("gpulease_gpu_chart_step_s", CHART_STEP_S)))


@web.stream_request_body
class GpuReadingsHandler(StreamedPush, GpuHandler):
    """Streamed so that who pushes, and how often, is checked before the body is read."""

    max_body_bytes = MAX_BODY_BYTES
    what = "A push of GPU readings (push fewer servers at once)"

    @property
    def rate(self) -> PushRate:
        return self.settings.setdefault(
            "gpulease_gpu_push_rate", PushRate(server_burst=PUSH_BURST, server_per_s=PUSH_PER_S,
                                               user_burst=PUSH_BURST, user_per_s=PUSH_PER_S))

    async def admit(self) -> None:
        await self.identify()
        self.require_admin()
        wait = self.rate.wait_s(self.caller()["name"], "gpu-readings", time.monotonic())
        if wait:
            raise APIError(429, f"GPU readings are pushed too often: at most {PUSH_PER_S:g} "
                                f"a second (bursts of {PUSH_BURST:g}); try again in {wait} s",
                           headers={"Retry-After": str(wait)})
        self.bound_body()

    async def put(self) -> None:
        # Naive UTC, as the hub lists a server's start and the sessions are kept.
        push = parse_readings(self.body_json(), datetime.now(UTC).replace(tzinfo=None))
        # The sessions first: were the database down (503), memory keeps nothing either.
        accepted = await asyncio.to_thread(fold_readings, self.ctx.engine,
                                           [r.sample() for r in push.readings],
                                           round(push.interval_s * 1000))
        self.readings.put(push, accepted)
        self.set_status(204)
        self.finish()


class MyGpuHandler(GpuHandler):
    async def prepare(self) -> None:
        await self.identify()

    def _whose(self) -> tuple[str, str]:
        """(user, server) the caller may see: its own server, or one of its own."""
        me = self.caller()
        if me.get("kind", "user") != "user":
            raise APIError(403, f"{me.get('name')} is a service: this is a researcher's own "
                                "view, asked with their token or their server's")
        name = me["name"]
        asked_user = self.get_argument("user", None)
        if asked_user not in (None, name):
            raise APIError(403, "A researcher sees only their own servers' GPU and cost here, "
                                "never another user's")
        # not stripped: a name of control characters counts as the characters it is
        asked = self.get_argument("server", None, strip=False)
        if asked is not None and len(asked) > MAX_NAME:
            raise Refusal.of_field("server", f"server must be a server name of at most "
                                             f"{MAX_NAME} characters")
        try:
            owner, own = server_of(me)
        except PushError:
            return name, asked or ""  # a researcher's own token: any of their servers
        if asked is not None and asked != own:
            raise APIError(403, f"A server's own token sees only its own server ({own!r}), "
                                f"not {asked!r}")
        return owner, own

    async def get(self) -> None:
        user, server = self._whose()
        view, session = await asyncio.to_thread(cost_view, self.ctx, user, server)
        now = datetime.now(UTC).replace(tzinfo=None)
        held = self.readings.of_session(user, server, session)
        latest = None if held is None or held.latest is None else reading_view(
            held.latest, iso, now, held.interval_s)
        history = [] if held is None else [{**p, "at": iso(p["at"])} for p in held.points(now)]
        self.write_json({"user": user, "server": server, **view, "reading": latest,
                         "history": history,
                         # the points' spacing: the chart's step, or the culler's interval
                         # where longer (the chart draws a gap only past it)
                         "history_step_s": max(self.readings.step_s,
                                               0 if held is None else ceil(held.interval_s)),
                         # the service's clock, which the chart's points are on
                         "now": iso(now)})


ROUTES = [(r"api/gpu-readings", GpuReadingsHandler), (r"api/me/gpu", MyGpuHandler)]
