"""The box's GPU temperatures on /hub/metrics, from NVML at each scrape (a fake pynvml:
no GPU here)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpulease.spawners.nvml_metrics import GpuTemperatureCollector, read_temperatures
from tests.unit.core.model.test_inventory import FakeNVMLError, FakePynvml


class TemperatureNvml(FakePynvml):
    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._live()
        assert sensor == self.NVML_TEMPERATURE_GPU
        if handle.get("temperature") is None:
            raise FakeNVMLError("GPU is lost")
        return handle["temperature"]


def _box(*temperatures) -> TemperatureNvml:
    return TemperatureNvml([{"name": "NVIDIA H200", "uuid": f"GPU-{i}", "memory": 1,
                             "temperature": t} for i, t in enumerate(temperatures)])


def test_each_gpus_temperature_is_read_when_scraped_and_nvml_is_shut_down():
    nvml = _box(41, 87)
    registry = CollectorRegistry()
    registry.register(GpuTemperatureCollector("box", nvml))
    assert nvml.shutdowns == 0  # registering reads nothing
    text = generate_latest(registry).decode()
    assert ('gpulease_gpu_temperature_celsius{gpu="1",model="H200",node="box",uuid="GPU-1"} '
            "87.0") in text
    assert nvml.shutdowns == 1
    nvml.gpus[1]["temperature"] = 90
    assert registry.get_sample_value("gpulease_gpu_temperature_celsius",
                                     {"gpu": "1", "model": "H200", "node": "box",
                                      "uuid": "GPU-1"}) == 90.0


def test_a_gpu_that_does_not_answer_has_no_series_and_no_nvml_means_none():
    assert [(i, c) for i, _u, _m, c in read_temperatures(_box(50, None, 60))] == [
        (0, 50.0), (2, 60.0)]
    assert read_temperatures(FakePynvml([], library_missing=True)) == []
    registry = CollectorRegistry()
    registry.register(GpuTemperatureCollector("box", FakePynvml([], library_missing=True)))
    assert "gpulease_gpu_temperature_celsius{" not in generate_latest(registry).decode()
