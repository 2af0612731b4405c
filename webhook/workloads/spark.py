"""Kubeflow Spark Operator's SparkApplication and ScheduledSparkApplication (sparkoperator.k8s.io): the
driver pod and the executor pods Spark creates for them (spark-operator `api/v1beta2`, GPUs added by
`addGPU` in `internal/webhook/sparkpod_defaulter.go`, counts defaulted in `api/v1beta2/defaults.go`).

Each role's Spark container (`spark-kubernetes-driver` / `-executor`, or the one of that name in the
role's pod `template`) gets `gpu: {name, quantity}` as a limit; without it, Spark's own
`spark.<role>.resource.gpu.amount` with `.vendor` in sparkConf asks for `<vendor>/gpu`. Executors:
`executor.instances`, else sparkConf's `spark.executor.instances`, else 1; with dynamic allocation the
initial executors (the largest of instances, initialExecutors and minExecutors), noted.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .model import Builder, Context, count, mapping, sequence

CONTAINERS = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}
_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName", "hostNetwork", "priorityClassName",
               "dnsConfig", "hostAliases", "shareProcessNamespace")
_CONTAINER_FIELDS = ("env", "envFrom", "securityContext", "volumeMounts", "lifecycle", "ports")


def _int_conf(b: Builder, conf: Mapping[str, Any], key: str) -> int | None:
    value = conf.get(key)
    if value is None:
        return None
    try:
        number = int(str(value))
    except ValueError:
        raise b.doc.error("spec.sparkConf", f"{key} is {value!r}; expected a whole number") from None
    return max(number, 0)


def _gpu(b: Builder, role: str, spec: Mapping[str, Any], conf: Mapping[str, Any], path: str) -> dict[str, Any]:
    gpu = mapping(b.doc, spec.get("gpu"), f"{path}.gpu", required=False)
    if gpu:
        name, quantity = gpu.get("name"), gpu.get("quantity")
        if not isinstance(name, str) or not name:
            raise b.doc.error(f"{path}.gpu.name", "missing: the GPU resource name, e.g. nvidia.com/gpu")
        if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
            raise b.doc.error(f"{path}.gpu.quantity", f"expected a whole number above 0, got {quantity!r}")
        return {name: quantity}
    amount = conf.get(f"spark.{role}.resource.gpu.amount")
    if amount is None:
        return {}
    vendor = conf.get(f"spark.{role}.resource.gpu.vendor")
    if not vendor:
        raise b.doc.error("spec.sparkConf", f"spark.{role}.resource.gpu.amount without spark.{role}.resource.gpu"
                          ".vendor: Spark on Kubernetes asks for <vendor>/gpu, e.g. nvidia.com")
    return {f"{vendor}/gpu": amount}


def _role_pod(b: Builder, app: Mapping[str, Any], role: str, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = mapping(b.doc, app.get(role), f"{path}.{role}", required=False)
    conf = mapping(b.doc, app.get("sparkConf"), f"{path}.sparkConf", required=False)
    template = mapping(b.doc, spec.get("template"), f"{path}.{role}.template", required=False)
    pod_spec = copy.deepcopy(dict(mapping(b.doc, template.get("spec"), f"{path}.{role}.template.spec",
                                          required=False)))
    containers = list(sequence(b.doc, pod_spec.get("containers"), f"{path}.{role}.template.spec.containers",
                               required=False))
    # Spark takes the template's container of its own name, else its first.
    at = next((i for i, c in enumerate(containers) if isinstance(c, Mapping) and c.get("name") == CONTAINERS[role]),
              0 if containers else None)
    main = dict(containers[at]) if at is not None else {}
    main["name"] = CONTAINERS[role]
    main["image"] = spec.get("image") or app.get("image") or main.get("image") or "<spark image>"
    for key in _CONTAINER_FIELDS:
        if spec.get(key) is not None:
            main[key] = copy.deepcopy(spec[key])
    gpus = _gpu(b, role, spec, conf, f"{path}.{role}")
    if gpus:
        resources = dict(main.get("resources") or {})
        main["resources"] = {**resources, "limits": {**(resources.get("limits") or {}), **gpus}}
    if at is None:
        containers = [main]
    else:
        containers[at] = main
    pod_spec["containers"] = [*containers, *(spec.get("sidecars") or [])]
    if spec.get("initContainers"):
        pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), *spec["initContainers"]]
    if app.get("volumes"):
        pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), *app["volumes"]]
    for key in _POD_FIELDS:
        if spec.get(key) is not None:
            pod_spec[key] = copy.deepcopy(spec[key])
    if spec.get("podSecurityContext") is not None:
        pod_spec["securityContext"] = copy.deepcopy(spec["podSecurityContext"])
    if "schedulerName" not in pod_spec and app.get("batchScheduler"):
        pod_spec["schedulerName"] = app["batchScheduler"]
    meta = copy.deepcopy(dict(mapping(b.doc, template.get("metadata"), f"{path}.{role}.template.metadata",
                                      required=False)))
    meta["labels"] = {**(meta.get("labels") or {}), **(spec.get("labels") or {}), "spark-role": role}
    if spec.get("annotations"):
        meta["annotations"] = {**(meta.get("annotations") or {}), **spec["annotations"]}
    return meta, pod_spec


def _executors(b: Builder, app: Mapping[str, Any], path: str) -> tuple[int, tuple[str, ...]]:
    conf = mapping(b.doc, app.get("sparkConf"), f"{path}.sparkConf", required=False)
    executor = mapping(b.doc, app.get("executor"), f"{path}.executor", required=False)
    instances = (count(b.doc, executor, "instances", f"{path}.executor.") if executor.get("instances") is not None
                 else _int_conf(b, conf, "spark.executor.instances"))
    dynamic = mapping(b.doc, app.get("dynamicAllocation"), f"{path}.dynamicAllocation", required=False)
    enabled = dynamic.get("enabled") is True if dynamic else str(conf.get("spark.dynamicAllocation.enabled",
                                                                          "")).lower() == "true"
    if not enabled:
        return (1 if instances is None else instances), ()
    where = f"{path}.dynamicAllocation."
    initial = max(instances or 0, count(b.doc, dynamic, "initialExecutors", where, default=0),
                  count(b.doc, dynamic, "minExecutors", where, default=0))
    top = dynamic.get("maxExecutors", "no maxExecutors")
    return initial, (f"dynamic allocation: decided at its initial executors {initial} (up to {top})",)


def application(b: Builder, app: Mapping[str, Any], path: str) -> None:
    for role in ("driver", "executor"):
        meta, pod = _role_pod(b, app, role, path)
        replicas, notes = (1, ()) if role == "driver" else _executors(b, app, path)
        b.pod(meta, pod, f"{path}.{role}", replicas, role, notes=notes)
    b.consumed.append(f"/{path.replace('.', '/')}/sparkConf")


def spark_application(b: Builder, ctx: Context) -> None:
    application(b, mapping(b.doc, b.doc.data.get("spec"), "spec"), "spec")


def scheduled_spark_application(b: Builder, ctx: Context) -> None:
    spec = mapping(b.doc, b.doc.data.get("spec"), "spec")
    application(b, mapping(b.doc, spec.get("template"), "spec.template"), "spec.template")


__all__ = ["spark_application", "scheduled_spark_application", "CONTAINERS"]
