"""GPU compute activity of a server's devices, 0..100, behind one interface.

Compute utilisation only: memory merely held (a loaded model) is not
activity. NVML gives utilisation for full cards but none for MIG devices;
there GPM (Hopper and newer) or DCGM's DCGM_FI_PROF_GR_ENGINE_ACTIVE (through
Prometheus) is needed. Everything here is read only: no GPU setting is changed.

Memory in use (`read_memory`) is read apart from activity, for the researcher's status
bar and the session's peak (readings.py), never for an idle decision.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlencode

import aiohttp

from gpulease.host.nvml import load_pynvml

DCGM_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
# Framebuffer used and free, MiB (dcgm-exporter's default counters); total = used + free.
DCGM_FB_USED, DCGM_FB_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
DCGM_FB_QUERY = f'{{__name__=~"{DCGM_FB_USED}|{DCGM_FB_FREE}"}}'  # both in one query
MIB = 1 << 20
Memory = tuple[int, int]  # bytes (used, total) of one device


class GpuActivitySource(Protocol):
    name: str

    async def read(self, device_uuids: list[str]) -> dict[str, float | None]:
        """Compute utilisation per device, 0..100; None where it cannot be read."""

    def describe(self, uuid: str) -> str:
        """Where the last value of `uuid` came from ('nvml', 'gpm', 'dcgm'), or why it is None."""

    async def pod_devices(self, namespace: str, pod: str) -> list[str] | None:
        """The devices this source sees a pod holding (the cluster shape, where the API
        server never says which device a pod got); None: it cannot tell, and
        `describe(pod_label(namespace, pod))` says why."""

    async def read_memory(self, device_uuids: list[str]) -> dict[str, Memory | None]:
        """Memory per device, bytes (used, total); None where it cannot be read, and
        `describe_memory(uuid)` says why. Never an estimate."""

    def describe_memory(self, uuid: str) -> str:
        """Where the last memory reading of `uuid` came from, or why it is None."""

    def for_readings(self) -> GpuActivitySource:
        """The source the readings loop reads through: this one where reading does not
        change what a pass reads next (caches shared), else a twin with its own state."""


def pod_label(namespace: str, pod: str) -> str:
    return f"pod {namespace}/{pod}"


def no_gpu_reading(namespace: str, pod: str) -> str:
    """Why a GPU pod has no reading when dcgm-exporter attributes none of its series to it.
    Under DRA (GPUKubeSpawner.gpu_allocation "dra") the exporter maps devices to pods only
    with KUBERNETES_ENABLE_DRA (its Helm value kubernetesDRA.enabled): without it every
    DRA server's GPU is unread, and the culler judges on its other signals. Even with it,
    the exporter (at its 2026 source) labels a DRA MIG slice's pod only on the whole GPU's
    series, never its instance's (their ids miss its DRA map), so a slice has none."""
    return (f"no GPU reading: dcgm-exporter attributes no device to pod {namespace}/{pod} "
            "(it maps devices to pods from the kubelet; a DRA claim's only with "
            "KUBERNETES_ENABLE_DRA, and a DRA MIG slice's instance not at all)")


def combine(source: GpuActivitySource, values: dict[str, float | None],
            threshold: float) -> tuple[float | None, str]:
    """One server's GPU signal from its devices: the busiest device.

    A device above the threshold makes the server busy; but a quiet device
    next to an unreadable one proves nothing, so the signal is then unknown.
    """
    if not values:
        return None, "no devices found for this server"
    known = {u: v for u, v in values.items() if v is not None}
    unknown = [u for u, v in values.items() if v is None]
    if known:
        best = max(known, key=lambda u: known[u])
        if not unknown or known[best] > threshold:
            return known[best], source.describe(best)
    return None, "; ".join(f"{u}: {source.describe(u)}" for u in unknown)


class StaticGpuSource:
    """A test double with the real interface: the test sets each device's utilisation."""

    name = "static"

    def __init__(self, values: dict[str, float | None] | None = None,
                 default: float | None = 0.0,
                 memory: dict[str, Memory] | None = None) -> None:
        self.values = dict(values or {})
        self.default = default
        self.memory = dict(memory or {})  # what the test set; other devices unread

    async def read(self, device_uuids: list[str]) -> dict[str, float | None]:
        return {u: self.values.get(u, self.default) for u in device_uuids}

    def describe(self, uuid: str) -> str:
        return "static" if self.values.get(uuid, self.default) is not None else \
            "set unknown by the test"

    async def pod_devices(self, namespace: str, pod: str) -> list[str] | None:
        return None

    async def read_memory(self, device_uuids: list[str]) -> dict[str, Memory | None]:
        return {u: self.memory.get(u) for u in device_uuids}

    def describe_memory(self, uuid: str) -> str:
        return "static" if uuid in self.memory else "no memory set by the test"

    def for_readings(self) -> StaticGpuSource:
        return self


class NoGpuSource:
    name = "none"

    async def read(self, device_uuids: list[str]) -> dict[str, float | None]:
        return dict.fromkeys(device_uuids)

    def describe(self, uuid: str) -> str:
        return "no GPU activity source configured"

    async def pod_devices(self, namespace: str, pod: str) -> list[str] | None:
        return None

    async def read_memory(self, device_uuids: list[str]) -> dict[str, Memory | None]:
        return dict.fromkeys(device_uuids)

    def describe_memory(self, uuid: str) -> str:
        return "no GPU source configured"

    def for_readings(self) -> NoGpuSource:
        return self


class NvmlGpuSource:
    """Embedded shape: NVML on this host. `nvml` is the pynvml module or a fake of it."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml if nvml is not None else load_pynvml()
        self._ready: bool | None = None
        self._init_error = ""
        self._why: dict[str, str] = {}
        self._memory_why: dict[str, str] = {}
        self._gpm_prev: dict[str, Any] = {}  # MIG uuid -> the previous pass's GPM sample
        self._lock = threading.Lock()  # one pass's threads share the sample buffers

    async def read(self, device_uuids: list[str]) -> dict[str, float | None]:
        return await asyncio.to_thread(self._read_sync, list(device_uuids))

    def describe(self, uuid: str) -> str:
        return self._why.get(uuid, self._init_error or "not read yet")

    async def pod_devices(self, namespace: str, pod: str) -> list[str] | None:
        self._why[pod_label(namespace, pod)] = (
            "NVML cannot tell a pod's devices (the cluster shape reads dcgm-exporter "
            "through Prometheus: prometheus:URL)")
        return None

    async def read_memory(self, device_uuids: list[str]) -> dict[str, Memory | None]:
        return await asyncio.to_thread(self._read_memory_sync, list(device_uuids))

    def describe_memory(self, uuid: str) -> str:
        return self._memory_why.get(uuid, self._init_error or "not read yet")

    def for_readings(self) -> NvmlGpuSource:
        """A twin on the same NVML: GPM's utilisation is that between a source's last two
        samples, so a loop sampling every 10 s through this one would leave a pass only
        the last 10 s of its 30 (a burst in between missed). NVML has nothing to cache."""
        return NvmlGpuSource(self.nvml)

    def _read_memory_sync(self, uuids: list[str]) -> dict[str, Memory | None]:
        with self._lock:
            if not self._ensure_init():
                self._memory_why.update(dict.fromkeys(uuids, self._init_error))
                return dict.fromkeys(uuids)
            out: dict[str, Memory | None] = {}
            for u in uuids:
                try:
                    # A MIG device's handle gives its own instance's memory, not the card's.
                    info = self.nvml.nvmlDeviceGetMemoryInfo(
                        self.nvml.nvmlDeviceGetHandleByUUID(u))
                    out[u], self._memory_why[u] = (int(info.used), int(info.total)), "nvml"
                except self.nvml.NVMLError as e:
                    out[u], self._memory_why[u] = None, f"NVML: {e}"
            return out

    def _read_sync(self, uuids: list[str]) -> dict[str, float | None]:
        with self._lock:
            if not self._ensure_init():
                for u in uuids:
                    self._why[u] = self._init_error
                return dict.fromkeys(uuids)
            out: dict[str, float | None] = {}
            for u in uuids:
                try:
                    out[u] = self._read_one(u)
                except self.nvml.NVMLError as e:
                    self._why[u] = f"NVML: {e}"
                    out[u] = None
            return out

    def _ensure_init(self) -> bool:
        if self._ready is None:
            if self.nvml is None:
                self._ready, self._init_error = False, "NVML: pynvml is not installed"
            else:
                try:
                    self.nvml.nvmlInit()
                    self._ready = True
                except self.nvml.NVMLError as e:
                    self._ready, self._init_error = False, f"NVML not available: {e}"
        return bool(self._ready)

    def _read_one(self, uuid: str) -> float | None:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        if not (uuid.startswith("MIG-") or nvml.nvmlDeviceIsMigDeviceHandle(handle)):
            self._why[uuid] = "nvml"
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        if not nvml.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice:
            self._why[uuid] = ("MIG device without GPM support on this GPU "
                               "(NVML has no utilisation for MIG; use DCGM)")
            return None
        instance = nvml.nvmlDeviceGetGpuInstanceId(handle)
        sample = nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmMigSampleGet(parent, instance, sample)
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(sample)
            raise
        previous = self._gpm_prev.get(uuid)
        self._gpm_prev[uuid] = sample
        if previous is None:
            self._why[uuid] = "GPM: first sample (utilisation needs two)"
            return None
        try:
            return self._gpm_util(uuid, previous, sample)
        finally:
            nvml.nvmlGpmSampleFree(previous)

    def _gpm_util(self, uuid: str, first: Any, second: Any) -> float | None:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        result = nvml.nvmlGpmMetricsGet(request).metrics[0]
        if result.nvmlReturn != 0:
            self._why[uuid] = f"GPM: metric error {result.nvmlReturn}"
            return None
        self._why[uuid] = "gpm"
        return max(0.0, min(100.0, float(result.value)))

    def forget(self, keep_uuids: set[str]) -> None:
        with self._lock:
            for uuid in set(self._gpm_prev) - keep_uuids:
                self.nvml.nvmlGpmSampleFree(self._gpm_prev.pop(uuid))


def _vector(body: Any) -> list[dict]:
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ValueError(f"Prometheus answered {str(body)[:200]}")
    return body.get("data", {}).get("result", [])


def dcgm_index(body: Any) -> dict[tuple[str, str], float]:
    """{(GPU UUID, GPU instance id or ''): percent} from a Prometheus `/api/v1/query` answer."""
    out: dict[tuple[str, str], float] = {}
    for item in _vector(body):
        labels, (_ts, value) = item.get("metric", {}), item["value"]
        key = (labels.get("UUID", ""), str(labels.get("GPU_I_ID", "")))
        # DCGM reports the engine-active ratio 0..1.
        out[key] = max(out.get(key, 0.0), max(0.0, min(100.0, float(value) * 100.0)))
    return out


def dcgm_memory(body: Any) -> dict[tuple[str, str], Memory]:
    """{(GPU UUID, GPU instance id or ''): (bytes used, bytes total)} from an answer to
    DCGM_FB_QUERY; a device with only one of the two series has no reading (a total
    guessed from half of it would be made up)."""
    parts: dict[tuple[str, str], dict[str, float]] = {}
    for item in _vector(body):
        labels, (_ts, value) = item.get("metric", {}), item["value"]
        name = labels.get("__name__", "")
        if name in (DCGM_FB_USED, DCGM_FB_FREE):
            key = (labels.get("UUID", ""), str(labels.get("GPU_I_ID", "")))
            # A series once per pod holding the device (DRA labels a GPU's series with each
            # of its slices' pods): the same value, kept once.
            parts.setdefault(key, {})[name] = float(value)
    return {key: (int(p[DCGM_FB_USED] * MIB), int((p[DCGM_FB_USED] + p[DCGM_FB_FREE]) * MIB))
            for key, p in parts.items() if len(p) == 2}


class PodDevice(NamedTuple):
    """A device dcgm-exporter labels with a pod: its name as `read` takes it, and why it has
    no reading of its own ('' where it has one)."""

    name: str
    unread: str = ""


def dcgm_pods(body: Any) -> dict[tuple[str, str], list[PodDevice]]:
    """{(namespace, pod): [its devices]}: the devices dcgm-exporter labels with the pod
    using them (DCGM_EXPORTER_KUBERNETES, from the kubelet's pod-resources socket; `pod`,
    `namespace`, `container`), named by `device_name` (UUID and GPU_I_ID).

    A Prometheus that does not honour the exporter's labels (honor_labels: false, a
    ServiceMonitor's default) keeps them as `exported_pod` and `exported_namespace`,
    its own `pod` and `namespace` then naming the exporter's pod: those win.

    A DRA claim's MIG device (the series carries `dra_mig_profile`) is labelled on every
    series of its GPU: `dra_slice` picks the pod's own. Full cards under DRA, and
    everything the device plugin maps (exactly, to the instance), are as labelled.
    """
    out: dict[tuple[str, str], list[PodDevice]] = {}
    slices: dict[tuple[tuple[str, str], str, str, str], list[str]] = {}
    for item in _vector(body):
        labels = item.get("metric", {})
        pod = (labels.get("exported_namespace") or labels.get("namespace") or "",
               labels.get("exported_pod") or labels.get("pod") or "")
        if not pod[1]:
            continue  # a device no pod holds (or the exporter's mapping is off)
        uuid, instance = labels.get("UUID", ""), str(labels.get("GPU_I_ID", ""))
        if profile := labels.get("dra_mig_profile", ""):
            device = labels.get("dra_device_name") or profile
            own = slices.setdefault((pod, uuid, device, profile), [])
            if labels.get("GPU_I_PROFILE") == profile and instance not in own:
                own.append(instance)
            continue
        devices = out.setdefault(pod, [])
        if (found := PodDevice(device_name(uuid, instance))) not in devices:
            devices.append(found)
    for (pod, uuid, device, profile), own in slices.items():
        out.setdefault(pod, []).append(dra_slice(uuid, device, profile, own))
    return out


def dra_slice(uuid: str, device: str, profile: str, instances: list[str]) -> PodDevice:
    """A pod's DRA MIG device on GPU `uuid` (`device`: the driver's name of it), from the
    GPU_I_IDs of its `profile` among the series labelled with the pod.

    Under DRA, dcgm-exporter maps a MIG device to its parent GPU's UUID (GetDeviceInfo) and
    labels the GPU's series with every pod holding a slice of it, each with its own slice's
    `dra_mig_profile` (and `dra_mig_device_uuid`, empty with DynamicMIG, where devices
    have none). The pod's own is then the instance of its profile, where there is one;
    two or more (slices of one profile on the GPU), or none, cannot be read: unknown,
    never the busiest of them and never 0.
    """
    if len(instances) == 1:
        return PodDevice(device_name(uuid, instances[0]))
    name = f"{uuid}/{device}"
    if instances:
        return PodDevice(name, (
            f"dcgm-exporter labels {len(instances)} {profile} instances of {uuid} with this "
            "pod (DRA maps MIG devices to their GPU): no way to tell which is its own"))
    return PodDevice(name, (
        f"dcgm-exporter labels no {profile} instance of {uuid} with this pod, only other "
        "series of that GPU (DRA maps MIG devices to their GPU)"))


def device_name(uuid: str, instance: str) -> str:
    """A device as the culler names it: a card's UUID, a MIG device's parent UUID and GI."""
    return f"{uuid}/gi{instance}" if instance else uuid


class PrometheusDcgmSource:
    """dcgm-exporter's DCGM_FI_PROF_GR_ENGINE_ACTIVE through the Prometheus HTTP API.

    One query serves all servers of a pass (cached for `cache_s`). A full card
    joins on its UUID label; a MIG device on its parent's UUID and GPU_I_ID,
    from `mig_map` {MIG uuid: (GPU uuid, GPU instance id)}. In the cluster
    shape a pod's devices are the series labelled with it (`pod_devices`,
    `dcgm_pods`); a DRA MIG device whose own series cannot be told apart from its
    GPU's others reads None, and `describe` says why (`dra_slice`). Memory
    (`read_memory`): DCGM_FI_DEV_FB_USED and _FREE, one query per refresh, joined alike.
    """

    name = "dcgm"

    def __init__(self, url: str, *, mig_map: dict[str, tuple[str, int]] | None = None,
                 timeout_s: float = 5.0, cache_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.mig_map = dict(mig_map or {})
        self.timeout_s, self.cache_s = timeout_s, cache_s
        self._index: dict[tuple[str, str], float] = {}
        self._pods: dict[tuple[str, str], list[PodDevice]] = {}
        self._unread: dict[str, str] = {}  # pods' devices without a reading: why
        self._fetched = -1e18
        self._error = ""
        self._why: dict[str, str] = {}
        self._lock = asyncio.Lock()
        # Memory: its own query and cache, read by the readings loop only (not each pass).
        self._memory: dict[tuple[str, str], Memory] = {}
        self._memory_fetched, self._memory_error = -1e18, ""
        self._memory_why: dict[str, str] = {}
        self._memory_lock = asyncio.Lock()

    async def _query(self, query: str) -> Any:
        url = f"{self.url}/api/v1/query?{urlencode({'query': query})}"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session, \
                session.get(url) as response:
            return await response.json(content_type=None)

    async def _refresh(self) -> None:
        async with self._lock:  # concurrent reads of one pass share one query
            if time.monotonic() - self._fetched < self.cache_s:
                return
            try:
                body = await self._query(DCGM_METRIC)
                self._index, self._pods, self._error = dcgm_index(body), dcgm_pods(body), ""
            except Exception as e:  # down, refusing, or garbage: all unknown
                self._index, self._pods = {}, {}
                self._error = f"Prometheus at {self.url}: {type(e).__name__}: {e}"
            self._unread = {d.name: d.unread for devices in self._pods.values()
                            for d in devices if d.unread}
            self._fetched = time.monotonic()

    def _key(self, uuid: str) -> tuple[str, str]:
        """A device's (GPU UUID, GPU_I_ID) in dcgm-exporter's series."""
        if uuid in self.mig_map:
            parent, instance = self.mig_map[uuid]
            return (parent, str(instance))
        if "/gi" in uuid:  # a pod's MIG device, as device_name named it
            parent, _, gi = uuid.rpartition("/gi")
            return (parent, gi)
        return (uuid, "")

    async def read(self, device_uuids: list[str]) -> dict[str, float | None]:
        await self._refresh()
        out: dict[str, float | None] = {}
        for uuid in device_uuids:
            unread = self._unread.get(uuid, "")  # a DRA MIG device without its own series
            value = None if unread else self._index.get(self._key(uuid))
            if self._error:
                self._why[uuid] = self._error
            elif unread:
                self._why[uuid] = unread
            elif value is None:
                self._why[uuid] = f"no {DCGM_METRIC} sample for {uuid}"
            else:
                self._why[uuid] = "dcgm"
            out[uuid] = value
        return out

    async def _refresh_memory(self) -> None:
        async with self._memory_lock:
            if time.monotonic() - self._memory_fetched < self.cache_s:
                return
            try:
                self._memory, self._memory_error = dcgm_memory(
                    await self._query(DCGM_FB_QUERY)), ""
            except Exception as e:  # down, refusing, or garbage: all unknown
                self._memory = {}
                self._memory_error = f"Prometheus at {self.url}: {type(e).__name__}: {e}"
            self._memory_fetched = time.monotonic()

    async def read_memory(self, device_uuids: list[str]) -> dict[str, Memory | None]:
        """The devices as `read` names them, joined the same way (a DRA MIG slice the pod
        mapping cannot tell apart is unread here too, for the same reason)."""
        await self._refresh_memory()
        out: dict[str, Memory | None] = {}
        for uuid in device_uuids:
            unread = self._unread.get(uuid, "")
            value = None if unread else self._memory.get(self._key(uuid))
            out[uuid], self._memory_why[uuid] = value, self._memory_error or unread or (
                f"no {DCGM_FB_USED} and {DCGM_FB_FREE} samples for {uuid}"
                if value is None else "dcgm")
        return out

    def describe_memory(self, uuid: str) -> str:
        return self._memory_why.get(uuid, self._memory_error or "not read yet")

    def for_readings(self) -> PrometheusDcgmSource:
        return self  # one cached query serves the passes and the readings loop

    async def pod_devices(self, namespace: str, pod: str) -> list[str] | None:
        await self._refresh()
        if self._error:
            self._why[pod_label(namespace, pod)] = self._error
            return None
        return [d.name for d in self._pods.get((namespace, pod), [])]

    def describe(self, uuid: str) -> str:
        return self._why.get(uuid, self._error or "not read yet")
