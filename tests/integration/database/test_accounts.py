"""Local accounts: validation, argon2id hashing, the store on both databases, the first admin."""

from __future__ import annotations

from pathlib import Path

import pytest
from argon2 import PasswordHasher
from sqlalchemy import select

from gpulease.store import accounts
from gpulease.store.accounts import (
    AccountError,
    LocalAccountStore,
    ensure_first_admin,
    hash_password,
    needs_rehash,
    validate_password,
    validate_username,
    verify_password,
)
from gpulease.store.db import local_accounts, open_database, sqlite_url

PASSWORD = "Tr0ub4dor&3-horse"


@pytest.fixture
def store(engine) -> LocalAccountStore:
    return LocalAccountStore(engine)


def stored_hash(store: LocalAccountStore, name: str) -> str:
    with store.engine.connect() as conn:
        return conn.execute(
            select(local_accounts.c.password_hash).where(local_accounts.c.name == name)
        ).scalar_one()


# --- validation -------------------------------------------------------------


@pytest.mark.parametrize("name", ["alice", "a", "bob-smith", "x1-2", "a" * 32])
def test_valid_names_pass(name):
    assert validate_username(name) == name


def test_names_are_not_lowercased():
    # the rule's own tests: tests/integration/host/test_user_names.py
    with pytest.raises(AccountError, match="uppercase letters .* 'alice', is valid"):
        validate_username("Alice")


@pytest.mark.parametrize(
    "name, words",
    [
        ("", "it is empty"),
        ("a" * 33, "33 characters long"),
        ("1alice", "start with a letter"),
        ("-alice", "start with a letter"),
        ("al ice", "characters other than a-z, 0-9 and '-'"),
        ("al/ice", "characters other than"),
        ("alice$", "characters other than"),
        ("älice", "characters other than"),
        ("bob.smith", "characters other than"),
        ("x_1", "characters other than"),
        ("root", "reserved"),
        ("daemon", "reserved"),
    ],
)
def test_bad_names_refused_with_reason(name, words):
    with pytest.raises(AccountError, match=words):
        validate_username(name)


@pytest.mark.parametrize(
    "password, words",
    [
        ("short", "at least 8 characters"),
        ("x" * 1025, "at most 1024"),
        ("alice.smith", "must not be the user name"),
        ("ALICE.SMITH", "must not be the user name"),
    ],
)
def test_bad_passwords_refused_with_reason(password, words):
    with pytest.raises(AccountError, match=words):
        validate_password(password, "alice.smith")


def test_account_error_is_a_value_error():
    assert issubclass(AccountError, ValueError)


# --- hashing ----------------------------------------------------------------


def test_hash_is_argon2id_and_salted():
    first, second = hash_password(PASSWORD), hash_password(PASSWORD)
    assert first.startswith("$argon2id$")
    assert first != second  # a fresh salt each time
    assert verify_password(first, PASSWORD)
    assert not verify_password(first, PASSWORD + "x")
    assert not verify_password("not a hash", PASSWORD)
    assert not needs_rehash(first)


def test_hash_with_other_parameters_needs_rehash():
    weaker = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1).hash(PASSWORD)
    assert verify_password(weaker, PASSWORD)
    assert needs_rehash(weaker)


# --- the store, on SQLite and PostgreSQL --------------------------------------


def test_create_and_verify(store):
    with pytest.raises(AccountError, match="uppercase"):
        store.create("Alice", PASSWORD)  # the name as typed, or a refusal: never another
    assert store.create("alice", PASSWORD) == "alice"
    assert store.exists("alice") and not store.exists("ALICE")
    assert store.verify("alice", PASSWORD)
    assert not store.verify("alice", "wrong password")
    assert not store.verify("alice", "")
    assert not store.verify("nobody-here", PASSWORD)
    assert not store.verify("not a valid name!", PASSWORD)
    assert store.names() == ["alice"]


def test_duplicate_refused(store):
    store.create("alice", PASSWORD)
    with pytest.raises(AccountError, match="user 'alice' already exists"):
        store.create("alice", "another password")
    assert store.verify("alice", PASSWORD)  # the first account is untouched


def test_create_refuses_bad_input_and_stores_nothing(store):
    with pytest.raises(AccountError, match="reserved"):
        store.create("root", PASSWORD)
    with pytest.raises(AccountError, match="at least 8"):
        store.create("bob", "short")
    assert store.names() == []


def test_set_password_and_delete(store):
    store.create("alice", PASSWORD)
    store.set_password("alice", "a brand new passphrase")
    assert not store.verify("alice", PASSWORD)
    assert store.verify("alice", "a brand new passphrase")
    with pytest.raises(AccountError, match="does not exist"):
        store.set_password("bob", "a brand new passphrase")
    with pytest.raises(AccountError, match="at least 8"):
        store.set_password("alice", "short")
    store.delete("alice")
    assert not store.exists("alice")
    assert not store.verify("alice", "a brand new passphrase")
    with pytest.raises(AccountError, match="does not exist"):
        store.delete("alice")


def test_stored_value_is_argon2id_hash(store):
    store.create("alice", PASSWORD)
    value = stored_hash(store, "alice")
    assert value.startswith("$argon2id$")
    assert f"m={accounts.HASH_MEMORY_KIB},t={accounts.HASH_TIME_COST}" in value
    assert PASSWORD not in value


def test_login_upgrades_an_outdated_hash(store):
    store.create("alice", PASSWORD)
    weaker = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1).hash(PASSWORD)
    with store.engine.begin() as conn:
        conn.execute(local_accounts.update().values(password_hash=weaker))
    assert not store.verify("alice", "wrong password")
    assert stored_hash(store, "alice") == weaker  # a failed login changes nothing
    assert store.verify("alice", PASSWORD)
    upgraded = stored_hash(store, "alice")
    assert upgraded != weaker and not needs_rehash(upgraded)
    assert store.verify("alice", PASSWORD)


def test_unknown_user_costs_an_argon2_verify(store, monkeypatch):
    # Constant work: an unknown name is checked against a dummy hash.
    calls = []
    real = accounts.verify_password
    monkeypatch.setattr(accounts, "verify_password", lambda h, pw: calls.append(h) or real(h, pw))
    store.create("alice", PASSWORD)
    assert not store.verify("mallory", PASSWORD)
    assert not store.verify("alice", "wrong password")
    assert len(calls) == 2
    assert calls[0].startswith("$argon2id$")
    assert calls[0] != stored_hash(store, "alice")


def test_password_never_in_sqlite_file(tmp_path: Path):
    path = tmp_path / "accounts.sqlite"
    engine = open_database(sqlite_url(path))
    try:
        store = LocalAccountStore(engine)
        store.create("alice", PASSWORD)
        store.set_password("alice", "second-secret-phrase")
        store.verify("alice", "second-secret-phrase")
    finally:
        engine.dispose()  # checkpoints the WAL into the main file
    files = [p for p in tmp_path.iterdir() if p.name.startswith("accounts.sqlite")]
    data = b"".join(p.read_bytes() for p in files)
    assert b"$argon2id$" in data  # the search does see the table's contents
    for secret in (PASSWORD, "second-secret-phrase"):
        assert secret.encode() not in data


# --- the first admin ------------------------------------------------------------


def test_first_admin_with_generated_password(store):
    password = ensure_first_admin(store, "admin", None)
    assert password and len(password) >= 16
    assert store.verify("admin", password)


def test_generated_passwords_differ(store, engine):
    first = ensure_first_admin(store, "admin", None)
    store.delete("admin")
    second = ensure_first_admin(store, "admin", None)
    assert first != second
    assert store.verify("admin", second) and not store.verify("admin", first)


def test_first_admin_with_given_password(store):
    with pytest.raises(AccountError, match="uppercase"):  # --admin Admin: the hub says why
        ensure_first_admin(store, "Admin", "given-by-environment")
    assert ensure_first_admin(store, "admin", "given-by-environment") == "given-by-environment"
    assert store.verify("admin", "given-by-environment")


def test_first_admin_refuses_weak_given_password(store):
    with pytest.raises(AccountError, match="at least 8"):
        ensure_first_admin(store, "admin", "short")
    assert not store.exists("admin")


def test_existing_admin_untouched(store):
    store.create("admin", PASSWORD)
    before = stored_hash(store, "admin")
    assert ensure_first_admin(store, "admin", None) is None
    assert ensure_first_admin(store, "admin", "given-by-environment") is None
    assert stored_hash(store, "admin") == before
    assert store.verify("admin", PASSWORD)
