"""The NVML adapter: read this host's GPUs and MIG devices into an Inventory.

Read only: nothing here sets a GPU setting (MIG mode, clocks, ...). A host
without the NVIDIA driver is the normal case on CPU machines, so a missing
library means "no GPU" (None), logged at debug, never an error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from gpulease.core.model.gpu_models import mig_profile_from_attributes, model_key_from_nvml_name
from gpulease.core.model.inventory import Gpu, Inventory, MigDevice, Node

log = logging.getLogger(__name__)

_MIG_NAME_RE = re.compile(r"\bMIG\s+(\S+)$")


def load_pynvml() -> ModuleType | None:
    try:
        import pynvml  # the nvidia-ml-py distribution
    except ImportError:
        return None
    return pynvml


def nvml_text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes where newer ones return str.
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def nvml_session(nvml: Any, purpose: str) -> Iterator[bool]:
    """NVML initialised for the block, shut down after it: yields False (and logs at
    debug, naming `purpose`) where NVML cannot start, True where it did."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # NVMLError_LibraryNotFound on a CPU machine; DriverNotLoaded and
        # friends where a driver is installed but unusable.
        log.debug("NVML: not available (%s): no %s from NVML", exc, purpose)
        yield False
        return
    try:
        yield True
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("NVML: shutdown failed: %s", exc)


def read_nvml_inventory(node_name: str, nvml: Any = None) -> Inventory | None:
    """This host's GPUs through NVML; None without a driver or without GPUs.

    `nvml` is the pynvml module; tests pass a fake one in its place.
    """
    nvml = nvml if nvml is not None else load_pynvml()
    if nvml is None:
        log.debug("NVML: the pynvml module (nvidia-ml-py) is not installed")
        return None
    with nvml_session(nvml, "GPU inventory") as started:
        if not started:
            return None
        driver = nvml_text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                gpus.append(_read_gpu(nvml, index, driver))
            except nvml.NVMLError as exc:
                # A GPU that fails to answer (fallen off the bus) is left out:
                # reconcile then reports its devices as gone.
                log.warning("NVML: GPU %d cannot be read (%s); leaving it out", index, exc)
    if not gpus:
        log.debug("NVML: driver %s but no GPU", driver)
        return None
    return Inventory((Node(node_name, tuple(gpus)),), "nvml", f"driver {driver}")


def _read_gpu(nvml: Any, index: int, driver: str) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    model = model_key_from_nvml_name(nvml_text(nvml.nvmlDeviceGetName(handle)))
    uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
    memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    mig_enabled = _mig_enabled(nvml, handle)
    mig_devices = _read_mig_devices(nvml, handle, uuid, model) if mig_enabled else ()
    return Gpu(uuid, index, model, memory, mig_enabled, mig_devices, driver)


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False  # NotSupported: a GPU without MIG
    return current == nvml.NVML_DEVICE_MIG_ENABLE


def _read_mig_devices(nvml: Any, handle: Any, gpu_uuid: str, model: str) -> tuple[MigDevice, ...]:
    devices = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue  # an empty slot: no MIG device was created there
        profile, memory = _mig_profile(nvml, mig, model)
        devices.append(MigDevice(nvml_text(nvml.nvmlDeviceGetUUID(mig)), profile, memory, gpu_uuid,
                                 slot))
    return tuple(devices)


def _mig_profile(nvml: Any, mig: Any, model: str) -> tuple[str, int | None]:
    """(profile name, memory bytes) of a MIG device.

    The device name ('NVIDIA H200 MIG 1g.18gb') is exact, `+me` included; the
    attributes (slices, memory) are the fallback and give the exact memory.
    """
    slices = memory_mib = None
    try:
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        slices, memory_mib = int(attrs.gpuInstanceSliceCount), int(attrs.memorySizeMB)
    except nvml.NVMLError as exc:
        log.debug("NVML: no attributes for a MIG device: %s", exc)
    memory = memory_mib * 1024**2 if memory_mib is not None else None
    try:
        match = _MIG_NAME_RE.search(nvml_text(nvml.nvmlDeviceGetName(mig)))
    except nvml.NVMLError:
        match = None
    if match:
        return match.group(1), memory
    if slices is not None and memory_mib is not None:
        known = mig_profile_from_attributes(model, slices, memory_mib)
        return known or f"{slices}g.{round(memory_mib / 1024)}gb", memory
    return "unknown", memory
