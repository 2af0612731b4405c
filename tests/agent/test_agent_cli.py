"""`gpu-admission agent`: arguments, --print/--once, the loop, and exit code 3 without NVML."""

from __future__ import annotations

import argparse
import ctypes.util
import io
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import fake_nvml
import pytest
from fake_custom_objects import FakeCustomObjects

from webhook.agent.discovery import discover
from webhook.agent.metrics import AgentMetrics
from webhook.commands import agent as agent_main
from webhook.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER_HINT = "is the NVIDIA driver installed, and are the GPUs and libnvidia-ml visible to this container?"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    agent_main.add_arguments(parser)
    return parser.parse_args(argv)


class Output:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.err = io.StringIO()


def run(args: argparse.Namespace, nvml, api=None, stop=None) -> tuple[int, Output]:
    output = Output()
    code = agent_main.run_agent(args, nvml=nvml, api=api, out=output.out, err=output.err, stop=stop)
    return code, output


def expected_spec(machine) -> dict:
    nvml = machine()
    nvml.nvmlInit()
    return discover(nvml)


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver library is installed here"
)
def test_real_cli_without_nvml_library_prints_one_line_and_exits_3() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "agent", "--once", "--print", "--node-name", "x"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr == (
        f"gpu-admission agent: error: NVML is not available: NVML Shared Library Not Found; {NO_DRIVER_HINT}\n"
    )


def test_missing_bindings_exit_3_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(UserError) as raised:
        agent_main.run_agent(parse("--once", "--print", "--node-name", "x"))
    assert raised.value.exit_code == 3
    assert str(raised.value).startswith("the NVML Python bindings are missing (")
    assert str(raised.value).endswith("); install the agent extra: pip install 'gpu-admission[agent]'")


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (fake_nvml.NVMLError_DriverNotLoaded, "Driver Not Loaded"),
        (fake_nvml.NVMLError_LibraryNotFound, "NVML Shared Library Not Found"),
    ],
)
def test_nvml_init_failure_exits_3(error, words: str) -> None:
    with pytest.raises(UserError) as raised:
        run(parse("--once", "--print", "--node-name", "x"), fake_nvml.pcie_box(init_error=error))
    assert raised.value.exit_code == 3
    assert str(raised.value) == f"NVML is not available: {words}; {NO_DRIVER_HINT}"


def test_once_print_writes_one_json_line_and_shuts_nvml_down() -> None:
    nvml = fake_nvml.dgx_a100()
    code, output = run(parse("--once", "--print", "--node-name", "gpu-node-1"), nvml)
    assert code == 0
    lines = output.out.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == expected_spec(fake_nvml.dgx_a100)
    assert output.err.getvalue() == ""
    assert nvml.calls[-1] == "nvmlShutdown"


def test_once_publishes_the_inventory() -> None:
    api = FakeCustomObjects()
    code, output = run(parse("--once", "--node-name", "gpu-node-1"), fake_nvml.dgx_h100(), api=api)
    assert code == 0
    assert api.objects["gpu-node-1"]["spec"] == expected_spec(fake_nvml.dgx_h100)
    assert api.objects["gpu-node-1"]["status"]["driverVersion"] == "550.90.07"
    assert output.out.getvalue() == ""
    assert output.err.getvalue() == "gpu-admission agent: GPUInventory 'gpu-node-1' created: 8 GPUs\n"


def test_kubeconfig_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(UserError) as raised:
        run(parse("--once", "--node-name", "n1", "--kubeconfig", str(missing)), fake_nvml.pcie_box())
    assert raised.value.exit_code == 2
    assert str(raised.value) == f"{missing}: --kubeconfig file not found"


def test_node_name_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    api = FakeCustomObjects()
    run(parse("--once"), fake_nvml.pcie_box(), api=api)
    assert list(api.objects) == ["from-env"]


def test_once_failure_ends_the_run_with_one_line() -> None:
    nvml = fake_nvml.pcie_box()

    def lost() -> int:
        raise fake_nvml.NVMLError_GpuIsLost()

    nvml.nvmlDeviceGetCount = lost
    with pytest.raises(UserError) as raised:
        run(parse("--once", "--print", "--node-name", "x"), nvml)
    assert (raised.value.exit_code, str(raised.value)) == (1, "GPU discovery failed: GPU is lost")
    assert nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--once", "--node-name", "Node_1"],
         "--node-name: 'Node_1' is not a valid node name (a DNS subdomain)"),
        (["--once"], "--node-name: required (or set NODE_NAME, e.g. from the downward API spec.nodeName)"),
        (["--node-name", "n1", "--interval", "0"], "--interval: must be a positive number of seconds, got 0"),
        (["--node-name", "n1", "--metrics-port", "70000"],
         "--metrics-port: must be a port number 0..65535, got 70000"),
        (["--once", "--node-name", "n1", "--metrics-port", "9400"],
         "--metrics-port serves metrics while the agent runs: drop --once"),
    ],
)  # fmt: skip
def test_bad_arguments(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    nvml = fake_nvml.pcie_box()
    with pytest.raises(UserError) as raised:
        run(parse(*argv), nvml)
    assert (raised.value.exit_code, str(raised.value)) == (2, message)
    assert nvml.calls == []  # refused before NVML was touched


class StopAfter(threading.Event):
    """A stop event that ends the loop after `passes` waits, without sleeping."""

    def __init__(self, passes: int, between=None) -> None:
        super().__init__()
        self.passes = passes
        self.between = between
        self.waited: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout)
        if self.between is not None:
            self.between(len(self.waited))
        if len(self.waited) >= self.passes:
            self.set()
        return self.is_set()


def test_loop_prints_only_changes() -> None:
    nvml = fake_nvml.pcie_box()

    def between(passes: int) -> None:
        if passes == 2:
            fake_nvml.with_gpu(nvml, 1, remapped_rows=(0, 1, 1, 0))

    stop = StopAfter(4, between)
    code, output = run(parse("--print", "--node-name", "n1", "--interval", "5"), nvml, stop=stop)
    assert code == 0
    assert stop.waited == [5.0, 5.0, 5.0, 5.0]
    lines = [json.loads(line) for line in output.out.getvalue().splitlines()]
    assert [[gpu["healthy"] for gpu in spec["gpus"]] for spec in lines] == [
        [True, True, True, True],
        [True, False, True, True],
    ]


def test_loop_writes_only_when_changed_and_survives_failures() -> None:
    nvml = fake_nvml.pcie_box()
    api = FakeCustomObjects()
    real_count = nvml.nvmlDeviceGetCount

    def lost() -> int:
        raise fake_nvml.NVMLError_GpuIsLost()

    def between(passes: int) -> None:
        if passes == 1:
            nvml.nvmlDeviceGetCount = lost
        elif passes == 2:
            nvml.nvmlDeviceGetCount = real_count
            api.fail["get"] = [503]
        elif passes == 4:
            fake_nvml.with_gpu(nvml, 0, mig=1)

    code, output = run(parse("--node-name", "n1"), nvml, api=api, stop=StopAfter(5, between))
    assert code == 0
    assert output.err.getvalue().splitlines() == [
        "gpu-admission agent: GPUInventory 'n1' created: 4 GPUs",
        "gpu-admission agent: GPU discovery failed: GPU is lost; retrying",
        "gpu-admission agent: cannot read GPUInventory 'n1': HTTP 503 Error: injected 503; retrying",
        "gpu-admission agent: GPUInventory 'n1' replaced: 4 GPUs",
    ]
    assert [call for call, _ in api.calls] == ["get", "create", "get", "get", "get", "replace"]
    assert api.objects["n1"]["spec"]["gpus"][0]["migMode"] is True


def test_agent_counts_writes_and_failures() -> None:
    nvml = fake_nvml.pcie_box()
    nvml.nvmlInit()
    metrics = AgentMetrics(nvml, "n1")
    from webhook.agent.publish import InventoryPublisher

    api = FakeCustomObjects()
    agent = agent_main.Agent(nvml, "n1", InventoryPublisher(api, "n1"), metrics, io.StringIO(), io.StringIO())
    assert [agent.run_pass(), agent.run_pass()] == ["created", "unchanged"]
    api.fail["get"] = [500]
    assert agent.run_pass() == "failed"
    registry = metrics.registry
    assert registry.get_sample_value("gpu_admission_agent_inventory_writes_total", {"action": "created"}) == 1.0
    assert registry.get_sample_value("gpu_admission_agent_failures_total", {"stage": "publish"}) == 1.0
    assert registry.get_sample_value("gpu_admission_agent_last_success_timestamp_seconds") > 0


def test_metrics_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        nvml = fake_nvml.pcie_box()
        with pytest.raises(UserError) as raised:
            run(parse("--print", "--node-name", "n1", "--metrics-port", str(port)), nvml, stop=StopAfter(1))
    assert (raised.value.exit_code, str(raised.value)) == (2, f"--metrics-port {port}: Address already in use")
    assert nvml.calls[-1] == "nvmlShutdown"


def test_loop_serves_metrics_while_it_runs() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scraped: list[str] = []

    def between(passes: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped.append(response.read().decode())

    code, _output = run(
        parse("--print", "--node-name", "n1", "--metrics-port", str(port)),
        fake_nvml.pcie_box(),
        stop=StopAfter(1, between),
    )
    assert code == 0
    assert "gpu_admission_agent_nvml_up 1.0" in scraped[0].splitlines()
    with pytest.raises(ConnectionRefusedError):  # the agent stopped serving when it stopped
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
