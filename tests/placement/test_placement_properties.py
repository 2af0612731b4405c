"""Placement invariants over random clusters and request streams, checked against brute force."""

from __future__ import annotations

from dataclasses import replace

from gpu_nodes import dgx, paired, pcie_box, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.domain.model import Node, NodeUsage
from webhook.core.domain.request import PodRequest
from webhook.core.domain.request import TopologyPreference as Topo
from webhook.core.placement.context import POLICIES, PlacementContext
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, place

KINDS = {"dgx": dgx, "paired": paired, "t4": pcie_box}


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Node]:
    count = draw(st.integers(1, 6))
    nodes: dict[str, Node] = {}
    for i in range(count):
        kind = draw(st.sampled_from(sorted(KINDS)))
        node = KINDS[kind](f"n{i}")
        sick = draw(st.sets(st.integers(0, len(node.gpus) - 1), max_size=2))
        cpu = draw(st.sampled_from([16_000, 64_000, 0]))
        gpus = tuple(replace(g, healthy=g.index not in sick) for g in node.gpus)
        nodes[node.name] = replace(node, gpus=gpus, cpu_milli=cpu or node.cpu_milli, memory_mib=node.memory_mib)
    return nodes


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    gpus = draw(st.sampled_from([1, 1, 1, 2, 2, 4, 8]))
    kind = draw(st.sampled_from(["whole", "mib", "pct", "cores"]))
    memory_mib = draw(st.sampled_from([1024, 8000, 20000])) if kind == "mib" else None
    memory_pct = draw(st.sampled_from([10, 25, 50])) if kind == "pct" else None
    cores = draw(st.sampled_from([10, 30, 60])) if kind in ("cores", "pct") else None
    return request(
        gpus,
        memory_mib=memory_mib,
        memory_pct=memory_pct,
        cores=cores,
        cpu_milli=draw(st.sampled_from([0, 1000, 8000])),
        memory_mib_host=draw(st.sampled_from([0, 4096, 65536])),
        topology=draw(st.sampled_from([None, Topo.REQUIRED, Topo.NONE])),
        models_include=draw(st.sampled_from([(), ("a100",), ("h100", "t4")])),
        uuids_include=draw(st.sampled_from([(), (), ("GPU-n0-1", "GPU-n0-2", "GPU-n1-0")])),
        uuids_exclude=draw(st.sampled_from([(), (), ("GPU-n0-0", "GPU-n2-3")])),
    )


def per_gpu(req: PodRequest, card: int) -> tuple[int, int]:
    """The request on one card, written independently of the code under test."""
    if not req.shared:
        return card, 100
    memory = req.memory_mib if req.memory_mib is not None else card * (req.memory_pct or req.cores or 100) // 100
    cores = req.cores if req.cores is not None else max(1, min(100, -(-memory * 100 // card)))
    return memory, cores


def fitting_gpus(node: Node, used: NodeUsage, req: PodRequest) -> list[int]:
    out = []
    for i, gpu in enumerate(node.gpus):
        u = used.gpus[i] if used.gpus else None
        model_ok = not req.models_include or any(m in gpu.model.lower() for m in req.models_include)
        uuid_ok = (not req.uuids_include or gpu.uuid in req.uuids_include) and gpu.uuid not in req.uuids_exclude
        if not gpu.healthy or not model_ok or not uuid_ok:
            continue
        memory, cores = per_gpu(req, gpu.memory_mib)
        if u is None:
            fits = memory <= gpu.memory_mib
        elif not req.shared:
            fits = u.tasks == 0 and u.memory_mib == 0 and u.cores == 0 and not u.exclusive
        else:
            fits = not u.exclusive and u.memory_mib + memory <= gpu.memory_mib and u.cores + cores <= 100
        if fits:
            out.append(i)
    return out


def can_host(node: Node, used: NodeUsage, req: PodRequest) -> bool:
    if node.cpu_milli - used.cpu_milli < req.cpu_milli or node.memory_mib - used.memory_mib < req.memory_mib_host:
        return False
    gpus = fitting_gpus(node, used, req)
    if req.topology is Topo.REQUIRED and req.gpus > 1:
        # An all-NVLink set of the size among the fitting GPUs (cliques on these nodes are whole kinds).
        linked = [i for i in gpus if any(node.nvlink[i][j] for j in gpus if j != i)]
        if node.gpu_model.startswith("NVIDIA-A100"):
            pairs = {i // 2 for i in linked if i ^ 1 in gpus}
            return req.gpus <= 2 and bool(pairs)
        return len(linked) >= req.gpus
    return len(gpus) >= req.gpus


def check_usage(nodes: dict[str, Node], usage: dict[str, NodeUsage]) -> None:
    for name, used in usage.items():
        node = nodes[name]
        assert used.cpu_milli <= node.cpu_milli and used.memory_mib <= node.memory_mib
        for gpu, u in zip(node.gpus, used.gpus, strict=True):
            assert u.memory_mib <= gpu.memory_mib and u.cores <= 100
            assert not u.exclusive or u.tasks == 1
            assert gpu.healthy or u.tasks == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    stream=st.lists(st.tuples(requests(), st.sampled_from(POLICIES), st.booleans()), min_size=1, max_size=25),
)
def test_place_and_commit_never_overcommit(nodes: dict[str, Node], stream: list[tuple[PodRequest, str, bool]]) -> None:
    index = NodeIndex.build(nodes, {})
    first = NodeIndex.build(nodes, {})
    cow = first.updated({})
    usage = {name: index.usage(name) for name in nodes}
    empty = dict(usage)
    for req, policy, spread_inside in stream:
        ctx = PlacementContext(policy=policy, gpu_policy="spread" if spread_inside else "binpack", limit=3, seed=7)
        found = place(req, index, ctx)
        assert place(req, cow, ctx) == found  # both ways of updating agree
        hosts = sorted(n for n in nodes if can_host(nodes[n], usage[n], req))
        ever = sorted(n for n in nodes if not nodes[n].unschedulable and can_host(nodes[n], empty[n], req))
        assert list(found.eligible) == ever, req
        assert {o.node for o in found.options} <= set(hosts) <= set(found.eligible)
        assert len(found.options) == min(3, len(hosts))
        assert sum(found.rejected.values()) == len(nodes) - len(hosts)
        for option in found.options:
            assert set(option.gpus) <= set(fitting_gpus(nodes[option.node], usage[option.node], req))
            assert len(set(option.gpus)) == req.gpus
        if found.best is None:
            continue
        name = found.best.node
        usage[name] = commit(usage[name], found.best, req, nodes[name])
        check_usage(nodes, usage)
        index.apply(name, usage[name])
        cow = cow.updated({name: usage[name]})
    rebuilt = NodeIndex.build(nodes, usage)
    assert all(index.usage(n) == cow.usage(n) == rebuilt.usage(n) == usage[n] for n in nodes)
    assert index.class_count() == cow.class_count() == rebuilt.class_count()
    assert all(first.usage(n) == empty[n] for n in nodes)  # the first index is untouched by updates
    probe = request(1, memory_pct=10, cores=10)
    assert place(probe, index, PlacementContext()) == place(probe, rebuilt, PlacementContext())
