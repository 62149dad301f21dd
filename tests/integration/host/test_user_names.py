"""The user-name rule itself, its words, the rename hints; and the checks of the code that
makes and owns homes, which refuses names outside the rule and never follows a link."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpulease.core.policy.user_names import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    BadName,
    is_valid_name,
    name_problem,
    outside_the_rule,
    rename_hint,
    suggested_name,
)
from gpulease.host.state import StateError, checked_home, ensure_home, prepare_state_dir
from gpulease.host.unix_accounts import UnixAccount, UnixAccountError, own_home
from gpulease.hub.auth.local import LocalAccountsAuthenticator
from gpulease.store.accounts import AccountError, validate_username

VALID = ["a", "alice", "ab-c", "a1", "x-1-2", "a" * 32, "a" + "-" * 30 + "z", "admin"]
INVALID = [
    ("", "it is empty"),
    ("a" * 33, "33 characters long"),
    ("Alice", "uppercase letters (the name in lowercase, 'alice', is valid)"),
    ("ALICE", "uppercase"),
    ("Nobody", "it has uppercase letters;"),  # "nobody" is no valid name either
    ("a_b", "other than a-z, 0-9 and '-': '_'"),
    ("a.b", "'.'"),
    (".", "'.'"),
    ("..", "'.'"),
    ("a/..", "'.', '/'"),
    ("-a", "does not start with a letter"),
    ("1a", "does not start with a letter"),
    ("a-", "ends with '-'"),
    ("ålice", "'å'"),
    ("a b", "' '"),
    ("alice\n", "'\\n'"),  # `$` alone would let the newline through
    ("\nalice", "'\\n'"),
    ("a\x00b", "'\\u0000'"),
    ("root", "reserved for a system account"),
    ("nobody", "reserved"),
    ("jovyan", "reserved"),
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name):
    assert name_problem(name) == "" and is_valid_name(name)
    assert re.fullmatch(NAME_PATTERN, name)
    assert validate_username(name) == name


@pytest.mark.parametrize("name, words", INVALID)
def test_invalid_names_say_what_is_wrong_and_name_the_rule(name, words):
    problem = name_problem(name)
    assert words in problem and NAME_PATTERN in problem, problem
    assert not is_valid_name(name)
    with pytest.raises(AccountError) as refused:
        validate_username(name)
    assert str(refused.value) == problem


@pytest.mark.parametrize("value", [None, 5, ["alice"], {"name": "alice"}, b"alice"])
def test_non_strings_are_refused(value):
    assert "must be a string" in name_problem(value) and NAME_PATTERN in name_problem(value)


def test_the_pattern_and_the_checks_agree_on_every_short_name():
    alphabet = "aZ0-_.é/ \n"
    names = [a + b + c for a in alphabet for b in ["", *alphabet] for c in ["", *alphabet]]
    for name in names:
        by_pattern = re.fullmatch(NAME_PATTERN.strip("^$"), name) is not None
        assert is_valid_name(name) == by_pattern, repr(name)
    assert MAX_NAME_LENGTH == 32


def test_long_input_is_shown_cut():
    problem = name_problem("x" * 100_000)
    assert len(problem) < 600 and "100000 characters long" in problem


@pytest.mark.parametrize("name, suggestion", [
    ("Alice", "alice"), ("a_b", "a-b"), ("old.name", "old-name"), ("ålice", "alice"),
    ("1st-user", "st-user"), ("a" * 40, "a" * 32), ("a__b--", "a-b"), ("root", None),
    ("...", None), ("__", None),
])
def test_suggested_names_are_valid(name, suggestion):
    assert suggested_name(name) == suggestion
    assert suggestion is None or is_valid_name(suggestion)


def test_outside_the_rule_merges_both_tables():
    bad = outside_the_rule(["admin", "old.name", "Caps"], ["old.name", "alice", "x_y"])
    assert [(b.name, b.where) for b in bad] == [
        ("Caps", ("hub user",)), ("old.name", ("hub user", "local account")),
        ("x_y", ("local account",))]
    assert outside_the_rule(["admin", "alice"], ["alice"]) == []


def test_rename_hint_names_the_rule_and_the_commands():
    (bad,) = outside_the_rule(["old.name"], ["old.name"])
    hint = rename_hint(bad, "/srv/state/homes")
    assert hint.startswith("User name 'old.name' is not allowed") and NAME_PATTERN in hint
    assert "Found as: hub user, local account" in hint
    assert "rename it to 'old-name'" in hint
    assert 'PATCH /hub/api/users/old.name {"name": "old-name"}' in hint
    assert "`gpulease users add old-name`" in hint
    assert "mv /srv/state/homes/old.name /srv/state/homes/old-name" in hint
    hub_only = rename_hint(BadName("root", name_problem("root"), ("hub user",)), "/h")
    assert "reserved" in hub_only and "a valid name" in hub_only
    assert "gpulease users add" not in hub_only


# --- the authenticator: JupyterHub's validate_username and normalize_username ----------


def test_authenticator_refuses_what_the_rule_refuses_and_maps_nothing_silently():
    auth = LocalAccountsAuthenticator()
    for name in VALID:
        assert auth.validate_username(name), name
    for name, _ in INVALID:
        assert not auth.validate_username(name), name
    assert auth.normalize_username("Alice") == "Alice"  # refused next, not made "alice"
    auth.username_map = {"Alice": "alice"}  # an explicit map still applies
    assert auth.normalize_username("Alice") == "alice"


def test_authenticator_keeps_a_configured_username_pattern():
    auth = LocalAccountsAuthenticator(username_pattern=r"^lab-")
    assert auth.validate_username("lab-ada") and not auth.validate_username("ada")


# --- the homes ---------------------------------------------------------------------


def mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "../x", "Alice", "a_b", "root",
                                  "/etc", "a\x00"])
def test_no_home_is_made_for_a_name_outside_the_rule(tmp_path, name):
    state = prepare_state_dir(tmp_path / "state")
    before = {p: (mode(p), os.stat(p).st_uid) for p in (tmp_path, state.root, state.homes)}
    with pytest.raises(StateError, match="outside the rule"):
        ensure_home(state, name)
    assert sorted(os.listdir(state.homes)) == []
    assert {p: (mode(p), os.stat(p).st_uid) for p in before} == before


def test_a_home_that_is_a_link_is_refused_and_its_target_unchanged(tmp_path):
    state = prepare_state_dir(tmp_path / "state")
    target = tmp_path / "elsewhere"
    target.mkdir()
    target.chmod(0o755)
    (state.homes / "linked").symlink_to(target, target_is_directory=True)
    with pytest.raises(StateError, match="is a symbolic link"):
        ensure_home(state, "linked")
    account = UnixAccount("gl-linked", os.getuid(), os.getgid(), "linked")
    with pytest.raises(UnixAccountError, match="is a symbolic link"):
        own_home(state.homes / "linked", account)
    assert mode(target) == 0o755


def test_a_home_that_is_a_file_is_refused(tmp_path):
    state = prepare_state_dir(tmp_path / "state")
    (state.homes / "filed").write_text("")
    os.chmod(state.homes / "filed", 0o644)
    with pytest.raises(StateError, match="not a folder"):
        ensure_home(state, "filed")
    assert mode(state.homes / "filed") == 0o644


def test_a_linked_homes_folder_is_followed_once_homes_stay_directly_under_it(tmp_path):
    """The admin may put homes/ on another disk with a link; a home is still a real
    folder directly under where that link points."""
    state = prepare_state_dir(tmp_path / "state")
    disk = tmp_path / "disk"
    state.homes.rmdir()
    disk.mkdir(mode=0o755)
    state.homes.symlink_to(disk, target_is_directory=True)
    home = ensure_home(state, "ada")
    assert home == disk.resolve() / "ada" and mode(home) == 0o700
    assert checked_home(state.homes, "ada") == home


def test_own_home_refuses_a_home_not_named_for_its_user(tmp_path):
    state = prepare_state_dir(tmp_path / "state")
    home = ensure_home(state, "ada")
    other = UnixAccount("gl-bob", os.getuid(), os.getgid(), "bob")
    with pytest.raises(UnixAccountError, match="not bob's home"):
        own_home(home, other)
    bad = UnixAccount("gl-a_b", os.getuid(), os.getgid(), "a_b")
    with pytest.raises(UnixAccountError, match="outside the rule"):
        own_home(state.homes / "a_b", bad)
    assert not (state.homes / "a_b").exists()


def test_own_home_hands_over_a_real_home(tmp_path):
    state = prepare_state_dir(tmp_path / "state")
    home = ensure_home(state, "ada")
    (home / "notebook.ipynb").write_text("{}")
    os.chmod(home, 0o755)
    own_home(home, UnixAccount("gl-ada", os.getuid(), os.getgid(), "ada"))
    assert mode(home) == 0o700
