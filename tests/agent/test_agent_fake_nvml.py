"""The fake NVML is held to pynvml, and the agent is held to the fake: the calls match exactly."""

from __future__ import annotations

import inspect

import fake_nvml
import pynvml
import pytest
from prometheus_client import generate_latest

from webhook.agent.discovery import discover, driver_version
from webhook.agent.metrics import AgentMetrics
from webhook.agent.nvml import start, stop


def _required_parameters(function) -> list[str]:
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is inspect.Parameter.empty and name != "self"
    ]


@pytest.mark.parametrize("name", fake_nvml.FAKE_FUNCTIONS)
def test_every_fake_call_exists_in_pynvml_with_the_same_required_arguments(name: str) -> None:
    real = getattr(pynvml, name)
    assert len(_required_parameters(getattr(fake_nvml.FakeNvml, name))) == len(_required_parameters(real))


def test_constants_and_error_classes_match_pynvml() -> None:
    for name, value in vars(fake_nvml.FakeNvml).items():
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == value, name
        elif name.startswith("NVMLError_"):
            real = getattr(pynvml, name)
            assert real().value == value.value, name
            assert str(real()) == str(value()), name


def test_the_agent_makes_exactly_the_calls_the_fake_implements() -> None:
    made: set[str] = set()
    for machine in (
        fake_nvml.dgx_h100,
        fake_nvml.dgx_a100,
        fake_nvml.dgx_a100_mig,
        fake_nvml.pcie_server_bridged,
        fake_nvml.pcie_box,
    ):
        for options in ({}, {"remote_type_supported": False}):
            nvml = machine(**options)
            start(nvml)
            discover(nvml)
            driver_version(nvml)
            generate_latest(AgentMetrics(nvml, "n1").registry)
            stop(nvml)
            made.update(nvml.calls)
    retired = fake_nvml.with_gpu(fake_nvml.pcie_box(), 0, remapped_rows=None, retired_pending=0)
    start(retired)
    discover(retired)
    made.update(retired.calls)
    assert sorted(made) == list(fake_nvml.FAKE_FUNCTIONS)


def test_calls_before_init_fail_as_in_pynvml() -> None:
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.pcie_box().nvmlDeviceGetCount()
