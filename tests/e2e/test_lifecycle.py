"""End to end: a hub restarted on a changed GPU layout, and a hub exposed to the network."""

from __future__ import annotations

import re
import shutil
import time

import pytest
import requests

from gpulease.core.model.inventory import DEMO_INVENTORY
from tests.support.certificates import self_signed
from tests.support.hubproc import HubProcess, close_together, start_together

pytestmark = pytest.mark.e2e

PW = "admin-secret-pw"

# The same host after an admin re-cut GPU 0 into two 3g.71gb instances.
RECUT_INVENTORY = """\
nodes:
  - name: local
    gpus:
      - {model: H200, memory: 141Gi, mig: [3g.71gb, 3g.71gb], driver: "580.159"}
      - {model: H200, memory: 141Gi, driver: "580.159"}
"""


def test_restart_on_a_changed_mig_layout_reports_the_vanished_slice(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    shutil.copy(DEMO_INVENTORY, inventory)
    hub = HubProcess(state=tmp_path / "state", admin_password=PW,
                     extra_args=[f"--inventory={inventory}"]).start()
    try:
        admin = hub.token_for("admin", PW)
        hub.grant(admin, "user:admin")
        r = hub.api("POST", "users/admin/server", admin, {"user_options": {"profile": "h200-1g"}})
        assert r.status_code in (201, 202), r.text
        hub.wait_server_ready("admin", admin)
        inv = hub.service("GET", "api/inventory", admin).json()
        slice_uuid = next(d["uuid"] for n in inv["nodes"] for g in n["gpus"]
                          for d in g["devices"] if d["holder"])
        hub.kill()
        inventory.write_text(RECUT_INVENTORY)
        hub.start()
        assert f"Device {slice_uuid}" in hub.log() and "no longer in the inventory" in hub.log()
        inv = hub.service("GET", "api/inventory", admin).json()
        assert [d["uuid"] for d in inv["gone"]] == [slice_uuid]
        present = {d["uuid"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]}
        assert slice_uuid not in present
        # the profile's slice no longer exists on this host at all: 422, not a queue
        r = hub.api("POST", "users/admin/servers/other", admin,
                    {"user_options": {"profile": "h200-1g"}})
        assert r.status_code == 422, r.text
        # once its server stops, the vanished device is released, never handed out
        assert hub.api("DELETE", "users/admin/server", admin).status_code in (202, 204)
        hub.wait_server_stopped("admin", admin)
        inv = hub.service("GET", "api/inventory", admin).json()
        assert inv["gone"] == []
    finally:
        hub.close()


def test_exposed_without_tls_warns_and_with_tls_serves_https(tmp_path):
    cert, key = self_signed(tmp_path, "hub", ["localhost"], ["127.0.0.1"])
    # Beyond loopback a hub names its users' domain, or shares one origin on purpose.
    plain = HubProcess(state=tmp_path / "plain", admin_password=PW,
                       extra_args=["--ip=0.0.0.0", "--GPULeaseHub.allow_shared_origin=True"])
    tls = HubProcess(state=tmp_path / "tls", admin_password=PW,
                     extra_args=["--ip=0.0.0.0", f"--ssl-cert={cert}", f"--ssl-key={key}",
                                 "--subdomain-host=https://localhost:{port}"])
    tls.scheme = "https"
    start_together(plain, tls)
    try:
        assert "without TLS" in plain.log()
        assert "every user's servers share the hub's origin" in plain.log()
        r = requests.get(f"https://127.0.0.1:{tls.port}/hub/api", verify=str(cert), timeout=10)
        assert r.status_code == 200 and "version" in r.json()
        assert "without TLS" not in tls.log()
        # with https the hub's login cookie is __Host- prefixed: no subdomain can toss one
        browser = requests.Session()
        form = browser.get(f"https://127.0.0.1:{tls.port}/hub/login", verify=str(cert),
                           timeout=30)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.text).group(1)
        login = browser.post(f"https://127.0.0.1:{tls.port}/hub/login", verify=str(cert),
                             data={"username": "admin", "password": PW, "_xsrf": xsrf},
                             allow_redirects=False, timeout=30)
        assert login.status_code == 302, login.text[:1000]
        assert any(c.name == "__Host-jupyterhub-hub-login" and c.secure and c.path == "/"
                   for c in login.cookies), login.headers.get("Set-Cookie")
        # The idle culler still reads the profiles (it reaches the service at
        # its own port, not through the proxy whose certificate it cannot check):
        # unable to, it would stop no idle server, and they would bill forever.
        deadline = time.monotonic() + 30
        while "culler pass:" not in tls.log() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "culler pass:" in tls.log()
        assert "cannot read the profiles" not in tls.log()
    finally:
        close_together(plain, tls)
