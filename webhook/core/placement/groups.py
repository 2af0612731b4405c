"""Groups of pods that must share one topology domain (multi-pod jobs across nodes).

A group is the set of pods one controller makes for one job (PyTorchJob workers, a JobSet's replicated
job, a LeaderWorkerSet group, a Ray worker group, a Volcano job, a PodGroup) or that name it with
`gpu-admission.io/group`. The first pod of a group chooses the domain (a value of a topology level: a
node label such as `nvidia.com/gpu.clique`) that can hold the whole group; later pods follow it. The
choice lives in a `GroupRecord`, kept with the reservations so that replicas and restarts agree.

Interface shared by the core (admission), the cluster layer (ledger, snapshot) and `check`:
- `group_of(pod)` reads a pod's group from its labels and annotations;
- `Snapshot.groups` holds the records known when the snapshot was taken, by `GroupRecord.key`;
- a decision's `Allocation.group` / `Allocation.domain` name the group and the domain chosen;
- `commit(records, ref, level, domain, gpus_per_pod, member, free=...)` is what the ledger (and
  `check`, between replicas) runs to record a member: it returns the updated record, or a refusal
  when the domain is no longer the group's to take (another group won it meanwhile). `free` (keyword,
  optional, added to the first interface) is the domain's GPUs free as the caller's reservations
  stand, before this member's own: with it, a new group is refused when the domain cannot hold it
  besides what other groups' records still promise there;
- `without_member(record, member)` is the record once a member is gone (None when none is left);
- `domain_of(allocation.domain)` splits "level=value" for `commit` ("" when the group has no domain:
  another scheduler, Kueue TAS or KAI places its pods (`group_place.topology_owner`), the cluster has
  no topology labels, or a preferred group split);
- `record_to_json` / `record_from_json`: the record's JSON form (ValueError names the field).

Which labels name a group, and what size they state (checked against each controller's source):
`gpu-admission.io/group` (annotation, the pod author's word, wins over any controller's labels);
LeaderWorkerSet `leaderworkerset.sigs.k8s.io/name` + `group-index`, size from the pod annotation
`leaderworkerset.sigs.k8s.io/size`; JobSet `jobset.sigs.k8s.io/jobset-name` + `replicatedjob-name`
(open-ended: pods carry `replicatedjob-replicas`, the Job count, but not each Job's parallelism, so that
count is only the minimum); Kubeflow training operator `training.kubeflow.org/job-name` (one group per
job across replica types, named by `operator-name`'s kind); KubeRay `ray.io/cluster` + `ray.io/group`;
Volcano `volcano.sh/job-name`; scheduler-plugins `scheduling.x-k8s.io/pod-group` and the legacy
`pod-group.scheduling.sigs.k8s.io[/name]` (with `.../min-available` as the minimum).
`gpu-admission.io/group-size: N` states the size for any of them; otherwise the size comes from the
controller's own object or PodGroup (`Snapshot.group_sizes`, filled by the watch cache and `check`'s
snapshot with `sizes_of`): PodGroup `spec.minMember` (Volcano, scheduler-plugins), Volcano Job
`tasks[].replicas`, Kubeflow `*ReplicaSpecs[].replicas`, JobSet `replicas x parallelism` per replicated
job, RayCluster worker group `replicas x numOfHosts` (head group 1). Volcano's own pod annotation
`scheduling.k8s.io/group-name` (a pod of a Volcano PodGroup) names the group `podgroup/<name>` too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.domain.names import GROUP_ANNOTATION, GROUP_SIZE_ANNOTATION
from webhook.core.domain.podview import PodView
from webhook.core.podspec import workload
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.view import labels_and_annotations


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A pod's group as its labels/annotations state it."""

    namespace: str
    name: str  # stable within the namespace, e.g. "pytorchjob/train" or "jobset/js/workers"
    size: int | None  # pods in the group; None when open-ended
    source: str  # what named it: the label or annotation key
    # Pods known to come when the size is not stated: JobSet's Job count (each Job has at least one
    # pod), a legacy PodGroup's min-available. An open-ended group needs a domain with room for these.
    minimum: int = 1

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """Where a group lives and how much of it is placed, as the ledger keeps it."""

    namespace: str
    name: str
    level: str  # node label key of the domain ("nvidia.com/gpu.clique")
    domain: str  # that label's value
    size: int | None  # pods expected (None: open-ended)
    gpus_per_pod: int
    members: tuple[str, ...] = ()  # admitted pods (UIDs in the webhook, names in `check`), sorted

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def promised_gpus(self) -> int:
        """GPUs of the domain the group still expects to take (beyond its members already placed)."""
        if self.size is None:
            return 0
        return max(self.size - len(self.members), 0) * self.gpus_per_pod


# LeaderWorkerSet states the group's size on every pod; JobSet states how many Jobs the replicated job
# has (each Job's parallelism is not on the pod, so that count is a floor, not the size).
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins coscheduling (PodGroup CRD)
LEGACY_PODGROUP_LABELS = ("pod-group.scheduling.sigs.k8s.io", "pod-group.scheduling.sigs.k8s.io/name")
LEGACY_MIN_AVAILABLE = "pod-group.scheduling.sigs.k8s.io/min-available"
# Volcano: the PodGroup a pod belongs to (set by the Volcano Job controller, or by hand on plain pods);
# read after `volcano.sh/job-name`, so a Volcano Job's pods stay one group named by their job.
VOLCANO_PODGROUP = "scheduling.k8s.io/group-name"


def _text(source: Mapping[str, Any], key: str) -> str:
    value = source.get(key)
    return value if isinstance(value, str) else ""


def _count(text: str) -> int | None:
    """A controller's count ("4"), or None when absent or not a positive integer (then the group is
    open-ended rather than refused: the pod's author did not write it)."""
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


def _controller_group(labels: Mapping[str, Any],
                      annotations: Mapping[str, Any]) -> tuple[str, int | None, int, str] | None:
    """(name, size, minimum, source) of the group a controller's labels put the pod in."""
    def get(key: str) -> str:
        return _text(labels, key) or _text(annotations, key)

    if name := get(workload.LWS_NAME):
        # One leader-worker group per group-index: a model replica's pods (tensor/pipeline parallel)
        size = _count(get(LWS_SIZE))
        return f"lws/{name}/{get(workload.LWS_GROUP) or '0'}", size, size or 1, workload.LWS_NAME
    if name := get(workload.JOBSET_NAME):
        jobs = _count(get(JOBSET_REPLICAS)) or 1
        return f"jobset/{name}/{get(workload.JOBSET_JOB)}", None, jobs, workload.JOBSET_NAME
    if name := get(workload.TRAINING_JOB):
        # Master and workers of one job share its collective rings, so the group is the job, every
        # replica type in it (the kind comes from the operator's name: a PyTorchJob and a TFJob may
        # share a name in one namespace).
        operator = get(workload.TRAINING_OPERATOR).removesuffix("-controller") or "trainingjob"
        return f"{operator}/{name}", None, 1, workload.TRAINING_JOB
    if name := get(workload.RAY_CLUSTER):
        return f"raycluster/{name}/{get(workload.RAY_GROUP)}", None, 1, workload.RAY_CLUSTER
    if name := get(workload.VOLCANO_JOB):
        return f"vcjob/{name}", None, 1, workload.VOLCANO_JOB
    if name := _text(labels, PODGROUP_LABEL):
        return f"podgroup/{name}", None, 1, PODGROUP_LABEL
    for key in LEGACY_PODGROUP_LABELS:
        if name := _text(labels, key):
            return f"podgroup/{name}", None, _count(_text(labels, LEGACY_MIN_AVAILABLE)) or 1, key
    if name := _text(annotations, VOLCANO_PODGROUP):
        return f"podgroup/{name}", None, 1, VOLCANO_PODGROUP
    return None


# Every key that can name a group (labels or annotations; the pod-group ones count in labels only, but
# looking for them in annotations too only means the full look-up runs).
_GROUP_KEYS = frozenset((GROUP_ANNOTATION, workload.LWS_NAME, workload.JOBSET_NAME, workload.TRAINING_JOB,
                         workload.RAY_CLUSTER, workload.VOLCANO_JOB, PODGROUP_LABEL, *LEGACY_PODGROUP_LABELS,
                         VOLCANO_PODGROUP))


def names_no_group(pod: Mapping[str, Any] | PodView) -> bool:
    """True when the pod carries none of the keys that name a group, so `group_of` finds none (and its
    only refusal, a malformed group size, cannot matter: a group size alone names no group). A cheap
    test, for callers that go on to ask for a group only when one may be there."""
    labels, annotations = labels_and_annotations(pod)
    return _GROUP_KEYS.isdisjoint(labels) and _GROUP_KEYS.isdisjoint(annotations)


def group_of(pod: Mapping[str, Any] | PodView, namespace: str,
             sizes: Mapping[str, int] | None = None) -> GroupRef | None:
    """The pod's group, or None when it belongs to none. Raises ValueError naming the annotation when
    `gpu-admission.io/group` or `gpu-admission.io/group-size` is malformed (the pod author's to fix).

    `sizes` (`Snapshot.group_sizes`, by `GroupRef.key`): the sizes read from the controllers' objects,
    used for a controller's group when neither the pod's annotation nor its labels state one."""
    labels, annotations = labels_and_annotations(pod)
    if GROUP_SIZE_ANNOTATION not in annotations and names_no_group(pod):
        return None  # most pods: no key that names a group or states a size
    size = _stated_size(annotations)
    explicit = annotations.get(GROUP_ANNOTATION)
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.strip() or len(explicit) > 253:
            raise ValueError(f"metadata.annotations[{GROUP_ANNOTATION}]: expected a group name, got {explicit!r}")
        return GroupRef(namespace, explicit.strip(), size, GROUP_ANNOTATION, size or 1)
    found = _controller_group(labels, annotations)
    if found is None:
        return None
    name, stated, minimum, source = found
    size = size or stated
    ref = GroupRef(namespace, name, size, source, size or minimum)
    return sized(ref, sizes) if sizes else ref


def sized(ref: GroupRef, sizes: Mapping[str, int]) -> GroupRef:
    """`ref` with the size its controller's object states (`Snapshot.group_sizes`) when the pod states
    none; a group the pod's author named (`gpu-admission.io/group`) is theirs to size."""
    if ref.size is not None or ref.source == GROUP_ANNOTATION:
        return ref
    size = sizes.get(ref.key)
    if type(size) is not int or size < 1:
        return ref
    return GroupRef(ref.namespace, ref.name, size, ref.source, size)


def _stated_size(annotations: Mapping[str, Any]) -> int | None:
    raw = annotations.get(GROUP_SIZE_ANNOTATION)
    if raw is None:
        return None
    if not isinstance(raw, str) or _count(raw.strip()) is None or len(raw) > 9:
        raise ValueError(f"metadata.annotations[{GROUP_SIZE_ANNOTATION}]: expected a positive integer, got {raw!r}")
    return int(raw.strip())


def record_to_json(record: GroupRecord) -> dict[str, Any]:
    return {
        "namespace": record.namespace,
        "name": record.name,
        "level": record.level,
        "domain": record.domain,
        "size": record.size,
        "gpusPerPod": record.gpus_per_pod,
        "members": list(record.members),
    }


def _field(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def record_from_json(data: Any) -> GroupRecord:
    """Raises ValueError naming the field when `data` is not a record."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    size = data.get("size")
    if size is not None and (type(size) is not int or size < 1):  # type(): not bool
        raise ValueError(f"size: expected a positive integer or null, got {size!r}")
    gpus = data.get("gpusPerPod")
    if type(gpus) is not int or gpus < 0:
        raise ValueError(f"gpusPerPod: expected an integer >= 0, got {gpus!r}")
    members = data.get("members", [])
    if not isinstance(members, list) or any(type(m) is not str or not m for m in members):
        raise ValueError(f"members: expected a list of non-empty strings, got {members!r}")
    return GroupRecord(_field(data, "namespace"), _field(data, "name"), _field(data, "level"),
                       _field(data, "domain"), size, gpus, tuple(sorted(set(members))))


def promised_in(records: Mapping[str, GroupRecord], level: str, domain: str, besides: str = "") -> int:
    """GPUs the records of groups other than `besides` (a key) still expect to take in the domain."""
    return sum(r.promised_gpus for r in records.values()
               if r.domain == domain and r.level == level and r.key != besides)


def commit(records: Mapping[str, GroupRecord], ref: GroupRef, level: str, domain: str, gpus_per_pod: int,
           member: str, *, free: int | None = None, quota_room: int | None = None) -> GroupRecord | str:
    """The group's record with `member` added (created when the group has none), or a refusal message
    when the domain cannot be the group's: another group's record already promises what it needs.

    `free`: the domain's GPUs free now, counting every reservation made so far but not this member's.
    When other groups' records still expect GPUs in the domain, what this member and the rest of its
    group will take (its own promise covers members within its size) must fit in what is free less those
    promises. Two groups racing for the last domain: the second to commit sees the first's promise and
    is refused, so one waits and neither is half in. With no other group's promise there, a group may
    take a domain that is busy now (it waits for room, as admission warned). Without `free`, only the
    group's own record is checked.

    `quota_room`: GPUs the namespace's quota still allows beyond this member (None: no GPU quota). A new
    group's stated size is a promise that holds the domain against other groups; it is cut to the pods the
    namespace could ever add, so that pods stating a size they cannot reach hold nothing beyond it."""
    record = records.get(ref.key)
    if record is not None:
        if (record.level, record.domain) != (level, domain):
            return (f"group {ref.key} lives in {record.level}={record.domain}; "
                    f"this pod was placed in {level}={domain}")
        if member in record.members:
            return record
        beyond_promise = record.size is not None and len(record.members) >= record.size
        needs = gpus_per_pod if beyond_promise else 0
    else:
        size = ref.size
        if size is not None and quota_room is not None and gpus_per_pod > 0:
            size = max(1, min(size, 1 + max(quota_room, 0) // gpus_per_pod))
        needs = (size if size is not None else ref.minimum) * gpus_per_pod
        record = GroupRecord(ref.namespace, ref.name, level, domain, size, gpus_per_pod)
    if free is not None and needs:
        others = promised_in(records, level, domain, besides=ref.key)
        if others and needs > free - others:
            return (f"group {ref.key} needs {needs} GPUs in {level}={domain}: {free} are free and "
                    f"other groups' pods still to come hold {others} of them")
    return GroupRecord(record.namespace, record.name, level, domain, record.size, record.gpus_per_pod,
                       tuple(sorted((*record.members, member))))


def domain_of(text: str) -> tuple[str, str] | None:
    """`Allocation.domain` ("nvidia.com/gpu.clique=c1") as (level, value); None when empty or malformed
    (a label key holds no "=", so the first one splits it)."""
    level, sep, value = text.partition("=")
    return (level, value) if sep and level and value else None


def without_member(record: GroupRecord, member: str) -> GroupRecord | None:
    """The record once `member` is gone, or None when no member is left (the domain is free again)."""
    members = tuple(m for m in record.members if m != member)
    if not members:
        return None
    return GroupRecord(record.namespace, record.name, record.level, record.domain, record.size,
                       record.gpus_per_pod, members)


# -- sizes from the controllers' objects ----------------------------------------------------------------

# (API group, kind) of the objects that state a group's size, each read by `sizes_of`.
SIZED_KINDS = frozenset({
    ("scheduling.volcano.sh", "PodGroup"), ("scheduling.x-k8s.io", "PodGroup"), ("scheduling.sigs.k8s.io", "PodGroup"),
    ("batch.volcano.sh", "Job"), ("kubeflow.org", "PyTorchJob"), ("kubeflow.org", "TFJob"),
    ("kubeflow.org", "MPIJob"), ("kubeflow.org", "XGBoostJob"), ("kubeflow.org", "PaddleJob"),
    ("kubeflow.org", "JAXJob"), ("jobset.x-k8s.io", "JobSet"), ("ray.io", "RayCluster"),
})
# Kubeflow kind -> the spec field of its replica specs
_REPLICA_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs",
                  "XGBoostJob": "xgbReplicaSpecs", "PaddleJob": "paddleReplicaSpecs", "JAXJob": "jaxReplicaSpecs"}


def _number(value: Any, default: int | None = None) -> int | None:
    """A count field (an integer >= 0), `default` when absent, None when malformed."""
    if value is None:
        return default
    return value if type(value) is int and value >= 0 else None  # type(): not bool


def _kubeflow_size(kind: str, spec: Mapping[str, Any]) -> int | None:
    replicas = mapping_of(spec.get(_REPLICA_SPECS[kind]))
    total = 0
    for role, replica_spec in replicas.items():
        # mpi-operator: the launcher runs mpirun and takes no part in the job's GPUs, unless told to
        # run as a worker too.
        if kind == "MPIJob" and str(role).lower() == "launcher" and spec.get("runLauncherAsWorker") is not True:
            continue
        count = _number(mapping_of(replica_spec).get("replicas"), 1)  # the operators default to 1
        if count is None:
            return None
        total += count
    return total or None


def sizes_of(obj: Mapping[str, Any]) -> dict[str, int]:
    """The group sizes an owner object or PodGroup states, by the `GroupRef.key` its pods' group gets;
    empty for any other object, or one whose counts are malformed (its pods' groups stay open-ended).

    PodGroup (Volcano, scheduler-plugins): `spec.minMember`, the pods the gang scheduler waits for.
    Volcano Job: the sum of `spec.tasks[].replicas`, every pod the job makes (the group is placed whole;
    `spec.minAvailable`, what Volcano gangs on and its PodGroup's minMember, may be fewer, but the pods
    beyond it still come to the same domain). Kubeflow jobs: the sum of their replica specs' `replicas`
    (an MPIJob's launcher counts only with `runLauncherAsWorker`). JobSet: per replicated job,
    `replicas x template.spec.parallelism`. RayCluster: the head group is 1 pod; per worker group,
    `replicas` (`minReplicas` when unset) x `numOfHosts`."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return {}
    group, _, version = api_version.rpartition("/")
    if (group, kind) not in SIZED_KINDS:
        return {}
    metadata = mapping_of(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return {}
    namespace = metadata.get("namespace")
    prefix = f"{namespace if isinstance(namespace, str) and namespace else 'default'}/"
    spec = mapping_of(obj.get("spec"))
    found: dict[str, int | None] = {}
    if kind == "PodGroup":
        found[f"podgroup/{name}"] = _number(spec.get("minMember"))
    elif kind == "Job":
        tasks = spec.get("tasks")
        counts = [_number(mapping_of(t).get("replicas"), 1) for t in tasks] if isinstance(tasks, list) else [None]
        found[f"vcjob/{name}"] = None if None in counts else sum(c for c in counts if c is not None)
    elif kind in _REPLICA_SPECS:
        # The pods' group is named by the operator: the v1 training operator calls itself
        # `<kind>-controller`, mpi-operator (kubeflow.org/v2beta1 MPIJob) `mpi-operator`.
        operator = "mpi-operator" if kind == "MPIJob" and version != "v1" else kind.lower()
        found[f"{operator}/{name}"] = _kubeflow_size(kind, spec)
    elif kind == "JobSet":
        for job in spec.get("replicatedJobs") or ():
            job = mapping_of(job)
            job_name = job.get("name")
            template = mapping_of(mapping_of(job.get("template")).get("spec"))
            jobs, parallelism = _number(job.get("replicas"), 1), _number(template.get("parallelism"), 1)
            if isinstance(job_name, str) and job_name and jobs is not None and parallelism is not None:
                found[f"jobset/{name}/{job_name}"] = jobs * parallelism
    elif kind == "RayCluster":
        if "headGroupSpec" in spec:
            found[f"raycluster/{name}/headgroup"] = 1
        for worker in spec.get("workerGroupSpecs") or ():
            worker = mapping_of(worker)
            group_name = worker.get("groupName")
            replicas = _number(worker.get("replicas"))
            if worker.get("replicas") is None:
                replicas = _number(worker.get("minReplicas"), 0)
            hosts = _number(worker.get("numOfHosts"), 1)
            if isinstance(group_name, str) and group_name and replicas is not None and hosts:
                found[f"raycluster/{name}/{group_name}"] = replicas * hosts
    return {prefix + key: size for key, size in found.items() if size}


def merge_sizes(tables: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """One `Snapshot.group_sizes` from each object's `sizes_of` (the larger where two objects name one
    group: a Volcano PodGroup and a scheduler-plugins PodGroup of the same name)."""
    merged: dict[str, int] = {}
    for sizes in tables:
        for key, size in sizes.items():
            if size > merged.get(key, 0):
                merged[key] = size
    return merged
