"""What a server's GPU does, and what it costs: the culler's readings in, the status bar's out.

- `PUT api/gpu-readings` `{"servers": [{"user", "server", "activity", "memory_used_bytes",
  "memory_total_bytes", "source", "why"}]}` — gpulease admins (the idle culler),
  as `GET api/server-activity`. Each reading is folded into its server's open
  session (gpulease/store/gpu_stats.py; a server without one is skipped) in one
  transaction, and kept an hour in memory (hub/service/gpu_readings.py). 204;
  400 naming every bad field, nothing kept; 403 for anyone else; 413 over the
  service's 1 MiB; 429 with `Retry-After` beyond the push ration, before the
  body is read.
- `GET api/me/gpu[?server=NAME]` — a researcher's own token (any of their
  servers, NAME defaulting to "") or a server's own token (`JUPYTERHUB_API_TOKEN`:
  that server only): the open session's profile, rate, cost so far, the
  balance of the account it bills and how long that lasts at this rate, the
  latest reading and the last hour's. Never another user's (`user=` naming
  someone else is 403, admins included: this is the researcher's own view).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from tornado import web

from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.activity_store import PushError, iso, server_of
from gpulease.hub.service.body_limit import MAX_BODY_BYTES
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.gpu_readings import GpuReadings, parse_readings, reading_view
from gpulease.hub.service.push_rate import PushRate
from gpulease.hub.service.streamed_push import StreamedPush, TokenIdentified
from gpulease.store.gpu_stats import fold_readings
from gpulease.store.sessions import SessionLedger

# The culler pushes once a pass, in chunks of at most 5,000 servers: 200,000
# servers are 40 pushes, which the burst takes; a runaway loop is held to 5 a second.
PUSH_BURST = 50.0
PUSH_PER_S = 5.0


class GpuHandler(TokenIdentified):
    """Shared: the readings held in memory, and the caller identified without blocking
    (every server's status bar asks, and pushes come from the culler)."""

    @property
    def readings(self) -> GpuReadings:
        return self.settings.setdefault("gpulease_gpu_readings", GpuReadings())


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
        readings = parse_readings(self.body_json(), datetime.now(UTC))  # PushError: 400
        # The sessions first: were the database down (503), memory keeps nothing either.
        await asyncio.to_thread(fold_readings, self.ctx.engine, [r.sample() for r in readings])
        self.readings.put(readings)
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
        asked = self.get_argument("server", None)
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
        view = await asyncio.to_thread(cost_view, self.ctx, user, server)
        latest = self.readings.latest(user, server)
        history = self.readings.history(user, server, datetime.now(UTC))
        self.write_json({
            "user": user, "server": server, **view,
            "reading": None if latest is None else reading_view(latest, iso),
            "history": [{"at": iso(r.at), "activity": r.activity,
                         "memory_used_bytes": r.memory_used_bytes} for r in history],
        })


def cost_view(ctx: Any, user: str, server: str) -> dict[str, Any]:
    """The open session's profile, rate and cost so far, its account's balance and how
    long that lasts at this rate (blocking: run in a thread). Without an open session:
    the personal balance only. Cost and balance both count to the session's last
    confirmed heartbeat, as the ledger's balance does, so the two agree."""
    session = SessionLedger(ctx.engine).open_for(user, server)
    if session is None:
        return {"profile": None, "rate_per_hour": None, "cost_so_far": None,
                "balance": bv.money(ctx.ledger.balance(f"user:{user}")), "runway_s": None,
                "account": f"user:{user}", "as_of": None}
    balance = ctx.ledger.balance(session.account)
    rate = session.rate_per_hour_ucr
    return {"profile": session.profile, "rate_per_hour": bv.money(rate),
            "cost_so_far": bv.money(session.cost()), "balance": bv.money(balance),
            # None: a free rate never runs out
            "runway_s": max(0, balance * 3600 // rate) if rate > 0 else None,
            "account": session.account, "as_of": bv.iso(session.last_confirmed)}


ROUTES = [(r"api/gpu-readings", GpuReadingsHandler), (r"api/me/gpu", MyGpuHandler)]
