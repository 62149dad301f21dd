"""Local accounts of the embedded shape: names, argon2id password hashes, the first admin.

Only argon2id hashes are stored, never a password. The checks on names (the
rule is gpulease.core.policy.user_names') and passwords are pure functions so that
the CLI, the hub service and the authenticator all refuse the same things
with the same messages.
"""

from __future__ import annotations

import logging
import secrets
from functools import cache

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gpulease.core.clock import utcnow
from gpulease.core.policy.user_names import MAX_NAME_LENGTH as MAX_NAME_LENGTH  # re-exported
from gpulease.core.policy.user_names import name_problem
from gpulease.core.refusal import Refusal
from gpulease.store.db import local_accounts, reading

log = logging.getLogger("gpulease.accounts")

MIN_PASSWORD_LENGTH = 8
# Far above any real passphrase; keeps a request body from making us hash megabytes.
MAX_PASSWORD_LENGTH = 1024

# RFC 9106's second recommended option is t=3, p=4, m=64 MiB; on the build
# machine that costs ~110 ms per verify, and the login path runs one per
# attempt, so memory is halved (and lanes to 2) to stay near 40 ms here while
# keeping its three passes. Raising these later is safe: `verify` rehashes on
# the next successful login.
HASH_TIME_COST = 3
HASH_MEMORY_KIB = 32 * 1024
HASH_PARALLELISM = 2

_hasher = PasswordHasher(
    time_cost=HASH_TIME_COST,
    memory_cost=HASH_MEMORY_KIB,
    parallelism=HASH_PARALLELISM,
    hash_len=32,
    salt_len=16,
    type=Type.ID,
)


class AccountError(Refusal, ValueError):
    """A name, password or account state that is not allowed (400); the message says what is."""


def validate_username(name: str) -> str:
    """`name` itself when it is valid (gpulease.core.policy.user_names), else AccountError
    saying why.

    Nothing is lowercased: "Alice" is refused with words naming "alice", so
    that the name an admin typed is the name that exists.
    """
    problem = name_problem(name)
    if problem:
        raise AccountError(problem)
    return name


def validate_password(password: str, name: str) -> None:
    """Raise AccountError unless `password` is acceptable for the user `name`."""
    if not isinstance(password, str):
        raise AccountError("password must be a string")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(f"password must be at least {MIN_PASSWORD_LENGTH} characters long")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise AccountError(f"password must be at most {MAX_PASSWORD_LENGTH} characters long")
    if password.lower() == name.lower():
        raise AccountError("password must not be the user name")


def hash_password(password: str) -> str:
    """An argon2id hash (PHC string, salt and parameters included) of `password`."""
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether `password` matches `password_hash`; False for a corrupt hash too."""
    try:
        return _hasher.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    """Whether the hash was made with other parameters than the current ones."""
    try:
        return _hasher.check_needs_rehash(password_hash)
    except InvalidHashError:
        return True


@cache
def _dummy_hash() -> str:
    # Verified against when the user is unknown, so that an unknown name costs
    # the same argon2 work as a wrong password and timing does not tell them apart.
    return hash_password(secrets.token_urlsafe(16))


class LocalAccountStore:
    """The `local_accounts` table: create, change, verify and delete accounts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _hash_of(self, name: str) -> str | None:
        with reading(self.engine) as conn:
            return conn.execute(
                select(local_accounts.c.password_hash).where(local_accounts.c.name == name)
            ).scalar_one_or_none()

    def create(self, name: str, password: str) -> str:
        """Create the account; return its name."""
        name = validate_username(name)
        validate_password(password, name)
        password_hash = hash_password(password)
        now = utcnow()
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(local_accounts).values(
                        name=name, password_hash=password_hash, created_at=now, updated_at=now
                    )
                )
        except IntegrityError:
            # Insert-and-catch rather than check-then-insert: two creators racing
            # for one name get one success and one clear refusal.
            raise AccountError(f"user {name!r} already exists") from None
        return name

    def set_password(self, name: str, password: str) -> None:
        name = validate_username(name)
        validate_password(password, name)
        with self.engine.begin() as conn:
            changed = conn.execute(
                update(local_accounts)
                .where(local_accounts.c.name == name)
                .values(password_hash=hash_password(password), updated_at=utcnow())
            ).rowcount
        if not changed:
            raise AccountError(f"user {name!r} does not exist")

    def verify(self, name: str, password: str) -> bool:
        """Whether `password` is `name`'s; the same argon2 work whether or not `name` exists."""
        if not isinstance(password, str):
            password = ""
        try:
            name = validate_username(name)
            stored = self._hash_of(name)
        except AccountError:
            stored = None
        if stored is None:
            verify_password(_dummy_hash(), password)
            return False
        if not verify_password(stored, password):
            return False
        if needs_rehash(stored):
            self._rehash(name, stored, password)
        return True

    def _rehash(self, name: str, old_hash: str, password: str) -> None:
        # Only replace the hash we verified against, so that a password changed
        # meanwhile is not overwritten by the old one.
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    update(local_accounts)
                    .where(local_accounts.c.name == name)
                    .where(local_accounts.c.password_hash == old_hash)
                    .values(password_hash=hash_password(password), updated_at=utcnow())
                )
        except SQLAlchemyError as e:
            # The login itself succeeded; an upgrade of the hash can wait for the next one.
            log.warning("Could not rehash the password of %r: %s", name, e)

    def exists(self, name: str) -> bool:
        try:
            name = validate_username(name)
        except AccountError:
            return False
        return self._hash_of(name) is not None

    def names(self) -> list[str]:
        with reading(self.engine) as conn:
            return list(
                conn.execute(
                    select(local_accounts.c.name).order_by(local_accounts.c.name)
                ).scalars()
            )

    def delete(self, name: str) -> None:
        name = validate_username(name)
        with self.engine.begin() as conn:
            deleted = conn.execute(
                delete(local_accounts).where(local_accounts.c.name == name)
            ).rowcount
        if not deleted:
            raise AccountError(f"user {name!r} does not exist")


def generate_password() -> str:
    return secrets.token_urlsafe(16)


def ensure_first_admin(store: LocalAccountStore, name: str, password: str | None) -> str | None:
    """Create the first admin account on first run.

    Returns the password that was set (given, or generated when `password` is
    None) so that the caller can show it once; None when the account already
    existed, whose password is never read back or changed.
    """
    name = validate_username(name)
    if store.exists(name):
        return None
    if password is None:
        password = generate_password()
    try:
        store.create(name, password)
    except AccountError:
        if store.exists(name):
            return None  # another process created it first; its password stays its own
        raise
    return password
