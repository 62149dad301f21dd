"""The CLI's client for the gpulease service's REST API."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from gpulease.hub.state import StateDir, default_state_root, read_cli_file


class ClientError(RuntimeError):
    """The hub answered with an error, or could not be reached."""


@dataclass(frozen=True)
class HubClient:
    url: str
    token: str
    timeout: float = 30.0

    @property
    def service_url(self) -> str:
        return self.url.rstrip("/") + "/services/gpulease/"

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        try:
            response = requests.request(
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
            raise ClientError(_describe_error(response))
        return response.json() if response.content else None


def _describe_error(response: requests.Response) -> str:
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
        url, token = url or found["url"], token or found["token"]
    return HubClient(url, token)
