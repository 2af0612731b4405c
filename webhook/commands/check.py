"""`gpu-admission check`: decide the GPU pods of manifests offline, through the webhook's own functions.

Each workload's pods go through `admit.mutate()`, the patch is applied, and the patched pod through
`admit.validate()`, exactly as the API server would chain the two webhooks. Admitted pods are counted
into the snapshot, so later workloads see the capacity and quota the earlier ones took.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.domain.decision import denied
from webhook.core.domain.vendor_quota import device_resource

from .check_report import EXIT_ALLOWED, EXIT_DENIED, EXIT_INPUT, Result, summary  # noqa: F401 - the module's API

OUTPUTS = ("text", "table", "json", "yaml", "junit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="manifest files or directories (*.yaml, *.yml, *.json), or - for stdin"
    )
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="PATH",
        help="cluster objects (Nodes, Namespaces, ResourceQuotas, Pods, GPUInventories); "
        "repeatable; default: the embedded demo cluster",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="read the cluster state from a live cluster instead")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: built-in defaults)")
    parser.add_argument(
        "-n", "--namespace", default="default", help="namespace for manifests that do not set one (default: default)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="text",
        help="text (default), table (one row per workload), json, yaml or junit",
    )
    parser.add_argument(
        "--fail-on-warn", action="store_true", help="exit 1 when any warning is printed, even if every pod is admitted"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="text output: show each patch")


def _cluster_objects(args: argparse.Namespace, policy: Any) -> list[dict[str, Any]]:
    from webhook.cluster.files import demo_objects, read_cluster

    if args.kubeconfig:
        from .snapshot import live_objects

        return list(live_objects(args.kubeconfig, args.context))
    if args.cluster:
        return list(read_cluster(args.cluster, need_namespaces=policy.managed_namespaces != "all"))
    return list(demo_objects())


def evaluate(workloads: Sequence[Any], snapshot: Any, policy: Any, default_namespace: str) -> list[Result]:
    """Decide every pod template in order; each admitted pod is counted before the next is decided."""
    from webhook.core.admission import scope
    from webhook.workloads import ClaimObject, Problem, Skipped, is_cluster_scoped

    results: list[Result] = []
    lws_sizes = {
        (w.source, w.name): w.group_size + 1
        for w in workloads
        if getattr(w, "family", "") == "lws" and getattr(w, "role", "") == "worker"
    }
    for item in workloads:
        if isinstance(item, Problem):
            scoped = not item.kind or is_cluster_scoped(None, item.kind)
            namespace = item.namespace or ("" if scoped else default_namespace)
            results.append(
                Result(
                    item.source,
                    item.kind,
                    item.name,
                    namespace,
                    managed=False,
                    allowed=False,
                    code=0,
                    reason="input-error",
                    message=item.message,
                    replicas=0,
                    error=True,
                    error_field=item.field,
                )
            )
        elif isinstance(item, ClaimObject):
            results.append(_decide_claim(item, snapshot, policy, item.namespace or default_namespace))
        elif isinstance(item, Skipped):
            namespace = "" if item.cluster_scoped else item.namespace or default_namespace
            managed = bool(namespace) and scope.is_managed(namespace, snapshot, policy)
            results.append(
                Result(
                    item.source,
                    item.kind,
                    item.name,
                    namespace,
                    managed=managed,
                    skipped=True,
                    reason="skipped",
                    message=item.reason,
                    replicas=0,
                )
            )
        else:
            namespace = item.namespace or default_namespace
            try:
                result, snapshot = _decide(
                    item, snapshot, policy, namespace, lws_sizes.get((item.source, item.name), 1)
                )
            except Exception as err:  # noqa: BLE001 - one pod the core chokes on must not end the run
                result = Result(
                    item.source,
                    item.kind,
                    item.name,
                    namespace,
                    managed=False,
                    allowed=False,
                    code=500,
                    reason="input-error",
                    role=item.role,
                    replicas=item.replicas,
                    message=f"could not be decided: internal error ({type(err).__name__}: {err})",
                    error=True,
                    error_field=item.template_path.lstrip("/").replace("/", "."),
                )
            results.append(result)
    _note_open_groups(results, snapshot)
    _note_unknown_memory(results, snapshot)
    return results


def _note_unknown_memory(results: list[Result], snapshot: Any) -> None:
    """A pod placed on a node that states no memory for its GPUs (a GPU product label without
    nvidia.com/gpu.memory, and no GPUInventory): say so, and what would state it."""
    for r in results:
        placed = r.nodes or [str((r.allocation or {}).get("node") or "")]
        if not r.allowed or (r.allocation or {}).get("mig"):
            continue
        for name in sorted(set(placed)):
            node = snapshot.nodes.get(name)
            if node is None or not node.gpus or any(g.memory_mib for g in node.gpus):
                continue
            source = (
                "it has no nvidia.com/gpu.memory label (GPU Feature Discovery sets it) and no GPUInventory "
                "(`gpu-admission agent` publishes one)"
                if node.vendor == "nvidia"
                else "it advertises no GPU memory resource and has no GPUInventory"
            )
            r.warnings.append(
                f"node {name}: the memory of its GPUs is unknown, so no GPU memory request can be "
                f"checked against it: {source}"
            )


def _note_open_groups(results: list[Result], snapshot: Any) -> None:
    """A group whose pods state no size (a training operator job, a Ray worker group) is placed by its
    first pod without knowing how many follow: say how to tell the webhook, with the count check saw."""
    for key, record in sorted(snapshot.groups.items()):
        if record.size is not None:
            continue
        entries = [(r, p) for r in results for p in r.pods if p.get("group", {}).get("name") == key]
        minimum = max((p["group"]["minimum"] for _, p in entries), default=1)
        if not entries or len(record.members) <= minimum:
            continue
        entries[0][0].notes.append(
            f"group {key}: its pods state no size, so the webhook's first pod chooses a domain with room for "
            f"{minimum} pod{'s' if minimum != 1 else ''}, not all {len(record.members)}; annotate its pod templates "
            f'with gpu-admission.io/group-size: "{len(record.members)}" to have the whole group placed together'
        )


def _decide_claim(item: Any, snapshot: Any, policy: Any, namespace: str) -> Result:
    """A ResourceClaim or ResourceClaimTemplate, decided by the validating webhook's own function."""
    from webhook.core.admission.dra_objects import check_claim_object
    from webhook.workloads.claims import admission_request

    decision = check_claim_object(admission_request(item, namespace), snapshot, policy)
    return Result(
        item.source,
        item.kind,
        item.name,
        namespace,
        managed=decision.managed,
        allowed=decision.allowed,
        code=decision.code if not decision.allowed else 200,
        message=decision.message,
        reason=decision.reason,
        replicas=0,
        group="resource.k8s.io",
        warnings=list(decision.warnings),
    )


def _decide(item: Any, snapshot: Any, policy: Any, namespace: str, lws_size: int = 1) -> tuple[Result, Any]:
    """The pods of one template, one by one as the controller creates them; the snapshot with those admitted.

    A template with 0 pods now (scaled to zero, autoscaled from 0) is still decided as one pod, not
    counted, so a pod that can never be admitted is reported before it is scaled up."""
    import jsonpatch

    from webhook.cluster.observe import with_pod as observed_with
    from webhook.core.admission import admit
    from webhook.core.placement.state import with_allocation
    from webhook.core.podspec import workload as controllers
    from webhook.core.podspec.record import allocation_to_json

    result = Result(
        item.source,
        item.kind,
        item.name,
        namespace,
        replicas=item.replicas,
        role=item.role,
        notes=list(item.notes),
        walked=item.walked,
        group=item.group,
    )
    owner_kind, owner_name = item.controller
    pods = max(item.replicas, 1)
    for replica in range(pods):
        pod = copy.deepcopy(dict(item.pod))
        meta = dict(pod.get("metadata") or {})
        meta["namespace"] = namespace
        base = meta.get("name") or meta.get("generateName") or item.name or "pod"
        if item.kind != "Pod":
            meta.pop("generateName", None)
            suffix = f"{item.role}-{replica}".lower().replace(" ", "-").replace(":", "").replace("/", "-")
            meta["name"] = f"{str(base).rstrip('-')}-{suffix if item.role else replica}"
        if item.family:  # the labels the workload's controller sets on each pod it creates
            labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
            meta["labels"] = {
                **labels,
                **controllers.pod_labels(item.family, owner_kind, owner_name, item.role, replica, item.group_size),
            }
            _add_group_size(meta, item, lws_size)
        pod["metadata"] = meta
        name = str(meta.get("name") or base)  # a Pod with only generateName: named by its prefix
        mutated = admit.mutate(pod, snapshot, policy, namespace=namespace)
        decision = mutated
        if mutated.allowed and mutated.gpu_pod and mutated.managed:
            patched = jsonpatch.apply_patch(pod, [dict(op) for op in mutated.patch]) if mutated.patch else pod
            patched["metadata"]["uid"] = f"check-{item.source}{item.template_path}-{replica}"
            decision = admit.validate(patched, snapshot, policy, namespace=namespace)
            if item.replicas and decision.allowed:  # as the ledger records it between the replicas
                decision, snapshot = _join_group(patched, namespace, decision, snapshot, name)
        result.pods.append(
            _pod_entry(name, decision if decision.allocation else mutated, decision, snapshot, pod, namespace)
        )
        if replica == 0:
            result.managed = mutated.managed
            result.patch = [dict(op) for op in mutated.patch]
            result.allocation = allocation_to_json(mutated.allocation) if mutated.allocation else None
            result.message, result.reason = decision.message, decision.reason
        for warning in (*mutated.warnings, *decision.warnings):
            if warning not in result.warnings:
                result.warnings.append(warning)
            drew = result.warning_pods.setdefault(warning, [])
            if replica + 1 not in drew:
                drew.append(replica + 1)
        if not decision.allowed:
            result.allowed, result.code, result.reason = False, decision.code, decision.reason
            prefix = f"pod {replica + 1} of {item.replicas}: " if item.replicas > 1 else ""
            prefix = "0 pods now; one pod of it: " if item.replicas == 0 else prefix
            result.message = prefix + decision.message
            break
        if item.replicas and decision.allocation is not None and mutated.gpu_pod and mutated.managed:
            snapshot = with_allocation(snapshot, namespace, decision.allocation)
            snapshot = observed_with(snapshot, patched)  # the learned workload mix counts it too
            if decision.allocation.node:
                result.nodes.append(decision.allocation.node)
    if result.allowed and item.replicas > 1 and result.managed and result.allocation is not None:
        kind = result.allocation.get("mig")  # MIG or shared devices: the scheduler picks the nodes offering them
        where = f"on nodes offering {device_resource(str(kind))}" if kind else _nodes_text(result.nodes)
        result.message = f"{item.replicas} pods admitted; " + where + _domains_text(result.pods)
    elif item.replicas == 0:
        result.notes.append("0 pods now: one pod decided, not counted")
    if getattr(item, "per_node", False):
        result.warnings.append("DaemonSet: evaluated as one pod; it runs one per eligible node")
    return result, snapshot


def _with_live_groups(snapshot: Any, objects: list[dict[str, Any]]) -> Any:
    """The groups the webhook's ledger already placed (its `gpu-admission-groups` ConfigMap, listed with
    `--kubeconfig` or written in a --cluster file): their pods follow their domains here too."""
    from dataclasses import replace

    from webhook.cluster.group_ledger import records_in

    records = records_in(objects)
    return replace(snapshot, groups={**snapshot.groups, **records}) if records else snapshot


def _add_group_size(meta: dict[str, Any], item: Any, lws_size: int) -> None:
    """The group size the controller states on each pod: LeaderWorkerSet's size annotation, JobSet's
    replicated-job Job count (a label and an annotation). The training operator, Ray and Volcano state
    none: their groups are open-ended unless the template carries gpu-admission.io/group-size."""
    from webhook.core.placement.groups import JOBSET_REPLICAS, LWS_SIZE
    from webhook.core.podspec import workload as controllers

    extra: dict[str, str] = {}
    if item.family == controllers.LWS:  # `lws_size`: the size its worker template was counted with
        extra[LWS_SIZE] = str(lws_size if item.role == "leader" else item.group_size + (item.role == "worker"))
    elif item.family == controllers.JOBSET:
        extra[JOBSET_REPLICAS] = str(max(item.replicas // max(item.group_size, 1), 1))
        meta["labels"] = {**meta["labels"], **extra}
    if extra:
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        meta["annotations"] = {**extra, **annotations}


def _with_manifest_group_sizes(snapshot: Any, manifests: Sequence[Any], namespace: str) -> Any:
    """The group sizes the checked manifests' own controllers state (a PyTorchJob's replica specs, a
    PodGroup's minMember), as the watch reads them from the cluster once they are applied."""
    from dataclasses import replace

    from webhook.core.placement.groups import merge_sizes, sizes_of

    tables = []
    for doc in manifests:
        data = doc.data if isinstance(doc.data, dict) else {}
        metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        if not metadata.get("namespace"):
            data = {**data, "metadata": {**metadata, "namespace": namespace}}
        tables.append(sizes_of(data))
    found = merge_sizes(tables)
    return replace(snapshot, group_sizes=merge_sizes([snapshot.group_sizes, found])) if found else snapshot


def _join_group(pod: Mapping[str, Any], namespace: str, decision: Any, snapshot: Any, member: str) -> tuple[Any, Any]:
    """Record an admitted pod in its group's record as the webhook's ledger does (`groups.commit`), so the
    next replica follows the domain; a refusal denies the pod as the ledger would (403)."""
    from dataclasses import replace

    from webhook.core.placement.group_room import domain_free, split_domain
    from webhook.core.placement.groups import commit, group_of

    allocation = decision.allocation
    if allocation is None or not allocation.group or not allocation.domain:
        return decision, snapshot
    ref = group_of(pod, namespace, snapshot.group_sizes)
    if ref is None:
        return decision, snapshot
    level, value = split_domain(allocation.domain)
    outcome = commit(
        snapshot.groups, ref, level, value, allocation.gpu_count, member, free=domain_free(snapshot, allocation.domain)
    )
    if isinstance(outcome, str):
        return denied(
            403,
            "group-domain-taken",
            f"{outcome}; the webhook refuses this pod until that group's pods are in",
            warnings=decision.warnings,
        ), snapshot
    return decision, replace(snapshot, groups={**snapshot.groups, outcome.key: outcome})


def _pod_entry(
    name: str, placed: Any, decision: Any, snapshot: Any, pod: Mapping[str, Any], namespace: str
) -> dict[str, Any]:
    """One decided pod for `-o json`: its verdict, allocation and, for a group's pod, its group as the
    webhook reads it from the pod (size stated, or the minimum known) and the domain its node is in (the
    group's own domain, unless the preferred mode placed it outside)."""
    from webhook.core.placement.group_place import topology_owner
    from webhook.core.placement.group_room import split_domain
    from webhook.core.placement.groups import group_of
    from webhook.core.podspec.record import allocation_to_json
    from webhook.core.podspec.vendors import mapping_of

    entry: dict[str, Any] = {"name": name, "allowed": decision.allowed, "reason": decision.reason}
    if not decision.allowed:
        entry.update(code=decision.code, message=decision.message)
    allocation = placed.allocation
    entry["allocation"] = allocation_to_json(allocation) if allocation is not None else None
    if allocation is not None and allocation.group:
        try:
            ref = group_of(pod, namespace, snapshot.group_sizes)
        except ValueError:
            ref = None
        if ref is not None:
            entry["group"] = {"name": ref.key, "size": ref.size, "minimum": ref.minimum}
            owner = topology_owner(pod, str(mapping_of(pod.get("spec")).get("schedulerName") or ""))
            if owner:  # Kueue TAS, KAI or another scheduler places the group between nodes
                entry["group"]["topology"] = owner
        level, _ = split_domain(allocation.domain)
        node = snapshot.nodes.get(allocation.node or "")
        value = node.labels.get(level) if node is not None and level else None
        entry["domain"] = f"{level}={value}" if value is not None else allocation.domain if not node else ""
    return entry


def _domains_text(pods: list[dict[str, Any]]) -> str:
    """ ", all in nvidia.com/gpu.clique=c1" for a group kept whole; ", split over 2 domains" otherwise;
    ", topology left to Kueue TAS" where another system places the group."""
    owners = {p["group"].get("topology", "") for p in pods if "group" in p}
    if len(owners) == 1 and "" not in owners:  # its domain is that system's, not the webhook's
        return f", topology left to {owners.pop()}"
    domains = [p["domain"] for p in pods if "domain" in p]
    if not any(domains):
        return ""
    distinct = sorted(set(domains))
    if len(distinct) == 1:
        return f", all in {distinct[0]}"
    return f", split over {len(distinct)} domains" + (" (some pods in none)" if "" in distinct else "")


def _nodes_text(nodes: list[str]) -> str:
    if not nodes:
        return "no node free now"
    distinct = sorted(set(nodes))
    return "nodes " + ", ".join(distinct[:4]) + (f" (+{len(distinct) - 4})" if len(distinct) > 4 else "")


DEMO_CLUSTER = (
    "Deciding against the embedded demo cluster (2 H100 and 2 A100 nodes with 8 GPUs each, 2 L4 and 1 T4 node; "
    "managed namespaces team-a and team-b, see webhook/demo/cluster.yaml)"
)
DEMO_BANNER = (
    f"{DEMO_CLUSTER}; some examples are denied on purpose, so exit code 1 is expected. Pass --cluster or "
    "--kubeconfig to decide against your own cluster."
)
DEMO_NOTE = f"{DEMO_CLUSTER}. Pass --cluster or --kubeconfig to decide against your own cluster."
# The manifests of the source tree's examples/ directory, the ones the demo cluster is made for.
BUNDLED_EXAMPLES = frozenset(
    {
        "01-single-gpu.yaml",
        "02-shared-slice.yaml",
        "03-nvlink-training.yaml",
        "04-inference-deployment.yaml",
        "05-quota-exceeded.yaml",
        "06-too-many-gpus.yaml",
        "07-cores-over-100.yaml",
        "08-isolation-bypass.yaml",
        "09-unmanaged-namespace.yaml",
        "10-service.yaml",
    }
)


def bundled_examples_only(files: Sequence[str]) -> bool:
    """Whether every file read is one of the bundled examples (examples/NN-*.yaml), not the user's own."""
    import os

    return bool(files) and all(
        os.path.basename(f) in BUNDLED_EXAMPLES and os.path.basename(os.path.dirname(os.path.abspath(f))) == "examples"
        for f in files
    )


def _no_kind_problems(documents: list[Any]) -> list[Any]:
    """A document without a kind is no Kubernetes object (a docker-compose file, Helm values): an input
    error naming its file and document, not an object to walk for pod templates."""
    from webhook.manifests import Document, Problem

    out: list[Any] = []
    for doc in documents:
        kind = doc.data.get("kind") if isinstance(doc, Document) else "-"
        if isinstance(kind, str) and kind:
            out.append(doc)
            continue
        what = "no kind" if kind is None else f"kind is {kind!r}, not a name"
        message = f"{what}: not a Kubernetes object (every object states apiVersion and kind)"
        error = doc.error("kind", message)
        metadata = doc.data.get("metadata") if isinstance(doc.data.get("metadata"), Mapping) else {}
        name = metadata.get("name") if isinstance(metadata.get("name"), str) else ""
        out.append(Problem(doc.source, error.field, message, str(error), name=name, index=doc.index))
    return out


def _namespace_warnings(results: list[Result], snapshot: Any, policy: Any, args: argparse.Namespace) -> None:
    """A workload's namespace the cluster files (or the live cluster) do not have: its pods are let
    through unchanged, which is rarely what the files were meant to say."""
    if policy.managed_namespaces == "all" or not (args.cluster or args.kubeconfig):
        return
    for r in results:
        if r.error or r.skipped or not r.namespace or r.namespace in snapshot.namespaces:
            continue
        if args.cluster:
            r.warnings.append(
                f"namespace {r.namespace} is not in the cluster files ({', '.join(args.cluster)}), so it is treated "
                f'as not managed: add its Namespace (labelled gpu-admission.io/enabled: "true" to manage it), '
                "check against a namespace they have with -n, or set managedNamespaces: all in --policy"
            )
        else:
            r.warnings.append(
                f"namespace {r.namespace} does not exist in the cluster, so it is treated as not "
                "managed: create it, or check against an existing one with -n"
            )


def run(args: argparse.Namespace) -> int:
    from webhook.cluster.files import with_manifest_claims, with_manifest_config_maps
    from webhook.cluster.translate import build_snapshot
    from webhook.errors import UserError
    from webhook.manifests import STDIN, Document, expand_paths, read_all
    from webhook.policyfile.read import load_policy
    from webhook.workloads import workloads

    from .check_report import exit_code, render_json, render_junit, render_table, render_text, render_yaml

    files = list(expand_paths(args.paths))
    empty = [p for p in args.paths if p != STDIN and not any(True for _ in expand_paths([p]))]
    if empty:
        raise UserError(f"{empty[0]}: no manifests in this directory (*.yaml, *.yml, *.json)")
    policy = load_policy(args.policy)
    objects = _cluster_objects(args, policy)
    try:
        snapshot = build_snapshot(objects, dra_classes=policy.dra_device_classes)
    except ValueError as err:
        raise UserError(f"invalid cluster state: {err}") from None
    snapshot = _with_live_groups(snapshot, objects)
    documents = _no_kind_problems(read_all(args.paths, stdin=sys.stdin))
    if not documents:
        raise UserError(f"{', '.join(args.paths)}: no Kubernetes objects to check (the files are empty)")
    # DRA claims and claim templates written next to the workloads count as if they existed already.
    manifests = [doc for doc in documents if isinstance(doc, Document)]
    snapshot = with_manifest_claims(snapshot, manifests, args.namespace)
    snapshot = with_manifest_config_maps(snapshot, manifests, args.namespace)  # what their envFrom reads
    snapshot = _with_manifest_group_sizes(snapshot, manifests, args.namespace)  # a PyTorchJob sizes its pods' group
    results = evaluate(workloads(documents), snapshot, policy, args.namespace)
    _namespace_warnings(results, snapshot, policy, args)
    if args.output == "json":
        print(render_json(results))
    elif args.output == "yaml":
        print(render_yaml(results))
    elif args.output == "junit":
        print(render_junit(results))
    elif args.output == "table":
        print(render_table(results))
    else:
        if not args.cluster and not args.kubeconfig:
            # "exit 1 is expected" only where it is: the bundled examples, some of them denied.
            denied = exit_code(results) == EXIT_DENIED
            print(DEMO_BANNER if denied and bundled_examples_only(files) else DEMO_NOTE)
        print(render_text(results, args.verbose))
    code = exit_code(results, args.fail_on_warn)
    if args.fail_on_warn and code == EXIT_DENIED and exit_code(results) == EXIT_ALLOWED:
        warned = sum(len(r.warnings) for r in results)
        print(
            f"gpu-admission check: {warned} warning{'s' if warned != 1 else ''}, and --fail-on-warn is set",
            file=sys.stderr,
        )
    return code
