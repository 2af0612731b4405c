"""`check` sizes a group from the controller object it is given, as the watch does once it is applied:
a PyTorchJob's Master and Worker replicas are one group of their sum, without any annotation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOB = (Path(__file__).parent.parent / "fixtures" / "workloads" / "public"
       / "training-operator-v1-examples-pytorch-mnist-v1-pytorch_job_mnist_nccl.yaml")


def test_a_pytorchjobs_pods_are_one_group_of_its_replicas() -> None:
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "check", "-n", "team-a", "-o", "json", str(JOB)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    results = data["results"] if isinstance(data, dict) else data
    groups = [p["group"] for r in results for p in r["pods"]]
    assert len(groups) == 2  # Master 1 + Worker 1
    assert all(g == {"name": "team-a/pytorchjob/pytorch-dist-mnist-nccl", "size": 2, "minimum": 2} for g in groups)
