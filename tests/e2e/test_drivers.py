"""End to end on a real hub (the embedded shape): an image whose CUDA needs a newer NVIDIA
driver than a GPU has is never given that GPU, and with no GPU new enough the start is
refused 422 naming the image, the driver it needs and the newest there is.

The box is declared (an inventory file: no GPU here), one H200 on driver 550.54.15 and
one on 580.159, each with one 1g.18gb slice; servers are JupyterHub's mock server.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.hubproc import HubProcess
from tests.support.isolation_env import mock_server_catalog

pytestmark = pytest.mark.e2e

ADMIN_PW = "admin-secret-pw"
SLICE = {"gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1, "memory": "1Gi",
         "price_per_hour": "1", "min_run": "0"}
PROFILES = {"profiles": [
    {"slug": "cuda-future", "display_name": "Needs a driver nobody has",
     "images": ["mock-future"], **SLICE},
    {"slug": "cuda-12", "display_name": "Needs 560.28", "images": ["mock-cuda12"], **SLICE},
    {"slug": "any", "display_name": "No driver need", "images": ["mock"], **SLICE},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "550.54.15", "mig": ["1g.18gb"]},
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb"]}]}]}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("drivers")
    mock = yaml.safe_load(mock_server_catalog(base).read_text())["images"][0]
    catalog = base / "drivers-catalog.yaml"
    catalog.write_text(yaml.safe_dump({"images": [
        mock,
        {**mock, "name": "mock-cuda12", "cuda": "12.6", "min_driver": "560.28"},
        {**mock, "name": "mock-future", "cuda": "19.0", "min_driver": "900.1"}]}))
    (base / "profiles.yaml").write_text(yaml.safe_dump(PROFILES))
    (base / "inventory.yaml").write_text(yaml.safe_dump(INVENTORY))
    args = [f"--profiles={base / 'profiles.yaml'}", f"--inventory={base / 'inventory.yaml'}",
            f"--catalog={catalog}", "--GPULeaseHub.culler_enabled=False",
            "--GPULeaseHub.queue_max_wait=0"]
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=args).start()
    yield h
    h.close()


def test_an_image_no_gpus_driver_runs_is_refused_422_naming_image_driver_and_newest(hub):
    admin = hub.token_for("admin", ADMIN_PW)
    token = hub.add_user(admin, "ada")
    r = hub.api("POST", "users/ada/server", token, {"profile": "cuda-future"})
    assert r.status_code == 422, r.text
    said = r.json()["message"]
    assert ("The image mock-future needs NVIDIA driver 900.1 or newer, and no H200 slice "
            "1g.18gb here has it (the newest driver on one is 580.159)") in said, said


def test_an_image_gets_only_a_gpu_whose_driver_runs_it(hub):
    admin = hub.token_for("admin", ADMIN_PW)
    first, second, third = (hub.add_user(admin, n) for n in ("bo", "cy", "di"))
    assert hub.api("POST", "users/bo/server", first,
                   {"profile": "cuda-12"}).status_code in (201, 202)
    hub.wait_server_ready("bo", first)
    # The 550 GPU's slice is free, but its driver cannot run CUDA 12.6: no room for cy.
    r = hub.api("POST", "users/cy/server", second, {"profile": "cuda-12"})
    assert r.status_code == 503, r.text
    # An image with no need takes that slice.
    assert hub.api("POST", "users/di/server", third,
                   {"profile": "any"}).status_code in (201, 202)
    hub.wait_server_ready("di", third)
    view = hub.service("GET", "api/inventory", admin).json()
    held = {(gpu["index"], (device.get("holder") or {}).get("user"))
            for node in view["nodes"] for gpu in node["gpus"] for device in gpu["devices"]}
    assert held == {(1, "bo"), (0, "di")}, view  # 580.159 is GPU 1, 550.54.15 GPU 0
