"""The request shape each held GPU pod adds to the histogram the learned workload mix is derived from.

Read from what the watch cache keeps of the pod (`PodUsage`: GPUs, slice, CPU and memory it holds) and
the GPU models it allows (`nvidia.com/use-gputype` and the other vendors' equivalents), so the same pod
gives the same shape in the watch cache, in `build_snapshot` (`check`), and in the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.model import Allocation, Node, Snapshot
from webhook.core.domain.shapes import EMPTY, Observed, Shape, shape_of, slice_milli
from webhook.core.placement.mixlearn import Histogram
from webhook.core.podspec.vendor_table import SELECTORS

from .podusage import PodUsage, pod_usage_of


def models_of(pod: Mapping[str, Any], vendor: str) -> tuple[str, ...]:
    """The GPU models the pod allows (HAMi's use-type annotation of its vendor); empty: any."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return ()
    keys = SELECTORS.get(vendor, SELECTORS["nvidia"])[0]
    value = annotations.get(keys)
    return tuple(p.strip() for p in value.split(",") if p.strip()) if isinstance(value, str) else ()


def _card(nodes: Mapping[str, Node], name: str | None) -> int:
    node = nodes.get(name or "")
    return node.gpus[0].memory_mib if node is not None and node.gpus else 0


def pod_shape(use: PodUsage, models: tuple[str, ...], nodes: Mapping[str, Node]) -> Shape | None:
    """The shape of a held GPU pod; None for MIG devices and for a MiB-only slice on no known node."""
    if use.mig:
        return None
    milli = slice_milli(use.memory_mib, use.memory_pct, use.cores, _card(nodes, use.node))
    return shape_of(use.count, milli, use.cpu_milli, use.memory_mib_host, models)


def allocation_shape(allocation: Allocation, nodes: Mapping[str, Node]) -> Shape | None:
    """The shape of an admitted pod the watch has not shown yet (a reservation)."""
    if allocation.mig:
        return None
    milli = slice_milli(allocation.memory_mib, None, allocation.cores, _card(nodes, allocation.node))
    return shape_of(allocation.gpu_count, milli, allocation.cpu_milli, allocation.host_memory_mib)


def observed_of(uses: Iterable[tuple[PodUsage | None, Mapping[str, Any]]], nodes: Mapping[str, Node]) -> Observed:
    """The histogram of a list of pods (`build_snapshot`): what the watch cache keeps for the same pods."""
    histogram = Histogram()
    for use, pod in uses:
        if use is not None:
            histogram.add(pod_shape(use, models_of(pod, use.vendor), nodes))
    return histogram.view()


def with_pod(snapshot: Snapshot, pod: Mapping[str, Any]) -> Snapshot:
    """`snapshot` with an admitted pod counted in its histogram, as the watch cache will count it."""
    use = pod_usage_of(pod)
    if use is None:
        return snapshot
    shape = pod_shape(use, models_of(pod, use.vendor), snapshot.nodes)
    return replace(snapshot, observed=(snapshot.observed or EMPTY).plus((shape,)))
