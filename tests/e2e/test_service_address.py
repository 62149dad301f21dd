"""GPULeaseHub.service_address: the proxy reaches the gpulease service by a name and a
fixed port, as the Helm chart's proxy pod reaches the hub pod's Service.

A real `gpulease up` whose service is at `localhost:<port>`: the proxy's route for
/services/gpulease/ names that address, the service answers through the proxy, and
it listens on every address (the hub pod's own address, not only loopback).
"""

from __future__ import annotations

import socket

import pytest
import requests

from tests.support.hubproc import HubProcess, free_port

pytestmark = pytest.mark.e2e
PW = "admin-secret-pw"


def test_the_service_at_a_named_address_answers_through_the_proxy(tmp_path):
    port = free_port()
    hub = HubProcess(state=tmp_path / "state", admin_password=PW, extra_args=[
        f"--GPULeaseHub.service_address=localhost:{port}"]).start()
    try:
        admin = hub.token_for("admin", PW)
        r = hub.service("GET", "api/profiles", admin)
        assert r.status_code == 200, r.text + hub.log()[-2000:]
        routes = requests.get(f"http://127.0.0.1:{hub.api_port}/api/routes", timeout=10,
                              headers={"Authorization": f"token {proxy_token(hub)}"}).json()
        assert {r["target"] for path, r in routes.items() if path.rstrip("/").endswith("/services/gpulease")} \
            == {f"http://localhost:{port}"}, routes
        # listening on every address: this host's own (non-loopback) name reaches it too
        address = socket.gethostbyname(socket.gethostname())
        with socket.create_connection((address, port), timeout=5):
            pass
    finally:
        hub.close()


def test_a_service_address_without_a_port_stops_the_hub_naming_the_form(tmp_path):
    hub = HubProcess(state=tmp_path / "state", admin_password=PW, extra_args=[
        "--GPULeaseHub.service_address=gpulease-hub"])
    with pytest.raises(Exception):  # noqa: B017 - the hub exits; its log says why
        hub.start(timeout=30)
    assert "service_address 'gpulease-hub': expected host:port" in hub.log(), hub.log()[-2000:]
    hub.close()


def proxy_token(hub: HubProcess) -> str:
    return next(hub.state.rglob("proxy_token")).read_text().strip()
