"""GitHub sign-in: only the allowed organisations and their teams are groups, and a group
that gives rights which no allowed organisation or team can be refuses the start."""

from __future__ import annotations

from types import SimpleNamespace

from gpulease.hub.auth.github import (
    GPULeaseGitHubAuthenticator,
    github_groups,
    group_orgs,
    producible,
    unproducible,
)
from gpulease.hub.auth.rights_groups import refuse_unproducible_groups, rights_groups

STATE = {"orgs": ["Uni-Lab", "gpu-admins", "club-001"], "teams": [
    {"slug": "vision", "organization": {"login": "Uni-Lab"}},
    {"slug": "owners", "organization": {"login": "gpu-admins"}}]}


def test_only_the_allowed_organisations_and_their_teams_become_groups():
    orgs = group_orgs(["uni-lab"])
    # gpu-admins is an organisation anyone could have made: it is no group
    assert github_groups(STATE, orgs) == ["uni-lab", "uni-lab:vision"]
    assert github_groups(STATE, group_orgs([])) == []


def test_an_allowed_team_names_its_organisation():
    assert group_orgs(["Uni-Lab:vision", "other"]) == {"uni-lab", "other"}
    assert github_groups(STATE, group_orgs(["uni-lab:vision"])) == ["uni-lab", "uni-lab:vision"]


def test_the_authenticator_reads_its_allowed_organisations():
    auth = GPULeaseGitHubAuthenticator(allowed_organizations={"uni-lab"})
    assert auth.auth_state_groups_key(STATE) == ["uni-lab", "uni-lab:vision"]


def test_what_github_can_produce():
    orgs = frozenset({"uni-lab"})
    assert producible("uni-lab", orgs) and producible("uni-lab:vision", orgs)
    assert not producible("gpu-admins", orgs)  # no allowed organisation
    assert not producible("gpu-admins:owners", orgs)
    assert not producible("Uni-Lab", orgs)  # groups are lowercase
    assert not producible("uni-lab:", orgs) and not producible("uni-lab:a:b", orgs)


def test_a_rights_group_no_allowed_organisation_produces_is_refused_by_name():
    rights = {"GPULeaseHub.admin_groups": ["gpu-admins"],
              "GPULeaseHub.auditor_groups": ["uni-lab:audit"],
              "profile h200-full (groups)": ["uni-lab:vision", "vision"],
              "group account group:nlp": ["nlp"]}
    problems = unproducible(rights, group_orgs(["uni-lab"]))
    assert len(problems) == 3
    assert problems[0].startswith("GPULeaseHub.admin_groups names the group 'gpu-admins'")
    assert "(uni-lab)" in problems[0] and "ORG:TEAM" in problems[0]
    assert problems[1].startswith("profile h200-full (groups) names the group 'vision'")
    assert problems[2].startswith("group account group:nlp names the group 'nlp'")
    assert "allowed_organizations is empty" in unproducible({"x": ["a"]}, frozenset())[0]
    auth = GPULeaseGitHubAuthenticator(allowed_organizations={"uni-lab:vision"})
    assert auth.refused_rights_groups({"GPULeaseHub.admin_groups": ["uni-lab:vision"]}) == []


def test_every_place_a_group_gives_rights_is_checked():
    auth = GPULeaseGitHubAuthenticator(allowed_organizations={"uni-lab"},
                                       admin_groups={"gpu-admins", "ops"},
                                       allowed_groups={"uni-lab"})
    profiles = [SimpleNamespace(slug="h200-full", groups=("vision",), spot_groups=()),
                SimpleNamespace(slug="cpu", groups=(), spot_groups=("uni-lab:students",))]
    rights = rights_groups(["gpu-admins"], ["finance"], auth, profiles, ["group:nlp"])
    assert rights == {
        "GPULeaseHub.admin_groups": ["gpu-admins"],
        "GPULeaseHub.auditor_groups": ["finance"],
        "GPULeaseGitHubAuthenticator.admin_groups": ["ops"],  # gpu-admins named once
        "GPULeaseGitHubAuthenticator.allowed_groups": ["uni-lab"],
        "profile h200-full (groups)": ["vision"],
        "profile cpu (spot_groups)": ["uni-lab:students"],
        "group account group:nlp": ["nlp"]}
    refused = auth.refused_rights_groups(rights)
    assert [line.split(" names the group ")[1].split(",")[0] for line in refused] == [
        "'gpu-admins'", "'finance'", "'ops'", "'vision'", "'nlp'"]


def _github_hub(group_accounts, admin_groups=()):
    """What refuse_unproducible_groups reads of a GPULeaseHub, with its outcome recorded."""
    hub = SimpleNamespace(
        authenticator=GPULeaseGitHubAuthenticator(allowed_organizations={"uni-lab"}),
        admin_groups=list(admin_groups), auditor_groups=[], exited=[], warnings=[],
        _ctx=SimpleNamespace(profiles=SimpleNamespace(list=lambda: []),
                             ledger=SimpleNamespace(group_accounts=lambda: group_accounts)),
        _undo_prepare=lambda: None)
    hub.exit = hub.exited.append
    hub.log = SimpleNamespace(warning=lambda msg, *a: hub.warnings.append(msg % a))
    return hub


def test_a_group_account_the_ledger_keeps_warns_and_never_stops_the_hub():
    # An admin granted credits to group:Lab (or an organisation later dropped from
    # allowed_organizations) while the hub ran: the ledger keeps that account for ever, so
    # refusing it would stop every later start, and no GitHub user can spend it anyway.
    hub = _github_hub(["group:Lab", "group:uni-lab"])
    refuse_unproducible_groups(hub)
    assert hub.exited == []
    assert len(hub.warnings) == 1 and "group account group:Lab" in hub.warnings[0]
    assert "no one can charge it" in hub.warnings[0]
    config = _github_hub(["group:Lab"], admin_groups=["gpu-admins"])
    refuse_unproducible_groups(config)  # configuration is refused still
    assert config.exited == [1]


def test_a_refused_profile_group_says_how_to_correct_it_while_the_hub_is_down(capsys):
    # The admin page's edits live in the database until the profiles file changes: the
    # refusal says that the file is where to correct a profile the page gave a bad group.
    hub = _github_hub([])
    hub._ctx.profiles.list = lambda: [SimpleNamespace(slug="h200", groups=("vision",),
                                                      spot_groups=())]
    refuse_unproducible_groups(hub)
    assert hub.exited == [1]
    err = capsys.readouterr().err
    assert "profile h200 (groups) names the group 'vision'" in err
    assert "GPULeaseHub.profiles_file" in err
