"""On a real NVIDIA GPU: a kernel started by LocalGPUSpawner sees exactly its device.

`nvidia-smi` ignores CUDA_VISIBLE_DEVICES, so the check asks CUDA itself
(torch) from inside the kernel: one device, and its UUID is the placed one.
Marked `gpu`; skipped unless NVML finds a GPU and torch is installed.
Read only: nothing here changes MIG mode or any other GPU setting.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest
import yaml

from gpulease.host.nvml import read_nvml_inventory
from tests.support.hubproc import HubProcess, run_in_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

PW = "admin-secret-pw"


def _profile_for(inventory) -> dict:
    """A profile for the first allocatable device NVML reports on this host."""
    device = next(iter(inventory.allocatable()))
    gpu = {"model": device.model}
    if device.mig_profile:
        gpu["mig"] = device.mig_profile
    return {"slug": "real-gpu", "display_name": "The GPU of this host", "gpu": gpu,
            "cpu": 2, "memory": "8Gi", "images": ["pytorch"], "price_per_hour": "1"}


def test_kernel_sees_exactly_its_device_through_cuda(tmp_path):
    inventory = read_nvml_inventory(socket.gethostname())
    if inventory is None or not list(inventory.allocatable()):
        pytest.skip("no NVIDIA GPU visible through NVML")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed in this environment")
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(yaml.safe_dump({"profiles": [_profile_for(inventory)]}))
    hub = HubProcess(state=tmp_path / "state", admin_password=PW,
                     extra_args=[f"--profiles={profiles}"]).start()
    try:
        token = hub.token_for("admin", PW)
        hub.grant(token, "user:admin")
        r = hub.api("POST", "users/admin/server", token, {"user_options": {"profile": "real-gpu"}})
        assert r.status_code in (201, 202), r.text
        srv = hub.wait_server_ready("admin", token)
        inv = hub.service("GET", "api/inventory", token).json()
        assert inv["source"] == "nvml"
        placed = [d["uuid"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]
                  if d["holder"]]
        assert len(placed) == 1
        out = run_in_kernel(hub.url, srv["url"], token, (
            "import os, torch\n"
            "print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
            "print(torch.cuda.device_count())\n"
            "print(str(torch.cuda.get_device_properties(0).uuid))\n"
        ), timeout=180)
        visible, count, uuid = out.split()
        assert visible == placed[0]
        assert int(count) == 1
        # torch prints the UUID without NVML's GPU-/MIG- prefix
        assert placed[0].split("-", 1)[1] == uuid, (placed[0], uuid)
    finally:
        hub.close()
