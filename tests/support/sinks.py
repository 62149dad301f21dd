"""Where the hub's notifications land in tests: an SMTP server and a webhook receiver on
loopback ports, keeping what they get.
"""

from __future__ import annotations

import email
import email.policy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from tests.support.hubproc import free_port


class SmtpSink:
    """A real SMTP server on loopback that keeps what it receives."""

    def __init__(self, users: dict[str, str] | None = None):
        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.port = free_port()
        kwargs = {}
        if users:
            kwargs = dict(auth_require_tls=False, authenticator=self._auth(users))
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, **kwargs)

    @staticmethod
    def _auth(users: dict[str, str]):
        def check(server, session, envelope, mechanism, auth_data) -> AuthResult:
            ok = users.get(auth_data.login.decode()) == auth_data.password.decode()
            return AuthResult(success=ok, handled=False)
        return check

    async def handle_DATA(self, server, session, envelope) -> str:
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        self.messages.append(email.message_from_bytes(envelope.content,
                                                      policy=email.policy.default))
        return "250 OK"

    def wait(self, count: int = 1, timeout: float = 20) -> list:
        deadline = time.monotonic() + timeout
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.messages

    def __enter__(self) -> SmtpSink:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()


class WebhookSink:
    """An incoming-webhook receiver on loopback: records JSON bodies, answers `status`."""

    def __init__(self, status: int = 200, delay: float = 0.0):
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                time.sleep(delay)
                sink.paths.append(self.path)
                sink.bodies.append(json.loads(raw))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int = 1, timeout: float = 20) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.bodies) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.bodies

    def __enter__(self) -> WebhookSink:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
