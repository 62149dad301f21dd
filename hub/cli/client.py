"""The CLI's client for the gpulease service's REST API."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from gpulease.host.state import StateDir, default_state_root, read_cli_file
from gpulease.site_urls import SiteURLs, loopback_session


class ClientError(RuntimeError):
    """The hub answered with an error, or could not be reached."""


@dataclass(frozen=True)
class HubClient:
    url: str  # the hub's public URL, with its base URL
    token: str
    timeout: float = 30.0
    # where the gpulease service is (its own origin under a subdomain host); "": asked of
    # the hub on first use (GET hub/gpulease/site)
    service: str = ""

    @cached_property
    def service_url(self) -> str:
        return self.service or self._discover_service()

    def _discover_service(self) -> str:
        """Where the hub says its service is, trusted only on the hub's own host or a
        subdomain of it (the token goes there); else the path it names, on the hub's host."""
        hub = self.url if self.url.endswith("/") else self.url + "/"
        said = SiteURLs(hub).service()  # a hub that does not say: under its own origin
        try:
            r = loopback_session().get(SiteURLs(hub).hub("gpulease/site"), timeout=self.timeout,
                                       allow_redirects=False)
            if r.status_code == 200:
                said = urljoin(hub, r.json()["service"])
        except (requests.RequestException, ValueError, KeyError, TypeError):
            pass
        ours, theirs = urlsplit(hub), urlsplit(said)
        host, name = (ours.hostname or "").lower(), (theirs.hostname or "").lower()
        if theirs.scheme == ours.scheme and (name == host or name.endswith("." + host)):
            return said
        return urljoin(hub, theirs.path)

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        try:
            response = loopback_session().request(
                method,
                self.service_url + path,
                json=body,
                params=params,
                headers={"Authorization": f"token {self.token}"},
                timeout=self.timeout,
                allow_redirects=False,
            )
        except requests.RequestException as e:
            raise ClientError(f"cannot reach the hub at {self.url}: {e}") from None
        if response.status_code >= 400 or response.status_code in (301, 302):
            raise ClientError(describe_error(response))
        return response.json() if response.content else None


def describe_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    lines = [f"HTTP {response.status_code}: {body.get('message', '')}"]
    for err in body.get("errors") or []:
        lines.append(f"  {err.get('field')}: {err.get('message')}")
    return "\n".join(lines)


def client_from(url: str | None, token: str | None, state_dir: str | None) -> HubClient:
    """--url/--token, else $GPULEASE_URL/$GPULEASE_TOKEN, else the embedded hub's state folder."""
    url = url or os.environ.get("GPULEASE_URL")
    token = token or os.environ.get("GPULEASE_TOKEN")
    if not (url and token):
        given = state_dir or os.environ.get("GPULEASE_STATE")
        # `up`'s default: ./.gpulease, or as root its folder in /var/lib/gpulease
        roots = [Path(given)] if given else list(dict.fromkeys([
            Path(".gpulease").resolve(),
            default_state_root(Path.cwd(), accounts_must_reach=os.geteuid() == 0)]))
        found = next(filter(None, (read_cli_file(StateDir(r.resolve())) for r in roots)), None)
        if not found:
            where = " nor ".join(f"{r}/private/cli.json" for r in roots)
            raise ClientError(
                f"no hub to talk to: {where} not found (is `gpulease up` "
                "running with this state folder?); or pass --url and --token"
            )
        service = found.get("service_url", "") if not url or url == found["url"] else ""
        url, token = url or found["url"], token or found["token"]
        return HubClient(url, token, service=service)
    return HubClient(url, token)
