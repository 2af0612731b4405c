"""`gpu-admission check` on a directory of 1,000 workload documents of mixed kinds.

    python benchmarks/check_workloads.py [--documents 1000] [--runs 3]

Target: the whole command (read, find the pod templates, decide every pod) in a few seconds. The
baseline, measured in the same run, is parsing the same YAML alone (with check's own libyaml loader):
the ratio says how much finding and deciding the pods adds to reading the files.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from webhook import manifests  # noqa: E402
from webhook.cluster.files import demo_objects  # noqa: E402
from webhook.cluster.translate import build_snapshot  # noqa: E402
from webhook.commands.check import evaluate  # noqa: E402
from webhook.core.policy.model import Policy  # noqa: E402
from webhook.manifests import read_all  # noqa: E402
from webhook.workloads import workloads  # noqa: E402

NAMESPACES = ("team-a", "team-b", "sandbox", "default")
TARGET_S = 5.0


def pod(gpus: int, name: str = "main") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": "1"}
    return {"spec": {"containers": [{"name": name, "image": "registry.example.com/app:1", "resources": {
        "limits": limits}}]}}


def document(i: int) -> dict[str, Any]:
    """Document i: one of eleven kinds, in turn; GPU counts small enough that many are admitted."""
    meta = {"name": f"w{i}", "namespace": NAMESPACES[i % len(NAMESPACES)]}
    kind = i % 11
    if kind == 0:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                "spec": {"replicas": 2, "template": pod(1)}}
    if kind == 1:
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod(1)},
                                    "Worker": {"replicas": 3, "template": pod(1)}}}}
    if kind == 2:
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta, "spec": {
            "replicatedJobs": [{"name": "workers", "replicas": 2,
                                "template": {"spec": {"parallelism": 2, "template": pod(1)}}}]}}
    if kind == 3:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta, "spec": {
            "replicas": 1, "leaderWorkerTemplate": {"size": 3, "leaderTemplate": pod(1), "workerTemplate": pod(1)}}}
    if kind == 4:
        return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": {
            "headGroupSpec": {"template": pod(0)},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": pod(1)}]}}
    if kind == 5:
        return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": meta, "spec": {
            "predictor": {"minReplicas": 1, "model": {"modelFormat": {"name": "huggingface"},
                                                      "resources": {"limits": {"nvidia.com/gpu": 1}}}}}}
    if kind == 6:
        return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta, "spec": {
            "tasks": [{"name": "ps", "replicas": 1, "template": pod(0)},
                      {"name": "worker", "replicas": 2, "template": pod(1)}]}}
    if kind == 7:
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": meta, "spec": {
            "entrypoint": "train", "templates": [{"name": "train", "container": pod(1)["spec"]["containers"][0]}]}}
    if kind == 8:
        return {"apiVersion": "example.com/v1", "kind": "ModelServer", "metadata": meta,
                "spec": {"engine": {"replicas": 1, "template": pod(1)}}}
    if kind == 9:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                "spec": {"parallelism": 2, "template": pod(1)}}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"ports": [{"port": 80}]}}


def write(directory: Path, count: int, per_file: int = 10) -> list[Path]:
    files = []
    for start in range(0, count, per_file):
        path = directory / f"w{start:05d}.yaml"
        docs = [document(i) for i in range(start, min(start + per_file, count))]
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        files.append(path)
    return files


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return times, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    loader: Any = manifests._Loader  # check's own reader: libyaml's safe loader without timestamps
    with tempfile.TemporaryDirectory() as tmp:
        files = write(Path(tmp), args.documents)

        def parse_only() -> int:
            return sum(1 for f in files for _ in yaml.load_all(f.read_text(), Loader=loader))

        def in_process() -> Any:
            snapshot = build_snapshot(list(demo_objects()))
            return evaluate(workloads(read_all([tmp])), snapshot, Policy(), "default")

        def command() -> int:
            done = subprocess.run([sys.executable, "-m", "webhook.cli", "check", "-o", "json", tmp],
                                  cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
            if done.returncode not in (0, 1):
                raise SystemExit(f"check failed with exit {done.returncode}: {done.stderr[-500:]}")
            return done.returncode

        base, parsed = timed(parse_only, args.runs)
        inner, results = timed(in_process, args.runs)
        whole, _ = timed(command, args.runs)
    pods = sum(max(r.replicas, 1) for r in results if not r.skipped and not r.error)  # a denial stops its template
    verdicts = {"allowed": sum(r.allowed and not r.skipped for r in results),
                "denied": sum(not r.allowed for r in results), "skipped": sum(r.skipped for r in results)}
    base_s, inner_s, whole_s = (statistics.median(t) for t in (base, inner, whole))
    print(f"{parsed} documents in {len(files)} files -> {len(results)} pod templates / skips, "
          f"{pods} pods in them ({verdicts})")
    print(f"baseline, YAML parse alone:           median {base_s * 1000:.0f} ms over {args.runs} runs")
    print(f"read + templates + decide, in process: median {inner_s * 1000:.0f} ms  "
          f"({inner_s / base_s:.1f}x the parse; {inner_s / pods * 1e6:.0f} us per pod at most)")
    print(f"gpu-admission check -o json, whole:    median {whole_s:.2f} s  ({whole_s / base_s:.1f}x the parse)"
          f"   target < {TARGET_S:.0f} s")
    ok = whole_s < TARGET_S
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
