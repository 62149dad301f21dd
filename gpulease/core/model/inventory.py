"""The GPU inventory of the embedded shape: what devices this host offers.

An inventory comes from NVML (a real GPU host), from a declared YAML file
(hosts without a GPU: demos and tests), or is empty; gpulease/host/gpus.py
chooses and reads the source, this module only models and parses. Everything downstream
(placement, assignments, the inventory page) sees only these dataclasses.
The declared file's parser collects every problem before it raises, so an
admin fixes the file in one go.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpulease.core.model.gpu_models import (
    GPU_MEMORY,
    MIG_COMPUTE_SLICES_PER_GPU,
    MIG_PROFILES,
    mig_compute_slices,
    mig_memory_bytes,
)
from gpulease.core.shown import shown
from gpulease.core.units import parse_quantity

DEMO_INVENTORY: Path = Path(__file__).parent / "samples" / "demo-inventory.yaml"


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    profile: str
    memory_bytes: int | None
    gpu_uuid: str
    index: int  # slot on its GPU


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_bytes: int | None
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...]
    driver: str | None


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class AllocatableDevice:
    """One device a server can be given: a MIG device, or a GPU without MIG."""

    uuid: str
    node: str
    gpu_uuid: str
    gpu_index: int
    model: str
    mig_profile: str | None
    memory_bytes: int | None
    slot: int | None = None  # MIG slot on its GPU; None for a full card
    driver: str | None = None  # its GPU's NVIDIA driver (None: not declared)


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    source: str  # "nvml" | "declared" | "none"
    detail: str  # nvml: "driver 580.65"; declared: the file; none: why

    @property
    def label(self) -> str:
        if self.source == "nvml":
            drivers = sorted({g.driver for n in self.nodes for g in n.gpus if g.driver})
            return f"NVML, driver {', '.join(drivers) or 'unknown'}"
        if self.source == "declared":
            return f"declared — no physical GPU ({self.detail})"
        return "no GPU"

    def allocatable(self) -> Iterator[AllocatableDevice]:
        # A GPU in MIG mode cannot be handed out whole: only its MIG devices.
        for node in self.nodes:
            for gpu in node.gpus:
                if not gpu.mig_enabled:
                    yield AllocatableDevice(
                        gpu.uuid, node.name, gpu.uuid, gpu.index, gpu.model, None,
                        gpu.memory_bytes, driver=gpu.driver,
                    )
                    continue
                for mig in gpu.mig_devices:
                    yield AllocatableDevice(
                        mig.uuid, node.name, gpu.uuid, gpu.index, gpu.model, mig.profile,
                        mig.memory_bytes, mig.index, gpu.driver,
                    )

    def device_uuids(self) -> set[str]:
        return {d.uuid for d in self.allocatable()}


class InventoryError(ValueError):
    """A declared inventory that cannot be used; `errors` lists every problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


_TOP_KEYS = {"nodes"}
_NODE_KEYS = {"name", "gpus"}
_GPU_KEYS = {"model", "memory", "mig", "driver"}


def _unknown_keys(data: dict, allowed: set[str], where: str, errors: list[str]) -> None:
    for key in data:
        if key not in allowed:
            errors.append(f"{where}: unknown key {shown(key)} "
                          f"(allowed: {', '.join(sorted(allowed))})")


def _parse_mig(
    raw: object, model: str, node: str, index: int, where: str, errors: list[str]
) -> tuple[MigDevice, ...]:
    gpu_uuid = f"GPU-declared-{node}-{index}"
    if model not in MIG_PROFILES:
        with_mig = ", ".join(MIG_PROFILES)
        errors.append(f"{where}.mig: {model} has no MIG support (MIG models: {with_mig})")
        return ()
    if not isinstance(raw, list):
        errors.append(f"{where}.mig: expected a list of MIG profiles, like [1g.18gb, 2g.35gb]")
        return ()
    valid = MIG_PROFILES[model]
    devices: list[MigDevice] = []
    for slot, profile in enumerate(raw):
        if not isinstance(profile, str) or profile not in valid:
            errors.append(
                f"{where}.mig[{slot}]: {shown(profile)} is not a MIG profile of {model} "
                f"(valid: {', '.join(valid)})"
            )
            continue
        devices.append(
            MigDevice(
                f"MIG-declared-{node}-{index}-{slot}-{profile}", profile, mig_memory_bytes(profile),
                gpu_uuid, slot,
            )
        )
    counts = Counter(d.profile for d in devices)
    for profile, count in counts.items():
        if count > valid[profile]:
            errors.append(
                f"{where}.mig: {count}× {profile} but a {model} holds at most {valid[profile]}"
            )
    slices = sum(mig_compute_slices(d.profile) for d in devices)
    if slices > MIG_COMPUTE_SLICES_PER_GPU:
        errors.append(
            f"{where}.mig: {slices} compute slices in all, but a {model} has "
            f"{MIG_COMPUTE_SLICES_PER_GPU}"
        )
    return tuple(devices)


def _parse_gpu(raw: object, node: str, index: int, where: str, errors: list[str]) -> Gpu | None:
    if not isinstance(raw, dict):
        errors.append(f"{where}: expected a mapping like {{model: H200, memory: 141Gi}}")
        return None
    _unknown_keys(raw, _GPU_KEYS, where, errors)
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip():
        errors.append(f"{where}.model: missing (a model key such as H200 or A100-80GB)")
        return None
    memory = GPU_MEMORY.get(model)
    if "memory" in raw:
        try:
            memory = parse_quantity(raw["memory"])
        except ValueError as exc:
            errors.append(f"{where}.memory: {exc}")
    driver = raw.get("driver")
    if driver is not None and not isinstance(driver, str):
        # An unquoted 570.10 reads as the float 570.1: insist on the string.
        errors.append(f"{where}.driver: {shown(driver)} must be a quoted string, like \"580.159\"")
        driver = None
    mig_enabled = "mig" in raw
    mig_devices = _parse_mig(raw["mig"], model, node, index, where, errors) if mig_enabled else ()
    return Gpu(
        f"GPU-declared-{node}-{index}", index, model, memory, mig_enabled, mig_devices, driver
    )


def _parse_node(raw: object, where: str, names: set[str], errors: list[str]) -> Node | None:
    if not isinstance(raw, dict):
        errors.append(f"{where}: expected a mapping with name and gpus")
        return None
    _unknown_keys(raw, _NODE_KEYS, where, errors)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.append(f"{where}.name: missing (a node name such as local)")
        return None
    if name in names:
        errors.append(f"{where}.name: duplicate node name {shown(name)}")
    names.add(name)
    gpus_raw = raw.get("gpus", [])
    if not isinstance(gpus_raw, list):
        errors.append(f"{where}.gpus: expected a list of GPUs")
        return None
    gpus = [_parse_gpu(g, name, i, f"{where}.gpus[{i}]", errors) for i, g in enumerate(gpus_raw)]
    return Node(name, tuple(g for g in gpus if g is not None))


def parse_declared_inventory(data: object, source: str) -> Inventory:
    """Inventory from a declared file's parsed YAML; InventoryError lists every problem."""
    errors: list[str] = []
    nodes: list[Node] = []
    if isinstance(data, dict):
        _unknown_keys(data, _TOP_KEYS, "top level", errors)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        errors.append("nodes: missing (expected `nodes:` with a list of nodes)")
    else:
        names: set[str] = set()
        for i, raw in enumerate(data["nodes"]):
            node = _parse_node(raw, f"nodes[{i}]", names, errors)
            if node is not None:
                nodes.append(node)
    if errors:
        raise InventoryError([f"{source}: {e}" for e in errors])
    return Inventory(tuple(nodes), "declared", source)


def load_declared_inventory(path: str | os.PathLike) -> Inventory:
    """Read and check a declared inventory file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError([f"{path}: file not found"]) from None
    except OSError as exc:
        raise InventoryError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_declared_inventory(data, str(path))
