"""End to end: api/notices and api/me/notifications of the gpulease service on a real hub.

The hub is configured with a local SMTP server (aiosmtpd) and a local webhook
receiver; a notice an admin posts reaches them by each user's choice. The
gpulease CLI's token plays the idle culler: a service holding
custom:gpulease:admin.
"""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.hubproc import HubProcess, close_together, start_together
from tests.support.sinks import SmtpSink, WebhookSink

pytestmark = pytest.mark.e2e
ADMIN_PW = "admin-secret-pw"
PW = {name: f"{name}-pw-12345" for name in ("alice", "bob")}
DEADLINE = "2031-05-04T14:05:00Z"
SMTP_PW = "relay-Pw-7781"  # reaches the service through $GPULEASE_SMTP_PASSWORD only
WARNING = ("Your server 'train' (H200 slice 1g.18gb) has been idle for 25 min and will be "
           "suspended at 14:05 UTC unless you use it. Your files are kept.")


@pytest.fixture(scope="module")
def sinks():
    with SmtpSink(users={"relay": SMTP_PW}) as smtp, WebhookSink() as hook:
        yield smtp, hook


@pytest.fixture(scope="module")
def hubs(tmp_path_factory, sinks):
    """The module's hub, and one with a webhook only (no SMTP), started at once."""
    smtp, hook = sinks
    base = tmp_path_factory.mktemp("notices")
    with WebhookSink() as webhook_only:
        main = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
            "--GPULeaseHub.smtp_host=127.0.0.1", f"--GPULeaseHub.smtp_port={smtp.port}",
            "--GPULeaseHub.smtp_from=hub@lab.example",
            f"--GPULeaseHub.notify_webhook_url={hook.url}", "--GPULeaseHub.smtp_username=relay",
        ], env={"GPULEASE_SMTP_PASSWORD": SMTP_PW})
        other = HubProcess(state=base / "webhook-only", admin_password=ADMIN_PW,
                           extra_args=[f"--GPULeaseHub.notify_webhook_url={webhook_only.url}"])
        start_together(main, other)
        try:
            yield {"main": main, "webhook only": other}
        finally:
            close_together(main, other)


@pytest.fixture(scope="module")
def hub(hubs):
    return hubs["main"]


@pytest.fixture(scope="module")
def tokens(hub) -> dict[str, str]:
    admin = hub.token_for("admin", ADMIN_PW)
    for name, pw in PW.items():
        r = hub.service("POST", "api/users", admin, {"name": name, "password": pw})
        assert r.status_code == 201, r.text
    culler = (hub.state / "private" / "cli_token").read_text().strip()
    return {"admin": admin, "culler": culler,
            **{name: hub.token_for(name, pw) for name, pw in PW.items()}}


def warning(user: str = "alice", server: str = "train", **more) -> dict:
    return {"user": user, "server": server, "kind": "idle_warning", "message": WARNING,
            "deadline": DEADLINE, **more}


def test_anonymous_is_refused(hub):
    for method, path in [("GET", "api/notices"), ("POST", "api/notices"),
                         ("DELETE", "api/notices?user=alice&server=train"),
                         ("GET", "api/me/notifications"), ("PUT", "api/me/notifications")]:
        r = requests.request(method, f"{hub.urls.service()}{path}", json={}, timeout=10)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["status"] == 403 and r.json()["message"]


def test_users_may_not_post_nor_touch_others_notices(hub, tokens):
    r = hub.service("POST", "api/notices", tokens["alice"], warning())
    assert r.status_code == 403 and "admin" in r.json()["message"]
    assert hub.service("GET", "api/notices?user=bob", tokens["alice"]).status_code == 403
    r = hub.service("DELETE", "api/notices?user=bob&server=train", tokens["alice"])
    assert r.status_code == 403


def test_a_service_must_name_the_user(hub, tokens):
    r = hub.service("GET", "api/notices", tokens["culler"])
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "user"
    r = hub.service("GET", "api/me/notifications", tokens["culler"])
    assert r.status_code == 400


@pytest.mark.parametrize("body, field", [
    ({"channel": "sms"}, "channel"),
    ({"address": "a@example.org"}, "channel"),
    ({"channel": "email", "address": "nope"}, "address"),
    ({"channel": "email"}, "address"),
    ({"channel": "webhook", "address": "<!channel>"}, "address"),
])
def test_prefs_validation(hub, tokens, body, field):
    r = hub.service("PUT", "api/me/notifications", tokens["alice"], body)
    assert r.status_code == 400, r.text
    assert r.json()["errors"][0]["field"] == field and r.json()["message"]
    r = hub.service("PUT", "api/me/notifications", tokens["alice"], {"channel": "none", "x": 1})
    assert r.status_code == 400 and "channel" in r.json()["message"]


@pytest.mark.parametrize("change, field", [
    ({"kind": "nap"}, "kind"),
    ({"deadline": "tomorrow"}, "deadline"),
    ({"deadline": 12}, "deadline"),
    ({"deadline": None}, "deadline"),  # a warning needs one
    ({"message": ""}, "message"),
    ({"user": ""}, "user"),
    ({"server": None}, "server"),
])
def test_post_validation(hub, tokens, change, field):
    r = hub.service("POST", "api/notices", tokens["culler"], {**warning(), **change})
    assert r.status_code == 400, r.text
    assert r.json()["errors"][0]["field"] == field
    r = hub.service("POST", "api/notices", tokens["culler"], {**warning(), "extra": 1})
    assert r.status_code == 400
    r = hub.service("DELETE", "api/notices?user=alice&kind=nap", tokens["culler"])
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "kind"


def test_warning_reaches_email_and_webhook_and_is_cleared(hub, tokens, sinks):
    smtp, hook = sinks
    r = hub.service("GET", "api/me/notifications", tokens["alice"])
    assert r.json() == {"channel": "none", "address": "",
                        "available": ["none", "email", "webhook"]}
    r = hub.service("PUT", "api/me/notifications", tokens["alice"],
                    {"channel": "email", "address": "alice@example.org"})
    assert r.status_code == 200 and r.json()["channel"] == "email", r.text
    r = hub.service("PUT", "api/me/notifications", tokens["bob"], {"channel": "webhook"})
    assert r.status_code == 200, r.text
    mails, hooks = len(smtp.messages), len(hook.bodies)

    r = hub.service("POST", "api/notices", tokens["culler"], warning())
    assert r.status_code == 201, r.text
    posted = r.json()
    assert posted["notified"] is True and posted["deadline"] == DEADLINE
    assert posted["created"].endswith("Z") and posted["kind"] == "idle_warning"
    r = hub.service("POST", "api/notices", tokens["admin"], warning("bob", ""))
    assert r.status_code == 201, r.text

    msg = smtp.wait(mails + 1)[-1]
    assert msg["To"] == "alice@example.org" and msg["From"] == "hub@lab.example"
    assert "14:05 UTC" in msg["Subject"]
    assert WARNING in " ".join(msg.get_content().split())
    assert SMTP_PW not in hub.log()  # the login worked, and the secret is not logged
    assert hook.wait(hooks + 1)[-1] == {"text": f"bob: {WARNING}"}

    r = hub.service("GET", "api/notices", tokens["alice"])
    assert r.status_code == 200
    (notice,) = r.json()["notices"]
    assert {k: notice[k] for k in ("server", "kind", "message", "deadline")} == {
        "server": "train", "kind": "idle_warning", "message": WARNING, "deadline": DEADLINE}
    assert notice["created"].endswith("Z")
    assert hub.service("GET", "api/notices?user=alice", tokens["admin"]).json() == r.json()

    # the culler posting the same warning again replaces it, without a second mail
    r = hub.service("POST", "api/notices", tokens["culler"], warning())
    assert r.status_code == 201 and r.json()["notified"] is False
    time.sleep(1)
    assert len(smtp.messages) == mails + 1
    assert len(hub.service("GET", "api/notices", tokens["alice"]).json()["notices"]) == 1

    # activity: the culler clears the warning
    r = hub.service("DELETE", "api/notices?user=alice&server=train&kind=idle_warning",
                    tokens["culler"])
    assert r.status_code == 200 and r.json() == {"cleared": 1}
    assert hub.service("GET", "api/notices", tokens["alice"]).json() == {"notices": []}

    # bob dismisses his own
    r = hub.service("DELETE", "api/notices", tokens["bob"])
    assert r.json() == {"cleared": 1}
    assert hub.service("GET", "api/notices", tokens["bob"]).json() == {"notices": []}


def test_suspended_notice_replaces_the_warning(hub, tokens):
    hub.service("POST", "api/notices", tokens["culler"], warning(server="gpu"))
    r = hub.service("POST", "api/notices", tokens["culler"], {
        "user": "alice", "server": "gpu", "kind": "suspended",
        "message": "Suspended after 30 min idle — resume it from the hub's home page."})
    assert r.status_code == 201 and r.json()["deadline"] is None
    kinds = [n["kind"] for n in
             hub.service("GET", "api/notices?server=gpu", tokens["alice"]).json()["notices"]]
    assert kinds == ["suspended"]
    r = hub.service("DELETE", "api/notices?server=gpu&kind=suspended", tokens["alice"])
    assert r.json() == {"cleared": 1}


def test_unconfigured_channels_are_refused_naming_what_is_available(hubs):
    h = hubs["webhook only"]
    admin = h.token_for("admin", ADMIN_PW)
    r = h.service("PUT", "api/me/notifications", admin,
                  {"channel": "email", "address": "admin@example.org"})
    assert r.status_code == 409, r.text
    assert r.json()["errors"][0]["field"] == "channel"
    assert "available: none, webhook" in r.json()["message"]
    r = h.service("PUT", "api/me/notifications", admin, {"channel": "webhook"})
    assert r.status_code == 200
    assert r.json()["available"] == ["none", "webhook"]

