"""End to end: names outside gpulease's rule are refused at every entry of a real hub.

The rule (gpulease.core.policy.user_names): `^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$`, no
system account's name. Attacked here through JupyterHub's own API (also
straight at the hub's port, which does not normalise `..` as the proxy
does), its admin page in Chromium, gpulease's api/users and CLI; and a name
made before the rule, put into both databases while the hub is down, is
reported at the next start and never gets a home. After each refusal: no
user row (not even for a moment: the hub logs every row it makes), and the
state folder and homes folder keep their mode and owner.
"""

from __future__ import annotations

import http.client
import os
import re
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import requests

from gpulease.core.policy.user_names import NAME_PATTERN
from tests.support.hubproc import ADMIN_PW, HubOptions

pytestmark = pytest.mark.e2e
BAD_NAMES = ["Alice", "a_b", "a.b", "-a", "a-", "1a", "a" * 33, "ålice", "root", "nobody",
             "a b", "a\nb"]


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(args=["--GPULeaseHub.culler_enabled=False"])


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, st.st_mode


def untouched(hub) -> dict[str, tuple[int, int, int]]:
    """Who owns the state folder, its parent and the homes folder, with which mode."""
    return {str(p): owner_and_mode(p)
            for p in (hub.state.parent, hub.state, hub.state / "homes", hub.state / "private")}


def hub_users(hub, admin: str) -> set[str]:
    r = hub.api("GET", "users", admin)
    assert r.status_code == 200, r.text
    return {u["name"] for u in r.json()}


def raw_post(port: int, path: str, token: str, body: str = "{}",
             host: str = "127.0.0.1") -> tuple[int, str]:
    """A request sent exactly as written (requests and browsers remove `..` segments)."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Authorization": f"token {token}",
                                                       "Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def names_the_rule(text: str) -> bool:
    return NAME_PATTERN in text


def rows_made(hub, before: int) -> list[str]:
    """User rows the hub made since the log had `before` characters."""
    return re.findall(r"Adding role user for User: (.*)", hub.log()[before:])


def test_dot_names_straight_at_the_hub_make_no_row_and_touch_nothing(hub, admin):
    state_before, users_before, log_at = untouched(hub), hub_users(hub, admin), len(hub.log())
    homes_before = sorted(os.listdir(hub.state / "homes"))
    for path in ("..", ".", "%2e%2e", "%2E", "..%2f..", "a%2f..", "%2e%2e%2f%2e%2e"):
        status, body = raw_post(hub.hub_port, f"/hub/api/users/{path}", admin,
                                host=hub.hub_host)
        assert status == 400, (path, status, body)
        assert names_the_rule(body), (path, body)
    assert rows_made(hub, log_at) == []
    assert hub_users(hub, admin) == users_before
    assert sorted(os.listdir(hub.state / "homes")) == homes_before
    assert untouched(hub) == state_before


def test_hub_api_refuses_names_outside_the_rule(hub, admin):
    state_before, users_before, log_at = untouched(hub), hub_users(hub, admin), len(hub.log())
    for name in BAD_NAMES:
        one = hub.api("POST", f"users/{quote(name, safe='')}", admin)
        assert one.status_code == 400, (name, one.status_code, one.text)
        assert names_the_rule(one.json()["message"]), one.text
        many = hub.api("POST", "users", admin, {"usernames": ["fine-name", name]})
        assert many.status_code == 400, (name, many.status_code, many.text)
        assert names_the_rule(many.json()["message"]), many.text
    odd = hub.api("POST", "users", admin, {"usernames": [5]})  # JupyterHub: a bare 500
    assert odd.status_code == 400 and names_the_rule(odd.json()["message"]), odd.text
    assert rows_made(hub, log_at) == []
    assert hub_users(hub, admin) == users_before
    assert untouched(hub) == state_before


def test_rename_to_a_bad_name_is_refused(hub, admin):
    assert hub.api("POST", "users/renamee", admin).status_code == 201
    for name in ("Renamee", "re.namee", ".."):
        r = hub.api("PATCH", "users/renamee", admin, {"name": name})
        assert r.status_code == 400 and names_the_rule(r.json()["message"]), (name, r.text)
    assert "renamee" in hub_users(hub, admin)
    assert hub.api("PATCH", "users/renamee", admin, {"name": "renamed"}).status_code == 200


def test_gpulease_api_and_cli_refuse_names_outside_the_rule(hub, admin):
    state_before, users_before = untouched(hub), hub_users(hub, admin)
    for name in ("a_b", "a.b", "Alice", "root", "a-"):
        r = hub.service("POST", "api/users", admin, {"name": name, "password": "x" * 12})
        assert r.status_code == 400, (name, r.text)
        body = r.json()
        assert [e["field"] for e in body["errors"]] == ["name"]
        assert names_the_rule(body["errors"][0]["message"]), body
    cli = hub.cli("users", "add", "a_b", "--password-stdin", stdin="x" * 12 + "\n")
    assert cli.returncode == 2, (cli.returncode, cli.stdout, cli.stderr)
    assert names_the_rule(cli.stderr) and "a_b" in cli.stderr, cli.stderr
    assert hub_users(hub, admin) == users_before
    assert untouched(hub) == state_before


def test_admin_page_refuses_names_outside_the_rule(hub, admin, browser_context):
    users_before, log_at = hub_users(hub, admin), len(hub.log())
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", ADMIN_PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
    page.goto(f"{hub.url}/hub/admin#/add-users")
    page.fill("#add-user-textarea", "Mallory_X\nok-name")
    page.locator("#add-user-textarea").blur()
    with page.expect_response(lambda r: urlsplit(r.url).path == "/hub/api/users"
                              and r.request.method == "POST") as answer:
        page.click("#submit")
    assert answer.value.status == 400
    assert names_the_rule(answer.value.json()["message"]), answer.value.text()
    page.get_by_text("Failed to create user").wait_for()
    assert rows_made(hub, log_at) == []
    assert hub_users(hub, admin) == users_before


def test_a_home_that_is_a_link_is_never_followed(hub, admin, tmp_path):
    """A valid name whose homes/<name> is a symlink (left by hand, or an older
    layout): neither `users add` nor a start changes what it points to."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    before = owner_and_mode(target)
    (hub.state / "homes" / "linked").symlink_to(target, target_is_directory=True)
    r = hub.service("POST", "api/users", admin, {"name": "linked", "password": "linked-pw-123"})
    assert r.status_code == 201, r.text
    assert owner_and_mode(target) == before
    if "unix_account_error" in r.json():  # as root: the Unix account's home was refused
        assert "symbolic link" in r.json()["unix_account_error"], r.text
    hub.grant(admin, "user:linked", "10")
    token = hub.token_for("linked", "linked-pw-123")
    start = hub.api("POST", "users/linked/server", token, {"profile": "cpu"})
    assert start.status_code >= 400, start.text
    assert "homes" in start.json()["message"], start.text
    assert owner_and_mode(target) == before
    assert (hub.state / "homes" / "linked").is_symlink()


# Restarts the hub: runs last.
def test_names_made_before_the_rule_are_reported_and_get_no_home(hub, admin):
    from jupyterhub import orm
    from sqlalchemy import insert

    from gpulease.core.clock import utcnow
    from gpulease.store.accounts import hash_password
    from gpulease.store.db import local_accounts, open_database

    hub.interrupt()
    private = hub.state / "private"
    db = orm.new_session_factory(f"sqlite:///{private / 'jupyterhub.sqlite'}")()
    db.add_all([orm.User(name="old.name"), orm.User(name="Caps")])
    db.commit()
    db.close()
    engine = open_database(f"sqlite:///{private / 'gpulease.sqlite'}")
    with engine.begin() as conn:
        conn.execute(insert(local_accounts).values(
            name="old.name", password_hash=hash_password("old-name-pw-1"), created_at=utcnow(),
            updated_at=utcnow()))
    engine.dispose()
    state_before = untouched(hub)
    hub.start()
    log = hub.log()
    for name, where in (("old.name", "hub user, local account"), ("Caps", "hub user")):
        line = next((ln for ln in log.splitlines() if f"User name '{name}'" in ln), "")
        assert names_the_rule(line), (name, log[-5000:])
        assert where in line and "PATCH /hub/api/users/" in line, line
    assert "rename it to 'old-name'" in log and "rename it to 'caps'" in log
    # The hub runs; the old names can neither log in nor get a home.
    assert hub.login_form("old.name", "old-name-pw-1").login_status != 302
    admin = hub.admin_token
    start = hub.api("POST", "users/old.name/server", admin, {"profile": "cpu"})
    assert start.status_code == 400 and names_the_rule(start.json()["message"]), start.text
    assert not (hub.state / "homes" / "old.name").exists()
    assert untouched(hub) == state_before
    assert requests.get(f"{hub.url}/hub/api", timeout=10).status_code == 200
