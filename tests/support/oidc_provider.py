"""A real OpenID Connect provider for the sign-in tests, and a browser's way through it.

`OIDCProvider` runs tests/oidc/provider.mjs (the npm package oidc-provider,
installed by `make install`) on a free loopback port. Its accounts are a JSON
file read at every lookup: `set_account` changes someone's groups or e-mail
at the provider, as an identity team would. `sign_in` walks the whole flow
over HTTP as a browser does: the hub's login redirect, the provider's login
form, its consent step, the hub's callback and cookie.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.hubproc import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "oidc" / "provider.mjs"
PACKAGE = ROOT / "node_modules" / "oidc-provider"
CLIENT_ID = "gpulease-hub"
CLIENT_SECRET = "test-client-secret-3b1f"


def require_provider() -> str:
    """Node and the oidc-provider package, or skip (fail under CI=true) naming them."""
    node = shutil.which("node")
    missing = [what for what, ok in (("node (Node.js 20+)", node),
                                     ("the npm package oidc-provider (make install)",
                                      PACKAGE.exists())) if not ok]
    if missing:
        message = f"the OpenID Connect provider needs {' and '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return node


@dataclass
class OIDCProvider:
    folder: Path
    redirect_uris: list[str]
    post_logout_uris: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_account(self, sub: str, **claims: Any) -> None:
        """Add or change an account at the provider (read at its next lookup)."""
        self.accounts[sub] = {**self.accounts.get(sub, {}), **claims}
        tmp = self.folder / "accounts.json.tmp"
        tmp.write_text(json.dumps(self.accounts))
        tmp.replace(self.folder / "accounts.json")

    def start(self) -> OIDCProvider:
        node = require_provider()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.set_account("nobody-yet", login="", password="")
        (self.folder / "clients.json").write_text(json.dumps([{
            "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
            # refresh tokens for a hub that asks offline_access (userdata_from_id_token)
            "grant_types": ["authorization_code", "refresh_token"],
            "redirect_uris": self.redirect_uris,
            "post_logout_redirect_uris": self.post_logout_uris,
        }]))
        self._log = open(self.folder / "provider.log", "ab")
        self.proc = subprocess.Popen(
            [node, str(SCRIPT), str(self.port), str(self.folder / "accounts.json"),
             str(self.folder / "clients.json")],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenID Connect provider exited:\n{self.log()}")
            try:
                if requests.get(f"{self.issuer}/.well-known/openid-configuration",
                                timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the OpenID Connect provider did not start:\n{self.log()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def log(self) -> str:
        path = self.folder / "provider.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def hub_config(self, hub_url: str, **traits: Any) -> str:
        """A gpulease config file's text that signs in through this provider."""
        lines = [
            'c.JupyterHub.authenticator_class = "gpulease-oidc"',
            f"c.GPULeaseOIDCAuthenticator.oidc_issuer = {self.issuer!r}",
            f"c.GPULeaseOIDCAuthenticator.client_id = {CLIENT_ID!r}",
            f"c.GPULeaseOIDCAuthenticator.client_secret = {CLIENT_SECRET!r}",
            f"c.GPULeaseOIDCAuthenticator.oauth_callback_url = {hub_url + '/hub/oauth_callback'!r}",
        ]
        lines += [f"c.{name} = {value!r}" for name, value in traits.items()]
        return "\n".join(lines) + "\n"


def _form(html: str) -> tuple[str, dict[str, str]]:
    action = re.search(r'<form[^>]*action="([^"]+)"', html)
    assert action, f"no form on the page:\n{html[:2000]}"
    fields = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', html))
    return action.group(1).replace("&amp;", "&"), fields


def sign_in(hub_url: str, login: str, password: str,
            session: requests.Session | None = None) -> requests.Response:
    """Through the hub's login redirect, the provider's form and consent, back to the hub.
    Returns the last answer (the hub's page once signed in); the session keeps the cookies."""
    s = session or requests.Session()
    page = s.get(f"{hub_url}/hub/oauth_login", timeout=30)
    if page.status_code != 200 or "/interaction/" not in page.url:
        return page  # no form: a refusal page of the hub (or the provider's error)
    action, _ = _form(page.text)
    target = requests.compat.urljoin(page.url, action)
    return s.post(target, data={"login": login, "password": password}, timeout=60)


def sign_in_up_to_the_callback(hub_url: str, login: str, password: str,
                               session: requests.Session) -> str:
    """The flow up to the provider's redirect back to the hub; returns that URL (the
    browser has not followed it yet)."""
    page = session.get(f"{hub_url}/hub/oauth_login", timeout=30)
    action, _ = _form(page.text)
    r = session.post(requests.compat.urljoin(page.url, action),
                     data={"login": login, "password": password}, allow_redirects=False,
                     timeout=30)
    while r.is_redirect:
        location = requests.compat.urljoin(r.url, r.headers["location"])
        if location.startswith(f"{hub_url}/hub/oauth_callback"):
            return location
        r = session.get(location, allow_redirects=False, timeout=30)
    raise AssertionError(f"the provider never sent the browser back: {r.status_code} {r.text[:500]}")


def signed_in_session(hub_url: str, login: str, password: str) -> requests.Session:
    s = requests.Session()
    final = sign_in(hub_url, login, password, s)
    assert final.status_code == 200 and "/hub/" in final.url, (final.status_code, final.url,
                                                                final.text[:2000])
    return s


def xsrf_headers(session: requests.Session) -> dict[str, str]:
    return {"X-XSRFToken": session.cookies.get("_xsrf", "")}
