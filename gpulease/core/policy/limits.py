"""Per-user and per-group limits on concurrent GPUs and MIG slices.

A limit belongs to a subject, `user:NAME` or `group:NAME`: `max_gpus` caps
the full GPUs, `max_slices` the MIG slices held at once (None: no limit). A
user's limit counts their own servers; a group's counts the servers of all
its members together. A start is checked against the user's limit and the
limits of every group they belong to, before it is placed or queued; what
waits in the queue counts as held, so queueing cannot get round a limit.

`check_limits` is the pure decision; gpulease/store/limits.py's `LimitStore` the `limits`
table.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown

FIELDS = ("max_gpus", "max_slices")
MAX_LIMIT = 1_000_000
_SUBJECT = re.compile(r"(user|group):([^/\s:][^/\s]{0,253})")


class LimitError(Refusal, ValueError):
    """A limit that cannot be set (400): `errors` name each field."""


@dataclass(frozen=True)
class Limit:
    subject: str  # user:NAME | group:NAME
    max_gpus: int | None = None
    max_slices: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {"max_gpus": self.max_gpus, "max_slices": self.max_slices}

    @property
    def empty(self) -> bool:
        return self.max_gpus is None and self.max_slices is None


def parse_subject(text: object) -> str:
    """`user:NAME` or `group:NAME`, else LimitError naming `subject`."""
    if not isinstance(text, str) or not _SUBJECT.fullmatch(text):
        message = f"{shown(text)} is not a limit subject; use user:NAME or group:NAME"
        raise LimitError(message, [("subject", message)])
    return text


def parse_limit_body(body: object) -> dict[str, int | None]:
    """`{"max_gpus": N|null, "max_slices": N|null}` checked field by field.

    Fields left out are not changed (absent from the result); null removes
    that limit.
    """
    if not isinstance(body, dict):
        message = 'The body must be {"max_gpus": N or null, "max_slices": N or null}'
        raise LimitError(message, [("body", message)])
    errors = [(key, f"unknown field; allowed: {', '.join(FIELDS)}")
              for key in sorted(set(body) - set(FIELDS))]
    values: dict[str, int | None] = {}
    for key in FIELDS:
        if key not in body:
            continue
        value = body[key]
        if value is None:
            values[key] = None
        elif isinstance(value, bool) or not isinstance(value, int):
            errors.append((key, f"must be a whole number of devices (0 or more) or null, "
                                f"not {shown(value)}"))
        elif not 0 <= value <= MAX_LIMIT:
            errors.append((key, f"must be between 0 and {MAX_LIMIT} (or null), not {value}"))
        else:
            values[key] = value
    if errors:
        raise LimitError("Invalid limit: " + "; ".join(f"{f}: {m}" for f, m in errors), errors)
    return values


# --- the decision ---------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """What one server holds (or waits for, in the queue): full GPUs and MIG slices."""

    user: str
    server: str
    gpus: int = 0
    slices: int = 0
    queued: bool = False

    def label(self) -> str:
        name = f"{self.user}/{self.server or '(default)'}"
        return f"{name} (queued)" if self.queued else name


@dataclass(frozen=True)
class LimitRefusal:
    subject: str
    field: str
    limit: int
    held: int
    servers: tuple[str, ...]
    requested: int

    @property
    def message(self) -> str:
        unit = "full GPU" if self.field == "max_gpus" else "MIG slice"
        plural = "s" if self.held != 1 else ""
        by = f" by {', '.join(self.servers)}" if self.servers else ""
        whose = ("for all its members together" if self.subject.startswith("group:")
                 else "at once")
        return (f"Over the limit of {self.subject}: {self.field} {self.limit} {whose}; "
                f"{self.held} {unit}{plural} held{by}, and this start asks for "
                f"{self.requested} more. Stop a server, or ask an admin to raise the limit.")


def check_limits(
    user: str,
    server: str,
    gpus: int,
    slices: int,
    user_groups: Collection[str],
    group_members: Mapping[str, Collection[str]],
    limit_table: Mapping[str, Limit],
    holdings: Iterable[Holding],
) -> LimitRefusal | None:
    """The first limit this start (`gpus` full GPUs, `slices` MIG slices) would exceed.

    `holdings` are every server's devices, held or waited for; the server
    being started is left out (a restart gives up what it held).
    `group_members` maps each of `user_groups` to its members.
    """
    if not gpus and not slices:
        return None
    others = [h for h in holdings if (h.user, h.server) != (user, server)]
    subjects = [(f"user:{user}", {user})]
    subjects += [(f"group:{g}", set(group_members.get(g, ())) | {user})
                 for g in sorted(user_groups)]
    for subject, members in subjects:
        limit = limit_table.get(subject)
        if limit is None:
            continue
        mine = [h for h in others if h.user in members]
        for field, asked, count in (("max_gpus", gpus, lambda h: h.gpus),
                                    ("max_slices", slices, lambda h: h.slices)):
            cap = getattr(limit, field)
            if cap is None or not asked:
                continue
            using = [h for h in mine if count(h)]
            held = sum(count(h) for h in using)
            if held + asked > cap:
                return LimitRefusal(subject, field, cap, held,
                                    tuple(h.label() for h in using), asked)
    return None
