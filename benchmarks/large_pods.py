"""Adversarial pods of growing size: the cost of an admission must grow with the pod (and the ConfigMaps it
names), and no lock shared with other namespaces may be held long by one pod.

    python benchmarks/large_pods.py [--scale 8] [--runs 3] [--profile SHAPE]

Each shape is built at sizes 1, 2, 4, ... `--scale`, and every body goes through the server's request
handler in process (`AdmissionHandler.handle`: /mutate, then /validate of the patched pod, as a dry run)
over a live source (`cluster.source.LiveSource` on a synced `ClusterCache` and an in-process reservation
store), so both webhooks take the locks they take in production. The shapes:

- `envfrom`: 10*s containers, each with 10 envFrom entries of one ConfigMap under different prefixes,
  the ConfigMap (in the watch cache) holding 500*s keys that an envFrom prefix could make into a GPU
  variable (`_k<i>`): the pod and the ConfigMap grow together;
- `envfrom-denied`: the same, with prefix `CUDA_DEVIC` on every entry (`E_k<i>` keys): every key refused;
- `init`: 600*s init containers (up to 4,800) with an env entry and a volume mount each;
- `env`: one GPU container with 2,500*s env entries;
- `scheduling`: 250*s tolerations, 25*s node affinity terms of 10 expressions, 250*s volumes.

Printed per size: body KiB (pod plus ConfigMap), wall milliseconds for /mutate and /validate, microseconds
per KiB, and the longest time each shared lock was held during them: the plan lock and the view lock of
the source, the reservation store's lock, and the watch cache's lock (the pod is also fed to the cache as
its watch would deliver it, timed apart). Per shape: the ratio of microseconds per KiB at the largest size
to the smallest (linear: about 1; quadratic: about the size ratio). The baseline is an ordinary 1-GPU pod
through the same path in the same run. Ends with one JSON line. Targets: every ratio under 3, and no lock
held longer than 5 ms by one pod.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import logging
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jsonpatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from server_support import cluster_objects  # noqa: E402

from webhook.cluster.cache import KINDS, ClusterCache  # noqa: E402
from webhook.cluster.reservations import InProcessStore, Ledger  # noqa: E402
from webhook.cluster.source import LiveSource  # noqa: E402
from webhook.core.policy.model import Policy  # noqa: E402
from webhook.policyfile.holder import PolicyHolder  # noqa: E402
from webhook.server.app import ServerConfig, create_app, handler_of  # noqa: E402
from webhook.server.review import decode_patch  # noqa: E402

NS = "team-a"
LOCK_TARGET_MS = 5.0
RATIO_TARGET = 3.0
KIND_OF = {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas", "ConfigMap": "configmaps"}


class TimedLock:
    """A lock (or RLock) that records the longest time it was held, outermost acquire to last release."""

    def __init__(self, inner: Any, name: str, longest: dict[str, float]) -> None:
        self.inner, self.name, self.longest = inner, name, longest
        self.depth: dict[int, int] = {}
        self.since: dict[int, float] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self.inner.acquire(blocking, timeout))
        if got:
            me = threading.get_ident()
            self.depth[me] = self.depth.get(me, 0) + 1
            if self.depth[me] == 1:
                self.since[me] = time.perf_counter()
        return got

    def release(self) -> None:
        me = threading.get_ident()
        self.depth[me] -= 1
        if self.depth[me] == 0:
            held = time.perf_counter() - self.since.pop(me)
            self.longest[self.name] = max(self.longest.get(self.name, 0.0), held)
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: Any) -> None:
        self.release()


def config_map(keys: int, stem: str) -> dict[str, Any]:
    data = {f"{stem}{i}": "v" for i in range(keys)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": NS}, "data": data}


def gpu_container(name: str = "main") -> dict[str, Any]:
    return {"name": name, "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}


def shape(kind: str, s: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The pod's spec and the ConfigMap it names (None: none) of a shape at size `s`."""
    if kind == "baseline":
        return {"containers": [gpu_container()]}, None
    if kind in ("envfrom", "envfrom-denied"):
        prefixes = ["CUDA_DEVIC"] * 10 if kind == "envfrom-denied" else [f"APP{j}_" for j in range(10)]
        entries = [{"configMapRef": {"name": "settings"}, "prefix": p} for p in prefixes]
        containers = [{"name": f"c{i}", "image": "x", "envFrom": copy.deepcopy(entries)} for i in range(10 * s)]
        containers[0]["resources"] = gpu_container()["resources"]
        return {"containers": containers}, config_map(500 * s, "E_k" if kind == "envfrom-denied" else "_k")
    if kind == "init":
        inits = [{"name": f"i{i}", "image": "x", "env": [{"name": "STEP", "value": str(i)}],
                  "volumeMounts": [{"name": "data", "mountPath": "/data"}]} for i in range(600 * s)]
        return {"containers": [gpu_container()], "initContainers": inits,
                "volumes": [{"name": "data", "emptyDir": {}}]}, None
    if kind == "env":
        main = gpu_container()
        main["env"] = [{"name": f"VAR_{i}", "value": str(i)} for i in range(2500 * s)]
        return {"containers": [main]}, None
    if kind == "scheduling":
        main = gpu_container()
        main["volumeMounts"] = [{"name": f"v{i}", "mountPath": f"/v{i}"} for i in range(250 * s)]
        terms = [{"matchExpressions": [{"key": f"k{t}-{e}", "operator": "NotIn", "values": ["a", "b"]}
                                       for e in range(10)]} for t in range(25 * s)]
        return {"containers": [main],
                "tolerations": [{"key": f"t{i}", "operator": "Exists", "effect": "NoSchedule"} for i in range(250 * s)],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": terms}}},
                "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(250 * s)]}, None
    raise ValueError(kind)


def review(spec: dict[str, Any], uid: str) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": NS}, "spec": spec}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS,
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod, "dryRun": True}}


class Rig:
    """A handler over a live source whose shared locks are timed."""

    def __init__(self, extra: list[dict[str, Any]]) -> None:
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        for obj in [*cluster_objects(), *extra]:
            by_kind[KIND_OF[obj["kind"]]].append(obj)
        self.cache = ClusterCache()
        for kind in KINDS:
            self.cache.replace(kind, by_kind[kind])
            self.cache.heard(kind)
        store = InProcessStore()
        self.source = LiveSource(self.cache, Ledger(store, clock=self.cache.clock))
        self.longest: dict[str, float] = {}
        self.source._plan_lock = TimedLock(self.source._plan_lock, "plan", self.longest)  # type: ignore[assignment]
        self.source._view_lock = TimedLock(self.source._view_lock, "view", self.longest)  # type: ignore[assignment]
        store._lock = TimedLock(store._lock, "reservations", self.longest)  # type: ignore[assignment]
        self.cache._lock = TimedLock(self.cache._lock, "cache", self.longest)  # type: ignore[assignment]
        config = ServerConfig(source=self.source, namespace="gpu-admission", record_key=b"k" * 32,
                              policy=PolicyHolder(None, loader=lambda _path: Policy()))
        self.handler = handler_of(create_app(config))

    def admit(self, spec: dict[str, Any], n: int) -> tuple[float, float, str, dict[str, Any]]:
        """Wall seconds of /mutate and /validate, the verdict, and the final pod."""
        body = json.dumps(review(spec, f"m-{n}")).encode()
        started = time.perf_counter()
        answer = self.handler.handle("mutate", "application/json", body, len(body))
        mutate = time.perf_counter() - started
        response = answer.body["response"]
        if not response["allowed"]:
            return mutate, 0.0, f"denied ({response['status']['reason']})", json.loads(body)["request"]["object"]
        final = json.loads(body)
        pod = jsonpatch.apply_patch(final["request"]["object"], decode_patch(response))
        pod["metadata"]["uid"] = f"pod-{n}"
        final["request"]["object"] = pod
        body = json.dumps(final).encode()
        started = time.perf_counter()
        answer = self.handler.handle("validate", "application/json", body, len(body))
        validate = time.perf_counter() - started
        response = answer.body["response"]
        verdict = "allowed" if response["allowed"] else f"denied at validation ({response['status']['reason']})"
        return mutate, validate, verdict, pod


def measure(kind: str, s: int, runs: int) -> dict[str, Any]:
    spec, cm = shape(kind, s)
    rig = Rig([cm] if cm else [])
    kib = (len(json.dumps(review(spec, "x"))) + (len(json.dumps(cm)) if cm else 0)) / 1024
    rig.admit(spec, 0)  # warm: the placement index, the compiled policy
    rig.longest.clear()
    times, verdict, pod = [], "", {}
    for n in range(runs):
        mutate, validate, verdict, pod = rig.admit(spec, n + 1)
        times.append((mutate, validate))
    admission = dict(rig.longest)
    rig.longest.clear()
    pod = copy.deepcopy(pod)
    pod["metadata"].update(uid="watched", resourceVersion="1")
    pod["status"] = {"phase": "Pending"}
    rig.cache.apply("pods", "ADDED", pod)  # as the watch delivers it once created
    mutate = statistics.median(t[0] for t in times)
    validate = statistics.median(t[1] for t in times)
    return {"shape": kind, "size": s, "kib": round(kib, 1), "mutate_ms": round(mutate * 1000, 2),
            "validate_ms": round(validate * 1000, 2), "us_per_kib": round((mutate + validate) * 1e6 / kib, 1),
            "verdict": verdict, "locks_ms": {k: round(v * 1000, 3) for k, v in sorted(admission.items())},
            "cache_apply_lock_ms": round(rig.longest.get("cache", 0.0) * 1000, 3)}


SHAPES = ("envfrom", "envfrom-denied", "init", "env", "scheduling")


def sizes(scale: int) -> list[int]:
    out, s = [], 1
    while s <= scale:
        out.append(s)
        s *= 2
    return out


def profile(kind: str, scale: int) -> None:
    spec, cm = shape(kind, scale)
    rig = Rig([cm] if cm else [])
    rig.admit(spec, 0)
    profiler = cProfile.Profile()
    profiler.runcall(rig.admit, spec, 1)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=8, help="the largest size (sizes double from 1)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=SHAPES, help="print a cProfile listing of one admission instead")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    if args.profile:
        profile(args.profile, args.scale)
        return 0
    base = measure("baseline", 1, max(args.runs, 20))
    print(f"{'shape':<16}{'size':>5}{'KiB':>9}{'mutate ms':>11}{'validate ms':>13}{'us/KiB':>9}"
          f"{'longest lock ms':>17}{'cache apply ms':>16}  answer")

    def row(r: dict[str, Any]) -> None:
        lock = max(r["locks_ms"].values(), default=0.0)
        print(f"{r['shape']:<16}{r['size']:>5}{r['kib']:>9.1f}{r['mutate_ms']:>11.2f}{r['validate_ms']:>13.2f}"
              f"{r['us_per_kib']:>9.1f}{lock:>17.3f}{r['cache_apply_lock_ms']:>16.3f}  {r['verdict']}")

    row(base)
    results: dict[str, Any] = {"baseline_us_per_kib": base["us_per_kib"],
                               "baseline_lock_ms": max(base["locks_ms"].values(), default=0.0), "shapes": {}}
    ok = True
    for kind in SHAPES:
        rows = [measure(kind, s, args.runs) for s in sizes(args.scale)]
        for r in rows:
            row(r)
        ratio = rows[-1]["us_per_kib"] / rows[0]["us_per_kib"]
        lock = max(max(r["locks_ms"].values(), default=0.0) for r in rows)
        cache = max(r["cache_apply_lock_ms"] for r in rows)
        print(f"{'':<16}per KiB, largest / smallest: {ratio:.2f} (linear: about 1); x baseline: "
              f"{rows[-1]['us_per_kib'] / base['us_per_kib']:.1f}; longest lock {lock:.2f} ms")
        results["shapes"][kind] = {"ratio": round(ratio, 2), "largest_kib": rows[-1]["kib"],
                                   "largest_ms": round(rows[-1]["mutate_ms"] + rows[-1]["validate_ms"], 1),
                                   "longest_lock_ms": lock, "cache_apply_lock_ms": cache}
        ok = ok and ratio < RATIO_TARGET and lock < LOCK_TARGET_MS
    print(f"targets: per-KiB cost of the largest under {RATIO_TARGET:.0f}x the smallest; no admission holds a shared "
          f"lock {LOCK_TARGET_MS:.0f} ms or more")
    print("targets met" if ok else "TARGETS MISSED")
    print(json.dumps(results, separators=(",", ":")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
