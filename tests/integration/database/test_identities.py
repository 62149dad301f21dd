"""Identities from a sign-in provider and the hub names they get (gpulease.store.identities)."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
from tornado.httpclient import HTTPClientError

from gpulease.core.policy.user_names import is_valid_name
from gpulease.hub.auth.github import github_groups
from gpulease.hub.auth.oauth import provider_groups, provider_unreachable
from gpulease.store.accounts import LocalAccountStore
from gpulease.store.identities import Identity, IdentityStore, base_name, candidate_names

ISS = "https://idp.uni.example/realms/research"


@pytest.mark.parametrize("preferred, email, expected", [
    ("alice", "", "alice"),
    ("Alice.Smith", "", "alice-smith"),
    ("", "Bob.Smith@uni.example", "bob-smith"),
    ("", "j.müller@uni.example", "j-muller"),
    ("42", "", "user"),                       # nothing valid: the fallback
    ("", "", "user"),
    ("root", "", "root"),                     # reserved: base_name keeps it; candidates skip it
    ("a" * 60, "", "a" * 32),
])
def test_the_base_name_comes_from_the_preferred_name_else_the_email(preferred, email, expected):
    assert base_name(Identity(ISS, "s", preferred, email)) == expected


def test_candidates_are_valid_names_with_suffixes_that_fit():
    first = list(itertools.islice(candidate_names(Identity(ISS, "s", "a" * 40)), 12))
    assert first[0] == "a" * 32 and first[1] == "a" * 30 + "-2" and first[10] == "a" * 29 + "-11"
    assert all(is_valid_name(n) and len(n) <= 32 for n in first)
    root = list(itertools.islice(candidate_names(Identity(ISS, "s", "root")), 2))
    assert root == ["root-2", "root-3"]  # a system account's name is never given


def test_an_identity_keeps_its_name_and_two_never_share_one(engine):
    store = IdentityStore(engine)
    alice, before = store.bind(Identity(ISS, "sub-1", "alice", "alice@uni.example"),
                               lambda _: False)
    assert alice.user_name == "alice" and before is None
    # a different identity, same preferred name (another provider, or a new account)
    other, _ = store.bind(Identity("https://github.com", "77", "alice"), lambda _: False)
    assert other.user_name == "alice-2"
    # alice changes e-mail and preferred name: her name stays
    again, before = store.bind(Identity(ISS, "sub-1", "alice.new", "alice.new@uni.example"),
                               lambda _: False)
    assert again.user_name == "alice" and before.identity.email == "alice@uni.example"
    assert store.of_user("alice").identity.email == "alice.new@uni.example"
    assert store.find(ISS, "sub-1").user_name == "alice"


def test_a_local_accounts_name_is_never_given(engine):
    LocalAccountStore(engine).create("admin", "a-long-password-1")
    store = IdentityStore(engine)
    bound, _ = store.bind(Identity(ISS, "sub-9", "admin"),
                          LocalAccountStore(engine).exists)
    assert bound.user_name == "admin-2"


def test_racing_first_logins_get_different_names(engine):
    store = IdentityStore(engine)
    with ThreadPoolExecutor(6) as pool:
        bound = list(pool.map(lambda i: store.bind(Identity(ISS, f"s{i}", "sam"),
                                                   lambda _: False)[0].user_name, range(6)))
    assert sorted(bound) == ["sam", "sam-2", "sam-3", "sam-4", "sam-5", "sam-6"]


def test_the_same_identity_racing_itself_gets_one_name(engine):
    store = IdentityStore(engine)
    with ThreadPoolExecutor(4) as pool:
        names = set(pool.map(lambda _: store.bind(Identity(ISS, "same", "tom"),
                                                  lambda _: False)[0].user_name, range(4)))
    assert names == {"tom"}


def test_what_counts_as_a_provider_that_cannot_be_reached():
    assert provider_unreachable(ConnectionRefusedError())
    assert provider_unreachable(TimeoutError())
    assert provider_unreachable(HTTPClientError(599))
    assert provider_unreachable(HTTPClientError(502))
    assert not provider_unreachable(HTTPClientError(401))  # a refusal: sign in again
    assert not provider_unreachable(ValueError("bad answer"))


def test_github_orgs_and_teams_of_the_allowed_organisations_become_groups():
    state = {"orgs": ["Uni-Lab", "other"], "teams": [
        {"slug": "vision", "organization": {"login": "Uni-Lab"}},
        {"slug": "nlp", "organization": {"login": "other"}}]}
    assert github_groups(state, {"uni-lab"}) == ["uni-lab", "uni-lab:vision"]
    assert github_groups({}, {"uni-lab"}) == []


@pytest.mark.parametrize("raw, groups", [
    (["researchers", "vision"], ["researchers", "vision"]),
    ("researchers", ["researchers"]),                 # one string is one group, not letters
    (["ok", None, 3, ["x"], "", " pad", "a\nb", "x" * 256], ["ok"]),
    (None, []), ({"researchers": True}, []),
])
def test_a_groups_claim_is_read_as_group_names(raw, groups):
    assert provider_groups(raw) == groups
