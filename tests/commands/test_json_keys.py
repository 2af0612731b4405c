"""Every command's JSON output names its fields as Kubernetes does: camelCase, the same in `check` and `simulate`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[2]
CAMEL = re.compile(r"[a-z][a-zA-Z0-9]*")

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,96000,393216,8,G2
n-1,104000,524288,2,T4
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p-0,12000,16384,1,1000,
p-1,6000,12288,1,470,
p-2,8000,8192,0,0,
p-3,16000,65536,2,1000,
"""


def field_names(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, key) for every mapping key, except the keys of `policies`, which are policy names."""
    if isinstance(value, dict):
        for key, item in value.items():
            if path != "policies":
                yield path, key
            yield from field_names(item, f"{path}.{key}".lstrip("."))
    elif isinstance(value, list):
        for item in value:
            yield from field_names(item, f"{path}[]")


def test_simulate_json_fields_are_camel_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS)  # an openb name: the paper's figure comes too
    code = main(
        ["simulate", "--trace-dir", str(tmp_path), "--seeds", "1", "--policy", "best-fit",
         "--no-progress", "--jobs", "1", "-o", "json"]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    names = list(field_names(out))
    assert [(p, k) for p, k in names if not CAMEL.fullmatch(k)] == []
    figures = out["policies"]["best-fit"]
    assert set(figures) == {"unallocatedPctAt100", "perSeed", "curve", "podsPerSecond"}
    assert set(figures["perSeed"][0]) == {
        "seed", "unallocatedPctAt100", "pods", "failedPods", "unplacedCpuOnlyPods", "seconds"
    }
    assert out["paperFgd"] == {"workload": "default", "unallocatedPctAt100": 4.77}


def test_check_json_fields_are_camel_case(capsys: pytest.CaptureFixture[str]) -> None:
    main(["check", "-o", "json", str(ROOT / "examples")])
    out = json.loads(capsys.readouterr().out)
    assert out["results"] and set(out["summary"]) == {"allowed", "denied", "skipped", "errors"}
    # The report's own fields; a patch carries pod fields, whose names are the pod's.
    own = {"results": out["results"], "summary": out["summary"]}
    for result in own["results"]:
        result.pop("patch")
    names = list(field_names(own))
    assert [(p, k) for p, k in names if not CAMEL.fullmatch(k)] == []
    assert any(k == "foundBy" for _, k in names)
