"""Admission of pods near the API server's 3 MiB object limit: work must stay linear in their size.

    python benchmarks/big_pods.py [--containers 20000] [--runs 3]

Each pod is one AdmissionReview body with tens of thousands of containers (a GPU slice in the first,
env entries, GPU resources, an isolation breach or an unknown accelerator in the others), fed to the
server's request handler in process (`AdmissionHandler.handle`: JSON parse, fast paths, the core, the
patch, the response). The baseline, measured in the same run, is `json.loads` of the same body: the
ratio is what deciding adds to reading it. CPU seconds (process time), so other load on the host
counts less. Targets: every body answered in under a second of CPU, and a pod twice as big costing at
most about twice as much (a quadratic step would cost four times).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from server_support import cluster_objects  # noqa: E402

from webhook.cluster.translate import build_snapshot  # noqa: E402
from webhook.server.app import ServerConfig, create_app, handler_of  # noqa: E402
from webhook.server.review import decode_patch  # noqa: E402
from webhook.server.source import StaticSource  # noqa: E402

TARGET_CPU_S = 1.0
MAX_BODY = 3 * 1024 * 1024


def container(i: int, shape: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": f"c{i}", "image": "registry.example.com/app:1"}
    if shape == "env":
        c["env"] = [{"name": "MODE", "value": "x"}, {"name": "RANK", "value": str(i)}]
    elif shape == "gpu-0":
        c["resources"] = {"limits": {"nvidia.com/gpu": "0"}}
    elif shape == "ld-preload":
        c["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        c["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
    elif shape == "unknown-accelerator":
        c["resources"] = {"limits": {"amd.com/gpu": "1"}}
    return c


def body(containers: int, shape: str) -> bytes:
    items = [container(i, shape) for i in range(containers)]
    items[0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "team-a"},
           "spec": {"containers": items}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "big-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a",
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod, "dryRun": True}}
    return json.dumps(review, separators=(",", ":")).encode()


def mutated(raw: bytes, response: dict[str, Any]) -> bytes:
    """The body the validating webhook gets: the pod after the patch (the same body when none)."""
    if not response.get("patch"):
        return raw
    review = json.loads(raw)
    review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], decode_patch(response))
    review["request"]["object"]["metadata"]["uid"] = "big-pod"
    return json.dumps(review, separators=(",", ":")).encode()


def cpu(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        started = time.process_time()
        result = fn()
        times.append(time.process_time() - started)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # one admission log line per call is not what is measured
    handler = handler_of(create_app(ServerConfig(source=StaticSource(build_snapshot(cluster_objects())))))
    ok = True
    print(f"{'pod':<22}{'containers':>11}{'body KiB':>10}{'json.loads ms':>15}{'mutate ms':>11}{'x json':>8}"
          f"{'validate ms':>13}{'x json':>8}  answer")
    for shape in ("env", "gpu-0", "ld-preload", "unknown-accelerator"):
        per_size = []
        for n in (args.containers // 2, args.containers):
            raw = body(n, shape)
            if len(raw) > MAX_BODY:
                print(f"{shape}: {len(raw)} bytes is over the 3 MiB limit; use fewer --containers")
                return 2
            base, _ = cpu(lambda raw=raw: json.loads(raw), args.runs)
            mutate, answer = cpu(lambda raw=raw: handler.handle("mutate", "application/json", raw, len(raw)), args.runs)
            response = answer.body["response"]
            final = mutated(raw, response)
            verdict = "allowed" if response["allowed"] else f"denied ({response['status']['reason']})"
            row = (f"{shape:<22}{n:>11}{len(raw) / 1024:>10.0f}{base * 1000:>15.1f}{mutate * 1000:>11.0f}"
                   f"{mutate / base:>8.1f}")
            if len(final) > MAX_BODY:  # the API server refuses to store it; validation never sees it
                validate = 0.0
                print(f"{row}{'-':>13}{'-':>8}  {verdict}; patched pod {len(final) / 1024:.0f} KiB, over 3 MiB")
            else:
                validate, _ = cpu(lambda f=final: handler.handle("validate", "application/json", f, len(f)), args.runs)
                print(f"{row}{validate * 1000:>13.0f}{validate / base:>8.1f}  {verdict}")
            per_size.append(max(mutate, validate))
            ok = ok and max(mutate, validate) < TARGET_CPU_S
        growth = per_size[1] / per_size[0]
        ok = ok and growth < 3.0
        print(f"{'':<22}twice the containers: {growth:.1f}x the CPU (linear: about 2)")
    print(f"target: every body under {TARGET_CPU_S:.0f} s of CPU, twice the size under 3x the CPU")
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
