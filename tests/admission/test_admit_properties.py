"""Properties of the mutate -> patch -> validate chain over random clusters and request streams."""

from __future__ import annotations

import copy

import jsonpatch
import kubernetes_validate
from builders import A100, H100, L4, node, pod, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.admission import admit
from webhook.core.domain.model import QuotaLimits, Snapshot, Usage
from webhook.core.placement.state import with_allocation
from webhook.core.policy.model import Policy

SCHEMA_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NODE_KINDS = [(H100, 8, "nvswitch"), (A100, 8, "paired"), (L4, 2, "none"), (L4, 4, "none")]


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    kinds = draw(st.lists(st.sampled_from(NODE_KINDS), min_size=1, max_size=4))
    nodes = [node(f"n{i}", model, count, links) for i, (model, count, links) in enumerate(kinds)]
    quotas = {}
    for ns in ("team-a", "team-b"):
        if draw(st.booleans()):
            quotas[ns] = (
                QuotaLimits(
                    "q",
                    gpus=draw(st.integers(0, 12)),
                    memory_mib=draw(st.none() | st.integers(0, 300000)),
                    cores=draw(st.none() | st.integers(0, 1200)),
                ),
            )
    return snapshot(*nodes, quotas=quotas)


@st.composite
def gpu_pods(draw: st.DrawFn, index: int = 0) -> dict:
    limits: dict[str, object] = {}
    if draw(st.booleans()):
        limits["nvidia.com/gpu"] = draw(st.integers(1, 9))
    memory = draw(st.sampled_from([None, "mib", "pct"]))
    if memory == "mib":
        limits["nvidia.com/gpumem"] = draw(st.integers(1, 90000))
    elif memory == "pct":
        limits["nvidia.com/gpumem-percentage"] = draw(st.integers(1, 100))
    if draw(st.booleans()):
        limits["nvidia.com/gpucores"] = draw(st.integers(1, 100))
    if not limits:
        limits["nvidia.com/gpu"] = 1
    annotations = {}
    if draw(st.booleans()):
        annotations["gpu-admission.io/topology"] = draw(st.sampled_from(["required", "preferred", "none"]))
    if draw(st.booleans()):
        annotations["gpu-admission.io/placement"] = draw(st.sampled_from(["binpack", "spread", "fewest-tasks"]))
    namespace = draw(st.sampled_from(["team-a", "team-b", "sandbox"]))
    return pod(limits, name=f"p{draw(st.integers(0, 10**6))}", namespace=namespace, annotations=annotations or None)


def _check_capacity(snap: Snapshot) -> None:
    for name, n in snap.nodes.items():
        for gpu, used in zip(n.gpus, snap.usage[name].gpus, strict=False):
            assert used.memory_mib <= gpu.memory_mib, (name, gpu.index, used)
            assert used.cores <= 100, (name, gpu.index, used)
            if used.exclusive:
                assert used.tasks == 1, (name, gpu.index, used)


def _check_quota(snap: Snapshot) -> None:
    for ns, quotas in snap.quotas.items():
        used = snap.namespace_usage.get(ns, Usage())
        for q in quotas:
            for attr in ("gpus", "memory_mib", "cores"):
                limit = getattr(q, attr)
                assert limit is None or getattr(used, attr) <= limit, (ns, attr, used, q)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(gpu_pods(), min_size=1, max_size=10))
def test_stream_never_overcommits_gpus_or_quotas(snap: Snapshot, pods: list[dict]) -> None:
    policy = Policy()
    for i, p in enumerate(pods):
        m = admit.mutate(p, snap, policy)
        if not (m.allowed and m.managed and m.gpu_pod):
            continue
        patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
        patched["metadata"]["uid"] = f"uid-{i}"
        v = admit.validate(patched, snap, policy)
        assert v.allowed, v.message
        assert v.patch == ()
        assert v.allocation is not None
        snap = with_allocation(snap, patched["metadata"]["namespace"], v.allocation)
        _check_capacity(snap)
        _check_quota(snap)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), gpu_pods())
def test_patch_is_idempotent_and_the_patched_pod_is_a_valid_pod(snap: Snapshot, p: dict) -> None:
    m = admit.mutate(p, snap, Policy())
    if not m.patch:
        return
    ops = [dict(op) for op in m.patch]
    once = jsonpatch.apply_patch(p, ops)
    twice = jsonpatch.apply_patch(copy.deepcopy(once), ops)
    assert twice == once
    assert admit.mutate(once, snap, Policy()).patch == ()
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(once, version, strict=True)
