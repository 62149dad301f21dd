"""GPU temperatures for Prometheus, read from NVML at each scrape (the embedded box).

`gpulease_gpu_temperature_celsius{node, gpu, uuid, model}` on the hub's
/hub/metrics, for the `GPUOverheat` alert (docs/monitoring.md); in the cluster
dcgm-exporter's `DCGM_FI_DEV_GPU_TEMP` plays this part. Read only, as the
inventory adapter (gpulease/host/nvml.py): a host without NVML yields no series.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from gpulease.core.model.gpu_models import model_key_from_nvml_name
from gpulease.host.nvml import load_pynvml, nvml_session, nvml_text

log = logging.getLogger(__name__)
TEMPERATURE = "gpulease_gpu_temperature_celsius"


def read_temperatures(nvml: Any) -> list[tuple[int, str, str, float]]:
    """(index, uuid, model, °C) of every GPU NVML can read; [] without NVML."""
    out: list[tuple[int, str, str, float]] = []
    with nvml_session(nvml, "GPU temperatures") as started:
        for index in range(nvml.nvmlDeviceGetCount() if started else 0):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                celsius = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                out.append((index, nvml_text(nvml.nvmlDeviceGetUUID(handle)),
                            model_key_from_nvml_name(nvml_text(nvml.nvmlDeviceGetName(handle))),
                            float(celsius)))
            except nvml.NVMLError as exc:  # one GPU that fails to answer: no series for it
                log.warning("NVML: GPU %d's temperature cannot be read (%s)", index, exc)
    return out


class GpuTemperatureCollector:
    """A Prometheus collector: this host's GPU temperatures, read when scraped."""

    def __init__(self, node: str, nvml: Any = None):
        self.node = node
        self.nvml = nvml if nvml is not None else load_pynvml()

    def describe(self) -> list:  # registering must not read NVML
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(TEMPERATURE, "GPU core temperature from NVML, degrees "
                                   "Celsius (read at each scrape)",
                                   labels=["node", "gpu", "uuid", "model"])
        for index, uuid, model, celsius in (read_temperatures(self.nvml) if self.nvml else []):
            family.add_metric([self.node, str(index), uuid, model], celsius)
        yield family


_registered: GpuTemperatureCollector | None = None


def register_gpu_temperatures(node: str) -> GpuTemperatureCollector:
    """Put the collector on the default registry (the one /hub/metrics serves), once."""
    global _registered
    if _registered is None:
        from prometheus_client import REGISTRY

        _registered = GpuTemperatureCollector(node)
        REGISTRY.register(_registered)
    return _registered
