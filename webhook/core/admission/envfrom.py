"""What a pod's `envFrom` takes from the ConfigMaps the webhook can read, and the sources it cannot read;
a GPU pod's envFrom screened (`screen_gpu`) and the pins the mutation writes for the sources it cannot
read (`pin_ops`; what they are: env_pins.py).

Cost: linear in the pod and in each ConfigMap it names, never their product. A ConfigMap's key K becomes
the variable prefix+K, and only the isolation variables matter (`limits.is_isolation_env`): for a prefix,
the candidate keys are looked up per guarded name (the name's tail after the prefix) and per family
(the keys that start with the family's tail, a range of the ConfigMap's sorted keys, sorted once per
ConfigMap and kept: `_sorted`), so a ConfigMap of thousands of harmless keys costs each envFrom entry a
few look-ups. One pod's entries that repeat a (ConfigMap, prefix) share one answer, and an entry names
at most `SHOWN_PER_ENTRY` variables (the rest are counted in one refusal).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

from webhook.core.domain.decision import warning
from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.domain.podview import PodView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, ISOLATION_ENV, ISOLATION_PREFIXES, is_isolation_env
from webhook.core.podspec.view import view_for
from webhook.core.policy.model import Policy

from . import env_pins
from .env_pins import Unresolved

EMPTY: frozenset[str] = frozenset()
SHOWN_PER_ENTRY = 5  # variables one envFrom entry's refusals name one by one

# A key K of a ConfigMap becomes the variable prefix+K. It can name an isolation variable only if it is a
# non-empty tail of one of the exact names, or starts with a tail of a family prefix (CUDA_MPS_: "MPS_",
# "_MPS_", ...). A prefix that itself starts with a family prefix makes every key one: refused outright.
# Keys that are not valid variable names are skipped by the kubelet, but no isolation name is invalid.
_TAILS: frozenset[str] = frozenset(name[i:] for name in ISOLATION_ENV for i in range(len(name)))
_FAMILY_TAILS: tuple[str, ...] = tuple(sorted({p[i:] for p in ISOLATION_PREFIXES for i in range(len(p))}))


def env_from_keys(data: object) -> frozenset[str]:
    """The keys of a ConfigMap's `data` that some envFrom prefix could turn into an isolation variable:
    all the watch cache keeps of a ConfigMap (values and every other key are dropped). The kubelet reads
    only `data` for envFrom, never `binaryData`."""
    if not isinstance(data, Mapping) or not data:
        return EMPTY
    keys = [k for k in data if isinstance(k, str) and (k in _TAILS or k.startswith(_FAMILY_TAILS))]
    return frozenset(keys) if keys else EMPTY


@lru_cache(maxsize=64)
def _sorted(keys: frozenset[str]) -> tuple[str, ...]:
    """A ConfigMap's keys in order, for the range look-ups of families (memoised per key set: the
    snapshot keeps one frozenset per ConfigMap, whose hash Python keeps too)."""
    return tuple(sorted(keys))


def _starting(ordered: tuple[str, ...], stem: str) -> Iterator[str]:
    """The keys of `ordered` that start with `stem`."""
    for i in range(bisect_left(ordered, stem), len(ordered)):
        if not ordered[i].startswith(stem):
            return
        yield ordered[i]


def _candidates(prefix: str, keys: frozenset[str]) -> Iterable[str]:
    """A superset of the keys that make an isolation variable with `prefix`: the tail of each exact name
    the prefix begins, and the keys that complete a family prefix; every key under a family prefix."""
    if prefix.startswith(ISOLATION_PREFIXES):
        return keys
    found = [name[len(prefix):] for name in ISOLATION_ENV if name.startswith(prefix)]
    out = [key for key in found if key in keys]
    families = [family[len(prefix):] for family in ISOLATION_PREFIXES if family.startswith(prefix)]
    if families and keys:
        ordered = _sorted(keys)
        for stem in families:
            out.extend(_starting(ordered, stem))
    return out


def refused_keys(prefix: str, keys: Iterable[str], gpu_pod: bool) -> list[tuple[str, str]]:
    """(key, variable) for each key of a ConfigMap that a container reading it through envFrom with this
    prefix must not take, in the variables' order: the one rule of pod admission and of ConfigMap writes
    (`configmap_writes.config_map_write`)."""
    pool = keys if isinstance(keys, frozenset) else frozenset(keys)
    found = {prefix + key: key for key in _candidates(prefix, pool)}
    return [(found[variable], variable) for variable in sorted(found)
            if is_isolation_env(variable) and (variable not in GPU_POD_ONLY_ENV or gpu_pod)]


def layer_of(variable: str) -> str:
    return ISOLATION_ENV.get(variable, "the GPU limit layer:").split(":")[0]


# ------------------------------------------------------------------------------------------ containers

_KIND_LABELS = {"containers": "container", "initContainers": "init container",
                "ephemeralContainers": "ephemeral container"}


def containers(spec: Mapping[str, Any], kinds: Iterable[str] = ("containers", "initContainers")
               ) -> Iterator[tuple[str, int, str, Mapping[str, Any]]]:
    """(list key, index, label, container) of the given lists."""
    for key in kinds:
        for index, raw in enumerate(list_of(spec.get(key))):
            container = mapping_of(raw)
            yield key, index, label(key, index, container), container


def label(key: str, index: int, container: Mapping[str, Any]) -> str:
    """How messages name a container: "container 'main'", "init container #0"."""
    return named(key, index, container.get("name"))


def named(key: str, index: int, name: object) -> str:
    """`label` of a container by its name."""
    kind = _KIND_LABELS[key]
    return f"{kind} {name!r}" if isinstance(name, str) and name else f"{kind} #{index}"


def _env_from_entries(pod: Mapping[str, Any] | PodView, kinds: Iterable[str]
                      ) -> Iterator[tuple[str, int, str, Iterable[Any]]]:
    """(list key, index, label, envFrom entries) of the given lists' containers that have entries: from
    a view, or from a pod's spec."""
    if isinstance(pod, PodView):
        for c in pod.containers:
            if c.env_from and c.kind in kinds:
                yield c.kind, c.index, named(c.kind, c.index, c.name), c.env_from
        return
    for key, index, where, container in containers(pod, kinds):
        entries = container.get("envFrom")
        if entries:
            yield key, index, where, list_of(entries)


# ------------------------------------------------------------------------------------------ the pod


def env_from(spec: Mapping[str, Any] | PodView, namespace: str, snapshot: Snapshot, gpu_pod: bool,
             kinds: Iterable[str] = ("containers", "initContainers", "ephemeralContainers")
             ) -> tuple[list[Refusal], list[Unresolved]]:
    """What the pod's envFrom sets that it must not (violations), and the sources the webhook cannot read
    (Secrets, ConfigMaps the snapshot does not hold) whose prefix could form an isolation variable.
    `spec` is the pod's spec, or the pod's view."""
    violations: list[Refusal] = []
    unresolved: list[Unresolved] = []
    known = snapshot.config_maps.get(namespace, {})
    answers: dict[tuple[str, str], list[str]] = {}  # (ConfigMap, prefix) -> the variables it refuses
    harmless: dict[str, bool] = {}
    for key, index, where, entries in _env_from_entries(spec, kinds):
        for entry in entries:
            source = mapping_of(entry)
            given = source.get("prefix")
            prefix = given if isinstance(given, str) else ""
            if prefix.startswith(ISOLATION_PREFIXES):
                violations.append(Refusal(
                    "isolation-env", 403, f"{where} takes envFrom with prefix {prefix}, which names the GPU limit "
                    "layer's variables; use another prefix"))
                continue
            config, secret = mapping_of(source.get("configMapRef")), mapping_of(source.get("secretRef"))
            name = config.get("name") if config else secret.get("name")
            if not isinstance(name, str):
                continue
            if not config or name not in known:
                safe = harmless.get(prefix)
                if safe is None:
                    safe = harmless[prefix] = env_pins.harmless(prefix)
                if not safe:
                    what = f"{'ConfigMap' if config else 'Secret'} {name!r}"
                    unresolved.append(Unresolved(key, index, where, what, prefix))
                continue
            variables = answers.get((name, prefix))
            if variables is None:
                variables = answers[(name, prefix)] = [v for _, v in refused_keys(prefix, known[name], gpu_pod)]
            if variables:
                violations += _refusals(where, name, variables)
    return violations, unresolved


def _refusals(where: str, name: str, variables: list[str]) -> list[Refusal]:
    """The refusals of one envFrom entry: one per variable, the first SHOWN_PER_ENTRY, then the count."""
    out = [Refusal("isolation-env", 403, f"{where} takes {variable} from ConfigMap {name!r} through envFrom, "
                   f"which bypasses GPU isolation ({layer_of(variable)}); remove that key and ask for GPUs in "
                   "resources.limits") for variable in variables[:SHOWN_PER_ENTRY]]
    more = len(variables) - SHOWN_PER_ENTRY
    if more > 0:
        out.append(Refusal("isolation-env", 403, f"{where} takes {more} more such variables from ConfigMap "
                           f"{name!r} through envFrom; remove those keys"))
    return out


# ------------------------------------------------------------------------------------------ a GPU pod


def screen_gpu(pod: Mapping[str, Any], request: PodRequest, snapshot: Snapshot, policy: Policy) -> PodRequest:
    """A GPU pod's envFrom: isolation variables from ConfigMaps become violations; a source the webhook
    cannot read is handled as the policy says: `deny` refuses it, `warn` admits it with a warning, and
    `neutralise` refuses it in a GPU container that could take a device list from it on a node that
    honours one (the switches it could set are pinned by the mutation: `pin_ops`)."""
    view = view_for(request, pod)
    if not any(c.env_from for c in view.containers):
        return request
    violations, unresolved = env_from(view, request.namespace, snapshot, gpu_pod=True)
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
        _neutralise(request, unresolved, snapshot, policy, violations, warnings)
    if not violations and warnings == list(request.warnings):
        return request
    return request.evolve(violations=(*request.violations, *violations), warnings=tuple(warnings))


def _neutralise(request: PodRequest, unresolved: list[Unresolved], snapshot: Snapshot, policy: Policy,
                violations: list[Refusal], warnings: list[str]) -> None:
    """Policy `neutralise`: a GPU container that could take a device list from an unread source is refused
    unless every node it can land on ignores the variable; else the pins are noted. Adds to the lists."""
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


def _pins_wanted(pod: Mapping[str, Any] | PodView, request: PodRequest, allocation: Allocation | None, backend: str,
                 snapshot: Snapshot, policy: Policy) -> dict[tuple[str, int], list[tuple[str, str]]]:
    if policy.unresolved_env_from != "neutralise":
        return {}
    view = view_for(request, pod)
    if not any(c.env_from for c in view.containers if c.kind != "ephemeralContainers"):
        return {}
    _, unresolved = env_from(view, request.namespace, snapshot, True, ("containers", "initContainers"))
    return env_pins.wanted_pins(request, unresolved, allocation, backend) if unresolved else {}


def pin_ops(pod: Mapping[str, Any] | PodView, request: PodRequest, allocation: Allocation, backend: str,
            snapshot: Snapshot, policy: Policy, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ops` with the pins of every GPU container that takes an unread envFrom source (env_pins.py)."""
    wanted = _pins_wanted(pod, request, allocation, backend, snapshot, policy)
    return env_pins.with_pins(pod, wanted, ops) if wanted else ops


def missing_pins(pod: Mapping[str, Any] | PodView, request: PodRequest, allocation: Allocation, backend: str,
                 snapshot: Snapshot, policy: Policy) -> str | None:
    """Why validation refuses the pod: a GPU container lacks a pin the mutation writes (None: none)."""
    wanted = _pins_wanted(pod, request, allocation, backend, snapshot, policy)
    if not wanted:
        return None
    labels = {(c.kind, c.index): named(c.kind, c.index, c.name)
              for c in view_for(request, pod).of_kind("containers", "initContainers")}
    return env_pins.missing(pod, wanted, labels)
