"""Prometheus metrics of the node agent: per-GPU readings at scrape time, served over HTTP."""

from __future__ import annotations

import urllib.request

import fake_nvml
from prometheus_client import generate_latest

from webhook.agent.metrics import AgentMetrics, serve_metrics

MIB = 1024 * 1024


def labels(index: int) -> dict[str, str]:
    return {
        "node": "gpu-node-1",
        "gpu": str(index),
        "uuid": f"GPU-14000000-0000-4000-8000-00000000000{index}",
        "model": "NVIDIA-L4",
    }


def started(nvml: fake_nvml.FakeNvml) -> AgentMetrics:
    nvml.nvmlInit()
    return AgentMetrics(nvml, "gpu-node-1")


def test_per_gpu_readings() -> None:
    registry = started(fake_nvml.pcie_box()).registry
    for i in range(4):
        sample = lambda name, i=i: registry.get_sample_value(name, labels(i))  # noqa: E731
        assert sample("gpu_admission_gpu_memory_used_bytes") == (300 + i) * MIB
        assert sample("gpu_admission_gpu_memory_total_bytes") == 23034 * MIB
        assert sample("gpu_admission_gpu_utilization_ratio") == i / 10
        assert sample("gpu_admission_gpu_temperature_celsius") == 40 + i
        assert sample("gpu_admission_gpu_healthy") == 1.0
    assert registry.get_sample_value("gpu_admission_agent_nvml_up") == 1.0


def test_a_board_without_power_reading_is_left_out_of_that_metric_only() -> None:
    registry = started(fake_nvml.pcie_box()).registry
    assert [registry.get_sample_value("gpu_admission_gpu_power_watts", labels(i)) for i in range(4)] == [
        27.5,
        27.5,
        27.5,
        None,
    ]
    assert registry.get_sample_value("gpu_admission_gpu_temperature_celsius", labels(3)) == 43.0


def test_readings_are_taken_at_scrape_time() -> None:
    nvml = fake_nvml.pcie_box()
    registry = started(nvml).registry
    assert registry.get_sample_value("gpu_admission_gpu_temperature_celsius", labels(0)) == 40.0
    fake_nvml.with_gpu(nvml, 0, reading=fake_nvml.Reading(temperature=81), remapped_rows=(0, 1, 1, 0))
    assert registry.get_sample_value("gpu_admission_gpu_temperature_celsius", labels(0)) == 81.0
    assert registry.get_sample_value("gpu_admission_gpu_healthy", labels(0)) == 0.0


def test_nvml_failing_shows_as_down_with_no_gpu_samples() -> None:
    nvml = fake_nvml.pcie_box()
    registry = started(nvml).registry

    def lost() -> int:
        raise fake_nvml.NVMLError_GpuIsLost()

    nvml.nvmlDeviceGetCount = lost
    text = generate_latest(registry).decode()
    assert registry.get_sample_value("gpu_admission_agent_nvml_up") == 0.0
    assert 'gpu="0"' not in text


def test_one_gpu_lost_mid_scrape_leaves_the_others() -> None:
    nvml = fake_nvml.pcie_box()
    registry = started(nvml).registry
    real_uuid = nvml.nvmlDeviceGetUUID

    def uuid(handle):
        if handle.index == 1:
            raise fake_nvml.NVMLError_GpuIsLost()
        return real_uuid(handle)

    nvml.nvmlDeviceGetUUID = uuid
    assert registry.get_sample_value("gpu_admission_agent_nvml_up") == 0.0
    assert registry.get_sample_value("gpu_admission_gpu_temperature_celsius", labels(2)) == 42.0
    assert registry.get_sample_value("gpu_admission_gpu_temperature_celsius", labels(1)) is None


def test_agent_counters() -> None:
    metrics = started(fake_nvml.pcie_box())
    metrics.writes.labels("created").inc()
    metrics.failures.labels("publish").inc(2)
    registry = metrics.registry
    assert registry.get_sample_value("gpu_admission_agent_inventory_writes_total", {"action": "created"}) == 1.0
    assert registry.get_sample_value("gpu_admission_agent_failures_total", {"stage": "publish"}) == 2.0


def test_served_over_http() -> None:
    metrics = started(fake_nvml.dgx_h100())
    server = serve_metrics(metrics.registry, 0, addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    line = (
        'gpu_admission_gpu_memory_total_bytes{gpu="7",model="NVIDIA-H100-80GB-HBM3",node="gpu-node-1",'
        'uuid="GPU-h1000007-0000-4000-8000-000000000007"} 8.5520809984e+10'
    )
    assert line in body.splitlines()
