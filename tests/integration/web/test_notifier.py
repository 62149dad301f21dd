"""Notification backends against a real local SMTP server and webhook receiver.

`SmtpSink` (aiosmtpd) and `WebhookSink` (http.server) listen on free loopback
ports; tests/e2e/test_notices_api.py uses them too.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from gpulease.core.notices import render
from gpulease.host.state import StateDir
from gpulease.hub.config.hub_config import HubSettings, hub_config
from gpulease.hub.servers.notifier import SmtpNotifier, WebhookNotifier, backends_from_env, dispatch
from gpulease.store.notices import KINDS, Prefs
from tests.support.hubproc import free_port
from tests.support.sinks import SmtpSink, WebhookSink

AT = dt.datetime(2025, 1, 1, 14, 5)
WARNING = ("Your server 'train' (H200 slice 1g.18gb) has been idle for 25 min and will be "
           "suspended at 14:05 UTC unless you use it. Your files are kept.")


# --- texts ---------------------------------------------------------------------------


def test_render_the_suspend_warning_and_the_suspend():
    subject, text = render("idle_warning", "alice", "train", "H200 slice 1g.18gb", 25, AT)
    assert text == WARNING
    assert "alice" in subject and "'train'" in subject and "14:05 UTC" in subject
    _, text = render("suspended", "alice", "train", "H200 slice 1g.18gb", 30, None)
    assert text.endswith("was suspended after 30 min idle — resume it from the hub's home page "
                         "on the same or another profile. Your files are kept.")
    _, text = render("idle_warning", "alice", "", None, 25, AT.replace(tzinfo=dt.UTC))
    assert text.startswith("Your default server has been idle for 25 min")
    _, text = render("max_runtime_stopped", "alice", "t", "2× H200", 480, None)
    assert "after 8 h, its profile's maximum runtime" in text


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_renders_with_and_without_details(kind):
    for args in (("p", 90, AT), (None, None, None)):
        subject, text = render(kind, "alice", "train", *args)
        assert subject.startswith("[gpulease] alice:") and text.endswith(".")
    with pytest.raises(ValueError):
        render("nap", "alice", "train", None, None, None)


# --- backends ------------------------------------------------------------------------


async def test_email_delivers_the_warning():
    with SmtpSink() as sink:
        smtp = SmtpNotifier("127.0.0.1", sink.port, sender="hub@lab.example")
        subject, text = render("idle_warning", "alice", "train", "H200 slice 1g.18gb", 25, AT)
        prefs = Prefs("email", "alice@example.org")
        assert await dispatch(prefs, "alice", subject, text, {"email": smtp}) is True
        (msg,) = sink.wait()
    assert sink.envelopes == [("hub@lab.example", ["alice@example.org"])]
    assert msg["To"] == "alice@example.org" and msg["From"] == "hub@lab.example"
    assert msg["Subject"] == subject and msg["Auto-Submitted"] == "auto-generated"
    body = msg.get_content()
    assert "Hello alice," in body and WARNING in " ".join(body.split())


async def test_email_logs_in_when_configured():
    with SmtpSink(users={"relay": "s3cret"}) as sink:
        good = SmtpNotifier("127.0.0.1", sink.port, username="relay", password="s3cret")
        bad = SmtpNotifier("127.0.0.1", sink.port, username="relay", password="wrong")
        prefs = Prefs("email", "a@example.org")
        assert await dispatch(prefs, "a", "s", "t", {"email": bad}) is False
        assert await dispatch(prefs, "a", "s", "t", {"email": good}) is True
        assert len(sink.wait()) == 1


async def test_webhook_delivers_the_warning_mentioning_the_user():
    with WebhookSink() as sink:
        hook = {"webhook": WebhookNotifier(sink.url)}
        subject, text = render("idle_warning", "alice", "train", "H200 slice 1g.18gb", 25, AT)
        assert await dispatch(Prefs("webhook", ""), "alice", subject, text, hook)
        assert await dispatch(Prefs("webhook", "<@U024BE7LH>"), "alice", subject, text, hook)
        bodies = sink.wait(2)
    assert sink.paths == ["/hook", "/hook"]
    assert bodies[0] == {"text": f"alice: {WARNING}"}
    assert bodies[1] == {"text": f"<@U024BE7LH>: {WARNING}"}


async def test_webhook_escapes_slack_control_characters():
    with WebhookSink() as sink:
        hook = {"webhook": WebhookNotifier(sink.url)}
        _, text = render("suspended", "alice", "<!channel>", None, 30, None)
        assert await dispatch(Prefs("webhook", ""), "alice", "s", text, hook)
        (body,) = sink.wait()
    assert "<!channel>" not in body["text"] and "&lt;!channel&gt;" in body["text"]


async def test_failures_are_logged_never_raised(caplog):
    closed = free_port()
    prefs_mail, prefs_hook = Prefs("email", "a@example.org"), Prefs("webhook", "")
    smtp = SmtpNotifier("127.0.0.1", closed, timeout=2)
    assert await dispatch(prefs_mail, "a", "s", "t", {"email": smtp}) is False
    dead = WebhookNotifier(f"http://127.0.0.1:{closed}/hook", timeout=2)
    assert await dispatch(prefs_hook, "a", "s", "t", {"webhook": dead}) is False
    with WebhookSink(status=500) as sink:
        assert await dispatch(prefs_hook, "a", "s", "t",
                              {"webhook": WebhookNotifier(sink.url)}) is False
    with WebhookSink(delay=1.5) as sink:
        slow = WebhookNotifier(sink.url, timeout=30)
        started = time.monotonic()
        assert await dispatch(prefs_hook, "a", "s", "t", {"webhook": slow}, timeout=0.5) is False
        assert time.monotonic() - started < 1.4
    # a channel the admin did not configure, and no channel at all
    assert await dispatch(prefs_hook, "a", "s", "t", {}) is False
    assert await dispatch(Prefs(), "a", "s", "t", {"webhook": dead}) is False
    assert await dispatch(Prefs("email", ""), "a", "s", "t", {"email": smtp}) is False
    assert "could not notify a by email" in caplog.text


def test_webhook_url_must_be_http():
    for url in ("ftp://x/hook", "file:///etc/passwd", "hook", "http://"):
        with pytest.raises(ValueError):
            WebhookNotifier(url)


def test_the_hub_refuses_a_webhook_url_that_is_not_http():
    from traitlets import TraitError

    from gpulease.hub.app import GPULeaseHub

    with pytest.raises(TraitError, match="http"):
        GPULeaseHub(notify_webhook_url="file:///etc/passwd")
    assert GPULeaseHub(notify_webhook_url="https://hooks.example/x").notify_webhook_url


def test_backends_from_the_service_environment():
    assert backends_from_env({}) == {}
    backends = backends_from_env({
        "GPULEASE_NOTIFY_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/X",
        "GPULEASE_SMTP_HOST": "mail.lab", "GPULEASE_SMTP_PORT": "587",
        "GPULEASE_SMTP_FROM": "hub@lab", "GPULEASE_SMTP_STARTTLS": "1",
        "GPULEASE_SMTP_USERNAME": "relay", "GPULEASE_SMTP_PASSWORD": "pw",
    })
    mail, hook = backends["email"], backends["webhook"]
    assert (mail.host, mail.port, mail.sender) == ("mail.lab", 587, "hub@lab")
    assert (mail.starttls, mail.username, mail.password) == (True, "relay", "pw")
    assert hook.url == "https://hooks.slack.com/services/T/B/X"
    assert "webhook" not in backends_from_env({"GPULEASE_NOTIFY_WEBHOOK_URL": "ftp://x"})


def test_hub_config_passes_the_settings_but_not_the_password(tmp_path, monkeypatch):
    settings = HubSettings(
        state=StateDir(Path(tmp_path)), db_url="sqlite:///x", inventory_file="",
        catalog_file="", node_name="box", admin_name="admin", service_port=9999,
        cli_token="t", proxy_token="p", chp_command=None,
        notify_webhook_url="https://hooks.example/x", smtp_host="mail.lab", smtp_port=587,
        smtp_from="hub@lab", smtp_starttls=True, smtp_username="relay",
    )
    c = hub_config(settings)
    env = next(s for s in c.JupyterHub.services if s["name"] == "gpulease")["environment"]
    assert env["GPULEASE_NOTIFY_WEBHOOK_URL"] == "https://hooks.example/x"
    assert (env["GPULEASE_SMTP_HOST"], env["GPULEASE_SMTP_PORT"]) == ("mail.lab", "587")
    assert (env["GPULEASE_SMTP_FROM"], env["GPULEASE_SMTP_STARTTLS"]) == ("hub@lab", "1")
    assert env["GPULEASE_SMTP_USERNAME"] == "relay"
    monkeypatch.setenv("GPULEASE_SMTP_PASSWORD", "top-secret")
    assert "top-secret" not in repr(c)
    assert callable(env["GPULEASE_SMTP_PASSWORD"])
    assert env["GPULEASE_SMTP_PASSWORD"](None) == "top-secret"
