"""Routes to a GPU that the allocation rules alone do not see: `envFrom`, ephemeral containers, and pods
that ask for no GPU but can still reach one.

Two facts of the kubelet and the NVIDIA container toolkit decide what works here:
- the kubelet builds a container's environment from `envFrom` first and `env` after, so an explicit
  `env` entry wins over any ConfigMap or Secret (and over the image's own ENV, which the runtime
  merges below both);
- the toolkit mounts no GPU for `NVIDIA_VISIBLE_DEVICES=void`, whatever else the image says (every
  CUDA base image sets `NVIDIA_VISIBLE_DEVICES=all`).
So a container that must see no GPU is *neutralised* by an explicit `NVIDIA_VISIBLE_DEVICES=void`.
A container that has GPUs cannot be neutralised that way (its device list comes from the device
plugin, and a pod's own variable would override it): what it takes from envFrom is checked where
the webhook can read it (ConfigMaps, from the snapshot); where it cannot (Secrets), the policy decides:
`neutralise` pins the limit layer's switches and admits only where the nodes ignore the device
variable (env_pins.py), `deny` refuses, `warn` admits with a warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied, patched, warning
from webhook.core.domain.model import Allocation, EnvReader, PodRequest, Snapshot
from webhook.core.domain.names import ALLOCATION
from webhook.core.domain.refusal import Refusal
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, ISOLATION_PREFIXES, NO_DEVICES
from webhook.core.podspec.patch import pointer
from webhook.core.podspec.podshape import shape_error
from webhook.core.podspec.vendors import (
    COUNT_RESOURCES,
    is_bypass_entry,
    is_gpu_pod,
    is_gpu_resource,
    list_of,
    mapping_of,
)
from webhook.core.policy.model import Policy

from . import env_pins
from .dra import claim_refs
from .envfrom import _FAMILY_TAILS, _TAILS, env_from, env_from_keys, layer_of, refused_keys
from .envfrom import containers as _containers
from .envfrom import label as _label
from .scope import is_managed

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
VOID: Mapping[str, str] = {"name": VISIBLE, "value": NO_DEVICES}
# The taints GPU nodes carry for the device plugins of the vendor table (and the chart's toleration).
GPU_TAINT_KEYS: frozenset[str] = frozenset(COUNT_RESOURCES.values())
__all__ = ["_FAMILY_TAILS", "_TAILS", "env_from", "env_from_keys", "layer_of", "refused_keys"]

# ------------------------------------------------------------------------------------------ ConfigMap writes

# The kubelet builds a container's environment, envFrom included, each time it starts the container
# (makeEnvironmentVariables), so an edit of a ConfigMap reaches pods admitted before it at their next
# restart. A write that gives a live GPU pod a variable its admission would have refused is refused.
ALL_KINDS = ("containers", "initContainers", "ephemeralContainers")
NO_READS: frozenset[tuple[str, str, str]] = frozenset()
MAX_REFUSALS = 5


def config_map_reads(pod: Mapping[str, Any]) -> frozenset[tuple[str, str, str]]:
    """(ConfigMap name, prefix, container label) of each envFrom of the pod that reads a ConfigMap with a
    prefix some key could turn into an isolation variable (a source with prefix APP_ is left out)."""
    found: set[tuple[str, str, str]] = set()
    spec = mapping_of(pod.get("spec"))
    for key in ALL_KINDS:
        for index, raw in enumerate(list_of(spec.get(key))):
            container = mapping_of(raw)
            entries = container.get("envFrom")
            if not entries:  # most containers: nothing more to read (nor a label to make)
                continue
            for entry in list_of(entries):
                source = mapping_of(entry)
                name = mapping_of(source.get("configMapRef")).get("name")
                given = source.get("prefix")
                prefix = given if isinstance(given, str) else ""
                if isinstance(name, str) and name and not env_pins.harmless(prefix):
                    found.add((name, prefix, _label(key, index, container)))
    return frozenset(found) if found else NO_READS


Reads = tuple[str, str, frozenset[tuple[str, str, str]]]  # namespace, pod name, config_map_reads
NO_POD_READS: Reads = ("", "", NO_READS)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def env_reads(pod: Mapping[str, Any], gpu_like: bool | None = None) -> Reads:
    """What a live GPU pod (a GPU resource or variable, a decision record, or DRA claims) reads of
    ConfigMaps through envFrom (`config_map_reads`): what `Snapshot.env_readers` is built from, by the
    watch cache for the pods it shows and by the sources for the pods they reserved for. Other pods count
    for nothing: one that can reach a GPU node runs with NVIDIA_VISIBLE_DEVICES=void, which envFrom cannot
    override, and has no limit library to switch off. A finished pod restarts no container. `gpu_like`:
    already known."""
    reads = config_map_reads(pod)  # first: most pods read nothing, and that settles it
    if not reads or mapping_of(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return NO_POD_READS
    metadata = mapping_of(pod.get("metadata"))
    if gpu_like is None:
        gpu_like = is_gpu_pod(pod) or ALLOCATION in mapping_of(metadata.get("annotations")) or bool(claim_refs(pod))
    if not gpu_like:
        return NO_POD_READS
    name = metadata.get("name") or metadata.get("generateName") or "?"
    return str(metadata.get("namespace") or "default"), str(name), reads


def with_env_reads(env_readers: Mapping[str, Mapping[str, tuple[EnvReader, ...]]], pods: Iterable[Reads]
                   ) -> Mapping[str, Mapping[str, tuple[EnvReader, ...]]]:
    """`env_readers` with the reads of more pods (none of them already counted there) added: each read
    joins the EnvReader of its (prefix, container), naming the first pod by name and counting it, as the
    cache builds them. Copies only the namespaces and ConfigMaps it changes."""
    out: dict[str, Mapping[str, tuple[EnvReader, ...]]] | None = None
    for namespace, pod, reads in pods:
        if not reads:
            continue
        if out is None:
            out = dict(env_readers)
        table = dict(out.get(namespace, {}))
        for config_map, prefix, where in reads:
            readers = list(table.get(config_map, ()))
            for i, reader in enumerate(readers):
                if (reader.prefix, reader.where) == (prefix, where):
                    readers[i] = EnvReader(prefix, where, min(reader.pod, pod), reader.pods + 1)
                    break
            else:
                readers.append(EnvReader(prefix, where, pod, 1))
            table[config_map] = tuple(sorted(readers))
        out[namespace] = table
    return env_readers if out is None else out


def config_map_refusals(namespace: str, name: str, keys: Iterable[str], readers: Iterable[EnvReader]
                        ) -> list[Refusal]:
    """What a ConfigMap whose `data` has these keys would give the GPU pods that read it (`readers`, from
    `Snapshot.env_readers`) that their admission refuses (`refused_keys`, as `env_from` applies it)."""
    every = [k for k in keys if isinstance(k, str)]
    candidates = env_from_keys(dict.fromkeys(every))
    found: dict[tuple[str, str], list[EnvReader]] = {}
    for reader in readers:
        # A family prefix (CUDA_DEVICE_) makes every key one, not only the candidates; admission refuses
        # such a prefix outright, so only a pod admitted before the webhook can have it.
        pool = every if reader.prefix.startswith(ISOLATION_PREFIXES) else candidates
        for key, variable in refused_keys(reader.prefix, pool, gpu_pod=True):
            found.setdefault((variable, key), []).append(reader)
    violations = []
    for (variable, key), who in sorted(found.items()):
        who.sort(key=lambda r: (r.pod, r.where))
        first, pods = who[0], sum(r.pods for r in who)
        more = f" (and {pods - 1} more pod{'s' if pods > 2 else ''})" if pods > 1 else ""
        through = f"envFrom with prefix {first.prefix}" if first.prefix else "envFrom"
        violations.append(Refusal(
            "isolation-env-configmap", 403,
            f"ConfigMap {name!r} key {key} would set {variable} ({layer_of(variable)}) in {first.where} of GPU pod "
            f"{namespace}/{first.pod}{more}, which reads it through {through}: the kubelet reads it again when the "
            "container restarts, which bypasses GPU isolation; remove that key, put it in a ConfigMap no GPU pod "
            "reads through envFrom (or give their envFrom a prefix such as APP_), or delete those pods first"))
    return violations


def config_map_write(request: Mapping[str, Any], snapshot: Snapshot, policy: Policy) -> Decision:
    """Decide a CREATE or UPDATE of a ConfigMap (an AdmissionRequest) against the live GPU pods that read
    it through envFrom. A re-created ConfigMap is a CREATE like any other; a DELETE changes no variable."""
    obj = mapping_of(request.get("object"))
    metadata = mapping_of(obj.get("metadata"))
    namespace = str(request.get("namespace") or metadata.get("namespace") or "default")
    name = str(metadata.get("name") or request.get("name") or "")
    if not is_managed(namespace, snapshot, policy):
        return allowed("not-managed", managed=False, gpu_pod=False)
    data = obj.get("data")
    if data is not None and not isinstance(data, Mapping):
        return _deny(400, "invalid-config-map", f"ConfigMap {name!r}: data must be a mapping of keys to strings")
    old = request.get("oldObject")
    if request.get("operation") == "UPDATE" and isinstance(old, Mapping) and old.get("data") == data:
        return allowed("data-unchanged", gpu_pod=False)  # labels, annotations: env unchanged
    readers = snapshot.env_readers.get(namespace, {}).get(name, ())
    if not readers or not data:
        return allowed("no-gpu-reader" if not readers else "no-data", gpu_pod=False)
    refusals = config_map_refusals(namespace, name, data, readers)
    if not refusals:
        return allowed("config-map-checked", gpu_pod=False)
    shown = "; ".join(v.message for v in refusals[:MAX_REFUSALS])
    extra = len(refusals) - MAX_REFUSALS
    return _deny(403, "isolation-env-configmap", shown + (f"; and {extra} more such keys" if extra > 0 else ""))


# ------------------------------------------------------------------------------------------ reach


def reach(pod: Mapping[str, Any], snapshot: Snapshot, policy: Policy, *, privileged: bool = False) -> list[str]:
    """Why a pod that asks for no GPU could still get one: a GPU RuntimeClass (the NVIDIA hook honours
    the image's NVIDIA_VISIBLE_DEVICES), the GPU taint tolerated, or a GPU node named in spec.nodeName.
    `privileged`: for a privileged container, which sees every device node whatever the toolkit says."""
    spec = mapping_of(pod.get("spec"))
    reasons: list[str] = []
    runtime = spec.get("runtimeClassName")
    if isinstance(runtime, str) and runtime in policy.gpu_runtime_classes:
        reasons.append(f"runtimeClassName {runtime}")
    node_name = spec.get("nodeName")
    if isinstance(node_name, str) and node_name:
        node = snapshot.nodes.get(node_name)
        if node is None:
            reasons.append(f"spec.nodeName {node_name}, a node the webhook does not know")
        elif node.gpus and (privileged or node.toolkit_envvar is not False):
            # A node whose toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers (its agent says
            # so: node_routes.py) gives no GPU through the image's variable: nothing to neutralise there.
            reasons.append(f"spec.nodeName {node_name}, a GPU node")
    keys = GPU_TAINT_KEYS.union(str(t.get("key")) for t in policy.tolerations if t.get("key"))
    for raw in list_of(spec.get("tolerations")):
        toleration = mapping_of(raw)
        key = toleration.get("key")
        if not key and toleration.get("operator") == "Exists":
            reasons.append("a toleration of every taint")
        elif isinstance(key, str) and key in keys:
            reasons.append(f"a toleration of the {key} taint")
    return reasons


def _privileged(spec: Mapping[str, Any], kinds: Iterable[str]) -> list[str]:
    return [where for _, _, where, c in _containers(spec, kinds)
            if mapping_of(c.get("securityContext")).get("privileged") is True]


# ------------------------------------------------------------------------------------------ neutralising


def _has_void(container: Mapping[str, Any]) -> bool:
    return any(mapping_of(e).get("name") == VISIBLE and mapping_of(e).get("value") == NO_DEVICES
               for e in list_of(container.get("env")))


def void_ops(pod: Mapping[str, Any], targets: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """`add` of each target container's whole env list with NVIDIA_VISIBLE_DEVICES=void appended (none for
    a container that has it already: a second pass yields no operations)."""
    spec = mapping_of(pod.get("spec"))
    ops: list[dict[str, Any]] = []
    for key, index in targets:
        items = list_of(spec.get(key))
        container = mapping_of(items[index]) if index < len(items) else {}
        if _has_void(container):
            continue
        existing = container.get("env")
        env = [*(existing if isinstance(existing, list) else []), dict(VOID)]
        ops.append({"op": "add", "path": pointer("spec", key, index, "env"), "value": env})
    return ops


def _lacking(pod: Mapping[str, Any], targets: Iterable[tuple[str, int]]) -> list[str]:
    spec = mapping_of(pod.get("spec"))
    labels = {(key, index): where for key, index, where, _ in
              _containers(spec, ("containers", "initContainers", "ephemeralContainers"))}
    return [labels.get(t, str(t)) for t in targets if void_ops(pod, [t])]


def _allow(reason: str, message: str = "", ops: list[dict[str, Any]] | None = None,
           warnings: tuple[str, ...] = ()) -> Decision:
    return patched(tuple(ops or ()), None, message, reason, warnings=warnings, gpu_pod=False)


def _deny(code: int, reason: str, message: str) -> Decision:
    return denied(code, reason, message, gpu_pod=False)


# ------------------------------------------------------------------------------------------ entry points


# A pod asking only for accelerators outside the vendor table (gpu.intel.com/i915, habana.ai/gaudi): no
# GPU of this controller, admitted unchanged with a warning, and screened like any pod asking for none.
FOREIGN_ACCELERATOR = "accelerator-not-counted"
NO_GPU_ANSWERS = frozenset({"not-gpu-pod", "no-gpu-requested", FOREIGN_ACCELERATOR})


def after_screen(pod: Mapping[str, Any], request: PodRequest, final: Decision, snapshot: Snapshot, policy: Policy,
                 *, mutating: bool) -> Decision:
    """The answer for a pod the first screen settled: a pod that asks for no GPU, in a managed namespace,
    is screened here too (the rest is returned as it was). That includes a pod that names a GPU resource
    with a count of 0 (`nvidia.com/gpu: 0`): the device plugin gives it no device, but a CUDA image's own
    NVIDIA_VISIBLE_DEVICES=all would still reach every GPU of the node it lands on."""
    if final.reason not in NO_GPU_ANSWERS or not is_managed(request.namespace, snapshot, policy):
        return final
    decision = screen_non_gpu(pod, request, snapshot, policy, mutating=mutating)
    if decision is None:
        return final
    if not final.warnings:
        return decision
    return replace(decision, warnings=(*final.warnings, *decision.warnings), allocation=None, managed=True,
                   gpu_pod=False)


def screen_non_gpu(pod: Mapping[str, Any], request: PodRequest, snapshot: Snapshot, policy: Policy, *,
                   mutating: bool) -> Decision | None:
    """A pod of a managed namespace that asks for no GPU. None: nothing to say (allowed unchanged)."""
    spec = mapping_of(pod.get("spec"))
    violations, _ = env_from(spec, request.namespace, snapshot, gpu_pod=False)
    if violations:
        return _deny(403, violations[0].rule, "; ".join(v.message for v in violations))
    privileged = _privileged(spec, ("containers", "initContainers"))
    if privileged and (found := reach(pod, snapshot, policy, privileged=True)):
        return _deny(403, "isolation-privileged",
                     f"{privileged[0]} is privileged and the pod can reach a GPU node ({', '.join(found)}): a "
                     "privileged container sees every GPU of the node; set securityContext.privileged: false "
                     "or remove that")
    reasons = reach(pod, snapshot, policy)
    if not reasons:
        return None  # cannot land on a (tainted) GPU node: whatever its image says, no GPU is there
    why = ", ".join(reasons)
    if policy.non_gpu_access == "deny":
        return _deny(403, "gpu-reachable",
                     f"asks for no GPU but can reach one ({why}), which bypasses GPU admission: remove that, or "
                     "ask for GPUs in resources.limits (e.g. nvidia.com/gpu: 1)")
    targets = [(key, index) for key, index, _, _ in _containers(spec)]
    if mutating:
        ops = void_ops(pod, targets)
        note = warning(f"asks for no GPU but can reach one ({why}): {VISIBLE}={NO_DEVICES} set in every container")
        return _allow("neutralised", f"{VISIBLE}={NO_DEVICES}", ops, (note,) if ops else ())
    lacking = _lacking(pod, targets)
    if lacking:
        return _deny(403, "gpu-reachable",
                     f"asks for no GPU but can reach one ({why}), and {lacking[0]} lacks {VISIBLE}={NO_DEVICES} "
                     "that the mutating webhook writes: retry the create, or remove that")
    return _allow("neutralised", f"{VISIBLE}={NO_DEVICES}")


def screen_gpu(pod: Mapping[str, Any], request: PodRequest, snapshot: Snapshot, policy: Policy) -> PodRequest:
    """A GPU pod's envFrom: isolation variables from ConfigMaps become violations; a source the webhook
    cannot read is handled as the policy says: `deny` refuses it, `warn` admits it with a warning, and
    `neutralise` refuses it in a GPU container that could take a device list from it on a node that
    honours one (the switches it could set are pinned by the mutation: `pin_ops`)."""
    spec = mapping_of(pod.get("spec"))
    if not any(c.get("envFrom") for _, _, _, c in _containers(spec, ("containers", "initContainers",
                                                                    "ephemeralContainers"))):
        return request
    violations, unresolved = env_from(spec, request.namespace, snapshot, gpu_pod=True)
    warnings = list(request.warnings)
    mode = policy.unresolved_env_from
    if unresolved and mode == "deny":
        violations.append(Refusal(
            "isolation-env-from", 403,
            f"{unresolved[0].describe()} through envFrom, which the webhook cannot read (policy "
            "isolation.unresolvedEnvFrom: deny): use a ConfigMap it can see, a prefix no GPU variable starts "
            "with (e.g. APP_), or env entries with valueFrom"))
    elif unresolved and mode == "warn":
        warnings.append(warning(f"{unresolved[0].describe()} through envFrom, unchecked: explicit limits win over "
                              "it, a GPU list would not"))
    elif unresolved:
        targets = env_pins.gpu_targets(request)
        ignored: list[bool] = []  # whether the nodes ignore the variable: asked once, when it matters
        for u in unresolved:
            variable = env_pins.device_variable(u.prefix)
            if (u.key, u.at) not in targets or variable is None:
                continue
            if not ignored:
                ignored.append(env_pins.nodes_ignore_variable(request, snapshot, policy.tolerations))
            if not ignored[0]:
                violations.append(Refusal(
                    "isolation-env-from", 403,
                    f"{u.describe()} through envFrom, which the webhook cannot read, and it could set {variable}, "
                    "which replaces the GPUs the device plugin gives that container: give the envFrom a prefix "
                    "no GPU variable starts with (e.g. APP_), or read the keys with env[].valueFrom."
                    "secretKeyRef, or set accept-nvidia-visible-devices-envvar-when-unprivileged = false on "
                    "the GPU nodes"))
                break
        if not violations and any((u.key, u.at) in targets for u in unresolved):
            first = next(u for u in unresolved if (u.key, u.at) in targets)
            warnings.append(warning(f"{first.describe()} through envFrom: GPU limit switches pinned to safe values"))
    if not violations and warnings == list(request.warnings):
        return request
    return request.evolve(violations=(*request.violations, *violations), warnings=tuple(warnings))


def _pins_wanted(pod: Mapping[str, Any], request: PodRequest, allocation: Allocation | None, backend: str,
                 snapshot: Snapshot, policy: Policy) -> dict[tuple[str, int], list[tuple[str, str]]]:
    if policy.unresolved_env_from != "neutralise":
        return {}
    spec = mapping_of(pod.get("spec"))
    if not any(c.get("envFrom") for _, _, _, c in _containers(spec)):
        return {}
    _, unresolved = env_from(spec, request.namespace, snapshot, True, ("containers", "initContainers"))
    return env_pins.wanted_pins(request, unresolved, allocation, backend) if unresolved else {}


def pin_ops(pod: Mapping[str, Any], request: PodRequest, allocation: Allocation, backend: str, snapshot: Snapshot,
            policy: Policy, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ops` with the pins of every GPU container that takes an unread envFrom source (env_pins.py)."""
    wanted = _pins_wanted(pod, request, allocation, backend, snapshot, policy)
    return env_pins.with_pins(pod, wanted, ops) if wanted else ops


def missing_pins(pod: Mapping[str, Any], request: PodRequest, allocation: Allocation, backend: str,
                 snapshot: Snapshot, policy: Policy) -> str | None:
    wanted = _pins_wanted(pod, request, allocation, backend, snapshot, policy)
    if not wanted:
        return None
    labels = {(key, index): where for key, index, where, _ in _containers(mapping_of(pod.get("spec")))}
    return env_pins.missing(pod, wanted, labels)


def sidecar_targets(request: PodRequest) -> list[tuple[str, int]]:
    """Containers of a GPU pod that get no GPU: on a GPU node, their image's NVIDIA_VISIBLE_DEVICES=all
    would show them every GPU of the node."""
    spec = mapping_of(request.raw.get("spec"))
    targets = []
    for c in request.containers:
        key = "initContainers" if c.init else "containers"
        items = list_of(spec.get(key))
        raw = mapping_of(items[c.index]) if c.index < len(items) else {}
        if (c.gpu is None or c.gpu.count <= 0) and not mapping_of(raw.get("resources")).get("claims"):
            targets.append((key, c.index))  # a container using a DRA claim gets its GPUs through CDI
    return targets


def sidecar_ops(pod: Mapping[str, Any], request: PodRequest) -> list[dict[str, Any]]:
    return void_ops(pod, sidecar_targets(request))


def missing_sidecar_void(pod: Mapping[str, Any], request: PodRequest) -> str | None:
    lacking = _lacking(pod, sidecar_targets(request))
    if not lacking:
        return None
    return (f"{lacking[0]} asks for no GPU and lacks {VISIBLE}={NO_DEVICES} that the mutating webhook writes: "
            "another webhook removed it; resubmit the pod")


def ephemeral(pod: Mapping[str, Any], old: Mapping[str, Any] | None, snapshot: Snapshot, policy: Policy, *,
              namespace: str | None = None, mutating: bool) -> Decision:
    """An UPDATE of pods/ephemeralcontainers (`kubectl debug`): the containers it adds are held to the
    isolation rules, and get NVIDIA_VISIBLE_DEVICES=void (an ephemeral container never has a GPU)."""
    malformed = shape_error(pod)
    if malformed:
        return denied(422, "invalid-pod", malformed, gpu_pod=False)
    metadata = mapping_of(pod.get("metadata"))
    namespace = namespace or str(metadata.get("namespace") or "default")
    if not is_managed(namespace, snapshot, policy):
        return allowed("not-managed", f"namespace {namespace} is not managed", managed=False, gpu_pod=False)
    spec = mapping_of(pod.get("spec"))
    before = {str(mapping_of(c).get("name")) for c in list_of(mapping_of(mapping_of(old).get("spec"))
                                                              .get("ephemeralContainers"))}
    added = [(key, index, where, c) for key, index, where, c in _containers(spec, ("ephemeralContainers",))
             if not c.get("name") or str(c.get("name")) not in before]
    if not added:
        return _allow("no-new-ephemeral")
    gpu_pod = is_gpu_pod(pod)
    node_name = spec.get("nodeName")
    node = snapshot.nodes.get(node_name) if isinstance(node_name, str) else None
    on_gpu_node = gpu_pod or node is None or bool(node.gpus)
    problems: list[Refusal] = []
    for _, _, where, container in added:
        for entry in list_of(container.get("env")):
            name = mapping_of(entry).get("name")
            if is_bypass_entry(entry) or (name in GPU_POD_ONLY_ENV and gpu_pod):
                problems.append(Refusal("isolation-env", 403,
                                          f"{where} sets {name} itself, which bypasses GPU isolation; remove it"))
        resources = mapping_of(container.get("resources"))
        if any(isinstance(r, str) and is_gpu_resource(r) for part in resources.values() for r in mapping_of(part)):
            problems.append(Refusal("ephemeral-resources", 422,
                                      f"{where} asks for GPUs; ephemeral containers cannot have resources"))
        if on_gpu_node and mapping_of(container.get("securityContext")).get("privileged") is True:
            problems.append(Refusal("isolation-privileged", 403,
                                      f"{where} is privileged on a GPU node, which exposes every GPU of the node; "
                                      "set securityContext.privileged: false"))
    found, unresolved = env_from({"ephemeralContainers": [c for _, _, _, c in added]}, namespace, snapshot,
                                 gpu_pod, ("ephemeralContainers",))
    problems += found
    # An ephemeral container never has a GPU: the NVIDIA_VISIBLE_DEVICES=void it gets is an explicit entry,
    # which wins over the source, so `neutralise` and `warn` admit it; `deny` refuses.
    if unresolved and policy.unresolved_env_from == "deny":
        problems.append(Refusal("isolation-env-from", 403,
                                  f"{unresolved[0].describe()} through envFrom, which the webhook cannot read "
                                  "(policy isolation.unresolvedEnvFrom: deny)"))
    if problems:
        return _deny(problems[0].code, problems[0].rule, "; ".join(p.message for p in problems))
    targets = [(key, index) for key, index, _, _ in added]
    if mutating:
        return _allow("ephemeral", f"{VISIBLE}={NO_DEVICES}", void_ops(pod, targets))
    lacking = _lacking(pod, targets) if on_gpu_node else []
    if lacking:
        return _deny(403, "gpu-reachable", f"{lacking[0]} lacks {VISIBLE}={NO_DEVICES} that the mutating webhook "
                                           "writes into ephemeral containers on GPU nodes: retry, or set it yourself")
    return _allow("ephemeral")
