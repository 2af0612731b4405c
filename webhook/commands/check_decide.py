"""Deciding `gpu-admission check`'s workloads: each pod through the webhook's own functions, in order.

Each workload's pods go through `admit.mutate()`, the patch is applied, and the patched pod through
`admit.validate()`, exactly as the API server would chain the two webhooks; a group's pod is recorded
in its group as the webhook's ledger records it. Admitted pods are counted into the snapshot, so later
workloads see the capacity and quota the earlier ones took. DRA claim objects are decided by the
validating webhook's function. The outcome of each workload is a `check_report.Result`, with the notes
and warnings that only a whole run can give (groups that state no size, GPUs of unknown memory).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.domain.decision import denied
from webhook.core.domain.vendor_quota import device_resource

from .check_report import Result


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
            results.append(Result.input_error(item.source, item.kind, item.name, namespace, item.message, item.field))
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
                result = Result.input_error(
                    item.source, item.kind, item.name, namespace,
                    f"could not be decided: internal error ({type(err).__name__}: {err})",
                    item.template_path.lstrip("/").replace("/", "."), code=500, role=item.role,
                    replicas=item.replicas,
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
    from webhook.core.placement.capacity import AWAITING
    from webhook.core.placement.state import with_allocation
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
    pods = max(item.replicas, 1)
    for replica in range(pods):
        pod, name = _replica_pod(item, namespace, replica, lws_size)
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
            if decision.allowed and mutated.reason == AWAITING:  # the webhook's own word for it
                result.reason = AWAITING
        _add_warnings(result, (*mutated.warnings, *decision.warnings), replica + 1)
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
    _sum_up(result, item)
    return result, snapshot


def _replica_pod(item: Any, namespace: str, replica: int, lws_size: int) -> tuple[dict[str, Any], str]:
    """Replica `replica` of the template as its controller creates it: named, labelled as the controller
    labels its pods, with the group size the controller states; and its name."""
    from webhook.core.podspec import workload as controllers

    owner_kind, owner_name = item.controller
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
    return pod, str(meta.get("name") or base)  # a Pod with only generateName: named by its prefix


def _add_warnings(result: Result, warnings: Sequence[str], pod_number: int) -> None:
    """Each warning once per workload, with the numbers of the pods that drew it."""
    for warning in warnings:
        if warning not in result.warnings:
            result.warnings.append(warning)
        drew = result.warning_pods.setdefault(warning, [])
        if pod_number not in drew:
            drew.append(pod_number)


def _sum_up(result: Result, item: Any) -> None:
    """The workload's message once all its pods are admitted (where they went), and its notes."""
    if result.allowed and item.replicas > 1 and result.managed and result.allocation is not None:
        kind = result.allocation.get("mig")  # MIG or shared devices: the scheduler picks the nodes offering them
        where = f"on nodes offering {device_resource(str(kind))}" if kind else _nodes_text(result.nodes)
        result.message = f"{item.replicas} pods admitted; " + where + _domains_text(result.pods)
    elif item.replicas == 0:
        result.notes.append("0 pods now: one pod decided, not counted")
    if getattr(item, "per_node", False):
        result.warnings.append("DaemonSet: evaluated as one pod; it runs one per eligible node")


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
    from webhook.core.podspec.coerce import mapping_of
    from webhook.core.podspec.record import allocation_to_json

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
