"""Kernels and terminals as servers pushed them to the gpulease service, and how far to trust them.

The culler never contacts a user's server (a server is user code: it could
log any credential sent to it). Servers running gpulease.singleuser push
their kernels and terminals to the gpulease service with their own token
(`PUT api/server-activity`); the culler reads them all in one request
(`GET api/server-activity`, gpulease admins only). Pure functions here; the
request is HubClient.server_activity.

Freshness rule (`view_for`):
- a push is evidence of the server's state when the service received it
  (`pushed`); one from before the server's current start belongs to an
  earlier run and is ignored;
- for `stale_after_s` after it (default 3 min: three heartbeats of 60 s,
  so one lost push changes nothing) it is current: a busy kernel is
  activity now;
- older, it is stale: nothing in it is busy now. A kernel busy or starting
  at the push counts as active until the push, the others keep their own
  last activity. A server that stopped pushing is thus idle from its last
  push at the latest and is suspended an idle timeout later, like any other;
- no push: within `stale_after_s` of the server's start, or of the
  service's memory beginning (`since`: the service restarted), it is on its
  way, the kernels are unknown and the server is not suspended; later, the
  server does not push (an image without gpulease.singleuser, or its pushes
  are refused), and it is judged on the hub's activity (with CPU and GPU
  where they are read), which the decision says;
- the service could not be read: the kernels are unknown, nobody is suspended.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from gpulease.idle_culler.hubapi import parse_time
from gpulease.idle_culler.signals import KernelState

Key = tuple[str, str]
DEFAULT_STALE_AFTER_S = 180.0
_ACTIVE = frozenset({"busy", "starting"})
NOT_PUSHED = "no state pushed (no gpulease.singleuser in this server's image?)"


@dataclass(frozen=True)
class PushedServer:
    pushed: datetime
    kernels: tuple[KernelState, ...]
    terminals: int | None  # None: no terminal support
    terminals_last_activity: datetime | None
    # Any kernel's last activity, shut down ones' too (a kernel that came and went
    # between two pushes is in no list); None from a server that does not say.
    kernels_last_activity: datetime | None = None


@dataclass(frozen=True)
class PushedActivity:
    since: datetime  # when the service's memory of pushes began
    servers: dict[Key, PushedServer]


def parse_server_activity(body: Any) -> PushedActivity:
    """`GET api/server-activity` of the gpulease service."""
    if not isinstance(body, dict) or not isinstance(body.get("servers"), list):
        raise ValueError("the gpulease service answered without a `servers` list")
    since = parse_time(body.get("since"))
    if since is None:
        raise ValueError("the gpulease service answered without `since`")
    servers: dict[Key, PushedServer] = {}
    for s in body["servers"]:
        pushed = parse_time(s.get("pushed"))
        if pushed is None:
            continue
        terminals = s.get("terminals")
        servers[(s["user"], s.get("server") or "")] = PushedServer(
            pushed=pushed,
            kernels=tuple(KernelState(id=str(k.get("id", "")),
                                      execution_state=str(k.get("execution_state") or "unknown"),
                                      last_activity=parse_time(k.get("last_activity")),
                                      connections=int(k.get("connections") or 0))
                          for k in s.get("kernels") or []),
            terminals=None if terminals is None else int(terminals.get("count") or 0),
            terminals_last_activity=None if terminals is None else parse_time(
                terminals.get("last_activity")),
            kernels_last_activity=parse_time(s.get("last_kernel_activity")),
        )
    return PushedActivity(since, servers)


@dataclass(frozen=True)
class KernelView:
    """What the culler knows of one server's kernels and terminals this pass."""

    kind: str  # fresh | stale | waiting | not_pushed | unknown
    kernels: tuple[KernelState, ...] | None
    terminals_last_activity: datetime | None
    error: str = ""  # why the kernels (and terminals) are unknown
    kernels_last_activity: datetime | None = None  # any kernel's, shut down ones' too
    source: str = ""  # for the decision log: how old the push is
    hold: str = ""  # non-empty: do not suspend this pass, and why

    @property
    def hub_activity_only(self) -> bool:
        return self.kind == "not_pushed"


def view_for(activity: PushedActivity | None, read_error: str, key: Key, started: datetime,
             now: datetime, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> KernelView:
    """The freshness rule of the module doc, for one server."""
    if activity is None:
        why = f"the gpulease service's pushed state could not be read ({read_error})"
        return KernelView("unknown", None, None, error=why, hold=why)
    push = activity.servers.get(key)
    if push is not None and push.pushed < started:
        push = None  # a push of an earlier run of this server
    window = timedelta(seconds=stale_after_s)
    if push is None:
        waiting_since = max(started, activity.since)
        if now - waiting_since < window:
            why = (f"no push yet (waiting since {_ts(waiting_since)}, "
                   f"at most {stale_after_s:g}s)")
            return KernelView("waiting", None, None, error=why, hold=why)
        return KernelView("not_pushed", None, None, error=NOT_PUSHED)
    age = max(0.0, (now - push.pushed).total_seconds())
    if age <= stale_after_s:
        return KernelView("fresh", push.kernels, push.terminals_last_activity,
                          source=f"pushed {age:.0f}s ago",
                          kernels_last_activity=push.kernels_last_activity)
    kernels = tuple(
        replace(k, execution_state="idle",
                last_activity=max(t for t in (k.last_activity, push.pushed) if t))
        if k.execution_state in _ACTIVE else k
        for k in push.kernels)
    return KernelView("stale", kernels, push.terminals_last_activity,
                      kernels_last_activity=push.kernels_last_activity,
                      source=f"stale: pushed {age:.0f}s ago (> {stale_after_s:g}s), busy "
                             "kernels count as active until then")


def _ts(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
