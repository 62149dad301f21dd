"""What a researcher's servers are doing, for the home page and `api/me/servers` (pure).

Both the hub process (home page, rendered server-side) and the gpulease
service (`GET api/me/servers`) gather the same facts — JupyterHub's view of
each server, gpulease's billing sessions, the queue — and turn them into one
state per server with this module, so the page and the API never disagree.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpulease.core.billing.rules import seconds_up
from gpulease.core.billing.sessions import Session
from gpulease.core.billing.suspended import suspended_servers
from gpulease.core.clock import iso_z  # as api/usage: to the millisecond
from gpulease.core.model.catalog import Catalog
from gpulease.core.model.profiles import Profile, saved_profile
from gpulease.core.policy.options import ServerChoice, resolve_user_options
from gpulease.core.units import format_credits

STATES = ("running", "pending", "queued", "suspended", "stopped")


@dataclass(frozen=True)
class ServerFacts:
    """JupyterHub's view of one server (running or not)."""

    name: str
    ready: bool = False
    pending: str | None = None  # "spawn", "stop", ... while something is under way
    started: dt.datetime | None = None
    user_options: Mapping[str, Any] | None = None

    @classmethod
    def from_model(cls, model: Mapping[str, Any]) -> ServerFacts:
        """From a server of the hub API's user model (`include_stopped_servers`)."""
        started = model.get("started")
        return cls(
            name=model.get("name") or "",
            ready=bool(model.get("ready")),
            pending=model.get("pending") or None,
            started=_parse_iso(started) if started else None,
            user_options=model.get("user_options") or None,
        )


@dataclass(frozen=True)
class LastFailure:
    """A server's most recent start that its own code failed: when, why (gpulease's
    words), and the last lines the server wrote (its owner's text, stripped of control
    sequences; a page escapes it as any text)."""

    at: dt.datetime
    why: str
    log_tail: str = ""


@dataclass(frozen=True)
class ServerState:
    name: str
    state: str
    profile: str | None
    pending: str | None = None
    started: dt.datetime | None = None
    billed_ms: int | None = None
    cost_ucr: int | None = None
    rate_per_hour_ucr: int | None = None
    queue_position: int | None = None
    reason: str | None = None
    reason_text: str | None = None
    # its last start failed, and nothing ran since: shown to its owner only (the home
    # page), never in api/me/servers, which admins and auditors read too
    failed_start: LastFailure | None = None

    def to_json(self) -> dict[str, Any]:
        """`api/me/servers` shape: money as decimal credit strings, times ISO UTC with Z."""
        out: dict[str, Any] = {"name": self.name, "state": self.state, "profile": self.profile}
        if self.state == "running":
            out.update(
                started=iso_z(self.started) if self.started else None,
                billed_seconds=None if self.billed_ms is None else seconds_up(self.billed_ms),
                billed_ms=self.billed_ms,
                cost=format_credits(self.cost_ucr) if self.cost_ucr is not None else None,
                rate_per_hour=(format_credits(self.rate_per_hour_ucr)
                               if self.rate_per_hour_ucr is not None else None),
            )
        elif self.state == "queued":
            out["position"] = self.queue_position
        elif self.state == "pending":
            out["pending"] = self.pending
            if self.started is not None:  # launched: billed from then, ready or not
                out.update(billed_since=iso_z(self.started), billed_ms=self.billed_ms)
        elif self.state == "suspended":
            out.update(reason=self.reason, reason_text=self.reason_text)
        return out




def _parse_iso(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    return moment


def failure_shown(failure: LastFailure | None, session: Session | None) -> LastFailure | None:
    """A stopped server's last failed start, while it is the last thing that happened to
    it: no session began after it (the failed start's own began at its launch, before)."""
    if failure is None or (session is not None and session.started > failure.at):
        return None
    return failure


def server_states(
    facts: Collection[ServerFacts],
    latest: Mapping[str, Session],
    idle_timeouts: Mapping[str, int],
    positions: Mapping[str, int | None],
    now: dt.datetime,
    failures: Mapping[str, LastFailure] | None = None,
) -> list[ServerState]:
    """One state per server, the default server ("") always first, then by name.

    `latest` is each server's most recent billing session (open or closed);
    `positions` the queue position of servers waiting for capacity; `failures` each
    server's last failed start (shown with a stopped server: `failure_shown`).
    """
    by_name = {f.name: f for f in facts}
    by_name.setdefault("", ServerFacts(""))
    active = {f.name for f in by_name.values() if f.ready or f.pending}
    suspended = {s.server: s for s in suspended_servers(dict(latest), active, dict(idle_timeouts))}
    out = []
    for name in sorted(by_name, key=lambda n: (n != "", n)):
        f = by_name[name]
        profile = saved_profile(f.user_options)
        session = latest.get(name)
        open_session = session if session is not None and session.ended is None else None
        if f.ready:
            if open_session is not None:
                out.append(ServerState(
                    name, "running", open_session.profile, started=open_session.started,
                    billed_ms=open_session.billed_ms(now),
                    cost_ucr=open_session.cost(now),
                    rate_per_hour_ucr=open_session.rate_per_hour_ucr))
            else:  # running but not metered (no meter, or its session not open yet)
                out.append(ServerState(name, "running", profile, started=f.started))
        elif f.pending:
            position = positions.get(name)
            if f.pending == "spawn" and position is not None:
                out.append(ServerState(name, "queued", profile, pending=f.pending,
                                       queue_position=position))
            elif f.pending == "spawn" and open_session is not None:
                # launched, not answering yet: its code runs, and is billed, from its launch
                out.append(ServerState(
                    name, "pending", open_session.profile, pending=f.pending,
                    started=open_session.started, billed_ms=open_session.billed_ms(now),
                    cost_ucr=open_session.cost(now),
                    rate_per_hour_ucr=open_session.rate_per_hour_ucr))
            else:
                out.append(ServerState(name, "pending", profile, pending=f.pending))
        elif name in suspended:
            s = suspended[name]
            out.append(ServerState(name, "suspended", profile or s.profile, reason=s.reason,
                                   reason_text=s.text))
        else:
            out.append(ServerState(name, "stopped", profile, failed_start=failure_shown(
                (failures or {}).get(name), session)))
    return out


def check_profile_choice(
    slug: str, *, user: str, groups: Collection[str], profiles: list[Profile], catalog: Catalog,
) -> ServerChoice:
    """A profile the user may choose (default profile): OptionsRefused 400/403 otherwise."""
    return resolve_user_options({"profile": slug}, user=user, user_groups=set(groups),
                                profiles=profiles, catalog=catalog, default_profile=None)
