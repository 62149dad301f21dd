"""The end of a reservation for the servers running on it.

`reservation_end_notice` ahead of a reservation's end (its end, or for a
cancelled one the first hour it refunded), each server on it is told
(`reservation_ending` notice: JupyterLab's banner, the hub's pages, mail or
webhook). At the end, per the reservation's `on_end`:

- `continue` (the default): its session closes at the end (reason
  `reservation_ended`, nothing charged) and an on-demand session of the same
  server opens from that moment at the profile's price, billed to the
  reservation's account; its devices count as on-demand from then on;
- `suspend`: the server is stopped like a credit stop (the heartbeat pushes it
  until it is gone), reason `reservation_ended`; its home is kept.

`end_steps` decides (pure); `end_reservations` does it, once per heartbeat
(the hub also beats at each end, so nobody waits an interval past it).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulease.core.billing.enforcement import RESERVATION_ENDED, StopOrder, StopProgress
from gpulease.core.billing.sessions import LiveSession
from gpulease.core.clock import utcnow
from gpulease.core.tiers import ON_DEMAND, RESERVED
from gpulease.store.reservations import Booked

if TYPE_CHECKING:
    from gpulease.core.billing.sessions import Key
    from gpulease.hub.billing.metering import Meter
    from gpulease.spawners.context import GPULeaseContext

log = logging.getLogger("gpulease.reservations")

NOTICE = "reservation_ending"


@dataclass(frozen=True)
class EndSteps:
    notify: list[tuple[Key, Booked]]  # tell these servers their reservation is ending
    end: list[tuple[Key, Booked]]  # their reservation has ended: continue or suspend now


def end_steps(live: Mapping[Key, LiveSession], booked: Mapping[int, Booked],
              now: dt.datetime, notice: dt.timedelta,
              told: Collection[tuple[Key, int]] = ()) -> EndSteps:
    """What to do now for the reserved sessions in `live` (`booked`: their reservations;
    `told`: the (server, reservation) pairs already told of its end: each server on a
    reservation is told once, one started after the others were told too)."""
    steps = EndSteps([], [])
    for key, session in sorted(live.items()):
        if session.tier != RESERVED or session.reservation_id is None:
            continue
        b = booked.get(session.reservation_id)
        if b is None:
            continue
        until = b.reservation.holds_until()
        if now >= until:
            steps.end.append((key, b))
        elif now >= until - notice and (key, b.id) not in told:
            steps.notify.append((key, b))
    return steps


def _notice_text(server: str, b: Booked, until: dt.datetime) -> str:
    name = f"server {server}" if server else "your server"
    after = ("it is suspended then (your home is kept; resume it on demand)"
             if b.on_end == "suspend" else "it goes on then on demand, at the profile's "
             f"on-demand price, charged to {b.reservation.account}")
    return (f"Reservation {b.id} of {name} ({b.reservation.profile}) ends at "
            f"{until.strftime('%H:%M')} UTC: {after}.")


async def end_reservations(ctx: GPULeaseContext, notice_s: float) -> None:
    """One pass (each heartbeat): notices ahead, then continue or suspend at the end."""
    meter: Meter | None = ctx.meter
    if meter is None:
        return
    ids = {s.reservation_id for s in meter.live.values()
           if s.tier == RESERVED and s.reservation_id is not None}
    if not ids:
        return
    found = await asyncio.to_thread(lambda: {i: ctx.reservations.get(i) for i in ids})
    booked = {i: b for i, b in found.items() if b is not None}
    now = utcnow()
    steps = end_steps(meter.live, booked, now, dt.timedelta(seconds=notice_s),
                      meter.told_of_ends)
    noticed: set[int] = set()
    for (user, server), b in steps.notify:
        until = b.reservation.holds_until()
        await _tell(ctx, meter, user, server, b, until)
        meter.told_of_ends.add(((user, server), b.id))
        noticed.add(b.id)
        if meter.beat_at is not None:
            meter.beat_at(until)  # the end is acted on at once, not a heartbeat later
    for rid in noticed:
        await asyncio.to_thread(ctx.reservations.mark_end_noticed, rid, now)
    for key, b in steps.end:
        live = meter.live.get(key)
        if live is None or key in meter.stopping:
            continue
        if b.on_end == "suspend":
            why = f"reservation {b.id} ended; its holder chose to suspend its servers"
            log.warning("%s/%s: %s", key[0], key[1] or "(default)", why)
            meter.stopping[key] = StopProgress(
                StopOrder(key, RESERVATION_ENDED, live.account, why), now, live.session_id)
        else:
            await _continue_on_demand(ctx, meter, key, live, b)


async def _tell(ctx: GPULeaseContext, meter: Meter, user: str, server: str, b: Booked,
                until: dt.datetime) -> None:
    text = _notice_text(server, b, until)
    try:
        if meter.announce is not None:  # never raises
            await meter.announce(NOTICE, user, server, b.reservation.profile, None,
                                 (f"[gpulease] {user}: reservation {b.id} ends at "
                                  f"{until.strftime('%H:%M')} UTC", text), until)
        else:
            await asyncio.to_thread(ctx.notices.post, user, server, NOTICE, text, until)
    except Exception as e:  # the end goes ahead at its time
        log.error("could not post the reservation notice of %s/%s: %s", user, server, e)


async def _continue_on_demand(ctx: GPULeaseContext, meter: Meter, key: Key,
                              live: LiveSession, b: Booked) -> None:
    user, server = key
    profile = await asyncio.to_thread(ctx.profiles.get, live.profile)
    if profile is None:  # deleted since: no on-demand price to go on at
        why = (f"reservation {b.id} ended and its profile {live.profile} no longer exists to "
               "go on at on demand")
        meter.stopping[key] = StopProgress(
            StopOrder(key, RESERVATION_ENDED, live.account, why), utcnow(), live.session_id)
        return
    until = b.reservation.holds_until()
    session = await asyncio.to_thread(meter.sessions.continue_on_demand, live.session_id,
                                      until, profile.price_per_hour_ucr)
    if session is None:
        return
    meter.live[key] = LiveSession(session.id, session.profile, session.account,
                                  session.rate_per_hour_ucr, live.last_alive, ON_DEMAND)
    await asyncio.to_thread(ctx.assignments.retier, user, server, ON_DEMAND)
    await asyncio.to_thread(ctx.notices.clear, user, server, [NOTICE])
    log.warning("%s/%s: reservation %d ended at %s; goes on on demand (session %d, %s µcr/h)",
                user, server or "(default)", b.id, until.isoformat(), session.id,
                session.rate_per_hour_ucr)
