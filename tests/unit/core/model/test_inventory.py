"""The declared inventory file, the Inventory model, and discovery's fallbacks."""

import logging

import pytest

from gpulease.core.model.inventory import (
    DEMO_INVENTORY,
    Gpu,
    Inventory,
    InventoryError,
    Node,
    load_declared_inventory,
    parse_declared_inventory,
)
from gpulease.host import nvml as nvml_adapter
from gpulease.host.gpus import discover_inventory

GiB = 1024**3
H200_PROFILES = "1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb"


def _errors(data) -> list[str]:
    with pytest.raises(InventoryError) as info:
        parse_declared_inventory(data, "inv.yaml")
    return info.value.errors


def _one_gpu(**gpu) -> dict:
    return {"nodes": [{"name": "n1", "gpus": [gpu]}]}


def test_parse_design_example():
    inv = parse_declared_inventory({"nodes": [{"name": "local", "gpus": [
        {"model": "H200", "memory": "141Gi", "mig": ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]},
        {"model": "H200", "memory": "141Gi", "driver": "580.159"},
    ]}]}, "inv.yaml")
    assert inv.source == "declared"
    assert inv.label == "declared — no physical GPU (inv.yaml)"
    [node] = inv.nodes
    gpu0, gpu1 = node.gpus
    assert (gpu0.uuid, gpu0.index, gpu0.model, gpu0.memory_bytes, gpu0.mig_enabled) == (
        "GPU-declared-local-0", 0, "H200", 141 * GiB, True)
    assert [(m.uuid, m.profile, m.index, m.gpu_uuid) for m in gpu0.mig_devices] == [
        ("MIG-declared-local-0-0-1g.18gb", "1g.18gb", 0, "GPU-declared-local-0"),
        ("MIG-declared-local-0-1-1g.18gb", "1g.18gb", 1, "GPU-declared-local-0"),
        ("MIG-declared-local-0-2-2g.35gb", "2g.35gb", 2, "GPU-declared-local-0"),
        ("MIG-declared-local-0-3-3g.71gb", "3g.71gb", 3, "GPU-declared-local-0"),
    ]
    assert gpu0.mig_devices[2].memory_bytes == 35 * GiB
    assert (gpu1.mig_enabled, gpu1.mig_devices, gpu1.driver) == (False, (), "580.159")

    devices = list(inv.allocatable())
    # The MIG GPU yields its four slices, never itself; the other GPU yields itself.
    assert [(d.uuid, d.mig_profile) for d in devices] == [
        ("MIG-declared-local-0-0-1g.18gb", "1g.18gb"), ("MIG-declared-local-0-1-1g.18gb", "1g.18gb"),
        ("MIG-declared-local-0-2-2g.35gb", "2g.35gb"), ("MIG-declared-local-0-3-3g.71gb", "3g.71gb"),
        ("GPU-declared-local-1", None),
    ]
    assert devices[4].memory_bytes == 141 * GiB and devices[4].gpu_index == 1
    assert inv.device_uuids() == {d.uuid for d in devices}
    assert "GPU-declared-local-0" not in inv.device_uuids()


def test_memory_defaults_to_nominal_and_unknown_models_pass():
    inv = parse_declared_inventory({"nodes": [{"name": "a", "gpus": [
        {"model": "A100-80GB"}, {"model": "Mystery-GPU", "memory": 1000}]}]}, "x")
    assert [g.memory_bytes for g in inv.nodes[0].gpus] == [80 * GiB, 1000]


def test_mig_enabled_with_no_devices_offers_nothing():
    inv = parse_declared_inventory(_one_gpu(model="H200", mig=[]), "x")
    assert inv.nodes[0].gpus[0].mig_enabled is True
    assert list(inv.allocatable()) == []


def test_unknown_keys_everywhere():
    assert _errors({"nodes": [{"name": "n1", "gpu": [], "gpus": [
        {"model": "H200", "mig_profiles": ["1g.18gb"]}]}], "extra": 1}) == [
        "inv.yaml: top level: unknown key 'extra' (allowed: nodes)",
        "inv.yaml: nodes[0]: unknown key 'gpu' (allowed: gpus, name)",
        "inv.yaml: nodes[0].gpus[0]: unknown key 'mig_profiles' "
        "(allowed: driver, memory, mig, model)",
    ]


def test_missing_model_and_missing_nodes():
    assert _errors(_one_gpu(memory="1Gi")) == [
        "inv.yaml: nodes[0].gpus[0].model: missing (a model key such as H200 or A100-80GB)"]
    assert _errors({}) == ["inv.yaml: nodes: missing (expected `nodes:` with a list of nodes)"]
    assert _errors(None) == ["inv.yaml: nodes: missing (expected `nodes:` with a list of nodes)"]


def test_duplicate_node_names():
    assert _errors({"nodes": [{"name": "a", "gpus": []}, {"name": "a", "gpus": []}]}) == [
        "inv.yaml: nodes[1].name: duplicate node name 'a'"]


def test_invalid_mig_profile_names_the_valid_ones():
    errors = _errors({"nodes": [{"name": "n1", "gpus": [
        {"model": "H200"}, {"model": "H200", "mig": ["1g.18gb", "1g.18gb", "1g.10gb"]}]}]})
    assert errors == [
        f"inv.yaml: nodes[0].gpus[1].mig[2]: '1g.10gb' is not a MIG profile of H200 "
        f"(valid: {H200_PROFILES})"]


def test_more_instances_than_the_profile_allows():
    assert _errors(_one_gpu(model="H200", mig=["3g.71gb"] * 3)) == [
        "inv.yaml: nodes[0].gpus[0].mig: 3× 3g.71gb but a H200 holds at most 2",
        "inv.yaml: nodes[0].gpus[0].mig: 9 compute slices in all, but a H200 has 7",
    ]
    assert _errors(_one_gpu(model="H200", mig=["1g.18gb+me", "1g.18gb+me"])) == [
        "inv.yaml: nodes[0].gpus[0].mig: 2× 1g.18gb+me but a H200 holds at most 1"]


def test_too_many_compute_slices():
    assert _errors(_one_gpu(model="A100-80GB", mig=["4g.40gb", "3g.40gb", "1g.10gb"])) == [
        "inv.yaml: nodes[0].gpus[0].mig: 8 compute slices in all, but a A100-80GB has 7"]
    # exactly seven is fine
    parse_declared_inventory(_one_gpu(model="A100-80GB", mig=["4g.40gb", "3g.40gb"]), "x")


def test_mig_on_a_model_without_mig():
    assert _errors(_one_gpu(model="L40S", mig=["1g.18gb"])) == [
        "inv.yaml: nodes[0].gpus[0].mig: L40S has no MIG support "
        "(MIG models: A100-40GB, A100-80GB, H100-80GB, H200, H100-NVL)"]


def test_bad_memory_and_unquoted_driver():
    assert _errors(_one_gpu(model="H200", memory="141GB", driver=580.1)) == [
        "inv.yaml: nodes[0].gpus[0].memory: '141GB' is not a quantity; quantities look like "
        "32Gi, 512Mi, 8G or a number of bytes",
        "inv.yaml: nodes[0].gpus[0].driver: the number 580.1 must be a quoted string, like \"580.159\"",
    ]


def test_every_problem_is_collected_before_raising():
    errors = _errors({"nodes": [
        {"name": "a", "gpus": [{"model": "H200", "mig": ["9g.1gb"]}, {"memory": "x"}]},
        {"name": "a", "gpus": "none"},
        "not-a-node",
    ]})
    assert errors == [
        f"inv.yaml: nodes[0].gpus[0].mig[0]: '9g.1gb' is not a MIG profile of H200 "
        f"(valid: {H200_PROFILES})",
        "inv.yaml: nodes[0].gpus[1].model: missing (a model key such as H200 or A100-80GB)",
        "inv.yaml: nodes[1].name: duplicate node name 'a'",
        "inv.yaml: nodes[1].gpus: expected a list of GPUs",
        "inv.yaml: nodes[2]: expected a mapping with name and gpus",
    ]
    # str() of the error carries every line, for a log or a CLI.
    with pytest.raises(InventoryError, match="duplicate node name"):
        parse_declared_inventory({"nodes": [{"name": "a"}, {"name": "a"}]}, "x")


def test_load_file_errors(tmp_path):
    with pytest.raises(InventoryError) as info:
        load_declared_inventory(tmp_path / "absent.yaml")
    assert info.value.errors == [f"{tmp_path / 'absent.yaml'}: file not found"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [ {name: a\n")
    with pytest.raises(InventoryError) as info:
        load_declared_inventory(bad)
    assert info.value.errors[0].startswith(f"{bad}: not valid YAML:")


def test_load_file_names_the_file_in_each_error(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - name: n\n    gpus:\n      - {model: H200, mig: [1g.10gb]}\n")
    with pytest.raises(InventoryError) as info:
        load_declared_inventory(path)
    assert info.value.errors == [
        f"{path}: nodes[0].gpus[0].mig[0]: '1g.10gb' is not a MIG profile of H200 "
        f"(valid: {H200_PROFILES})"]


def test_demo_inventory():
    inv = load_declared_inventory(DEMO_INVENTORY)
    assert inv.label == f"declared — no physical GPU ({DEMO_INVENTORY})"
    [node] = inv.nodes
    assert node.name == "local"
    gpu0, gpu1 = node.gpus
    assert gpu0.model == gpu1.model == "H200"
    assert gpu0.mig_enabled and [m.profile for m in gpu0.mig_devices] == ["1g.18gb"] * 7
    assert not gpu1.mig_enabled and gpu1.driver == "580.159"
    assert len(inv.device_uuids()) == 8


def test_label_of_each_source():
    gpu = Gpu("GPU-1", 0, "H200", None, False, (), "580.65")
    assert Inventory((Node("h", (gpu,)),), "nvml", "driver 580.65").label == "NVML, driver 580.65"
    assert Inventory((), "none", "why").label == "no GPU"


FAKE_NVML_INVENTORY = Inventory(
    (Node("host", (Gpu("GPU-real-0", 0, "H100-80GB", 80 * GiB, False, (), "580.65"),)),),
    "nvml", "driver 580.65")


def test_discover_prefers_the_declared_file_and_warns_if_nvml_sees_gpus(monkeypatch, caplog):
    monkeypatch.setattr(nvml_adapter, "read_nvml_inventory", lambda node: FAKE_NVML_INVENTORY)
    caplog.set_level(logging.INFO, logger="gpulease.host.gpus")
    inv = discover_inventory(str(DEMO_INVENTORY), "host")
    assert inv.source == "declared" and len(inv.device_uuids()) == 8
    assert any(r.levelno == logging.INFO and "declared file" in r.getMessage()
               for r in caplog.records)
    assert any(r.levelno == logging.WARNING and "NVML sees 1 GPU" in r.getMessage()
               for r in caplog.records)


def test_discover_declared_without_nvml_does_not_warn(monkeypatch, caplog):
    monkeypatch.setattr(nvml_adapter, "read_nvml_inventory", lambda node: None)
    caplog.set_level(logging.DEBUG)
    assert discover_inventory(DEMO_INVENTORY, "host").source == "declared"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_discover_uses_nvml_without_a_declared_file(monkeypatch):
    monkeypatch.setattr(nvml_adapter, "read_nvml_inventory", lambda node: FAKE_NVML_INVENTORY)
    assert discover_inventory(None, "host") is FAKE_NVML_INVENTORY


def test_discover_without_gpu_or_file_is_empty_not_an_error(monkeypatch, caplog):
    monkeypatch.setattr(nvml_adapter, "read_nvml_inventory", lambda node: None)
    caplog.set_level(logging.DEBUG)
    inv = discover_inventory(None, "host")
    assert (inv.nodes, inv.source, inv.label) == ((), "none", "no GPU")
    assert list(inv.allocatable()) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_discover_bad_declared_file_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml_adapter, "read_nvml_inventory", lambda node: None)
    with pytest.raises(InventoryError, match="file not found"):
        discover_inventory(tmp_path / "nope.yaml", "host")


# --- The NVML adapter, against a fake pynvml -------------------------------
# No GPU exists on the build machines, so this fake module stands in for the
# pynvml module and the hardware behind it. It has no setter functions at
# all: the adapter calling one would fail here (read only).


class FakeNVMLError(Exception):
    pass


class FakeNVMLErrorLibraryNotFound(FakeNVMLError):
    pass


class FakeNVMLErrorNotFound(FakeNVMLError):
    pass


class FakeNVMLErrorNotSupported(FakeNVMLError):
    pass


class FakeAttributes:
    def __init__(self, slices: int, memory_mb: int):
        self.gpuInstanceSliceCount = slices
        self.memorySizeMB = memory_mb


class FakeMemory:
    def __init__(self, total: int):
        self.total = total


class FakePynvml:
    """A fake of the pynvml module: GPUs as dicts, MIG slots as dicts or None (empty)."""

    NVMLError = FakeNVMLError
    NVMLError_LibraryNotFound = FakeNVMLErrorLibraryNotFound
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[dict], driver="580.65", library_missing=False):
        self.gpus, self.driver, self.library_missing = gpus, driver, library_missing
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self):
        if self.library_missing:
            raise FakeNVMLErrorLibraryNotFound("NVML Shared Library Not Found")
        self.initialised = True

    def nvmlShutdown(self):
        self.shutdowns += 1
        self.initialised = False

    def _live(self):
        assert self.initialised, "NVML called before nvmlInit or after nvmlShutdown"

    def nvmlSystemGetDriverVersion(self):
        self._live()
        return self.driver

    def nvmlDeviceGetCount(self):
        self._live()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._live()
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return FakeMemory(handle["memory"])

    def nvmlDeviceGetMigMode(self, handle):
        if "mig_mode" not in handle:
            raise FakeNVMLErrorNotSupported("Not Supported")
        return [handle["mig_mode"], handle["mig_mode"]]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return len(handle["slots"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        slot = handle["slots"][index]
        if slot is None:
            raise FakeNVMLErrorNotFound("Not Found")
        return slot

    def nvmlDeviceGetAttributes(self, handle):
        return FakeAttributes(handle["slices"], handle["memory_mb"])


def _fake_h200_and_a100() -> FakePynvml:
    h200_slots = [
        {"name": "NVIDIA H200 MIG 1g.18gb+me", "uuid": "MIG-a", "slices": 1, "memory_mb": 16128},
        None,  # an empty slot: nvmlDeviceGetMigDeviceHandleByIndex raises
        # A name without the profile: derived from the attributes instead.
        {"name": b"NVIDIA H200", "uuid": b"MIG-b", "slices": 2, "memory_mb": 32512},
    ]
    return FakePynvml([
        {"name": "NVIDIA H200", "uuid": "GPU-h200", "memory": 150_754_820_096, "mig_mode": 1,
         "slots": h200_slots},
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a100", "memory": 85_899_345_920,
         "mig_mode": 0, "slots": [{"name": "never read", "uuid": "MIG-x", "slices": 1,
                                   "memory_mb": 1}]},
    ])


def test_nvml_two_gpus_one_in_mig_mode_with_an_empty_slot():
    fake = _fake_h200_and_a100()
    inv = nvml_adapter.read_nvml_inventory("gpu-host", nvml=fake)
    assert fake.shutdowns == 1
    assert (inv.source, inv.label) == ("nvml", "NVML, driver 580.65")
    [node] = inv.nodes
    assert node.name == "gpu-host"
    h200, a100 = node.gpus
    assert (h200.uuid, h200.index, h200.model, h200.mig_enabled, h200.driver) == (
        "GPU-h200", 0, "H200", True, "580.65")
    assert h200.memory_bytes == 150_754_820_096
    assert [(m.uuid, m.profile, m.index, m.gpu_uuid, m.memory_bytes) for m in h200.mig_devices] == [
        ("MIG-a", "1g.18gb+me", 0, "GPU-h200", 16128 * 1024**2),
        ("MIG-b", "2g.35gb", 2, "GPU-h200", 32512 * 1024**2),
    ]
    # MIG mode off: the card is whole, whatever stale slots NVML might list.
    assert (a100.model, a100.mig_enabled, a100.mig_devices) == ("A100-80GB", False, ())
    assert [d.uuid for d in inv.allocatable()] == ["MIG-a", "MIG-b", "GPU-a100"]


def test_nvml_library_missing_is_none():
    fake = FakePynvml([], library_missing=True)
    assert nvml_adapter.read_nvml_inventory("h", nvml=fake) is None


def test_nvml_zero_gpus_is_none_and_shuts_down():
    fake = FakePynvml([])
    assert nvml_adapter.read_nvml_inventory("h", nvml=fake) is None
    assert fake.shutdowns == 1


def test_nvml_gpu_without_mig_support_and_unknown_name():
    fake = FakePynvml([{"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-r", "memory": 1}])
    inv = nvml_adapter.read_nvml_inventory("h", nvml=fake)
    [gpu] = inv.nodes[0].gpus
    assert (gpu.model, gpu.mig_enabled) == ("NVIDIA GeForce RTX 4090", False)


def test_nvml_shuts_down_even_when_reading_fails():
    class Broken(FakePynvml):
        def nvmlDeviceGetCount(self):
            raise RuntimeError("driver fell over")

    fake = Broken([])
    with pytest.raises(RuntimeError):
        nvml_adapter.read_nvml_inventory("h", nvml=fake)
    assert fake.shutdowns == 1


def test_nvml_a_gpu_that_cannot_be_read_is_left_out(caplog):
    class GpuLost(FakePynvml):
        def nvmlDeviceGetUUID(self, handle):
            if handle["uuid"] == "GPU-h200":
                raise FakeNVMLError("GPU is lost")
            return super().nvmlDeviceGetUUID(handle)

    fake = _fake_h200_and_a100()
    fake.__class__ = GpuLost
    inv = nvml_adapter.read_nvml_inventory("h", nvml=fake)
    assert [g.uuid for g in inv.nodes[0].gpus] == ["GPU-a100"]
    assert any("GPU 0 cannot be read" in r.getMessage() for r in caplog.records)


def test_real_pynvml_without_a_gpu_is_none_and_quiet(caplog):
    caplog.set_level(logging.DEBUG)
    inv = nvml_adapter.read_nvml_inventory("h")
    if inv is not None:
        pytest.skip("this machine has an NVIDIA GPU; tests/integration/host/test_gpu.py covers it")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
