"""The learned workload mix: one learner (core/mixlearn.py) over the GPU pods the cluster holds, for the
webhook (watch cache, reservations), `check` and the simulator."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
from server_support import gpu_node

from webhook.cluster.cache import ClusterCache
from webhook.cluster.observe import with_pod
from webhook.cluster.source import with_reservations
from webhook.cluster.translate import build_snapshot
from webhook.commands.simulate import parse_mix
from webhook.core.admission import admit
from webhook.core.admission.mutate import _context
from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.domain.shapes import EMPTY, shape_of, slice_milli
from webhook.core.placement.context import WorkloadShape
from webhook.core.placement.fragmentation import default_mix
from webhook.core.placement.mixlearn import (
    Histogram,
    Learner,
    hosts_of,
    learned_mix,
    mix_in_use,
    mix_of,
    request_shape,
)
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy, PolicyError, parse_policy
from webhook.errors import UserError
from webhook.server.metrics import mix_metric
from webhook.simulate.replay import capacity_milli, replay, workload
from webhook.simulate.trace import TracePod, make_node, to_request

H100 = "NVIDIA-H100-80GB-HBM3"
TRACE_NODES = [make_node(f"g2-{i}", 96000, 393216, 8, "G2") for i in range(3)] + [
    make_node(f"t4-{i}", 104000, 524288, 2, "T4") for i in range(3)]
TRACE_PODS = [TracePod("whole", 12000, 16384, 1, 1000), TracePod("big-share", 6000, 12288, 1, 810),
              TracePod("half", 6000, 12288, 1, 470), TracePod("third", 4000, 8192, 1, 320),
              TracePod("pair", 16000, 65536, 2, 1000), TracePod("cpu", 2000, 4096, 0, 0)]
A = shape_of(1, 500, 4000, 16000)
B = shape_of(2, 1000, 16000, 64000)


def nodes_objects(count: int = 4) -> list[dict[str, Any]]:
    return [gpu_node(f"gpu-{i}") for i in range(count)]


def gpu_pod(name: str, node: str | None, *, gpus: int = 1, share: int | None = 50, cpu: str = "4",
            memory: str = "16000Mi", models: str | None = None, phase: str = "Running") -> dict[str, Any]:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if share is not None:
        limits["nvidia.com/gpucores"] = str(share)
        limits["nvidia.com/gpumem-percentage"] = str(share)
    annotations = {"nvidia.com/use-gputype": models} if models else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {
        "limits": limits, "requests": {"cpu": cpu, "memory": memory}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "uid": name,
                                                            "annotations": annotations},
            "spec": spec, "status": {"phase": phase}}


def weights(mix: tuple[WorkloadShape, ...]) -> dict[tuple[int, int], float]:
    found: dict[tuple[int, int], float] = {}
    for s in mix:
        found[(s.gpus, s.milli)] = found.get((s.gpus, s.milli), 0.0) + s.weight
    return found


# -- the learner ------------------------------------------------------------------------------------------


def test_the_mix_follows_a_shift_in_the_workload() -> None:
    hosts = hosts_of(build_snapshot(nodes_objects()).nodes.values())
    histogram = Histogram()
    for _ in range(20):
        histogram.add(A)
    first = weights(mix_of(histogram.counts, hosts))
    assert first == {(1, 500): 1.0}
    for _ in range(400):
        histogram.add(B)
    second = weights(mix_of(histogram.counts, hosts))
    assert second[(2, 1000)] > 0.8 > second.get((1, 500), 0.0)
    for _ in range(20):  # the A pods finish: what the cluster no longer shows no longer counts
        histogram.add(A, -1)
    assert weights(mix_of(histogram.counts, hosts)) == {(2, 1000): 1.0}


def test_kinds_few_nodes_can_host_weigh_more_and_those_none_can_host_are_dropped() -> None:
    nodes = [make_node(f"g2-{i}", 96000, 393216, 8, "G2") for i in range(9)] + [
        make_node("g3", 128000, 786432, 8, "G3")]
    hosts = hosts_of(nodes)
    histogram = Histogram()
    for _ in range(90):
        histogram.add(shape_of(1, 1000, 1000))
    for _ in range(10):
        histogram.add(shape_of(8, 1000, 120000))  # only the G3 node has 120 cores
    mix = {s.gpus: s.weight for s in mix_of(histogram.counts, hosts)}
    # 90 small tasks over 80 GPUs against 10 big ones over 8: by count alone the big ones would weigh 0.1
    assert mix[8] > mix[1]
    histogram.add(shape_of(16, 1000))  # no node has 16 GPUs
    histogram.add(shape_of(1, 500, models=("A100",)))  # no node of that model
    assert {s.gpus for s in mix_of(histogram.counts, hosts)} == {1, 8}
    assert {(s.gpus, s.milli) for s in mix_of(histogram.counts, hosts)} == {(1, 1000), (8, 1000)}


def test_rare_shapes_are_left_out() -> None:
    hosts = hosts_of(build_snapshot(nodes_objects()).nodes.values())
    histogram = Histogram()
    for _ in range(1000):
        histogram.add(A)
    histogram.add(shape_of(1, 100))  # one pod in a thousand: under 1/256 of the weight
    assert weights(mix_of(histogram.counts, hosts)) == {(1, 500): 1.0}
    for _ in range(20):
        histogram.add(shape_of(1, 100))
    assert set(weights(mix_of(histogram.counts, hosts))) == {(1, 500), (1, 100)}


def test_small_changes_reuse_the_memoised_mix() -> None:
    hosts = hosts_of(build_snapshot(nodes_objects()).nodes.values())
    histogram = Histogram()
    for _ in range(280):  # equal supply on these nodes: shares 0.7 and 0.3, inside their steps of 1/16
        histogram.add(A)
    for _ in range(120):
        histogram.add(B)
    before = mix_of(histogram.counts, hosts)
    histogram.add(A)
    histogram.add(B, -1)
    assert mix_of(histogram.counts, hosts) is before  # the same tuple: every memo keyed on it still hits
    for _ in range(300):  # a real change in the workload is a new mix
        histogram.add(B)
    assert mix_of(histogram.counts, hosts) is not before


def test_the_simulators_learner_is_mix_of_after_every_pod_and_quantises_only_when_a_level_moves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `Learner` keeps the histogram pod by pod (the simulator): its mix must be `mix_of` of the counts
    # after every change, pods coming and going, rare shapes crossing the cut and levels crossing edges.
    import webhook.core.placement.mixlearn as mixlearn

    hosts = hosts_of(TRACE_NODES)
    rng = random.Random(5)
    shapes = [shape_of(1, milli, cpu, 8192) for milli in (100, 250, 470, 810, 1000) for cpu in (2000, 8000)]
    shapes += [shape_of(2, 1000, 16000, 65536), shape_of(8, 1000, 90000), shape_of(16, 1000)]  # 16: no host
    passes = []
    full = mixlearn.mix_of
    monkeypatch.setattr(mixlearn, "mix_of", lambda counts, h: passes.append(1) or full(counts, h))
    learner, histogram = Learner(hosts), Histogram()
    for step in range(3000):
        shape = rng.choices(shapes, weights=[1 + i % 5 for i in range(len(shapes))])[0]
        sign = -1 if histogram.counts.get(shape) and rng.random() < 0.3 else 1
        assert learner.add(shape, sign) and histogram.add(shape, sign)
        assert learner.counts == histogram.counts
        assert learner.mix() == full(histogram.counts, hosts), step
    assert learner.add(None) is False
    assert len(passes) < 3000 / 3  # most pods leave every level where it was


def test_nothing_observed_is_no_learned_mix_and_the_policy_uses_the_default() -> None:
    snapshot = build_snapshot(nodes_objects())
    assert learned_mix(snapshot.observed, snapshot.nodes) == ()
    assert mix_in_use(Policy(), snapshot) == ("default", default_mix_normalised())


def default_mix_normalised() -> tuple[WorkloadShape, ...]:
    mix = default_mix()
    total = sum(s.weight for s in mix)
    return tuple(WorkloadShape(s.gpus, s.milli, s.weight / total) for s in mix)


def test_slices_read_as_thousandths_of_a_card() -> None:
    assert slice_milli(None, 47, 47) == 470
    assert slice_milli(None, None, 100) == 1000
    assert slice_milli(20000, None, 100, card_mib=80000) == 250  # memory only: the card's share
    assert slice_milli(20000, None, None) is None  # MiB with no card known: cannot be told
    assert shape_of(0, 1000) is None and shape_of(1, None) is None
    assert request_shape(to_request(TracePod("t", 8000, 30000, 1, 470, ("V100M32",)))) == (
        1, 470, 8000, 30000, ("v100m32",))


# -- replicas, restarts, check, reservations ----------------------------------------------------------------


def feed(cache: ClusterCache, events: list[tuple[str, str, dict[str, Any]]]) -> None:
    for kind, verb, obj in events:
        cache.apply(kind, verb, obj)


def test_replicas_fed_the_same_events_in_any_order_derive_the_same_mix() -> None:
    nodes = nodes_objects()
    pods = [gpu_pod(f"a{i}", f"gpu-{i % 4}") for i in range(12)]
    pods += [gpu_pod(f"b{i}", f"gpu-{i % 4}", gpus=2, share=None, cpu="16", memory="64000Mi") for i in range(6)]
    pods += [gpu_pod("pending", None, share=25, cpu="2", phase="Pending")]
    gone = gpu_pod("gone", "gpu-0", share=None)
    events = [("nodes", "ADDED", n) for n in nodes] + [("pods", "ADDED", p) for p in pods]
    events += [("pods", "ADDED", gone), ("pods", "DELETED", gone)]
    one, two = ClusterCache(), ClusterCache()
    feed(one, events)
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    shuffled.remove(("pods", "DELETED", gone))
    shuffled.append(("pods", "DELETED", gone))  # a deletion still follows its pod's creation
    feed(two, shuffled)
    first, second = one.snapshot(), two.snapshot()
    assert first.observed == second.observed
    assert learned_mix(first.observed, first.nodes) == learned_mix(second.observed, second.nodes) != ()
    # a restarted replica lists what the cluster shows, and learns the same mix
    listed = build_snapshot([*nodes, *pods])
    assert listed.observed == first.observed
    assert learned_mix(listed.observed, listed.nodes) == learned_mix(first.observed, first.nodes)
    assert sum(first.observed.counts.values()) == 19  # the pending pod counts, the deleted one does not


def test_a_node_whose_card_size_changes_recounts_its_memory_sliced_pods() -> None:
    cache = ClusterCache()
    node = gpu_node("gpu-0", memory=80000)
    pod = gpu_pod("m", "gpu-0", share=None)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "20000"
    feed(cache, [("pods", "ADDED", pod), ("nodes", "ADDED", node)])
    assert set(cache.snapshot().observed.counts) == {(1, 250, 4000, 16000, ())}
    bigger = gpu_node("gpu-0", memory=40000)
    feed(cache, [("nodes", "MODIFIED", bigger)])
    assert set(cache.snapshot().observed.counts) == {(1, 500, 4000, 16000, ())}
    assert cache.snapshot().observed == build_snapshot([bigger, pod]).observed


def test_admitted_pods_count_before_the_watch_shows_them() -> None:
    from webhook.cluster.reservations import Reservation

    snapshot = build_snapshot(nodes_objects())
    allocation = Allocation("gpu-0", (0,), 1, 40779, 50, "nvidia", H100, TopologyClass.SINGLE, 0.0, "binpack",
                            cpu_milli=4000, host_memory_mib=16000)
    counted = with_reservations(snapshot, [Reservation("u1", "team-a", allocation, 1e12)])
    assert counted.observed is not None and dict(counted.observed.counts) == {(1, 500, 4000, 16000, ()): 1}
    assert snapshot.observed == EMPTY  # the base is untouched


def test_check_counts_the_pods_it_admits_as_the_watch_will() -> None:
    snapshot = build_snapshot(nodes_objects())
    pod = gpu_pod("p", "gpu-1", models="h100")
    after = with_pod(snapshot, pod)
    assert after.observed is not None and dict(after.observed.counts) == {(1, 500, 4000, 16000, ("h100",)): 1}
    assert after.observed == build_snapshot([*nodes_objects(), pod]).observed


def test_check_learns_from_the_cluster_file_and_what_it_admitted(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import yaml

    from webhook.commands import check

    cluster = tmp_path / "cluster.yaml"
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}}
    running = [gpu_pod(f"r{i}", "gpu-0") for i in range(3)]
    cluster.write_text(yaml.safe_dump_all([*nodes_objects(2), namespace, *running]))
    manifest = tmp_path / "job.yaml"
    workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "team-a"},
                "spec": {"replicas": 3, "selector": {}, "template": {"metadata": {}, "spec": gpu_pod(
                    "t", None, gpus=2, share=None, cpu="16", memory="64000Mi")["spec"]}}}
    manifest.write_text(yaml.safe_dump(workload))
    seen: list[dict[Any, int]] = []
    real = admit.mutate

    def spy(pod: Any, snapshot: Any, policy: Any, **kwargs: Any) -> Any:
        seen.append(dict(snapshot.observed.counts))
        return real(pod, snapshot, policy, **kwargs)

    monkeypatch.setattr(admit, "mutate", spy)
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    assert check.run(parser.parse_args([str(manifest), "--cluster", str(cluster), "-o", "json"])) == 0
    small, big = (1, 500, 4000, 16000, ()), (2, 1000, 16000, 64000, ())
    # each replica is decided against the cluster file's pods and the replicas admitted before it
    assert seen == [{small: 3}, {small: 3, big: 1}, {small: 3, big: 2}]


# -- policy, webhook, metrics ------------------------------------------------------------------------------


def test_policy_learn_default_or_a_fixed_list() -> None:
    assert Policy().workload_mix_source == "learn"
    assert parse_policy({"workloadMix": "default"}).workload_mix_source == "default"
    fixed = parse_policy({"workloadMix": [{"gpus": 1, "milli": 250, "weight": 3}]})
    assert fixed.workload_mix_source == "fixed"
    for bad, message in (("sometimes", "workloadMix: expected learn, default"),
                         ([{"gpus": 1, "weight": 0}], "workloadMix: every weight is 0"),
                         ([{"gpus": 1, "milli": 2000}], "workloadMix[0].milli")):
        with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_policy({"workloadMix": bad})


def test_the_webhook_places_with_the_learned_mix_unless_the_policy_fixes_one() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "team-a", "labels": {"gpu-admission.io/enabled": "true"}}}
    objects = [*nodes_objects(), namespace, *(gpu_pod(f"a{i}", f"gpu-{i % 4}") for i in range(8))]
    snapshot = build_snapshot(objects)
    request = parse_pod(gpu_pod("new", None), "team-a")
    learned = learned_mix(snapshot.observed, snapshot.nodes)
    assert weights(learned) == {(1, 500): 1.0}
    policy = parse_policy({"defaults": {"placement": "fragmentation"}})
    assert _context(request, policy, snapshot).workload_mix is learned
    assert mix_in_use(policy, snapshot) == ("learned", learned)
    fixed = parse_policy({"defaults": {"placement": "fragmentation"},
                          "workloadMix": [{"gpus": 4, "milli": 1000, "weight": 1}]})
    assert _context(request, fixed, snapshot).workload_mix == (WorkloadShape(4, 1000, 1.0),)
    assert mix_in_use(fixed, snapshot) == ("fixed", (WorkloadShape(4, 1000, 1.0),))
    neutral = parse_policy({"defaults": {"placement": "fragmentation"}, "workloadMix": "default"})
    assert _context(request, neutral, snapshot).workload_mix == ()  # the scorer's default_mix()
    binpack = parse_policy({})
    assert _context(request, binpack, snapshot).workload_mix == ()  # nothing to learn for binpack
    decision = admit.mutate(gpu_pod("new", None), snapshot, policy, namespace="team-a")
    assert decision.allowed and decision.allocation is not None and decision.allocation.node


def test_metrics_show_the_mix_in_use() -> None:
    snapshot = build_snapshot([*nodes_objects(), *(gpu_pod(f"a{i}", "gpu-0") for i in range(8))])
    family = mix_metric(snapshot, Policy())
    samples = [(s.labels["source"], s.labels["gpus"], s.labels["milli"], s.value) for s in family.samples]
    assert samples == [("learned", "1", "500", 1.0)]
    fixed = parse_policy({"workloadMix": [{"gpus": 1, "milli": 250, "weight": 1}, {"gpus": 2, "weight": 3}]})
    assert sorted((s.labels["source"], s.labels["gpus"], s.value) for s in mix_metric(snapshot, fixed).samples) == [
        ("fixed", "1", 0.25), ("fixed", "2", 0.75)]
    empty = build_snapshot(nodes_objects())
    assert {s.labels["source"] for s in mix_metric(empty, Policy()).samples} == {"default"}


# -- the simulator -----------------------------------------------------------------------------------------


def test_the_simulator_and_the_webhook_learn_the_same_mix_from_the_same_pods() -> None:
    pods = [TracePod(f"t{i}", 4000, 16000, 1, 500) for i in range(10)]
    pods += [TracePod(f"u{i}", 16000, 64000, 2, 1000) for i in range(5)]
    pods += [TracePod(f"v{i}", 2000, 8000, 1, 250, ("H100",)) for i in range(7)]
    simulated = Histogram()
    for pod in pods:
        simulated.add(request_shape(to_request(pod)))
    objects = nodes_objects()
    for i, pod in enumerate(pods):
        objects.append(gpu_pod(pod.name, f"gpu-{i % 4}", gpus=pod.gpus,
                               share=pod.milli // 10 if pod.milli < 1000 else None,
                               cpu=f"{pod.cpu_milli}m", memory=f"{pod.memory_mib}Mi",
                               models=",".join(pod.models) or None))
    snapshot = build_snapshot(objects)
    assert dict(snapshot.observed.counts) == simulated.counts
    assert mix_of(simulated.counts, hosts_of(snapshot.nodes.values())) == learned_mix(snapshot.observed,
                                                                                    snapshot.nodes)


def test_replay_learns_by_default_and_takes_a_fixed_or_default_mix() -> None:
    nodes = TRACE_NODES
    arrivals = workload(TRACE_PODS * 20, capacity_milli(nodes), 42)
    learned = replay(nodes, arrivals, "fragmentation", 42, check=True)
    neutral = replay(nodes, arrivals, "fragmentation", 42, mix="default", check=True)
    fixed = replay(nodes, arrivals, "fragmentation", 42, mix=default_mix(), check=True)
    assert list(neutral.allocated) == list(fixed.allocated)  # "default" is default_mix()
    assert learned.pods == neutral.pods


def test_simulate_mix_option(tmp_path: Path) -> None:
    assert parse_mix("learn") == "learn" and parse_mix("default") == "default"
    good = tmp_path / "mix.yaml"
    good.write_text("workloadMix:\n  - {gpus: 1, milli: 500, weight: 2}\n")
    assert parse_mix(str(good)) == (WorkloadShape(1, 500, 2.0),)
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloadMix:\n  - {gpus: 1, milli: 5000}\n")
    with pytest.raises(UserError, match=r"bad.yaml: document 0: field workloadMix\[0\].milli"):
        parse_mix(str(bad))
    with pytest.raises(UserError, match="--mix: 'sometimes' is neither learn, default nor a policy file"):
        parse_mix("sometimes")


def test_copying_a_snapshot_keeps_its_histogram() -> None:
    snapshot = build_snapshot([*nodes_objects(), gpu_pod("a", "gpu-0")])
    assert copy.copy(snapshot).observed is snapshot.observed
