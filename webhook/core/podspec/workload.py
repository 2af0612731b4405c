"""Which workload a pod belongs to, from the labels its controller copies onto it.

Two directions over one table, so the webhook's log line and `check` agree: `pod_labels()` gives the
labels a controller sets on the pods it creates (check adds them to the templates it decides),
`describe()` reads them back into a compact name such as "PyTorchJob train/worker/3".
Only labels the controllers themselves set are used; none of this changes a decision.
"""

from __future__ import annotations

from collections.abc import Mapping

# Kubeflow training operator (v1): replica-type is the role in lower case; operator-name names the kind.
TRAINING_JOB = "training.kubeflow.org/job-name"
TRAINING_TYPE = "training.kubeflow.org/replica-type"
TRAINING_ROLE = "training.kubeflow.org/job-role"  # mpi-operator v2: launcher / worker
TRAINING_INDEX = "training.kubeflow.org/replica-index"
TRAINING_OPERATOR = "training.kubeflow.org/operator-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
RAY_CLUSTER = "ray.io/cluster"
RAY_GROUP = "ray.io/group"
RAY_NODE_TYPE = "ray.io/node-type"
VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_INDEX = "volcano.sh/task-index"
JOB_NAME = "batch.kubernetes.io/job-name"
KSERVE_ISVC = "serving.kserve.io/inferenceservice"
KSERVE_COMPONENT = "component"
LLMISVC_PART_OF = "app.kubernetes.io/part-of"
LLMISVC_NAME = "app.kubernetes.io/name"
LLMISVC_COMPONENT = "app.kubernetes.io/component"
ARGO_WORKFLOW = "workflows.argoproj.io/workflow"

# training.kubeflow.org/operator-name -> kind (the v1 operator names itself after the kind it runs)
_OPERATORS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "paddlejob-controller": "PaddleJob",
    "xgboostjob-controller": "XGBoostJob",
    "jaxjob-controller": "JAXJob",
    "mxjob-controller": "MXJob",
}
_OPERATOR_OF = {kind: name for name, kind in _OPERATORS.items() if name != "mpi-operator"}

# Controller families, as `check` names them
TRAINING, MPI_V2, JOBSET, LWS, RAY, VOLCANO, JOB, KSERVE, LLMISVC, ARGO = (
    "training", "mpi-v2", "jobset", "lws", "ray", "volcano", "job", "kserve", "llmisvc", "argo",
)


def pod_labels(
    family: str, kind: str, name: str, role: str = "", index: int = 0, group_size: int = 1
) -> dict[str, str]:
    """The labels the controller of `family` puts on pod number `index` of `role` of workload `name`.

    `group_size` is the number of pods per group: LeaderWorkerSet workers (size - 1; pod `index` is worker
    `index % group_size + 1` of group `index // group_size`; the whole group, leader first, when the
    workerTemplate serves both) and JobSet jobs (parallelism)."""
    if family == TRAINING:
        return {TRAINING_JOB: name, TRAINING_TYPE: role.lower(), TRAINING_INDEX: str(index),
                TRAINING_OPERATOR: _OPERATOR_OF.get(kind, kind.lower() + "-controller")}
    if family == MPI_V2:
        return {TRAINING_JOB: name, TRAINING_ROLE: role.lower(), TRAINING_INDEX: str(index),
                TRAINING_OPERATOR: "mpi-operator"}
    if family == JOBSET:
        # `replicas` Jobs of each replicated job, `group_size` pods (parallelism) per Job
        job = index // max(group_size, 1)
        return {JOBSET_NAME: name, JOBSET_JOB: role, JOBSET_INDEX: str(job), JOB_NAME: f"{name}-{role}-{job}"}
    if family == LWS:
        if role == "leader":
            return {LWS_NAME: name, LWS_GROUP: str(index), LWS_WORKER: "0"}
        size = max(group_size, 1)
        first = 1 if role.endswith("worker") else 0  # with no leaderTemplate, pod 0 of each group leads
        return {LWS_NAME: name, LWS_GROUP: str(index // size), LWS_WORKER: str(index % size + first)}
    if family == RAY:
        head = role == "head"
        return {RAY_CLUSTER: name, RAY_GROUP: "headgroup" if head else role,
                RAY_NODE_TYPE: "head" if head else "worker"}
    if family == VOLCANO:
        return {VOLCANO_JOB: name, VOLCANO_TASK: role, VOLCANO_INDEX: str(index)}
    if family == JOB:
        return {JOB_NAME: name, "job-name": name}
    if family == KSERVE:
        return {KSERVE_ISVC: name, KSERVE_COMPONENT: role}
    if family == LLMISVC:
        return {LLMISVC_NAME: name, LLMISVC_PART_OF: "llminferenceservice",
                LLMISVC_COMPONENT: "llminferenceservice-" + (role or "workload")}
    if family == ARGO:
        return {ARGO_WORKFLOW: name}
    return {}


# Each of describe()'s answers needs one of these labels set: without any, it is "".
_NAME_KEYS = frozenset((TRAINING_JOB, JOBSET_NAME, LWS_NAME, RAY_CLUSTER, VOLCANO_JOB, KSERVE_ISVC, LLMISVC_NAME,
                        ARGO_WORKFLOW, JOB_NAME, "job-name"))


def _join(*parts: str) -> str:
    return "/".join(part for part in parts if part)


def describe(labels: Mapping[str, object] | None) -> str:
    """"PyTorchJob train/worker/3", "JobSet js/workers/0", ... or "" when no known controller's labels are set.

    Pure and cheap: the webhook calls it for every admission it logs."""
    if not labels or _NAME_KEYS.isdisjoint(labels):  # most pods: no controller's name label at all
        return ""

    def get(key: str) -> str:
        value = labels.get(key)
        return value if isinstance(value, str) else ""

    if name := get(TRAINING_JOB):
        kind = _OPERATORS.get(get(TRAINING_OPERATOR), "TrainingJob")
        return f"{kind} " + _join(name, get(TRAINING_TYPE) or get(TRAINING_ROLE), get(TRAINING_INDEX))
    if name := get(JOBSET_NAME):
        return "JobSet " + _join(name, get(JOBSET_JOB), get(JOBSET_INDEX))
    if name := get(LWS_NAME):
        return "LeaderWorkerSet " + _join(name, get(LWS_GROUP), get(LWS_WORKER))
    if name := get(RAY_CLUSTER):
        return "RayCluster " + _join(name, get(RAY_GROUP))
    if name := get(VOLCANO_JOB):
        return "VolcanoJob " + _join(name, get(VOLCANO_TASK), get(VOLCANO_INDEX))
    if name := get(KSERVE_ISVC):
        return "InferenceService " + _join(name, get(KSERVE_COMPONENT))
    if get(LLMISVC_PART_OF) == "llminferenceservice" and (name := get(LLMISVC_NAME)):
        return "LLMInferenceService " + _join(name, get(LLMISVC_COMPONENT).removeprefix("llminferenceservice-"))
    if name := get(ARGO_WORKFLOW):
        return "Workflow " + name
    if name := get(JOB_NAME) or get("job-name"):
        return "Job " + name
    return ""


__all__ = ["pod_labels", "describe"]
