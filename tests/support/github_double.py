"""A test double of GitHub's OAuth and REST endpoints, for GitHubOAuthenticator.

Named as a double: GitHub itself cannot run here. It serves what
oauthenticator's GitHubOAuthenticator asks of `github_url` (the OAuth
authorize page and token exchange) and of `github_api` (`/user`,
`/user/orgs`, `/user/teams`, and the org and team membership checks of
`allowed_organizations`), with GitHub's shapes and status codes (204 for a
member, 404 otherwise). The test changes `users` to move someone between
organisations and teams; each request reads it anew.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit


@dataclass
class GitHubUser:
    login: str
    id: int
    email: str = ""
    orgs: list[str] = field(default_factory=list)
    teams: dict[str, list[str]] = field(default_factory=dict)  # org -> team slugs


class GitHubDouble:
    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.users: dict[str, GitHubUser] = {}
        self.codes: dict[str, str] = {}   # code -> login
        self.tokens: dict[str, str] = {}  # access token -> login
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def user(self, login: str) -> GitHubUser | None:
        """As GitHub does, logins are matched without regard to case."""
        return next((u for name, u in self.users.items() if name.lower() == login.lower()), None)

    def start(self) -> GitHubDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: Any = None, headers: dict | None = None):
                data = b"" if body is None else (body if isinstance(body, bytes)
                                                 else json.dumps(body).encode())
                self.send_response(status)
                for k, v in (headers or {"Content-Type": "application/json"}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _who(self) -> GitHubUser | None:
                auth = self.headers.get("Authorization", "")
                token = auth.split(" ", 1)[1] if " " in auth else ""
                login = double.tokens.get(token)
                return double.users.get(login) if login else None

            def do_GET(self):
                url = urlsplit(self.path)
                if url.path == "/login/oauth/authorize":
                    page = (f'<form method="post" action="/session?{url.query}">'
                            '<input name="login"><button>Sign in</button></form>')
                    return self._send(200, page.encode(), {"Content-Type": "text/html"})
                me = self._who()
                if url.path.startswith("/api/v3/") and me is None:
                    return self._send(401, {"message": "Bad credentials"})
                path = url.path.removeprefix("/api/v3")
                if path == "/user":
                    return self._send(200, {"login": me.login, "id": me.id,
                                            "email": me.email or None, "name": me.login})
                if path == "/user/orgs":  # paged as GitHub pages it (per_page at most 100)
                    query = parse_qs(url.query)
                    per = min(int(query.get("per_page", ["30"])[0]), 100)
                    first = (int(query.get("page", ["1"])[0]) - 1) * per
                    return self._send(200, [{"login": o} for o in me.orgs[first:first + per]])
                if path == "/user/teams":
                    return self._send(200, [{"slug": t, "organization": {"login": org}}
                                            for org, teams in me.teams.items() for t in teams])
                parts = path.strip("/").split("/")
                if len(parts) == 4 and parts[0] == "orgs" and parts[2] == "members":
                    user = double.user(parts[3])
                    return self._send(204 if user and parts[1] in user.orgs else 404)
                if len(parts) == 6 and parts[0] == "orgs" and parts[2] == "teams":
                    user = double.user(parts[5])
                    member = user and parts[3] in user.teams.get(parts[1], [])
                    return self._send(204 if member else 404)
                return self._send(404, {"message": "Not Found"})

            def do_POST(self):
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length", 0))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/session":  # the user signed in at "GitHub"
                    if form.get("login") not in double.users:
                        return self._send(200, b"Incorrect username", {"Content-Type": "text/html"})
                    code = secrets.token_hex(8)
                    double.codes[code] = form["login"]
                    back = urlencode({"code": code, "state": query.get("state", "")})
                    target = f"{query['redirect_uri']}?{back}"
                    return self._send(302, b"", {"Location": target})
                if url.path == "/login/oauth/access_token":
                    if (form.get("client_id"), form.get("client_secret")) != (
                            double.client_id, double.client_secret):
                        return self._send(200, {"error": "incorrect_client_credentials",
                                                "error_description": "The client_id and/or "
                                                "client_secret passed are incorrect."})
                    login = double.codes.pop(form.get("code", ""), None)
                    if login is None:
                        return self._send(200, {"error": "bad_verification_code",
                                                "error_description": "The code passed is "
                                                "incorrect or expired."})
                    token = secrets.token_hex(16)
                    double.tokens[token] = login
                    return self._send(200, {"access_token": token, "token_type": "bearer",
                                            "scope": "read:org,read:user,user:email"})
                return self._send(404, {"message": "Not Found"})

        return Handler
