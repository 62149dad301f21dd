"""End to end: sign-in with GitHub through GPULeaseGitHubAuthenticator.

GitHub cannot run here: its OAuth and REST endpoints are a test double
(tests/support/github_double.py), reached through oauthenticator's own `github_url`
setting. The allowed organisations and their teams become groups, no other
organisation does; a team decides a profile; a group that gives rights which GitHub
never gives refuses the start.
"""

from __future__ import annotations

import re

import pytest
import requests
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES
from tests.support.github_double import GitHubDouble, GitHubUser
from tests.support.hubproc import HubProcess, free_port
from tests.support.oidc_provider import xsrf_headers

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLE_PROFILES


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("github")
    github = GitHubDouble("gh-client", "gh-secret").start()
    github.users["Octo_Cat"] = GitHubUser("Octo_Cat", 5001, "octo@uni.example",
                                          orgs=["uni-lab"], teams={"uni-lab": ["vision"]})
    github.users["stranger"] = GitHubUser("stranger", 5002, orgs=["elsewhere"])
    github.users["busy"] = GitHubUser("busy", 5003, orgs=[f"club-{i:03d}" for i in range(149)]
                                      + ["uni-lab"])
    profiles = yaml.safe_load(SAMPLE.read_text())
    for p in profiles["profiles"]:
        if p["slug"] == "h200-full":
            p["groups"] = ["uni-lab:vision"]
    (base / "profiles.yaml").write_text(yaml.safe_dump(profiles))
    port = free_port()
    config = base / "gpulease_config.py"
    config.write_text(_config(github, port))
    hub = HubProcess(state=base / "state", extra_args=[
        f"--config={config}", f"--GPULeaseHub.profiles_file={base / 'profiles.yaml'}",
        "--GPULeaseHub.admin_groups=uni-lab:admins"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    hub.start()
    hub.admin_token = (hub.state / "private" / "cli_token").read_text().strip()
    yield hub, github
    hub.close()
    github.stop()


def _config(github: GitHubDouble, port: int) -> str:
    return "\n".join([
        'c.JupyterHub.authenticator_class = "gpulease-github"',
        f"c.GPULeaseGitHubAuthenticator.github_url = {github.url!r}",
        'c.GPULeaseGitHubAuthenticator.client_id = "gh-client"',
        'c.GPULeaseGitHubAuthenticator.client_secret = "gh-secret"',
        f"c.GPULeaseGitHubAuthenticator.oauth_callback_url = "
        f"'http://localhost:{port}/hub/oauth_callback'",
        'c.GPULeaseGitHubAuthenticator.allowed_organizations = {"uni-lab"}',
    ]) + "\n"


def _sign_in(hub: HubProcess, login: str) -> tuple[requests.Session, requests.Response]:
    s = requests.Session()
    page = s.get(f"{hub.url}/hub/oauth_login", timeout=30)
    action = re.search(r'action="([^"]+)"', page.text).group(1).replace("&amp;", "&")
    final = s.post(requests.compat.urljoin(page.url, action), data={"login": login},
                   timeout=60)
    return s, final


def test_an_org_member_signs_in_with_teams_as_groups_and_a_team_decides_a_profile(site):
    hub, github = site
    browser, final = _sign_in(hub, "Octo_Cat")
    assert final.status_code == 200, final.text[:500]
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["name"] == "octo-cat"  # GitHub's login, mapped into the name rule
    assert sorted(me["groups"]) == ["uni-lab", "uni-lab:vision"]
    hub.grant(hub.admin_token, "user:octo-cat")
    r = browser.post(f"{hub.url}/hub/api/users/octo-cat/servers/big", headers=xsrf_headers(browser),
                     json={"user_options": {"profile": "h200-full"}}, timeout=60)
    assert r.status_code in (201, 202), r.text
    token = browser.post(f"{hub.url}/hub/api/users/octo-cat/tokens",
                         headers=xsrf_headers(browser), json={"expires_in": 600},
                         timeout=30).json()["token"]
    hub.wait_server_ready("octo-cat", token, "big")
    hub.api("DELETE", "users/octo-cat/servers/big", token)
    hub.wait_server_stopped("octo-cat", token, "big")

    # Out of the team at GitHub: the next start (refreshed first) loses the profile.
    github.users["Octo_Cat"].teams = {}
    r = hub.api("POST", "users/octo-cat/servers/big", token)
    assert r.status_code == 403, r.text
    assert hub.api("GET", "user", token).json()["groups"] == ["uni-lab"]

    # Out of the organisation: the token stops working.
    github.users["Octo_Cat"].orgs = []
    r = hub.api("POST", "users/octo-cat/servers/small", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code == 403, r.text


def test_someone_outside_the_allowed_organisations_gets_a_page_not_a_500(site):
    hub, _ = site
    _, final = _sign_in(hub, "stranger")
    assert final.status_code == 403, final.text[:500]
    assert "text/html" in final.headers["content-type"]


def test_an_allowed_organisation_past_githubs_first_page_is_the_only_group(site):
    hub, _ = site
    browser, final = _sign_in(hub, "busy")
    assert final.status_code == 200, final.text[:500]
    groups = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()["groups"]
    # uni-lab is the 150th of 150, on page two; the 149 clubs anyone could make are no groups
    assert groups == ["uni-lab"]


def test_an_organisation_anyone_can_make_gives_no_admin_rights(site):
    hub, github = site
    # gpu-admins is an organisation `stranger` made; uni-lab lets them in
    github.users["mallory"] = GitHubUser("mallory", 5004, orgs=["uni-lab", "gpu-admins"],
                                         teams={"gpu-admins": ["admins"]})
    browser, final = _sign_in(hub, "mallory")
    assert final.status_code == 200, final.text[:500]
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["groups"] == ["uni-lab"] and not me["admin"]


def test_a_team_of_an_allowed_organisation_gives_the_rights_it_is_named_for(site):
    hub, github = site
    github.users["root-of-lab"] = GitHubUser("root-of-lab", 5005, orgs=["uni-lab"],
                                             teams={"uni-lab": ["admins"]})
    browser, final = _sign_in(hub, "root-of-lab")
    assert final.status_code == 200, final.text[:500]
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["groups"] == ["uni-lab", "uni-lab:admins"] and me["admin"]


def test_a_rights_group_github_never_gives_refuses_the_start(site, tmp_path):
    _, github = site
    config = tmp_path / "gpulease_config.py"
    port = free_port()
    config.write_text(_config(github, port))
    hub = HubProcess(state=tmp_path / "state", extra_args=[
        f"--config={config}", "--GPULeaseHub.admin_groups=gpu-admins",
        "--GPULeaseHub.auditor_groups=uni-lab:audit"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    with pytest.raises(RuntimeError) as refused:
        hub.start()
    log = str(refused.value)
    assert "cannot start" in log
    assert "GPULeaseHub.admin_groups names the group 'gpu-admins'" in log
    assert "names the group 'uni-lab:audit'" not in log  # a team of an allowed organisation
