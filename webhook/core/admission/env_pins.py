"""A GPU container that takes `envFrom` from a source the webhook cannot read (a Secret; a ConfigMap the
watch cache has not seen): what it must carry, and where it may run.

Such a source can set any variable whose name starts with the envFrom `prefix`. The kubelet builds a
container's environment after the device plugin's variables (GenerateRunContainerOptions appends
makeEnvironmentVariables' result to the device manager's), and inside that from envFrom first and `env`
after ("Env will override EnvFrom variables": pkg/kubelet/kubelet_pods.go). So:
- an explicit `env` entry wins over the Secret: each switch of the limit layer that the prefix could
  name is pinned to its safe value (limits.ENV_FROM_PINS), and a capped container's per-device compute
  limits to its cap;
- NVIDIA_VISIBLE_DEVICES cannot be pinned in a GPU container (its list comes from the device plugin, and
  the Secret's value would replace it): such a container is admitted only where every GPU node it can
  land on reports that its toolkit ignores the variable in unprivileged containers
  (`Node.toolkit_envvar is False`).
A prefix that no isolation variable starts with (`APP_`) makes the source harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.domain.podview import PodView
from webhook.core.domain.request import PodRequest
from webhook.core.placement.nodeconstraints import CORDONED, constraints_of, tolerations_of
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.limits import DEVICE_SELECTING, ENV_FROM_PINS, ISOLATION_ENV, ISOLATION_PREFIXES
from webhook.core.podspec.patch import pointer
from webhook.core.podspec.view import as_view, view_for

Target = tuple[str, int]  # (containers | initContainers, index)
SM_DEVICE = "CUDA_DEVICE_SM_LIMIT_"


class Unresolved(NamedTuple):
    """One envFrom source the webhook cannot read, in one container."""

    key: str  # containers | initContainers | ephemeralContainers
    at: int  # index in that list
    where: str  # "container 'main'"
    what: str  # "Secret 'hf-token'"
    prefix: str

    def describe(self) -> str:
        return f"{self.where} reads {self.what}" + (f" with prefix {self.prefix}" if self.prefix else "")


def can_form(prefix: str, name: str) -> bool:
    """Whether prefix + some non-empty key is `name` (the kubelet skips no key that is a valid name)."""
    return len(name) > len(prefix) and name.startswith(prefix)


def harmless(prefix: str) -> bool:
    """No isolation variable can come out of a source with this prefix, whatever its keys."""
    if any(can_form(prefix, name) for name in ISOLATION_ENV):
        return False
    return not any(can_form(prefix, family) or prefix.startswith(family) for family in ISOLATION_PREFIXES)


def device_variable(prefix: str) -> str | None:
    """The first device-selecting variable the prefix could form (None: none)."""
    return next((name for name in DEVICE_SELECTING if can_form(prefix, name)), None)


def pins_for(prefixes: Iterable[str], gpus: int, cores: int, backend: str) -> list[tuple[str, str]]:
    """The (name, safe value) entries a GPU container taking unread sources with these prefixes needs."""
    wanted: dict[str, str] = {}
    for prefix in prefixes:
        wanted.update((n, v) for n, v in ENV_FROM_PINS.items() if can_form(prefix, n))
        if backend == "hami-core" and 0 < cores < 100 and can_form(prefix, SM_DEVICE + "0"):
            # HAMi-core reads CUDA_DEVICE_SM_LIMIT_<i> above 0 before CUDA_DEVICE_SM_LIMIT.
            wanted.update((f"{SM_DEVICE}{i}", str(cores)) for i in range(gpus))
    return sorted(wanted.items())


def gpu_targets(request: PodRequest) -> dict[Target, tuple[int, str]]:
    """The containers that get GPUs: (key, index) -> (GPU count from the device plugin, name). A container
    naming a DRA claim of a pod with DRA GPUs counts too (0 devices of the plugin's): its GPUs come through
    CDI, and the toolkit would add the Secret's device list to them."""
    targets = {("initContainers" if c.init else "containers", c.index): (c.gpu.count, c.name)
               for c in request.containers if c.gpu is not None and c.gpu.count > 0}
    if request.dra_gpus > 0:
        for c in view_for(request).of_kind("containers", "initContainers"):
            if c.claims and (c.kind, c.index) not in targets:
                targets[(c.kind, c.index)] = (0, c.name)
    return targets


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}  # the mutation adds it


def nodes_ignore_variable(request: PodRequest, snapshot: Snapshot, tolerations: Sequence[Mapping[str, Any]] = ()
                          ) -> bool:
    """Every NVIDIA GPU node the pod can land on reports that its toolkit ignores NVIDIA_VISIBLE_DEVICES
    from unprivileged containers (and there is at least one). "Can land on": its own nodeSelector,
    required node affinity and tolerations (with those the mutation adds) allow it; a cordon does not
    count, it is lifted at will. Other vendors' pods: their nodes run no NVIDIA toolkit."""
    if request.vendor not in ("", "nvidia"):
        return True
    constraints = constraints_of(view_for(request), tolerations_of((GPU_TOLERATION, *tolerations)))
    nodes = [n for n in snapshot.nodes.values()
             if n.gpus and n.vendor == "nvidia" and constraints.refusal(n) in ("", CORDONED)]
    return bool(nodes) and all(n.toolkit_envvar is False for n in nodes)


def wanted_pins(request: PodRequest, unresolved: Sequence[Unresolved], allocation: Allocation | None,
                backend: str) -> dict[Target, list[tuple[str, str]]]:
    """The pins each GPU container needs, for the unread sources it takes."""
    targets = gpu_targets(request)
    prefixes: dict[Target, list[str]] = {}
    for u in unresolved:
        if (u.key, u.at) in targets:
            prefixes.setdefault((u.key, u.at), []).append(u.prefix)
    out: dict[Target, list[tuple[str, str]]] = {}
    for target, given in prefixes.items():
        count, name = targets[target]
        cores = allocation.slice_of(name)[1] if allocation is not None else 100
        pins = pins_for(given, count, cores, backend)
        if pins:
            out[target] = pins
    return out


def _literal(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    name = entry.get("name")
    value = entry.get("value", "")  # the API server drops an empty value; the kubelet sets ""
    if not isinstance(name, str) or "valueFrom" in entry or not isinstance(value, str):
        return None
    return name, value


def _env(pod: Mapping[str, Any] | PodView, target: Target) -> tuple[Mapping[str, Any], ...]:
    container = as_view(pod).container(*target)
    return container.env if container is not None else ()


def lacking(env: object, pins: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    entries = env if isinstance(env, tuple) else list_of(env)
    present = {found for e in entries if (found := _literal(mapping_of(e))) is not None}
    return [pin for pin in pins if pin not in present]


def with_pins(pod: Mapping[str, Any] | PodView, wanted: Mapping[Target, list[tuple[str, str]]],
              ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ops` with each target's pins appended to its env: into the `add` of its env list another step
    already wrote (the limit variables), else as a new one. None for pins already there."""
    out = list(ops)
    adds: dict[Any, int] = {}  # path -> the first `add` of it (one look-up per target, not a scan)
    for i, op in enumerate(out):
        if op.get("op") == "add":
            adds.setdefault(op.get("path"), i)
    for target, pins in wanted.items():
        path = pointer("spec", target[0], target[1], "env")
        at = adds.get(path)
        base = out[at]["value"] if at is not None else _env(pod, target)
        extra = lacking(base, pins)
        if not extra:
            continue
        env = [*(base if isinstance(base, (list, tuple)) else ()), *({"name": n, "value": v} for n, v in extra)]
        if at is not None:
            out[at] = {**out[at], "value": env}
        else:
            adds[path] = len(out)
            out.append({"op": "add", "path": path, "value": env})
    return out


def missing(pod: Mapping[str, Any] | PodView, wanted: Mapping[Target, list[tuple[str, str]]],
            labels: Mapping[Target, str]) -> str | None:
    """Why validation refuses the pod: a GPU container lacks a pin the mutation writes."""
    for target, pins in wanted.items():
        gone = lacking(_env(pod, target), pins)
        if gone:
            name, value = gone[0]
            return (f"{labels.get(target, str(target))} takes envFrom from a source the webhook cannot read and "
                    f"lacks {name}={value!r} that the mutating webhook writes: another webhook removed it; "
                    "resubmit the pod")
    return None
