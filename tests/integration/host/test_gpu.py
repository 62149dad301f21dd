"""On a real NVIDIA GPU: the NVML inventory agrees with nvidia-smi.

Marked `gpu` and skipped unless NVML finds a GPU; scripts/gpu-check.sh runs
them on a GPU machine. Read only: nothing here changes MIG mode or any other
GPU setting.
"""

import re
import shutil
import socket
import subprocess

import pytest

from gpulease.core.model.gpu_models import model_key_from_nvml_name
from gpulease.core.model.inventory import Inventory
from gpulease.host.gpus import discover_inventory
from gpulease.host.nvml import read_nvml_inventory

pytestmark = pytest.mark.gpu

_GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[^)]+)\)$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)$")


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    inv = read_nvml_inventory(socket.gethostname())
    if inv is None:
        pytest.skip("no NVIDIA GPU visible through NVML (needs the driver and a GPU)")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("NVML sees a GPU but nvidia-smi is not on PATH")
    return inv


def _smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def _smi_list() -> dict[str, dict]:
    """`nvidia-smi -L` as {gpu uuid: {index, name, mig: {mig uuid: profile}}}."""
    gpus: dict[str, dict] = {}
    current = None
    for line in _smi("-L").splitlines():
        if m := _GPU_LINE.match(line):
            current = m.group(3)
            gpus[current] = {"index": int(m.group(1)), "name": m.group(2), "mig": {}}
        elif m := _MIG_LINE.match(line):
            assert current is not None, f"MIG line before any GPU line: {line!r}"
            gpus[current]["mig"][m.group(3)] = m.group(1)
    return gpus


def _query(fields: str) -> dict[str, list[str]]:
    rows = _smi(f"--query-gpu=uuid,{fields}", "--format=csv,noheader,nounits").splitlines()
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in r.split(",")] for r in rows)}


def test_gpus_and_mig_devices_match_nvidia_smi(inventory):
    smi = _smi_list()
    [node] = inventory.nodes
    ours = {g.uuid: g for g in node.gpus}
    assert set(ours) == set(smi)
    for uuid, gpu in ours.items():
        assert gpu.index == smi[uuid]["index"]
        assert gpu.model == model_key_from_nvml_name(smi[uuid]["name"])
        assert {m.uuid: m.profile for m in gpu.mig_devices} == smi[uuid]["mig"]
        assert all(m.gpu_uuid == uuid for m in gpu.mig_devices)


def test_mig_mode_matches_nvidia_smi(inventory):
    modes = _query("mig.mode.current")
    for gpu in inventory.nodes[0].gpus:
        [mode] = modes[gpu.uuid]
        # "[N/A]" on a GPU without MIG support: not enabled.
        assert gpu.mig_enabled == (mode == "Enabled"), (gpu.uuid, mode)
        if not gpu.mig_enabled:
            assert gpu.mig_devices == ()


def test_driver_and_memory_match_nvidia_smi(inventory):
    facts = _query("driver_version,memory.total")
    for gpu in inventory.nodes[0].gpus:
        driver, memory_mib = facts[gpu.uuid]
        assert gpu.driver == driver
        assert inventory.label == f"NVML, driver {driver}"
        assert gpu.memory_bytes // 1024**2 == int(memory_mib)


def test_allocatable_devices_follow_mig_mode(inventory):
    expected = set()
    for gpu in inventory.nodes[0].gpus:
        expected |= {m.uuid for m in gpu.mig_devices} if gpu.mig_enabled else {gpu.uuid}
    assert inventory.device_uuids() == expected


def test_discovery_without_a_declared_file_uses_nvml(inventory):
    found = discover_inventory(None, socket.gethostname())
    assert found.source == "nvml"
    assert found.device_uuids() == inventory.device_uuids()


def test_device_nodes_of_every_gpu_and_mig_device_exist(inventory):
    """What the devices cgroup allows a server: its GPU's /dev/nvidiaN and, for a MIG
    device, the GPU- and compute-instance capability files. Read only."""
    import os
    import stat

    from gpulease.spawners.local.devices import nvml_device_map

    mapping = nvml_device_map()
    assert set(mapping) == set(inventory.device_uuids()) | {
        g.uuid for n in inventory.nodes for g in n.gpus}
    for uuid, nodes in mapping.items():
        assert re.fullmatch(r"/dev/nvidia\d+", nodes[0]), (uuid, nodes)
        for path in nodes:
            assert stat.S_ISCHR(os.stat(path).st_mode), (uuid, path)
        if uuid.startswith("MIG-"):
            assert len(nodes) == 3, (uuid, nodes)  # the GPU node + two capability files
