"""The real gpulease service app (hub/service/app.py) in-process, beside a FAKE hub API.

The fake hub (named as such: no JupyterHub runs) answers only what the service asks
of it: whose a token is (`GET /hub/api/user`, from `tokens`; 403 for an unknown one)
and a user's model (`GET /hub/api/users/NAME`: their groups, no servers; 404 for one
`users` does not name). It is served from a thread of its own: the service's pages ask
the hub who a token is synchronously (HubOAuth's first lookup), which would wait forever
on a fake hub served by the very loop they block.

    async with running_service(tmp_path, monkeypatch, tokens) as (base, app):
        ...  # base: "http://127.0.0.1:PORT/services/gpulease/"
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from jupyterhub.services.auth import HubAuth, HubOAuth
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

PREFIX = "/services/gpulease/"
ACCESS = "access:services!service=gpulease"


def service_env(db_file: Path, hub_api_url: str, **more: str) -> dict[str, str]:
    """The environment JupyterHub gives the gpulease service, for a database file."""
    return {
        "GPULEASE_DB_URL": f"sqlite:///{db_file}",
        "JUPYTERHUB_API_URL": hub_api_url,
        "JUPYTERHUB_API_TOKEN": "t" * 32,
        "JUPYTERHUB_CLIENT_ID": "service-gpulease",
        "JUPYTERHUB_SERVICE_NAME": "gpulease",
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{PREFIX}oauth_callback",
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_HOST": "",
        **more,
    }


def fake_hub_app(tokens: Mapping[str, dict[str, Any]],
                 users: Callable[[str], dict[str, Any] | None] | None = None) -> web.Application:
    """The FAKE hub API: `tokens` maps a token to the hub's model of it; `users(name)` gives
    a user's model (None: 404); by default any name, with no groups."""

    def model_of(name: str) -> dict[str, Any] | None:
        if users is not None:
            return users(name)
        return {"kind": "user", "name": name, "admin": False, "groups": [], "servers": {}}

    class FakeHubUser(web.RequestHandler):
        def get(self) -> None:
            token = self.request.headers.get("Authorization", "").removeprefix("token ").strip()
            model = tokens.get(token)
            if model is None:
                raise web.HTTPError(403)
            self.finish(json.dumps(model))

    class FakeHubUserModel(web.RequestHandler):
        def get(self, name: str) -> None:
            model = model_of(name)
            if model is None:
                raise web.HTTPError(404)
            self.finish(json.dumps(model))

    return web.Application([(r"/hub/api/user", FakeHubUser),
                            (r"/hub/api/users/([^/?]+)", FakeHubUserModel)])


def serve_in_thread(app: web.Application) -> tuple[int, Callable[[], None]]:
    """Serve `app` from its own thread and event loop; (port, stop)."""
    sock, port = bind_unused_port()
    ready = threading.Event()
    held: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = HTTPServer(app)
        server.add_sockets([sock])
        held["loop"] = loop
        ready.set()
        loop.run_forever()
        server.stop()
        loop.close()

    thread = threading.Thread(target=run, name="fake-hub", daemon=True)
    thread.start()
    ready.wait(10)

    def stop() -> None:
        held["loop"].call_soon_threadsafe(held["loop"].stop)
        thread.join(10)

    return port, stop


@asynccontextmanager
async def running_service(tmp_path: Path, monkeypatch: Any, tokens: Mapping[str, dict[str, Any]],
                          users: Callable[[str], dict[str, Any] | None] | None = None,
                          **env: str) -> AsyncIterator[tuple[str, web.Application]]:
    """The service's app on a free port, its fake hub on another; (base URL, app)."""
    hub_port, stop_hub = serve_in_thread(fake_hub_app(tokens, users))
    environment = service_env(tmp_path / "gpulease.sqlite",
                              f"http://127.0.0.1:{hub_port}/hub/api", **env)
    for name, value in environment.items():  # HubAuth reads its settings from the environment
        monkeypatch.setenv(name, value)
    # HubAuth is a process-wide singleton: one made by an earlier test knows another hub.
    HubAuth.clear_instance()
    HubOAuth.clear_instance()
    from gpulease.hub.service.app import make_app

    app = make_app(environment)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{port}{PREFIX}", app
    finally:
        server.stop()
        stop_hub()
        HubAuth.clear_instance()
        HubOAuth.clear_instance()


def ctx_of(app: web.Application) -> Any:
    """The service's context (its database engine, ledger, profiles)."""
    return app.wildcard_router.rules[-1].target_kwargs["ctx"]
