"""Prometheus metrics of the node agent: per-GPU readings taken at scrape time, and the agent's own work.

Readings come straight from NVML when Prometheus asks, so a scrape never shows a stale value and the
agent keeps no history. A reading a card does not offer (power on some boards) is left out for that card.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .discovery import gfd_model_name, is_healthy
from .nvml import text

GPU_LABELS = ("node", "gpu", "uuid", "model")


class GpuCollector(Collector):
    """Memory used/total, utilisation, temperature, power and health of every GPU, read per scrape."""

    def __init__(self, nvml: Any, node_name: str) -> None:
        self.nvml = nvml
        self.node_name = node_name

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # no collect() at registration: that would call NVML before it is wanted

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        families = {
            "used": GaugeMetricFamily("gpu_admission_gpu_memory_used_bytes", "GPU memory in use", labels=GPU_LABELS),
            "total": GaugeMetricFamily(
                "gpu_admission_gpu_memory_total_bytes", "GPU memory installed", labels=GPU_LABELS
            ),
            "util": GaugeMetricFamily(
                "gpu_admission_gpu_utilization_ratio",
                "Share of the last sample period in which a kernel ran on the GPU (0..1)",
                labels=GPU_LABELS,
            ),
            "temp": GaugeMetricFamily(
                "gpu_admission_gpu_temperature_celsius", "GPU core temperature", labels=GPU_LABELS
            ),
            "power": GaugeMetricFamily("gpu_admission_gpu_power_watts", "GPU board power draw", labels=GPU_LABELS),
            "healthy": GaugeMetricFamily(
                "gpu_admission_gpu_healthy",
                "1 when the GPU has no lost state, failed or pending row remapping or pending retired pages",
                labels=GPU_LABELS,
            ),
        }
        up = GaugeMetricFamily("gpu_admission_agent_nvml_up", "1 when NVML answered this scrape for every GPU")
        answered = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            count, answered = 0, False
        for index in range(count):
            try:
                self._collect_gpu(index, families)
            except nvml.NVMLError:  # a GPU lost mid-scrape: the others are still worth reporting
                answered = False
        up.add_metric([], 1 if answered else 0)
        yield up
        yield from families.values()

    def _collect_gpu(self, index: int, families: dict[str, GaugeMetricFamily]) -> None:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        labels = [
            self.node_name,
            str(index),
            text(nvml.nvmlDeviceGetUUID(handle)),
            gfd_model_name(text(nvml.nvmlDeviceGetName(handle))),
        ]
        with suppress(nvml.NVMLError):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            families["used"].add_metric(labels, float(memory.used))
            families["total"].add_metric(labels, float(memory.total))
        with suppress(nvml.NVMLError):
            families["util"].add_metric(labels, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        with suppress(nvml.NVMLError):
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            families["temp"].add_metric(labels, float(temperature))
        with suppress(nvml.NVMLError):
            families["power"].add_metric(labels, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        families["healthy"].add_metric(labels, 1.0 if is_healthy(nvml, handle) else 0.0)


class AgentMetrics:
    """The agent's registry: GPU readings plus counters of inventory writes and failed passes."""

    def __init__(self, nvml: Any, node_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(GpuCollector(nvml, node_name))
        self.writes = Counter(
            "gpu_admission_agent_inventory_writes",
            "GPUInventory writes by the agent, by action (created, replaced)",
            ["action"],
            registry=self.registry,
        )
        self.failures = Counter(
            "gpu_admission_agent_failures",
            "Agent passes that failed, by stage (discover, publish)",
            ["stage"],
            registry=self.registry,
        )
        self.last_success = Gauge(
            "gpu_admission_agent_last_success_timestamp_seconds",
            "Unix time of the last pass that discovered and published the inventory",
            registry=self.registry,
        )


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> Any:
    """Serve /metrics on a background thread; returns the HTTP server (its `server_port`, `shutdown()`)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
