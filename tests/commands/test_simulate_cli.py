"""`gpu-admission simulate`: output shapes, the plot, argument and input errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.commands.simulate import parse_policies, parse_seeds
from webhook.core.placement.context import POLICIES
from webhook.errors import UserError
from webhook.simulate.replay import workload
from webhook.simulate.trace import load_pods

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,96000,393216,8,G2
n-1,104000,524288,2,T4
n-2,16000,122880,2,P100
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p-0,12000,16384,1,1000,
p-1,6000,12288,1,470,
p-2,4000,8192,1,320,
p-3,2000,4096,1,810,
p-4,16000,65536,2,1000,
p-5,8000,8192,0,0,
p-6,4000,8192,1,650,T4
"""


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def simulate(trace: tuple[Path, Path], *extra: str) -> int:
    nodes, pods = trace
    return main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--no-progress", "--jobs", "1", *extra])


def test_json_output_has_the_documented_shape(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate(trace, "--seeds", "1-3", "--policy", "fragmentation", "--policy", "binpack", "-o", "json")
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["policies"]
    assert list(out["policies"]) == ["fragmentation", "binpack"]
    for figures in out["policies"].values():
        assert [s["seed"] for s in figures["perSeed"]] == [1, 2, 3]
        values = [s["unallocatedPctAt100"] for s in figures["perSeed"]]
        assert figures["unallocatedPctAt100"] == pytest.approx(sum(values) / 3, abs=1e-3)
        curve = figures["curve"]
        assert curve[0] == [0, 100.0]
        assert [p[0] for p in curve] == list(range(len(curve)))
        assert 100 <= curve[-1][0] <= 130
        assert all(0 <= p[1] <= 100 for p in curve)
        assert [p for p in curve if p[0] == 100][0][1] == figures["unallocatedPctAt100"]


def test_runs_are_the_same_in_worker_processes(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    simulate(trace, "--seeds", "1-2", "-o", "json")
    alone = json.loads(capsys.readouterr().out)
    nodes, pods = trace
    main(
        [
            "simulate",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--no-progress",
            "--jobs",
            "2",
            "--seeds",
            "1-2",
            "-o",
            "json",
        ]
    )
    parallel = json.loads(capsys.readouterr().out)
    for result in (alone, parallel):
        for seed in result["policies"]["fragmentation"]["perSeed"]:
            seed.pop("seconds")
        result["policies"]["fragmentation"].pop("podsPerSecond")
    assert alone == parallel


def test_text_and_csv_outputs(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    simulate(trace, "--seeds", "5", "--policy", "best-fit")
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == [
        "policy",
        "unallocated",
        "%",
        "at",
        "100",
        "%",
        "min",
        "max",
        "seeds",
        "failed",
        "pods",
        "pods/s",
    ]
    assert text.splitlines()[1].startswith("best-fit ")
    simulate(trace, "--seeds", "5,6", "--policy", "best-fit", "-o", "csv")
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "policy,seed,unallocated_pct_at_100,pods,failed_pods"
    assert [r.split(",")[1] for r in rows[1:]] == ["5", "6", "mean"]


def test_plot_writes_a_png(trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "curve.png"
    assert simulate(trace, "--seeds", "1", "--policy", "all", "--plot", str(target)) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = capsys.readouterr().out.splitlines()[1:8]
    assert sorted(r.split()[0] for r in rows) == sorted(POLICIES)


def test_progress_goes_to_stderr(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--jobs", "1", "--seeds", "1", "-o", "json"])
    captured = capsys.readouterr()
    assert json.loads(captured.out)["policies"]
    assert re.fullmatch(r"simulate: fragmentation seed 1: 20 pods, \d+ failed, \d+ pods/s \(1/1\)\n", captured.err)


def test_trace_dir_and_workload_pick_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_small.csv").write_text(PODS)
    code = main(
        ["simulate", "--trace-dir", str(tmp_path), "--workload", "small", "--seeds", "1", "--no-progress", "-o", "json"]
    )
    assert code == 0
    arrivals = workload(load_pods(tmp_path / "openb_pod_list_small.csv"), 12_000, 1, 1.3)
    assert json.loads(capsys.readouterr().out)["policies"]["fragmentation"]["perSeed"][0]["pods"] == len(arrivals)


def test_bad_csv_is_one_line_naming_file_line_and_column(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    pods.write_text(PODS + "p-7,1000,10,1,two\n")
    assert simulate(trace, "--seeds", "1") == 2
    err = capsys.readouterr().err
    assert err == f"gpu-admission simulate: error: {pods}:9: column gpu_milli: 'two' is not a whole number\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "tetris"], "--policy: unknown policy 'tetris'"),
        (["--seeds", "9-1"], "--seeds: '9-1' is not a seed or a range like 42-51"),
        (["--tune", "0"], "--tune: 0.0 is outside 0..10"),
        (["--plot", "out.pdf"], "--plot: out.pdf must name a .png file"),
    ],
)
def test_bad_arguments_are_user_errors(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert simulate(trace, *args) == 2
    assert message in capsys.readouterr().err


def test_files_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-progress"]) == 2
    assert "give --nodes FILE and --pods FILE, or --trace-dir DIR" in capsys.readouterr().err


def test_seed_and_policy_lists() -> None:
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("3,1-2,3") == [3, 1, 2]
    assert parse_policies(None) == ["fragmentation"]
    assert parse_policies(["binpack,spread", "binpack"]) == ["binpack", "spread"]
    with pytest.raises(UserError):
        parse_seeds("a")


def test_plot_without_matplotlib_names_the_extra_before_running(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert simulate(trace, "--seeds", "1", "--plot", str(tmp_path / "out.png")) == 2
    captured = capsys.readouterr()
    assert "pip install 'gpu-admission[plot]'" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and not (tmp_path / "out.png").exists()
