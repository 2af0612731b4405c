"""`gpu-admission check`: decide the GPU pods of manifests offline, through the webhook's own functions.

Each workload's pods go through `admit.mutate()`, the patch is applied, and the patched pod through
`admit.validate()`, exactly as the API server would chain the two webhooks. Admitted pods are counted
into the snapshot, so later workloads see the capacity and quota the earlier ones took.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree

EXIT_ALLOWED, EXIT_DENIED, EXIT_INPUT = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="manifest files or directories (*.yaml, *.yml, *.json), or - for stdin")
    parser.add_argument("--cluster", action="append", default=[], metavar="PATH",
                        help="cluster objects (Nodes, Namespaces, ResourceQuotas, Pods, GPUInventories); "
                             "repeatable; default: the embedded demo cluster")
    parser.add_argument("--kubeconfig", metavar="FILE", help="read the cluster state from a live cluster instead")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: built-in defaults)")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for manifests that do not set one (default: default)")
    parser.add_argument("-o", "--output", choices=("text", "json", "junit"), default="text")
    parser.add_argument("-v", "--verbose", action="store_true", help="text output: show each patch")


@dataclass
class Result:
    source: str
    kind: str
    name: str
    namespace: str
    managed: bool = True
    allowed: bool = True
    code: int = 200
    message: str = ""
    reason: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[Mapping[str, Any]] = field(default_factory=list)
    allocation: dict[str, Any] | None = None
    replicas: int = 1
    skipped: bool = False
    nodes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "kind": self.kind, "name": self.name, "namespace": self.namespace,
            "managed": self.managed, "allowed": self.allowed, "code": self.code, "message": self.message,
            "reason": self.reason, "replicas": self.replicas, "warnings": self.warnings, "patch": self.patch,
            "allocation": self.allocation, "skipped": self.skipped,
        }


def _cluster_objects(args: argparse.Namespace) -> list[dict[str, Any]]:
    from .cluster.files import demo_objects, load_cluster

    if args.kubeconfig:
        from .cluster.main import live_objects

        return list(live_objects(args.kubeconfig, args.context))
    if args.cluster:
        return list(load_cluster(args.cluster))
    return list(demo_objects())


def evaluate(workloads: Sequence[Any], snapshot: Any, policy: Any, default_namespace: str) -> list[Result]:
    """Decide every workload in order; each admitted pod is counted before the next is decided."""
    import jsonpatch

    from .core import admit
    from .core.record import allocation_to_json
    from .core.state import with_allocation
    from .manifests import Skipped

    results: list[Result] = []
    for item in workloads:
        namespace = item.namespace or default_namespace
        if isinstance(item, Skipped):
            results.append(Result(item.source, item.kind, item.name, namespace, allowed=True, skipped=True,
                                  reason="skipped", message=item.reason, replicas=0))
            continue
        result = Result(item.source, item.kind, item.name, namespace, replicas=item.replicas)
        for replica in range(item.replicas):
            pod = copy.deepcopy(dict(item.pod))
            meta = dict(pod.get("metadata") or {})
            meta["namespace"] = namespace
            base = meta.get("name") or meta.get("generateName") or item.name or "pod"
            if item.kind != "Pod":
                meta.pop("generateName", None)
                meta["name"] = f"{str(base).rstrip('-')}-{replica}"
            pod["metadata"] = meta
            mutated = admit.mutate(pod, snapshot, policy, namespace=namespace)
            decision = mutated
            if mutated.allowed and mutated.gpu_pod and mutated.managed:
                patched = jsonpatch.apply_patch(pod, [dict(op) for op in mutated.patch]) if mutated.patch else pod
                patched["metadata"]["uid"] = f"check-{item.source}-{replica}"
                decision = admit.validate(patched, snapshot, policy, namespace=namespace)
            if replica == 0:
                result.managed = mutated.managed
                result.patch = [dict(op) for op in mutated.patch]
                result.allocation = allocation_to_json(mutated.allocation) if mutated.allocation else None
                result.message, result.reason = decision.message, decision.reason
            for warning in (*mutated.warnings, *decision.warnings):
                if warning not in result.warnings:
                    result.warnings.append(warning)
            if not decision.allowed:
                result.allowed, result.code, result.reason = False, decision.code, decision.reason
                prefix = f"pod {replica + 1} of {item.replicas}: " if item.replicas > 1 else ""
                result.message = prefix + decision.message
                break
            if decision.allocation is not None and mutated.gpu_pod and mutated.managed:
                snapshot = with_allocation(snapshot, namespace, decision.allocation)
                if decision.allocation.node:
                    result.nodes.append(decision.allocation.node)
        if result.allowed and item.replicas > 1 and result.managed and result.allocation is not None:
            result.message = f"{item.replicas} pods admitted; " + _nodes_text(result.nodes)
        elif item.replicas == 0:
            result.message = "0 replicas: nothing to admit"
        if getattr(item, "per_node", False):
            result.warnings.append("DaemonSet: evaluated as one pod; it runs one per eligible node")
        results.append(result)
    return results


def _nodes_text(nodes: list[str]) -> str:
    if not nodes:
        return "no node free now"
    distinct = sorted(set(nodes))
    return "nodes " + ", ".join(distinct[:4]) + (f" (+{len(distinct) - 4})" if len(distinct) > 4 else "")


def summary(results: Sequence[Result]) -> dict[str, int]:
    return {
        "allowed": sum(1 for r in results if r.allowed and not r.skipped),
        "denied": sum(1 for r in results if not r.allowed),
        "skipped": sum(1 for r in results if r.skipped),
    }


def render_text(results: Sequence[Result], verbose: bool) -> str:
    lines = []
    for r in results:
        target = f"{r.kind} {r.namespace}/{r.name or '(unnamed)'}"
        if r.replicas > 1:
            target += f" x{r.replicas}"
        if r.skipped:
            lines.append(f"SKIP   {target}: {r.message}  [{r.source}]")
            continue
        if not r.managed:
            verdict, detail = "ALLOW", f"namespace {r.namespace} is not managed: unchanged"
        elif r.reason == "not-gpu-pod":
            verdict, detail = "ALLOW", "asks for no GPU: unchanged"
        elif r.allowed:
            alloc = r.allocation or {}
            where = f"node {alloc['node']}" if alloc.get("node") else "waits for a free node"
            gpus = f"{alloc.get('gpuCount', 0)} GPU" + ("s" if alloc.get("gpuCount", 0) != 1 else "")
            detail = f"{where}, {gpus} x {alloc.get('memoryMiB')} MiB/{alloc.get('cores')}%, {alloc.get('topology')}"
            if r.replicas > 1:
                detail = f"{r.message}; {gpus} x {alloc.get('memoryMiB')} MiB/{alloc.get('cores')}% each"
            verdict = "ALLOW"
        else:
            verdict, detail = "DENY", f"{r.code} {r.reason}: {r.message}"
        lines.append(f"{verdict:<6} {target}: {detail}  [{r.source}]")
        lines.extend(f"       warning: {w}" for w in r.warnings)
        if verbose and r.patch:
            lines.extend("       " + json.dumps(op, sort_keys=True) for op in r.patch)
    s = summary(results)
    lines.append(f"{s['allowed']} allowed, {s['denied']} denied, {s['skipped']} skipped")
    return "\n".join(lines)


def render_junit(results: Sequence[Result]) -> str:
    s = summary(results)
    suite = ElementTree.Element("testsuite", name="gpu-admission check", tests=str(len(results)),
                                failures=str(s["denied"]), skipped=str(s["skipped"]), errors="0")
    for r in results:
        case = ElementTree.SubElement(suite, "testcase", classname=r.source,
                                      name=f"{r.kind} {r.namespace}/{r.name or '(unnamed)'}")
        if r.skipped:
            ElementTree.SubElement(case, "skipped", message=r.message)
        elif not r.allowed:
            failure = ElementTree.SubElement(case, "failure", message=r.message, type=r.reason)
            failure.text = f"code {r.code}: {r.message}"
        if r.warnings:
            ElementTree.SubElement(case, "system-out").text = "\n".join(r.warnings)
    ElementTree.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suite, encoding="unicode")


def run(args: argparse.Namespace) -> int:
    from .cluster.translate import build_snapshot
    from .errors import UserError
    from .manifests import load_documents, workloads
    from .policyfile import load_policy

    policy = load_policy(args.policy)
    try:
        snapshot = build_snapshot(_cluster_objects(args))
    except ValueError as err:
        raise UserError(f"invalid cluster state: {err}") from None
    documents = load_documents(args.paths, stdin=sys.stdin)
    results = evaluate(workloads(documents), snapshot, policy, args.namespace)
    if args.output == "json":
        print(json.dumps({"results": [r.to_json() for r in results], "summary": summary(results)}, indent=2))
    elif args.output == "junit":
        print(render_junit(results))
    else:
        print(render_text(results, args.verbose))
    return EXIT_DENIED if any(not r.allowed for r in results) else EXIT_ALLOWED
