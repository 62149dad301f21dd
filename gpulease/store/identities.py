"""Who signed in through a provider, and the hub name they have.

An identity is (issuer, subject): the provider's `iss` and `sub` for OpenID
Connect, GitHub's URL and numeric user id for GitHub. Neither changes when
the person changes their e-mail or display name, so the hub name given at
their first login (from the preferred username, else the e-mail's local
part, mapped into the user name rule) stays theirs. A name already used by
another identity, by a local account or by a hub user who came some other
way is never given: `-2`, `-3`, ... is added instead, so that nobody signs
in as someone else by choosing their preferred username.

`candidate_names` is the pure rule; `IdentityStore` the table.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from gpulease.core.clock import utcnow
from gpulease.core.policy.user_names import MAX_NAME_LENGTH, is_valid_name, name_stem
from gpulease.store.db import identities, reading

FALLBACK_NAME = "user"  # when neither the preferred name nor the e-mail maps to a valid one
MAX_SUFFIX = 10_000


@dataclass(frozen=True)
class Identity:
    """What a provider says about who signed in."""

    issuer: str
    subject: str
    preferred_username: str = ""
    email: str = ""

    def shown(self) -> str:
        """How pages and the audit log name it: the e-mail (or name) and the provider."""
        who = self.email or self.preferred_username or self.subject
        return f"{who} via {self.issuer}"


def base_name(identity: Identity) -> str:
    """What the identity calls itself, in the name rule's alphabet (it may be a reserved
    name, which `candidate_names` then only gives with a suffix)."""
    for raw in (identity.preferred_username, identity.email.partition("@")[0]):
        stem = name_stem(raw) if raw else ""
        if stem:
            return stem
    return FALLBACK_NAME


def candidate_names(identity: Identity) -> Iterator[str]:
    """The names to try, in order: the base name, then base-2, base-3, ..."""
    base = base_name(identity)
    if is_valid_name(base):
        yield base
    for n in range(2, MAX_SUFFIX):
        suffix = f"-{n}"
        stem = base[: MAX_NAME_LENGTH - len(suffix)].rstrip("-")
        name = f"{stem}{suffix}"
        if is_valid_name(name):
            yield name


@dataclass(frozen=True)
class BoundIdentity:
    identity: Identity
    user_name: str
    created_at: dt.datetime
    verified_at: dt.datetime


def _bound(row) -> BoundIdentity:
    return BoundIdentity(
        Identity(row.issuer, row.subject, row.preferred_username or "", row.email or ""),
        row.user_name, row.created_at, row.verified_at)


class IdentityStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def find(self, issuer: str, subject: str) -> BoundIdentity | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(identities).where(
                identities.c.issuer == issuer, identities.c.subject == subject)).first()
        return _bound(row) if row else None

    def of_user(self, user_name: str) -> BoundIdentity | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(identities).where(
                identities.c.user_name == user_name)).first()
        return _bound(row) if row else None

    def shown_by_user(self) -> dict[str, str]:
        """Every bound hub name and the identity it signed in as, as pages show it."""
        with reading(self.engine) as conn:
            rows = conn.execute(select(identities)).all()
        return {row.user_name: _bound(row).identity.shown() for row in rows}

    def bind(self, identity: Identity, taken: Callable[[str], bool]
             ) -> tuple[BoundIdentity, BoundIdentity | None]:
        """The identity's name, giving it the first free candidate at its first login.

        Returns (now, before): `before` is None for a new identity, else the row as it was
        (its e-mail and preferred name are updated, its name never). `taken(name)` says
        whether a name is used outside this table (a local account, another hub user)."""
        now = utcnow()
        before = self.find(identity.issuer, identity.subject)
        if before is not None:
            with self.engine.begin() as conn:
                conn.execute(update(identities).where(
                    identities.c.issuer == identity.issuer,
                    identities.c.subject == identity.subject,
                ).values(email=identity.email or None,
                         preferred_username=identity.preferred_username or None,
                         verified_at=now))
            return BoundIdentity(identity, before.user_name, before.created_at, now), before
        for name in candidate_names(identity):
            if taken(name) or self.of_user(name) is not None:
                continue
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(identities).values(
                        issuer=identity.issuer, subject=identity.subject, user_name=name,
                        email=identity.email or None,
                        preferred_username=identity.preferred_username or None,
                        created_at=now, verified_at=now))
            except IntegrityError:
                # another login took this name (or bound this identity) in between
                again = self.find(identity.issuer, identity.subject)
                if again is not None:
                    return again, None
                continue
            return BoundIdentity(identity, name, now, now), None
        raise RuntimeError(f"no free user name for {identity.shown()}")

    def verified(self, issuer: str, subject: str) -> None:
        """The provider confirmed the identity again (a refresh)."""
        with self.engine.begin() as conn:
            conn.execute(update(identities).where(
                identities.c.issuer == issuer, identities.c.subject == subject,
            ).values(verified_at=utcnow()))
