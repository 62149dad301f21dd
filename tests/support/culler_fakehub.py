"""FakeCullerHub: a TEST DOUBLE of the hub, proxy and gpulease-service endpoints the culler calls.

Paginated `GET /hub/api/users?state=active`, the kernel state servers pushed
(`api/server-activity`: some pushed long ago, some never), `api/profiles`,
`api/inventory` and `api/stop`. Nothing answers under `/user/`: the culler
never contacts a server. Used by tests/integration/web/test_culler_pass.py and bench/culler.py; never
outside tests. Its timestamps are fixed relative to REF and the culler's
clock is moved instead. (No tests in here; the name only follows the
test_culler_* file pattern.)
"""

from __future__ import annotations

import json
import random
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tornado import web

from gpulease.idle_culler.cpu import StaticCpuSource
from gpulease.idle_culler.culler import Culler, CullerConfig
from gpulease.idle_culler.gpu import StaticGpuSource
from gpulease.idle_culler.hubapi import HubClient

REF = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
TOKEN = "culler-secret"
KINDS = ["idle", "busy-kernel", "kernel-recent", "hub-recent", "cpu-busy", "gpu-busy",
         "gpu-memory-only", "stale-busy-push", "no-push-cpu-unknown", "terminal-recent"]
# stale-busy-push: its last push (an hour old) said busy; no-push-cpu-unknown: never
# pushed (no gpulease.singleuser), judged on the hub's activity alone.
STOPPED_KINDS = {"idle", "gpu-memory-only", "stale-busy-push", "no-push-cpu-unknown"}


def iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


@dataclass
class FakeServer:
    user: str
    name: str
    kind: str
    profile: str = "h200-1g"
    started: datetime = REF - timedelta(hours=2)
    hub_activity: datetime = REF - timedelta(hours=1)
    kernel_state: str = "idle"
    kernel_activity: datetime = REF - timedelta(hours=1)
    terminal_activity: datetime | None = None
    devices: list[str] = field(default_factory=list)
    # Runs gpulease.singleuser (pushes its state); False: a plain image, never pushes.
    singleuser: bool = True
    pushed: datetime | None = None  # None: just now (FakeCullerHub.push_time)
    # The spawner's state; None: the embedded one (its pid and devices). A cluster
    # server's is kubespawner's: {"pod_name", "namespace", ...}.
    state: dict | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.name)

    @property
    def url(self) -> str:
        return f"/user/{self.user}/{self.name + '/' if self.name else ''}"


def make_server(i: int, recent: datetime) -> FakeServer:
    """Server number i; its kind is KINDS[i % 10]; 'recent' is a minute before the deciding pass."""
    kind = KINDS[i % len(KINDS)]
    s = FakeServer(f"u{i}", "train" if i % 3 == 0 else "", kind, devices=[f"MIG-{i}"])
    return shape(s, recent)


def shape(s: FakeServer, recent: datetime) -> FakeServer:
    """Give server `s` the signals its kind stands for; 'recent' is when recent activity was."""
    kind = s.kind
    if kind == "busy-kernel":
        s.kernel_state = "busy"
    elif kind == "kernel-recent":
        s.kernel_activity = recent
    elif kind == "hub-recent":
        s.hub_activity = recent
    elif kind == "terminal-recent":
        s.terminal_activity = recent
    elif kind == "warn-window":
        s.hub_activity = s.kernel_activity = DECIDE_AT - timedelta(minutes=27)
    elif kind == "stale-busy-push":
        s.kernel_state, s.pushed = "busy", REF - timedelta(hours=1)
    elif kind in ("no-push", "no-push-cpu-unknown"):
        s.singleuser = False
    return s


def sources_for(servers: list[FakeServer]) -> tuple[StaticCpuSource, StaticGpuSource]:
    cpu = StaticCpuSource({s.key: 250.0 for s in servers if s.kind == "cpu-busy"}, default=0.5)
    cpu.values.update({s.key: None for s in servers if s.kind == "no-push-cpu-unknown"})
    gpu = StaticGpuSource({d: 60.0 for s in servers if s.kind == "gpu-busy" for d in s.devices},
                          default=0.0)
    return cpu, gpu


class FakeCullerHub:
    """The hub API (paginated users) and the gpulease service, with what servers pushed."""

    def __init__(self, servers: list[FakeServer], *, profiles: dict | None = None,
                 clock: Clock | None = None) -> None:
        self.servers = {s.key: s for s in servers}
        self.profiles = profiles or {"h200-1g": ("30m", "0")}
        self.profiles_fail = False
        self.activity_fail = False
        self.clock = clock  # pushes are "just now" by it; without one, just before DECIDE_AT
        self.since = REF - timedelta(hours=3)  # when the service's memory of pushes began
        self.stops: list[dict] = []
        self.pages = 0
        self.activity_reads: list[list[str]] = []  # ?user= of each read ([]: all)
        self.user_reads = 0
        self._models: list[dict] | None = None

    def push_time(self, s: FakeServer) -> datetime:
        if s.pushed is not None:
            return s.pushed
        return (self.clock() if self.clock else DECIDE_AT) - timedelta(seconds=10)

    def app(self) -> web.Application:
        args = {"hub": self}
        return web.Application([
            (r"/hub/api/users", UsersHandler, args),
            (r"/hub/api/users/([^/]+)", UserHandler, args),
            (r"/services/gpulease/api/profiles", ProfilesHandler, args),
            (r"/services/gpulease/api/inventory", InventoryHandler, args),
            (r"/services/gpulease/api/stop", StopHandler, args),
            (r"/services/gpulease/api/server-activity", ServerActivityHandler, args),
        ], log_function=lambda handler: None)

    def user_models(self) -> list[dict]:
        # Built once per change, not per page: the double must not be the bottleneck.
        if self._models is None:
            self._models = self._build_models()
        return self._models

    def _build_models(self) -> list[dict]:
        users: dict[str, dict] = {}
        for s in self.servers.values():
            model = users.setdefault(s.user, {"kind": "user", "name": s.user, "servers": {}})
            model["servers"][s.name] = {
                "name": s.name, "ready": True, "pending": None, "stopped": False,
                "started": iso(s.started), "last_activity": iso(s.hub_activity), "url": s.url,
                "user_options": {"profile": s.profile},
                "state": s.state if s.state is not None else {
                    "pid": 1000, "gpulease_devices": s.devices},
            }
        return list(users.values())


class FakeHandler(web.RequestHandler):
    def initialize(self, hub: FakeCullerHub) -> None:
        self.hub = hub

    def prepare(self) -> None:
        if self.request.headers.get("Authorization") != f"token {TOKEN}":
            raise web.HTTPError(403)


class UsersHandler(FakeHandler):
    def get(self) -> None:
        assert self.get_argument("state") == "active"
        self.hub.pages += 1
        users = self.hub.user_models()
        offset = int(self.get_argument("offset", "0"))
        limit = min(int(self.get_argument("limit")), 200)  # JupyterHub's api_page_max_limit
        if "application/jupyterhub-pagination+json" not in self.request.headers.get("Accept"):
            self.finish(json.dumps(users))
            return
        page = users[offset:offset + limit]
        following = offset + limit if offset + limit < len(users) else None
        self.finish({"items": page, "_pagination": {
            "offset": offset, "limit": limit, "total": len(users),
            "next": None if following is None else {"offset": following, "limit": limit,
                                                    "url": "/hub/api/users?..."}}})


class UserHandler(FakeHandler):
    def get(self, name: str) -> None:
        self.hub.user_reads += 1
        for model in self.hub.user_models():
            if model["name"] == name:
                self.finish(model)
                return
        raise web.HTTPError(404)


class ProfilesHandler(FakeHandler):
    def get(self) -> None:
        if self.hub.profiles_fail:
            raise web.HTTPError(503)
        # {slug: (idle_timeout, max_runtime[, gpu])}, gpu as api/profiles shows it
        self.finish({"profiles": [
            {"slug": slug, "idle_timeout": limits[0], "max_runtime": limits[1],
             **({"gpu": limits[2]} if len(limits) > 2 else {})}
            for slug, limits in self.hub.profiles.items()]})


class InventoryHandler(FakeHandler):
    def get(self) -> None:
        raise web.HTTPError(403)  # the culler copes with the state's devices alone


class StopHandler(FakeHandler):
    def post(self) -> None:
        body = json.loads(self.request.body)
        key = (body["user"], body["server"])
        if key not in self.hub.servers:
            raise web.HTTPError(409)
        del self.hub.servers[key]
        self.hub._models = None
        self.hub.stops.append(body)
        self.set_status(202)
        self.finish(body)


class ServerActivityHandler(FakeHandler):
    """What the gpulease service answers: the servers that pushed (not the plain ones)."""

    def get(self) -> None:
        users = self.get_arguments("user")
        self.hub.activity_reads.append(users)
        if self.hub.activity_fail:
            raise web.HTTPError(503)
        wanted = set(users)
        servers = []
        for s in self.hub.servers.values():
            if not s.singleuser or (wanted and s.user not in wanted):
                continue
            servers.append({
                "user": s.user, "server": s.name, "pushed": iso(self.hub.push_time(s)),
                "kernels": [{"id": f"k-{s.user}", "execution_state": s.kernel_state,
                             "last_activity": iso(s.kernel_activity), "connections": 0}],
                "terminals": {"count": 0 if s.terminal_activity is None else 1,
                              "last_activity": s.terminal_activity and iso(s.terminal_activity)},
            })
        self.finish(json.dumps({"since": iso(self.hub.since), "now": iso(DECIDE_AT),
                                "servers": servers}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class RecordingNotices:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def warn(self, user, server, decision):
        self.events.append(("warn", user, decision.action))

    async def cancel(self, user, server):
        self.events.append(("cancel", user, ""))

    async def suspended(self, user, server, decision):
        self.events.append(("suspended", user, decision.action))


async def start(servers, **kw):
    hub = FakeCullerHub(servers, **kw)
    port = free_port()
    http = hub.app().listen(port, address="127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    return hub, http, HubClient(f"{base}/hub/api", base, TOKEN)


def culler_for(client, servers, clock, notices=None, **config):
    cpu, gpu = sources_for(servers)
    cfg = CullerConfig(**config)
    return Culler(client, cpu, gpu, notices=notices or RecordingNotices(), config=cfg,
                  clock=clock)


DECIDE_AT = REF + timedelta(minutes=31)  # the deciding pass, after a first sight at REF
RECENT = DECIDE_AT - timedelta(minutes=1)
# Steady state: (kind, share). Past-timeout servers are few because each pass
# stops them; the warning window holds about warn_before / typical idle time.
MIX = [("hub-recent", 0.50), ("cpu-busy", 0.15), ("gpu-busy", 0.10), ("busy-kernel", 0.05),
       ("kernel-recent", 0.05), ("terminal-recent", 0.02), ("warn-window", 0.08),
       ("idle", 0.03), ("gpu-memory-only", 0.01), ("no-push", 0.01)]


def steady_fleet(n: int, seed: int, all_read: bool) -> list[FakeServer]:
    """n servers in a steady-state mix (MIX); all_read: all kept by busy kernels only."""
    rng = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    servers = []
    for i in range(n):
        kind = "busy-kernel" if all_read else rng.choices(kinds, weights)[0]
        s = FakeServer(f"u{i}", "train" if i % 4 == 0 else "", kind, devices=[f"MIG-{i}"])
        servers.append(shape(s, RECENT))
    return servers
