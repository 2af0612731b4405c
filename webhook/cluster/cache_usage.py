"""The watch cache's usage accounting: what the pods it holds take, kept up to date one event at a time.

`UsageBook` keeps each node's usage summed from the pods placed on it, added on for a new pod when
that gives what a fresh sum would (`podrecords.appended_usage`) and summed anew otherwise, so a launch
of n pods onto one node costs n additions, not n sums; each namespace's GPU usage (what its pods count
against its quotas, which depends on the card size of their node); and the held GPU pods' request
shapes, the learned workload mix's input. It reads the cache's nodes and pod records and owns nothing
else of the cache; the nodes whose usage changed since the last publish are in `changed`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from webhook.core.domain.model import Node, NodeUsage, Usage, usage_of
from webhook.core.domain.shapes import Shape
from webhook.core.placement.mixlearn import Histogram

from .observe import pod_shape
from .podrecords import PodRecord, appended_usage, node_usage
from .podusage import PodUsage


class UsageBook:
    """Node and namespace usage of the cache's pods, and the histogram of their shapes."""

    def __init__(self, nodes: Mapping[str, Node], pods: Mapping[str, PodRecord]) -> None:
        self._nodes = nodes  # the cache's, read only
        self._pods = pods
        self.usage: dict[str, NodeUsage] = {}
        self.by_node: dict[str, set[str]] = {}
        # Per node, what decides whether a new pod's usage can be added on instead of summed anew
        # (podrecords.appended_usage): the nonces of its pods with recorded GPU indices, and how many
        # of its GPU pods have none, and how many of those nonces are copies (held by two pods or more:
        # such pods count as having none).
        self._nonces: dict[str, Counter[str]] = {}
        self._loose: Counter[str] = Counter()
        self._copies: Counter[str] = Counter()
        self.deferred: set[str] | None = None  # nodes whose usage is added up after the first lists
        self.changed: set[str] = set()  # nodes whose usage changed since the last publish
        self.namespaces: dict[str, list[Any]] = {}  # namespace -> [Usage, GPU pods counted]
        self.namespaces_changed = False
        self.gpu_pods = 0
        # The held GPU pods by request shape (the learned workload mix's input), and each pod's shape
        # with the models it allows (kept to recompute its shape when its node's card size changes).
        self.observed = Histogram()
        self._shapes: dict[str, tuple[Shape | None, tuple[str, ...]]] = {}

    # -- the first lists ------------------------------------------------------------------------

    def defer(self) -> None:
        """Until `catch_up`, remember the nodes to sum instead of summing them (nothing reads yet)."""
        if self.deferred is None:
            self.deferred = set()

    def catch_up(self) -> None:
        deferred, self.deferred = self.deferred, None
        for name in deferred or ():
            if name in self._nodes:
                self.recompute(name)

    # -- pods -----------------------------------------------------------------------------------

    def add(self, key: str, pod: PodRecord, models: tuple[str, ...], new: bool) -> None:
        """Count pod `key`, just read (its GPU `models`, from its node constraints): on its node, in its
        namespace, in the shapes."""
        appendable = new and pod.node is not None and self._appendable(pod.node, pod)
        if pod.node is not None:
            self.by_node.setdefault(pod.node, set()).add(key)
            self._index(pod.node, pod.use, +1)
        pod.taken = self.taken(pod)
        self.count(pod, +1)
        self.observe(key, pod, models)
        if pod.node is not None and pod.node in self._nodes:
            if appendable:
                self._append(pod.node, pod)
            else:
                self.recompute(pod.node)

    def remove(self, key: str, pod: PodRecord) -> None:
        """Stop counting pod `key` (gone, or about to be counted again as it is now)."""
        self.observed.add(self._shapes.pop(key, (None, ()))[0], -1)
        self.count(pod, -1)
        if pod.node is not None:
            on_node = self.by_node.get(pod.node)
            if on_node is not None and key in on_node:
                self._index(pod.node, pod.use, -1)
                on_node.discard(key)
                if not on_node:
                    del self.by_node[pod.node]
            if pod.node in self._nodes:
                self.recompute(pod.node)

    def recount(self, name: str) -> None:
        """Node `name` changed: the card size sets what memory-less pods count against quotas, so
        recount its pods, and sum its usage anew if it is still there."""
        for uid in self.by_node.get(name, ()):
            pod = self._pods[uid]
            self.count(pod, -1)
            pod.taken = self.taken(pod)
            self.count(pod, +1)
            self.observe(uid, pod, None)
        if name in self._nodes:
            self.recompute(name)

    # -- node usage -----------------------------------------------------------------------------

    def _appendable(self, name: str, pod: PodRecord) -> bool:
        """Whether a new pod (the newest `seq`) goes last in its node's sum, so that adding its usage on
        gives what `node_usage` would: it holds no recorded indices, or they are no copy and no pod
        without recorded indices comes after it."""
        if self.deferred is not None or name not in self.usage or name not in self._nodes:
            return False
        use = pod.use
        if use is None or use.gpus is None:
            return True
        nonces = self._nonces.get(name)
        copied = use.nonce and nonces and nonces[use.nonce]
        return not (self._loose[name] or self._copies[name] or copied)

    def _append(self, name: str, pod: PodRecord) -> None:
        usage = appended_usage(self._nodes[name], self.usage[name], pod)
        if usage != self.usage[name]:
            self.usage[name] = usage
            self.changed.add(name)

    def _index(self, name: str, use: PodUsage | None, sign: int) -> None:
        if use is None:
            return
        if use.gpus is None:
            self._loose[name] += sign
            if self._loose[name] <= 0:
                del self._loose[name]
        elif use.nonce:
            nonces = self._nonces.setdefault(name, Counter())
            nonces[use.nonce] += sign
            if nonces[use.nonce] == (2 if sign > 0 else 1):  # a copy appeared or went
                self._copies[name] += sign
                if self._copies[name] <= 0:
                    del self._copies[name]
            if nonces[use.nonce] <= 0:
                del nonces[use.nonce]
                if not nonces:
                    del self._nonces[name]

    def recompute(self, name: str) -> None:
        """A node's usage from its pods, exactly as `build_snapshot` adds them up."""
        if self.deferred is not None:
            self.deferred.add(name)
            return
        usage = node_usage(self._nodes[name], [self._pods[uid] for uid in self.by_node.get(name, ())])
        if self.usage.get(name) != usage:
            self.usage[name] = usage
            self.changed.add(name)

    # -- namespace usage and shapes -------------------------------------------------------------

    def taken(self, pod: PodRecord) -> Usage:
        use = pod.use
        if use is None:
            return Usage()
        node = self._nodes.get(use.node or "")
        card = node.gpus[0].memory_mib if node is not None and node.gpus else 0
        return usage_of(use.vendor, use.mig, use.count, use.memory_on(card) * use.count, use.cores * use.count)

    def count(self, pod: PodRecord, sign: int) -> None:
        if pod.use is None:
            return
        self.gpu_pods += sign
        entry = self.namespaces.setdefault(pod.namespace, [Usage(), 0])
        entry[0] = entry[0] + pod.taken if sign > 0 else entry[0] - pod.taken
        entry[1] += sign
        if entry[1] == 0:
            del self.namespaces[pod.namespace]
        self.namespaces_changed = True

    def observe(self, key: str, pod: PodRecord, models: tuple[str, ...] | None) -> None:
        """Count the pod's shape in the histogram (again, when its node changed: `models` None, kept)."""
        old, kept = self._shapes.pop(key, (None, ()))
        self.observed.add(old, -1)
        if pod.use is None:
            return
        models = kept if models is None else models
        shape = pod_shape(pod.use, models, self._nodes)
        self._shapes[key] = (shape, models)
        self.observed.add(shape)

    def namespace_usage(self) -> dict[str, Usage]:
        return {ns: entry[0] for ns, entry in self.namespaces.items()}
