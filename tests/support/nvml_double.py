"""NvmlDouble: a TEST DOUBLE of pynvml, the calls the culler's NvmlGpuSource makes (read only).

No GPU or driver runs in the tests: utilisation, GPM samples and memory are what the test
sets. Used by tests/integration/web/test_culler_sources.py and test_culler_readings.py;
never outside tests. (No tests in here.)
"""

from __future__ import annotations

import time
from types import SimpleNamespace


class NVMLErrorDouble(Exception):
    pass


class GpmMetricsGetDouble:
    def __init__(self):
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)]


class NvmlDouble:
    """The pynvml calls the GPU source makes. GPUs: uuid -> util; MIG: uuid -> (parent, gi);
    memory: uuid -> (bytes used, bytes total), a device not in it answering Not Supported."""

    NVMLError = NVMLErrorDouble
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1
    c_nvmlGpmMetricsGet_t = GpmMetricsGetDouble

    def __init__(self, gpus, migs, gpm_supported=True, library=True, memory=None):
        self.gpus, self.migs, self.gpm_supported, self.library = gpus, migs, gpm_supported, library
        self.memory: dict[str, tuple[int, int]] = dict(memory or {})
        self.gi_busy_time: dict[tuple[str, int], float] = {}  # cumulative busy seconds
        self.allocated: set[int] = set()
        self._next = 0
        self.calls: list[str] = []

    def nvmlInit(self):
        if not self.library:
            raise NVMLErrorDouble("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.gpus and uuid not in self.migs:
            raise NVMLErrorDouble("Not Found")
        return uuid

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return h in self.migs

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls.append("util")
        return SimpleNamespace(gpu=self.gpus[h], memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        """pynvml's c_nvmlMemory_t (v1): a MIG device handle's is its own instance's."""
        self.calls.append(f"memory {h}")
        if h not in self.memory:
            raise NVMLErrorDouble("Not Supported")
        used, total = self.memory[h]
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return self.migs[h][0]

    def nvmlDeviceGetGpuInstanceId(self, h):
        return self.migs[h][1]

    def nvmlGpmQueryDeviceSupport(self, parent):
        return SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self):
        self._next += 1
        self.allocated.add(self._next)
        return SimpleNamespace(id=self._next)

    def nvmlGpmSampleFree(self, sample):
        self.allocated.discard(sample.id)

    def nvmlGpmMigSampleGet(self, parent, gi, sample):
        self.calls.append(f"gpm {parent} {gi}")
        sample.t = time.monotonic()
        sample.busy = self.gi_busy_time.get((parent, gi), 0.0)
        return sample

    def nvmlGpmMetricsGet(self, request):
        s1, s2 = request.sample1, request.sample2
        request.metrics[0].value = 100.0 * (s2.busy - s1.busy) / max(1e-9, s2.t - s1.t)
        return request
