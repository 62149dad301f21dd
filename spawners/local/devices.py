"""Which device nodes a server may open: its GPUs' nodes and the harmless basics.

`CUDA_VISIBLE_DEVICES` only tells CUDA which devices to show; a process can
still open every `/dev/nvidia*` node and use any GPU. Where the cgroup
devices controller (or systemd's DevicePolicy) is available the server is
allowed exactly these nodes, by major:minor:

- the basics every process needs (null, zero, full, random, urandom, tty,
  ptmx, pseudo terminals);
- for a GPU server: the driver's control nodes (nvidiactl, nvidia-uvm,
  nvidia-uvm-tools, nvidia-modeset) and the assigned devices' nodes: a full
  GPU is `/dev/nvidiaN` (N = NVML's minor number); a MIG device is its
  parent's `/dev/nvidiaN` plus the MIG capability files of its GPU instance
  and compute instance (`/dev/nvidia-caps/nvidia-capM`, M read from
  `/proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access`).

The UUID → nodes map comes from NVML on a real host (`nvml_device_map`) or
from configuration (`LocalGPUSpawner.device_nodes`) for declared inventories,
whose synthetic UUIDs have no nodes. The NVML part is verified only on hosts
with NVIDIA GPUs (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulease.host.nvml import nvml_text

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class DeviceRule:
    """One allowed device: kind 'c' or 'b', major, minor (None: any), access like 'rw'."""

    kind: str
    major: int
    minor: int | None
    access: str = "rw"

    def v1(self) -> str:
        """The line for cgroup v1's devices.allow."""
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {self.major}:{minor} {self.access}"


# /dev/null, zero, full, random, urandom, tty, ptmx and the pseudo terminals
# (major 136-143) that JupyterLab's terminals open.
BASIC_DEVICES: tuple[DeviceRule, ...] = (
    DeviceRule("c", 1, 3, "rwm"), DeviceRule("c", 1, 5, "rwm"), DeviceRule("c", 1, 7, "rwm"),
    DeviceRule("c", 1, 8, "rwm"), DeviceRule("c", 1, 9, "rwm"), DeviceRule("c", 5, 0, "rwm"),
    DeviceRule("c", 5, 2, "rwm"),
    *(DeviceRule("c", major, None, "rw") for major in range(136, 144)),
)  # fmt: skip

# Nodes of the NVIDIA driver that every CUDA process opens besides its GPUs.
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                        "/dev/nvidia-modeset")

_MINOR_RE = re.compile(r"DeviceFileMinor:\s*(\d+)")
CAPS_PROC = "/proc/driver/nvidia/capabilities"


def node_paths(uuids: Sequence[str], mapping: Mapping[str, Sequence[str]]
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the nodes of the assigned devices, the UUIDs the map does not know)."""
    paths: list[str] = []
    unknown: list[str] = []
    for uuid in uuids:
        nodes = mapping.get(uuid)
        if nodes is None:
            unknown.append(uuid)
            continue
        paths.extend(p for p in nodes if p not in paths)
    return tuple(paths), tuple(unknown)


def rules_for(node_ids: Iterable[tuple[str, int, int]]) -> tuple[DeviceRule, ...]:
    """The basics plus read/write on each (kind, major, minor) given."""
    extra = sorted({DeviceRule(kind, major, minor, "rw") for kind, major, minor in node_ids})
    return (*BASIC_DEVICES, *extra)


def parse_cap_minor(text: str) -> int | None:
    """The minor number in a MIG capability `access` file ('DeviceFileMinor: 12')."""
    m = _MINOR_RE.search(text)
    return int(m.group(1)) if m else None


def mig_cap_files(gpu_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The proc files naming the capability nodes of MIG instance (gi, ci) on GPU `gpu_minor`."""
    base = f"{CAPS_PROC}/gpu{gpu_minor}/mig/gi{gi}"
    return (f"{base}/access", f"{base}/ci{ci}/access")


# --- adapters ----------------------------------------------------------------------


def node_id(path: str) -> tuple[str, int, int] | None:
    """(kind, major, minor) of a device node; None when it is missing or not a device."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev)


def allowed_nodes(gpu_paths: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """The existing nodes a server may open besides the basics (none for a CPU-only server)."""
    if not gpu_paths:
        return ()
    ids = []
    for path in (*NVIDIA_CONTROL_NODES, *gpu_paths):
        ident = node_id(path)
        if ident is not None:
            ids.append(ident)
        elif path in gpu_paths:
            log.warning("device node %s of an assigned GPU does not exist", path)
    return tuple(ids)


def nvml_device_map(nvml: Any = None, read: Callable[[str], str] | None = None
                    ) -> dict[str, list[str]]:
    """UUID → device nodes of this host's GPUs and MIG devices, through NVML.

    Empty without a driver. `nvml` is the pynvml module (tests pass a fake).
    """
    if nvml is None:
        try:
            import pynvml as nvml  # the nvidia-ml-py distribution
        except ImportError:
            return {}
    read = read or (lambda p: open(p).read())  # noqa: SIM115 - tiny proc file
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound on CPU hosts: no GPU, no map
        return {}
    mapping: dict[str, list[str]] = {}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            minor = nvml.nvmlDeviceGetMinorNumber(handle)
            gpu_node = f"/dev/nvidia{minor}"
            mapping[nvml_text(nvml.nvmlDeviceGetUUID(handle))] = [gpu_node]
            try:
                mig_on = nvml.nvmlDeviceGetMigMode(handle)[0] == 1
            except Exception:  # not MIG-capable
                mig_on = False
            if not mig_on:
                continue
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except Exception:  # an empty slot
                    continue
                gi = nvml.nvmlDeviceGetGpuInstanceId(mig)
                ci = nvml.nvmlDeviceGetComputeInstanceId(mig)
                nodes = [gpu_node]
                for proc_file in mig_cap_files(minor, gi, ci):
                    try:
                        cap = parse_cap_minor(read(proc_file))
                    except OSError:
                        cap = None
                    if cap is not None:
                        nodes.append(f"/dev/nvidia-caps/nvidia-cap{cap}")
                mapping[nvml_text(nvml.nvmlDeviceGetUUID(mig))] = nodes
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return mapping
