"""Custom placement scorers installed as `gpu_admission.scorers` entry points reach the placement."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from builders import pod

from webhook.core.admission import admit
from webhook.core.domain.model import Snapshot
from webhook.errors import UserError
from webhook.policyfile.read import discover_scorers, load_policy


def install_plugin(root: Path, module: str, body: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[gpu_admission.scorers]\nfavourite = {module}:score\n")


def test_entry_point_scorer_decides_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mixed_cluster: Snapshot
) -> None:
    install_plugin(tmp_path, "favourite_node", """
        def score(request, node, usage, option):
            return 10.0 if node.name == "l1" else 0.0
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "favourite" in discover_scorers()
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("defaults:\n  placement: favourite\n")
    policy = load_policy(policy_file)
    decision = admit.mutate(pod({"nvidia.com/gpu": 1}), mixed_cluster, policy)
    assert decision.allowed and decision.allocation is not None
    assert decision.allocation.node == "l1" and decision.allocation.policy == "favourite"


def test_broken_plugin_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_plugin(tmp_path, "broken_scorer", "raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"entry point gpu_admission.scorers:favourite .* failed to load: boom"):
        discover_scorers()
