"""The culler's thin HTTP adapter: the hub's REST API and the gpulease service.

Never a user's server: the culler's token holds far more than any user
(custom:gpulease:admin), and a server is user code that could log it. The
servers' kernels and terminals come from what they pushed to the gpulease
service (idle-culler/pushed.py); their GPU readings go to it (readings.py).

One pooled client with a bounded number of connections serves the whole
pass; every request has a timeout. Nothing here decides anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from gpulease.core.model.profiles import saved_profile
from gpulease.core.units import parse_duration

PAGINATION = "application/jupyterhub-pagination+json"


@dataclass(frozen=True)
class ServerInfo:
    """One running server as the hub's users API lists it."""

    user: str
    server: str
    url: str  # path on the proxy, with the hub's base_url, ending in '/'
    started: datetime
    last_activity: datetime | None
    profile: str
    state: dict[str, Any] | None  # the spawner's state (needs admin:server_state)

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.server)


@dataclass(frozen=True)
class ProfileLimits:
    idle_timeout_s: int
    max_runtime_s: int
    # GPU devices a server of the profile holds (a MIG slice is one); None: not known.
    gpus: int | None = None


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 timestamp from the hub or jupyter_server, as an aware UTC datetime."""
    if not text:
        return None
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def servers_from_users(users: list[dict[str, Any]]) -> list[ServerInfo]:
    """Ready servers of a page of user models; pending starts and stops are not judged."""
    out = []
    for user in users:
        for name, model in (user.get("servers") or {}).items():
            if not model.get("ready") or model.get("pending") or model.get("stopped"):
                continue
            started = parse_time(model.get("started"))
            if started is None:
                continue
            options = model.get("user_options") or {}
            out.append(ServerInfo(
                user=user["name"], server=name, url=model.get("url") or "",
                started=started, last_activity=parse_time(model.get("last_activity")),
                # {"profile": ["short"]} is profile short (the hub takes a form's
                # lists of one): read otherwise, no max_runtime would apply to it
                profile=saved_profile(options) or "", state=model.get("state"),
            ))
    return out


def parse_profiles(body: dict[str, Any]) -> dict[str, ProfileLimits]:
    """{slug: limits} from the gpulease service's `GET api/profiles`."""
    out = {}
    for p in body.get("profiles") or []:
        gpu = p.get("gpu")
        gpus = 0 if not gpu else 1 if gpu.get("mig") else int(gpu.get("count") or 1)
        out[p["slug"]] = ProfileLimits(parse_duration(p.get("idle_timeout", "30m")),
                                       parse_duration(p.get("max_runtime", 0)), gpus)
    return out


def parse_holders(body: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """{(user, server): device UUIDs} from the gpulease service's `GET api/inventory`."""
    held: dict[tuple[str, str], list[str]] = {}
    for node in body.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            for device in gpu.get("devices") or []:
                holder = device.get("holder")
                if holder:
                    held.setdefault((holder["user"], holder["server"]), []).append(device["uuid"])
    return held


class HubError(Exception):
    """An HTTP error answer; `status` is its code."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(f"HTTP {status}" + (f" {message}" if message else ""))
        self.status = status


class HubClient:
    """HTTP to the hub API and the gpulease service, with keep-alive.

    A pass makes thousands of small requests: pooled keep-alive connections
    (aiohttp) instead of a new one per request.
    """

    def __init__(self, api_url: str, public_url: str, token: str, *,
                 timeout_s: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/")  # e.g. http://127.0.0.1:8081/hub/api
        self.public_url = public_url.rstrip("/")  # where /services/gpulease/ is
        self.token = token
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the running loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # The culler's semaphores bound the requests in flight; the pool
                # must not, or hung servers' connections would starve the rest.
                connector=aiohttp.TCPConnector(limit=0),
                headers={"Authorization": f"token {self.token}"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, url: str, body: Any = None, *,
                      accept: str = "application/json", timeout_s: float | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        async with self.session().request(
            method, url, json=body if method != "GET" else None,
            headers={"Accept": accept}, timeout=timeout, allow_redirects=False,
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise HubError(response.status, text[:200])
            return json.loads(text) if text else None

    async def running_servers(self, page_size: int = 200) -> list[ServerInfo]:
        """Every ready server, page by page (JupyterHub 6 pagination)."""
        servers: list[ServerInfo] = []
        seen: set[tuple[str, str]] = set()
        offset = 0
        while True:
            query = urlencode({"state": "active", "limit": page_size, "offset": offset})
            page = await self.request("GET", f"{self.api_url}/users?{query}", accept=PAGINATION)
            if isinstance(page, list):  # a hub without pagination answers a plain list
                items, following = page, None
            else:
                items, following = page.get("items") or [], (page.get("_pagination") or {}).get(
                    "next")
            for info in servers_from_users(items):
                # Users starting or stopping servers between pages shift the
                # offsets; a duplicate is harmless, skip it.
                if info.key not in seen:
                    seen.add(info.key)
                    servers.append(info)
            if not following or not items:
                return servers
            offset = int(following["offset"])

    async def user_servers(self, name: str) -> list[ServerInfo]:
        """One user's ready servers (an unknown user has none)."""
        try:
            model = await self.request("GET", f"{self.api_url}/users/{quote(name, safe='')}")
        except HubError as e:
            if e.status == 404:
                return []
            raise
        return servers_from_users([model])

    async def profiles(self) -> dict[str, ProfileLimits]:
        body = await self.request("GET", f"{self.public_url}/services/gpulease/api/profiles")
        return parse_profiles(body)

    async def holders(self) -> dict[tuple[str, str], list[str]]:
        body = await self.request("GET", f"{self.public_url}/services/gpulease/api/inventory")
        return parse_holders(body)

    async def server_activity(self, users: set[str] | None = None) -> Any:
        """What servers pushed (`GET api/server-activity`): all of them, or these users'."""
        query = "?" + urlencode([("user", u) for u in sorted(users)]) if users else ""
        return await self.request(
            "GET", f"{self.public_url}/services/gpulease/api/server-activity{query}")

    async def put_gpu_readings(self, servers: list[dict[str, Any]], interval_s: float) -> None:
        """The running GPU servers' latest activity and memory (`PUT api/gpu-readings`,
        204), which the service folds into their open billing sessions, each reading
        standing for `interval_s` of its session, and shows their researchers; raises
        HubError or aiohttp's errors where it was not taken."""
        await self.request("PUT", f"{self.public_url}/services/gpulease/api/gpu-readings",
                           {"servers": servers, "interval_s": interval_s})

    async def stop(self, user: str, server: str, reason: str) -> int:
        """Stop through the gpulease service, which closes the session with `reason`."""
        try:
            await self.request("POST", f"{self.public_url}/services/gpulease/api/stop",
                               {"user": user, "server": server, "reason": reason})
        except HubError as e:
            return e.status
        return 202
