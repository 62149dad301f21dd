"""Profiles in gpulease's database (table `profiles`) and users' default profiles.

A thin adapter: validation lives in `gpulease.core.model.profiles`. Each row keeps the
profile as in the profiles file (JSON text, prices as decimal strings), so
export and apply round-trip by meaning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection, Engine

from gpulease.core.clock import utcnow
from gpulease.core.model.catalog import Catalog
from gpulease.core.model.profiles import (
    FieldError,
    Profile,
    ProfileError,
    parse_profile,
    parse_profiles_text,
)
from gpulease.core.units import json_loads
from gpulease.store.audit import AuditLog
from gpulease.store.db import audit_log, reading, settings, user_prefs
from gpulease.store.db import profiles as profiles_table

log = logging.getLogger("gpulease.profiles")

PROFILES_FILE_HASH = "profiles_file_sha256"
# Who the audit log names for changes made by `gpulease up --profiles FILE`.
PROFILES_FILE_ACTOR = "profiles-file"
_AUDIT_ACTIONS = {"created": "profile.create", "updated": "profile.update"}


@dataclass(frozen=True)
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        parts = [f"{name} {', '.join(slugs)}" for name, slugs in (
            ("created", self.created), ("updated", self.updated),
            ("unchanged", self.unchanged), ("deleted", self.deleted)) if slugs]
        return "; ".join(parts) or "no profiles"


def spec_text(profile: Profile) -> str:
    """The stored form: the file form without the slug (the row's key), canonical JSON."""
    spec = {k: v for k, v in profile.to_spec().items() if k != "slug"}
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _row_spec(slug: str, spec: str, enabled: bool) -> dict:
    """A stored row as the audit log shows it: the file form, slug first."""
    try:
        stored = json_loads(spec)
    except ValueError:
        stored = {"unreadable_spec": spec}
    if not isinstance(stored, dict):
        stored = {"unreadable_spec": spec}
    return {"slug": slug, **{k: v for k, v in stored.items() if k != "slug"},
            "enabled": bool(enabled)}


class ProfileStore:
    def __init__(self, engine: Engine, catalog: Catalog):
        self.engine = engine
        self.catalog = catalog
        self.audit = AuditLog(engine)

    # --- reading ---------------------------------------------------------------

    def _from_row(self, row) -> Profile | None:
        try:
            profile = parse_profile(
                json_loads(row.spec), self.catalog, slug=row.slug, check_catalog=False
            )
        except (ProfileError, ValueError) as exc:
            # One bad row (e.g. a GPU model dropped from gpulease's table) must
            # not take every other profile down with it.
            log.error("Stored profile %s is not valid any more, skipped: %s", row.slug, exc)
            return None
        missing = [name for name in profile.images if self.catalog.get(name) is None]
        if missing:
            log.warning("Profile %s offers images no longer in the catalog: %s",
                        row.slug, ", ".join(missing))
        # The column is what an admin toggles; it wins over the copy in the spec.
        return replace(profile, enabled=bool(row.enabled))

    def list(self, include_disabled: bool = True) -> list[Profile]:
        """Profiles, cheapest first (then by slug)."""
        query = select(profiles_table)
        if not include_disabled:
            query = query.where(profiles_table.c.enabled.is_(True))
        with reading(self.engine) as conn:
            rows = conn.execute(query).all()
        found = [p for p in map(self._from_row, rows) if p is not None]
        return sorted(found, key=lambda p: (p.price_per_hour_ucr, p.slug))

    def exists(self, slug: str) -> bool:
        """Whether a row exists, even one that no longer reads as a valid profile."""
        with reading(self.engine) as conn:
            return conn.execute(
                select(profiles_table.c.slug).where(profiles_table.c.slug == slug)
            ).first() is not None

    def deleted_slugs(self) -> set[str]:
        """Profiles the audit log saw deleted that do not exist again (within its retention)."""
        query = select(audit_log.c.target).where(audit_log.c.action == "profile.delete")
        with reading(self.engine) as conn:
            targets = set(conn.execute(query.distinct()).scalars())
            current = set(conn.execute(select(profiles_table.c.slug)).scalars())
        slugs = {t.removeprefix("profile:") for t in targets if t.startswith("profile:")}
        return slugs - current

    def get(self, slug: str) -> Profile | None:
        with reading(self.engine) as conn:
            row = conn.execute(
                select(profiles_table).where(profiles_table.c.slug == slug)
            ).first()
        return self._from_row(row) if row is not None else None

    # --- writing ---------------------------------------------------------------

    def _validate(self, profiles: list[Profile]) -> None:
        # Profiles built in code (API handlers) get the same checks as the file.
        errors: list[FieldError] = []
        seen: set[str] = set()
        for profile in profiles:
            if profile.slug in seen:
                errors.append(FieldError(f"{profile.slug}: slug", "given twice in one apply"))
            seen.add(profile.slug)
            try:
                parse_profile(profile.to_spec(), self.catalog, where=profile.slug)
            except ProfileError as exc:
                errors.extend(exc.errors)
            except ValueError as exc:  # to_spec itself failed: nonsense field values
                errors.append(FieldError(profile.slug, str(exc)))
        if errors:
            raise ProfileError(errors)

    def _write_audited(self, conn: Connection, profile: Profile, actor: str | None) -> str:
        """`_write`, and with an `actor` its audit entry in the same transaction.

        A change is then never kept without its record, nor the reverse.
        """
        if actor is None:
            return self._write(conn, profile)
        row = conn.execute(
            select(profiles_table.c.spec, profiles_table.c.enabled)
            .where(profiles_table.c.slug == profile.slug)
        ).first()
        outcome = self._write(conn, profile)
        if outcome != "unchanged":
            before = None if row is None else _row_spec(profile.slug, row.spec, row.enabled)
            self.audit.record(actor, _AUDIT_ACTIONS[outcome], f"profile:{profile.slug}",
                              before, profile.to_spec(), conn=conn)
        return outcome

    def _write(self, conn: Connection, profile: Profile) -> str:
        """Insert or update one profile inside the caller's transaction."""
        text = spec_text(profile)
        row = conn.execute(
            select(profiles_table.c.spec, profiles_table.c.enabled)
            .where(profiles_table.c.slug == profile.slug)
        ).first()
        now = utcnow()
        if row is None:
            conn.execute(insert(profiles_table).values(
                slug=profile.slug, spec=text, enabled=profile.enabled,
                created_at=now, updated_at=now,
            ))
            return "created"
        if row.spec == text and bool(row.enabled) == profile.enabled:
            return "unchanged"
        conn.execute(
            update(profiles_table).where(profiles_table.c.slug == profile.slug)
            .values(spec=text, enabled=profile.enabled, updated_at=now)
        )
        return "updated"

    def _delete(self, conn: Connection, slugs: list[str], actor: str | None) -> list[str]:
        """Delete rows inside the caller's transaction; returns the slugs that existed."""
        rows = conn.execute(
            select(profiles_table).where(profiles_table.c.slug.in_(slugs))
        ).all() if slugs else []
        if not rows:
            return []
        conn.execute(delete(profiles_table).where(
            profiles_table.c.slug.in_([r.slug for r in rows])))
        if actor is not None:
            now = utcnow()
            for row in rows:
                self.audit.record(actor, "profile.delete", f"profile:{row.slug}",
                                  _row_spec(row.slug, row.spec, row.enabled), None,
                                  conn=conn, at=now)
        return sorted(r.slug for r in rows)

    def _apply(self, conn: Connection, profiles: list[Profile], prune: bool,
               actor: str | None = None) -> ApplyResult:
        result = ApplyResult()
        for profile in profiles:
            getattr(result, self._write_audited(conn, profile, actor)).append(profile.slug)
        if prune:
            keep = {p.slug for p in profiles}
            stored = conn.execute(select(profiles_table.c.slug)).scalars().all()
            gone = sorted(slug for slug in stored if slug not in keep)
            result.deleted.extend(self._delete(conn, gone, actor))
        return result

    def upsert(self, profile: Profile, actor: str | None = None) -> str:
        """'created', 'updated' or 'unchanged'; an `actor` gets the change audited."""
        self._validate([profile])
        with self.engine.begin() as conn:
            return self._write_audited(conn, profile, actor)

    def delete(self, slug: str, actor: str | None = None) -> bool:
        with self.engine.begin() as conn:
            return bool(self._delete(conn, [slug], actor))

    def apply(self, profiles: list[Profile], prune: bool = False,
              actor: str | None = None) -> ApplyResult:
        """Upsert every profile (and with `prune` delete the others) in one transaction."""
        self._validate(profiles)
        with self.engine.begin() as conn:
            return self._apply(conn, profiles, prune, actor)

    def apply_file_if_changed(self, path: str | Path,
                              actor: str | None = PROFILES_FILE_ACTOR) -> ApplyResult | None:
        """Apply a profiles file (upsert, no prune) when its bytes changed since last applied.

        The file is read and validated before the database is touched; edits
        made on the admin page persist until the file itself changes.
        """
        data = Path(path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProfileError([FieldError(str(path), f"not UTF-8 text: {exc}")]) from exc
        profiles = parse_profiles_text(text, self.catalog, str(path))
        digest = hashlib.sha256(data).hexdigest()
        with self.engine.begin() as conn:
            if _get_setting(conn, PROFILES_FILE_HASH) == digest:
                return None
            result = self._apply(conn, profiles, prune=False, actor=actor)
            _set_setting(conn, PROFILES_FILE_HASH, digest)
        return result

    # --- default profiles --------------------------------------------------------

    def get_default_profile(self, user: str) -> str | None:
        with reading(self.engine) as conn:
            return conn.execute(
                select(user_prefs.c.default_profile).where(user_prefs.c.user_name == user)
            ).scalar()

    def set_default_profile(self, user: str, slug: str | None) -> None:
        with self.engine.begin() as conn:
            exists = conn.execute(
                select(user_prefs.c.user_name).where(user_prefs.c.user_name == user)
            ).first()
            if exists:
                conn.execute(update(user_prefs).where(user_prefs.c.user_name == user)
                             .values(default_profile=slug))
            else:
                conn.execute(insert(user_prefs).values(user_name=user, default_profile=slug))


def _get_setting(conn: Connection, key: str) -> str | None:
    return conn.execute(select(settings.c.value).where(settings.c.key == key)).scalar()


def _set_setting(conn: Connection, key: str, value: str) -> None:
    if _get_setting(conn, key) is None:
        conn.execute(insert(settings).values(key=key, value=value))
    else:
        conn.execute(update(settings).where(settings.c.key == key).values(value=value))
