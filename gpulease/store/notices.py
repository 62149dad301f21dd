"""Notices: what a user is told about their servers, and how they want to be told.

A notice is a warning before something happens to a server (`idle_warning`,
`max_runtime_warning`: with a deadline) or a record of what happened
(`suspended`, `max_runtime_stopped`, `credit_low`, `queued_started`). The idle
culler and the credit enforcer post them through the gpulease service; the
JupyterLab extension and the hub pages show the open ones.

Rules:
- at most one open notice per (user, server, kind): posting again replaces it;
- posting what happened (`suspended`, `max_runtime_stopped`) clears the
  warnings of that server, which have come true;
- a stop notice stays until the server starts again (`server_started`) or the
  user dismisses it (`clear`);
- a warning whose deadline is `STALE_WARNING` past is no longer shown, so a
  culler that died between the warning and the suspend leaves no banner behind.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, delete, insert, or_, select, update

from gpulease.core.clock import utcnow
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.store.db import notices, notification_prefs, reading
from gpulease.store.ledger import advisory_lock

__all__ = [
    "CHANNELS", "KINDS", "MAX_MESSAGE", "STOP_KINDS", "WARNING_KINDS", "Notice", "NoticeError",
    "NoticeStore", "Prefs", "banner_text", "validate_prefs",
]

WARNING_KINDS = ("idle_warning", "max_runtime_warning", "preemption_warning",
                 "reservation_ending")
STOP_KINDS = ("suspended", "max_runtime_stopped")
# right_size: advice, not a warning (right_sizing_views.py raises it at most once per
# user and profile per lookback window: `post_once`).
KINDS = (*WARNING_KINDS, *STOP_KINDS, "credit_low", "queued_started", "right_size")
CHANNELS = ("none", "email", "webhook")
STALE_WARNING = dt.timedelta(minutes=10)
MAX_MESSAGE = 2000

# Deliberately strict: one @, no spaces, no header-breaking characters.
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")
# Who to mention on the admin's webhook: a plain name, or a Slack member id.
_MENTION = re.compile(r"(<@[A-Z0-9]{2,32}>|[\w][\w .'@-]{0,63})")
_BROADCASTS = ("@channel", "@here", "@everyone", "@all")


class NoticeError(Refusal, ValueError):
    """A notice or notification setting refused (400), naming the field it is about."""

    def __init__(self, field: str, message: str):
        super().__init__(message, [(field, message)])


@dataclass(frozen=True)
class Notice:
    id: int
    user: str
    server: str
    kind: str
    message: str
    deadline: dt.datetime | None  # naive UTC
    created: dt.datetime  # naive UTC
    cleared: dt.datetime | None = None
    # Set by `post`: an open notice of the same kind was replaced (the user was
    # told already, so callers need not notify again).
    replaced: bool = False


@dataclass(frozen=True)
class Prefs:
    channel: str = "none"  # none | email | webhook
    address: str = ""  # email: the address; webhook: the name to mention ("" = user name)


def validate_prefs(channel: object, address: object) -> Prefs:
    """The prefs as stored, or NoticeError naming `channel` or `address`."""
    if channel not in CHANNELS:
        raise NoticeError("channel", f"channel must be one of {', '.join(CHANNELS)}; "
                                     f"got {shown(channel)}")
    if address is None:
        address = ""
    if not isinstance(address, str):
        raise NoticeError("address", "address must be a string")
    address = address.strip()
    if channel == "none":
        return Prefs("none", "")
    if channel == "email":
        if not address:
            raise NoticeError("address", "email needs an address (name@example.org)")
        if len(address) > 254 or not _EMAIL.fullmatch(address):
            raise NoticeError("address", f"{shown(address)} is not an email address "
                                         "(name@example.org)")
        return Prefs("email", address)
    if address and (not _MENTION.fullmatch(address)
                    or any(b in address.lower() for b in _BROADCASTS)):
        raise NoticeError("address", "for webhook, address is the name to mention there "
                                     "(letters, digits, . _ - ' @ and spaces, at most 64) or "
                                     "a Slack member id like <@U024BE7LH>; empty means "
                                     "your user name; channel-wide mentions are not allowed")
    return Prefs("webhook", address)


def _check_notice(user: object, server: object, kind: object, message: object) -> None:
    if not isinstance(user, str) or not user or len(user) > 255:
        raise NoticeError("user", "user must be a user name")
    if not isinstance(server, str) or len(server) > 255:
        raise NoticeError("server", 'server must be a server name ("" for the default server)')
    if kind not in KINDS:
        raise NoticeError("kind", f"unknown kind {shown(kind)}; allowed: {', '.join(KINDS)}")
    if not isinstance(message, str) or not message.strip():
        raise NoticeError("message", "message must be a non-empty string")
    if len(message) > MAX_MESSAGE:
        raise NoticeError("message", f"message must be at most {MAX_MESSAGE} characters")


def _notice(row, replaced: bool = False) -> Notice:
    return Notice(id=row.id, user=row.user_name, server=row.server_name, kind=row.kind,
                  message=row.message, deadline=row.deadline, created=row.created_at,
                  cleared=row.cleared_at, replaced=replaced)


class NoticeStore:
    """Notices and notification prefs in gpulease's database (blocking calls)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def post(self, user: str, server: str, kind: str, message: str,
             deadline: dt.datetime | None = None) -> Notice:
        """Open a notice, replacing an open one of the same (user, server, kind)."""
        _check_notice(user, server, kind, message)
        if kind in WARNING_KINDS and deadline is None:
            raise NoticeError("deadline", f"a {kind} needs a deadline")
        values = dict(message=message, deadline=deadline)
        with self.engine.begin() as conn:
            # Two posts for one server take turns (the unique index is the backstop).
            advisory_lock(conn, f"notices:{user}\0{server}")
            now = utcnow()
            if kind in STOP_KINDS:  # the warnings have come true
                conn.execute(update(notices).where(
                    self._open(user, server), notices.c.kind.in_(WARNING_KINDS)
                ).values(cleared_at=now))
            # Replaced in place: a culler re-posting its warning every pass adds no rows.
            notice_id = conn.execute(
                update(notices).where(self._open(user, server), notices.c.kind == kind)
                .values(**values, created_at=now).returning(notices.c.id)
            ).scalar()
            replaced = notice_id is not None
            if not replaced:
                notice_id = conn.execute(
                    insert(notices).values(user_name=user, server_name=server, kind=kind,
                                           created_at=now, **values)
                    .returning(notices.c.id)
                ).scalar_one()
            row = conn.execute(select(notices).where(notices.c.id == notice_id)).one()
        return _notice(row, replaced=replaced)

    def told(self, user: str, kind: str, keys: Sequence[str], since: dt.datetime) -> set[str]:
        """The `keys` a notice of `kind` told `user` since `since` (open or cleared since)."""
        with reading(self.engine) as conn:
            return self._told(conn, user, kind, keys, since)

    @staticmethod
    def _told(conn: Any, user: str, kind: str, keys: Sequence[str],
              since: dt.datetime) -> set[str]:
        found = set()
        for key in keys:
            hit = conn.execute(select(notices.c.id).where(
                notices.c.user_name == user, notices.c.kind == kind,
                notices.c.created_at >= since,
                notices.c.message.contains(key, autoescape=True)).limit(1)).first()
            if hit is not None:
                found.add(key)
        return found

    def post_once(self, user: str, server: str, kind: str, keys: Sequence[str], message: str,
                  since: dt.datetime) -> Notice | None:
        """Open a notice telling each of `keys` (the message holds them all), unless a notice
        of `kind` told any of them to `user` since `since`, open or cleared since (None then:
        ask `told` and tell the rest).

        Unlike `post`, an open notice of the same (user, server, kind) is cleared, not
        rewritten: its row stays as the record of what it told. So the caller tells every
        key due on one server in one call, and waits while one is open and recent (as
        right_sizing_views.raise_notices does): a later call would clear it unseen."""
        _check_notice(user, server, kind, message)
        if not keys or any(key not in message for key in keys):
            raise ValueError("the message must hold each of its keys")
        with self.engine.begin() as conn:
            # Per user, not per server: the key is what is told once, on whichever server.
            advisory_lock(conn, f"notices-once:{user}\0{kind}")
            if self._told(conn, user, kind, keys, since):
                return None
            advisory_lock(conn, f"notices:{user}\0{server}")
            now = utcnow()
            conn.execute(update(notices).where(self._open(user, server), notices.c.kind == kind)
                         .values(cleared_at=now))
            notice_id = conn.execute(
                insert(notices).values(user_name=user, server_name=server, kind=kind,
                                       message=message, deadline=None, created_at=now)
                .returning(notices.c.id)).scalar_one()
            row = conn.execute(select(notices).where(notices.c.id == notice_id)).one()
        return _notice(row)

    @staticmethod
    def _open(user: str, server: str | None):
        cond = and_(notices.c.user_name == user, notices.c.cleared_at.is_(None))
        return cond if server is None else and_(cond, notices.c.server_name == server)

    def clear(self, user: str, server: str | None,
              kinds: Collection[str] | None = None) -> int:
        """Clear open notices of `user` on `server` (None: every server); how many."""
        where = self._open(user, server)
        if kinds is not None:
            unknown = set(kinds) - set(KINDS)
            if unknown:
                raise NoticeError("kind", f"unknown kind {shown(sorted(unknown)[0])}; "
                                          f"allowed: {', '.join(KINDS)}")
            where = and_(where, notices.c.kind.in_(list(kinds)))
        with self.engine.begin() as conn:
            return conn.execute(update(notices).where(where).values(cleared_at=utcnow())).rowcount

    def purge(self, cleared_before: dt.datetime) -> int:
        """Delete notices cleared before a time (history nobody reads); how many."""
        with self.engine.begin() as conn:
            return conn.execute(delete(notices).where(
                notices.c.cleared_at.is_not(None), notices.c.cleared_at < cleared_before
            )).rowcount

    def server_started(self, user: str, server: str) -> int:
        """A server (re)started: its stop notices are history now."""
        return self.clear(user, server, STOP_KINDS)

    def active(self, user: str, server: str | None = None,
               now: dt.datetime | None = None) -> list[Notice]:
        """Open notices of `user` (on `server`), oldest first; stale warnings left out."""
        stale = (now or utcnow()) - STALE_WARNING
        fresh = or_(notices.c.kind.not_in(WARNING_KINDS), notices.c.deadline.is_(None),
                    notices.c.deadline >= stale)
        query = (select(notices).where(self._open(user, server), fresh)
                 .order_by(notices.c.created_at, notices.c.id))
        with reading(self.engine) as conn:
            return [_notice(row) for row in conn.execute(query)]

    def get_prefs(self, user: str) -> Prefs:
        with reading(self.engine) as conn:
            row = conn.execute(select(notification_prefs)
                               .where(notification_prefs.c.user_name == user)).first()
        return Prefs(row.channel, row.address) if row else Prefs()

    def set_prefs(self, user: str, channel: object, address: object = "") -> Prefs:
        prefs = validate_prefs(channel, address)
        with self.engine.begin() as conn:
            advisory_lock(conn, f"notification_prefs:{user}")
            done = conn.execute(
                update(notification_prefs).where(notification_prefs.c.user_name == user)
                .values(channel=prefs.channel, address=prefs.address)
            ).rowcount
            if not done:
                conn.execute(insert(notification_prefs).values(
                    user_name=user, channel=prefs.channel, address=prefs.address))
        return prefs


_PRIORITY = {kind: i for i, kind in enumerate(
    ("suspended", "max_runtime_stopped", "credit_low", "queued_started"), start=1)}


def banner_text(items: list[Notice], limit: int = 2) -> str:
    """One line for the hub pages' banner: the most urgent notices first.

    Warnings come first, soonest deadline first, then what happened, newest
    first. At most `limit` messages; the rest are counted.
    """
    if not items:
        return ""
    far = dt.datetime.max

    def urgency(n: Notice) -> tuple:
        group = 0 if n.kind in WARNING_KINDS else _PRIORITY.get(n.kind, len(_PRIORITY) + 1)
        return (group, n.deadline or far, -n.created.timestamp())

    ordered = sorted(items, key=urgency)
    text = " ".join(n.message.strip() for n in ordered[:limit])
    more = len(ordered) - limit
    if more > 0:
        text += f" (and {more} more notice{'s' if more > 1 else ''})"
    return text
