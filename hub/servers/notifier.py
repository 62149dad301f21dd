"""Notifications outside the hub: a webhook (Slack / Teams) and email (SMTP).

The admin configures the backends (`GPULeaseHub.notify_webhook_url`, `smtp_*`);
each user chooses one channel (`Prefs`). `dispatch` sends one message by the
user's choice and never raises: a notification that cannot be delivered is
logged, and whatever triggered it (a suspend, a stop) goes on.

The texts of every notice kind are gpulease/core/notices.py's; the idle culler
and the credit enforcer use them for the notice's message, which is also what
is sent.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import smtplib
import ssl
import urllib.request
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Protocol
from urllib.parse import urlsplit

from traitlets import TraitError, Unicode

from gpulease.core.notices import render, subject_for
from gpulease.store.notices import Notice, NoticeStore, Prefs

__all__ = [
    "Notifier", "SmtpNotifier", "WebhookNotifier", "WebhookURL", "announce", "backends_from_env",
    "check_webhook_url", "dispatch", "tell",
]

log = logging.getLogger("gpulease.notifier")
SEND_TIMEOUT = 60.0
_SLACK_MEMBER = re.compile(r"<@[A-Z0-9]{2,32}>")


class Notifier(Protocol):
    async def send(self, user: str, prefs: Prefs, subject: str, text: str) -> None: ...


# --- backends ----------------------------------------------------------------------


def check_webhook_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the webhook URL must be an http(s) URL, got {url!r}")
    return url


class WebhookURL(Unicode):
    """A config option: empty, or an http(s) URL (checked when set)."""

    info_text = "an http(s) URL, or empty"

    def validate(self, obj, value):
        value = super().validate(obj, value)
        try:
            return check_webhook_url(value) if value else value
        except ValueError as e:
            raise TraitError(str(e)) from None


def _slack_escape(text: str) -> str:
    # Slack's control characters; Teams shows the entities as the characters.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class WebhookNotifier:
    """POSTs {"text": ...} (Slack and Teams incoming webhooks both accept it)."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = check_webhook_url(url)
        self.timeout = timeout

    def payload(self, user: str, prefs: Prefs, subject: str, text: str) -> dict[str, str]:
        mention = prefs.address or user
        mention = mention if _SLACK_MEMBER.fullmatch(mention) else _slack_escape(mention)
        return {"text": f"{mention}: {_slack_escape(text)}"}

    async def send(self, user: str, prefs: Prefs, subject: str, text: str) -> None:
        body = json.dumps(self.payload(user, prefs, subject, text)).encode()
        await asyncio.to_thread(self._post, body)

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(
            self.url, data=body, method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "gpulease"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()


class SmtpNotifier:
    """A plain-text mail through an SMTP relay (port 465: implicit TLS)."""

    def __init__(self, host: str, port: int = 25, sender: str = "gpulease@localhost",
                 starttls: bool = False, username: str = "", password: str = "",
                 timeout: float = 30.0):
        self.host, self.port, self.sender = host, int(port), sender
        self.starttls, self.username, self.password = starttls, username, password
        self.timeout = timeout

    def message(self, user: str, prefs: Prefs, subject: str, text: str) -> EmailMessage:
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = prefs.address
        msg["Subject"] = " ".join(subject.split())  # no line breaks in a header
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        msg["Auto-Submitted"] = "auto-generated"
        msg.set_content(f"Hello {user},\n\n{text}\n\n-- \ngpulease\n")
        return msg

    async def send(self, user: str, prefs: Prefs, subject: str, text: str) -> None:
        if not prefs.address:
            raise ValueError(f"{user} chose email but gave no address")
        await asyncio.to_thread(self._send, self.message(user, prefs, subject, text))

    def _send(self, msg: EmailMessage) -> None:
        context = ssl.create_default_context()
        if self.port == 465:
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout,
                                                  context=context)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        with smtp:
            if self.starttls and self.port != 465:
                smtp.starttls(context=context)
            if self.username:
                smtp.login(self.username, self.password)
            smtp.send_message(msg)


def backends_from_env(env: Mapping[str, str]) -> dict[str, Notifier]:
    """The backends the admin configured, as the hub passes them to its services."""
    backends: dict[str, Notifier] = {}
    url = env.get("GPULEASE_NOTIFY_WEBHOOK_URL", "")
    if url:
        try:
            backends["webhook"] = WebhookNotifier(url)
        except ValueError as e:
            log.error("webhook notifications are off: %s", e)
    host = env.get("GPULEASE_SMTP_HOST", "")
    if host:
        backends["email"] = SmtpNotifier(
            host, int(env.get("GPULEASE_SMTP_PORT") or 25),
            env.get("GPULEASE_SMTP_FROM") or "gpulease@localhost",
            starttls=env.get("GPULEASE_SMTP_STARTTLS", "") in ("1", "true", "yes"),
            username=env.get("GPULEASE_SMTP_USERNAME", ""),
            password=env.get("GPULEASE_SMTP_PASSWORD", ""),
        )
    return backends


async def dispatch(prefs: Prefs, user: str, subject: str, text: str,
                   backends: Mapping[str, Notifier], timeout: float = SEND_TIMEOUT) -> bool:
    """Send by the user's channel; True when sent. Never raises (failures are logged)."""
    if prefs.channel == "none":
        return False
    backend = backends.get(prefs.channel)
    if backend is None:
        log.warning("%s chose %s notifications, which the admin has not configured; "
                    "not sent: %s", user, prefs.channel, subject)
        return False
    try:
        await asyncio.wait_for(backend.send(user, prefs, subject, text), timeout)
    except Exception as e:  # a notification must never stop what triggered it
        log.warning("could not notify %s by %s (%s): %s: %s", user, prefs.channel, subject,
                    type(e).__name__, e)
        return False
    log.info("notified %s by %s: %s", user, prefs.channel, subject)
    return True


# --- from the hub process ----------------------------------------------------------

_sending: set[asyncio.Task] = set()


async def announce(store: NoticeStore, backends: Mapping[str, Notifier], kind: str, user: str,
                   server: str, profile: str | None, minutes: float | None,
                   rendered: tuple[str, str] | None = None,
                   deadline: dt.datetime | None = None) -> None:
    """Post a notice the hub itself raises (queued_started, credit_low, a cap's
    suspend: `rendered` (subject, text) instead of `render`'s) and tell its user.

    The notice is posted before this returns; the message goes out in the
    background (a slow mail server must not delay a start or a heartbeat),
    and only when the notice is new, not a repeat of an open one. Never
    raises: what triggered it goes on whether or not the user could be told.
    """
    subject, text = rendered or render(kind, user, server, profile, minutes, deadline)
    try:
        notice = await asyncio.to_thread(store.post, user, server, kind, text, deadline)
    except Exception as e:
        log.warning("could not post %s for %s/%s: %s", kind, user, server or "(default)", e)
        return
    if notice.replaced or not backends:
        return

    async def send() -> None:
        try:
            prefs = await asyncio.to_thread(store.get_prefs, user)
            await dispatch(prefs, user, subject, text, backends)
        except Exception as e:
            log.warning("could not notify %s of %s: %s", user, kind, e)

    task = asyncio.ensure_future(send())
    _sending.add(task)
    task.add_done_callback(_sending.discard)


def tell(store: NoticeStore, backends: Mapping[str, Notifier], notice: Notice) -> None:
    """Send a notice just opened to its user by their channel, in the background (the
    request that opened it does not wait for a mail server). Never raises."""
    if not backends:
        return

    async def send() -> None:
        try:
            prefs = await asyncio.to_thread(store.get_prefs, notice.user)
            subject = subject_for(notice.kind, notice.user, notice.server, notice.deadline)
            await dispatch(prefs, notice.user, subject, notice.message, backends)
        except Exception as e:
            log.warning("could not notify %s of %s: %s", notice.user, notice.kind, e)

    task = asyncio.ensure_future(send())
    _sending.add(task)
    task.add_done_callback(_sending.discard)
