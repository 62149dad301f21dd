"""Kernel and terminal state pushed by each server, held in the gpulease service's memory.

The idle culler needs each server's kernels (busy, idle, last activity) and
terminals. It used to read them from the server itself, with a token that
grants far more than the server's user has; a server is user code and can
log the headers it receives. So servers push instead, with their own token
(`JUPYTERHUB_API_TOKEN`, which holds `access:servers!server=USER/NAME` and
`access:services!service=gpulease`), and the culler reads what was pushed
from the service.

Pure parts here, I/O in hub/service/api/activity.py:

- `server_of(model)`: which server a token belongs to, from the hub's own
  answer about the token (`GET /hub/api/user`: its owner and its scopes),
  never from the body;
- `parse_push(body, now)`: a validated push, or every problem field by field;
- `ActivityStore`: the latest push of each server, bounded per user and in
  all; memory, not the database: thousands of servers pushing every minute
  would be hundreds of writes a second on SQLite, and the state is worth
  only a few minutes (see `since` and the culler's freshness rule in
  idle-culler/pushed.py for what a restart of the service means).

What a push says is the user's own word about their own server: it can keep
that server running (at their own cost, like any busy kernel) or let it be
suspended sooner, and nothing else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from gpulease.core.refusal import Refusal

MAX_BODY_BYTES = 256 * 1024
MAX_KERNELS = 1000
MAX_TERMINALS = 1000
MAX_SERVERS_PER_USER = 100
MAX_SERVERS = 200_000
# Entries nobody refreshed for this long belong to servers long gone.
FORGET_AFTER = timedelta(hours=6)
KERNEL_KEYS = ("id", "execution_state", "last_activity", "connections")
TERMINAL_KEYS = ("name", "last_activity")
_STATE = re.compile(r"^[a-z][a-z_-]{0,31}$")  # jupyter_server: idle, busy, starting, dead, ...
_SERVER_SCOPE = re.compile(r"^access:servers!server=([^/]+)/(.*)$")


class PushError(Refusal):
    """A refused push: `status` and every problem, naming its field."""

    def __init__(self, status: int, message: str, errors: list[tuple[str, str]] | None = None):
        super().__init__(message, errors or (), status=status)


@dataclass(frozen=True)
class PushedKernel:
    id: str
    execution_state: str
    last_activity: datetime | None
    connections: int


@dataclass(frozen=True)
class Push:
    """One server's state as it pushed it; `pushed` is when the service received it."""

    user: str
    server: str
    pushed: datetime
    kernels: tuple[PushedKernel, ...]
    terminals: int | None  # None: the server has no terminal support
    terminals_last_activity: datetime | None
    # The last activity of any kernel, those since shut down too: a kernel started, run
    # and shut down between two of the server's looks is in no push's list.
    kernels_last_activity: datetime | None = None

    @cached_property
    def as_json(self) -> str:
        """The view as JSON, made once: listing 10,000 servers then only joins strings."""
        return json.dumps(self.view())

    def view(self) -> dict[str, Any]:
        return {
            "user": self.user, "server": self.server, "pushed": iso(self.pushed),
            "kernels": [{"id": k.id, "execution_state": k.execution_state,
                         "last_activity": iso(k.last_activity), "connections": k.connections}
                        for k in self.kernels],
            "terminals": None if self.terminals is None else {
                "count": self.terminals, "last_activity": iso(self.terminals_last_activity)},
            "last_kernel_activity": iso(self.kernels_last_activity),
        }


def iso(when: datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def server_of(model: dict[str, Any]) -> tuple[str, str]:
    """(user, server) of a server's own token, from the hub's model of the token.

    A server token (JupyterHub's `Spawner.server_token_scopes`) carries
    `access:servers!server=USER/NAME` for its own server only. A token that is
    not limited to exactly one server of its own owner (a user's personal
    token, an admin's, a service's) names no server, and is refused.
    """
    if model.get("kind", "user") != "user":
        raise PushError(403, f"{model.get('name')} is a service: only a server pushes its "
                             "state, with its own token (JUPYTERHUB_API_TOKEN)")
    owner = model.get("name") or ""
    scopes = [s for s in model.get("scopes") or [] if s.split("!", 1)[0] == "access:servers"]
    servers = [m.groups() for m in map(_SERVER_SCOPE.match, scopes) if m]
    if len(scopes) != 1 or len(servers) != 1 or servers[0][0] != owner:
        raise PushError(403, "Push with the server's own token (JUPYTERHUB_API_TOKEN): this "
                             "token is not limited to one server of its owner, so it names no "
                             "server")
    return owner, servers[0][1]


def parse_push(body: Any, user: str, server: str, now: datetime) -> Push:
    """A validated push for (user, server); PushError(400) lists every problem.

    Timestamps after `now` are taken as `now`: a server cannot report
    activity later than the moment it reports.
    """
    errors: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        raise PushError(400, _SHAPE, [("", "must be a JSON object")])
    for key in sorted(set(body) - {"kernels", "terminals", "last_kernel_activity"}):
        why = ("the server is the token's own; a push names no user or server"
               if key in ("user", "server", "name") else "unknown field")
        errors.append((key, f"{why}; allowed: kernels, terminals, last_kernel_activity"))
    kernels = _items(body.get("kernels"), "kernels", MAX_KERNELS, KERNEL_KEYS, errors,
                     required=True)
    parsed = tuple(k for k in (_kernel(i, k, now, errors) for i, k in enumerate(kernels)) if k)
    terminals = body.get("terminals")
    count, last = None, None
    if terminals is not None:
        items = _items(terminals, "terminals", MAX_TERMINALS, TERMINAL_KEYS, errors)
        times = [_time(t.get("last_activity"), f"terminals[{i}].last_activity", now, errors)
                 for i, t in enumerate(items)]
        for i, t in enumerate(items):
            if t.get("name") is not None and not isinstance(t.get("name"), str):
                errors.append((f"terminals[{i}].name", "must be a string"))
        count, last = len(items), max((t for t in times if t), default=None)
    any_kernel = _time(body.get("last_kernel_activity"), "last_kernel_activity", now, errors)
    if errors:
        raise PushError(400, "Invalid server state: " + "; ".join(
            f"{f}: {m}" if f else m for f, m in errors[:5]), errors)
    return Push(user, server, now, parsed, count, last, any_kernel)


_SHAPE = ('The body must be {"kernels": [{"id", "execution_state", "last_activity", '
          '"connections"}], "terminals": [{"name", "last_activity"}] or null, '
          '"last_kernel_activity": a time or null (optional)}')


def _items(value: Any, name: str, limit: int, keys: tuple[str, ...],
           errors: list[tuple[str, str]], required: bool = False) -> list[dict[str, Any]]:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        errors.append((name, "must be a list" + (" (required)" if required else " or null")))
        return []
    if len(value) > limit:
        errors.append((name, f"at most {limit} entries, not {len(value)}"))
        return []
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            errors.append((f"{name}[{i}]", "must be an object"))
            continue
        for key in sorted(set(item) - set(keys)):
            errors.append((f"{name}[{i}].{key}", f"unknown field; allowed: {', '.join(keys)}"))
        out.append(item)
    return out


def _kernel(i: int, k: dict[str, Any], now: datetime,
            errors: list[tuple[str, str]]) -> PushedKernel | None:
    before = len(errors)
    kid, state, conns = k.get("id"), k.get("execution_state"), k.get("connections", 0)
    if not isinstance(kid, str) or not 0 < len(kid) <= 64:
        errors.append((f"kernels[{i}].id", "must be a kernel id (1 to 64 characters)"))
    if not isinstance(state, str) or not _STATE.match(state):
        errors.append((f"kernels[{i}].execution_state",
                       "must be a jupyter kernel state such as idle, busy or starting"))
    if isinstance(conns, bool) or not isinstance(conns, int) or not 0 <= conns <= 100_000:
        errors.append((f"kernels[{i}].connections", "must be a whole number from 0"))
    when = _time(k.get("last_activity"), f"kernels[{i}].last_activity", now, errors)
    if len(errors) > before:
        return None
    return PushedKernel(kid, state, when, conns)


def _time(value: Any, name: str, now: datetime, errors: list[tuple[str, str]]) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 40:
        errors.append((name, "must be an ISO 8601 timestamp or null"))
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        errors.append((name, f"{value[:40]} is not an ISO 8601 timestamp"))
        return None
    try:
        # In UTC now: 0001-01-01T00:00+01:00 is before year 1 there, which a
        # datetime cannot hold (it would fail later, writing the push out).
        when = (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        errors.append((name, f"{value[:40]} is out of range"))
        return None
    return min(when, now)


@dataclass
class ActivityStore:
    """The latest push of each server; `since` is when this memory began (service start).

    Pushes are kept in the order they arrived (oldest first), so bounding and
    forgetting cost nothing per push.
    """

    since: datetime
    per_user: int = MAX_SERVERS_PER_USER
    total: int = MAX_SERVERS
    _pushes: dict[tuple[str, str], Push] = field(default_factory=dict)
    _of_user: dict[str, dict[str, None]] = field(default_factory=dict)  # ordered sets

    def put(self, push: Push) -> None:
        push.as_json  # noqa: B018 - serialised now, spread over the pushes, not all at one GET
        key = (push.user, push.server)
        self._pushes.pop(key, None)  # re-inserted last: the dict stays in push order
        self._pushes[key] = push
        mine = self._of_user.setdefault(push.user, {})
        mine.pop(push.server, None)
        mine[push.server] = None
        # A user's own tokens could name made-up servers of theirs: the oldest go.
        while len(mine) > self.per_user:
            self._drop((push.user, next(iter(mine))))
        while len(self._pushes) > self.total:
            self._drop(next(iter(self._pushes)))

    def _drop(self, key: tuple[str, str]) -> None:
        self._pushes.pop(key, None)
        mine = self._of_user.get(key[0], {})
        mine.pop(key[1], None)
        if not mine:
            self._of_user.pop(key[0], None)

    def get(self, user: str, server: str) -> Push | None:
        return self._pushes.get((user, server))

    def pushes(self, now: datetime, users: set[str] | None = None) -> list[Push]:
        """The current pushes (of `users` only, when given); long-forgotten ones dropped."""
        cutoff = now - FORGET_AFTER
        while self._pushes:
            oldest = next(iter(self._pushes.values()))
            if oldest.pushed >= cutoff:
                break
            self._drop((oldest.user, oldest.server))
        if users is None:
            return list(self._pushes.values())
        return [self._pushes[(u, s)] for u in sorted(users) for s in self._of_user.get(u, {})]
