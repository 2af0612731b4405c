"""What a pod's `envFrom` takes from the ConfigMaps the webhook can read, and the sources it cannot read.

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

from webhook.core.domain.model import Snapshot
from webhook.core.domain.refusal import Refusal
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, ISOLATION_ENV, ISOLATION_PREFIXES, is_isolation_env
from webhook.core.podspec.vendors import list_of, mapping_of

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
    (`isolation.config_map_write`)."""
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
    kind = _KIND_LABELS[key]
    name = container.get("name")
    return f"{kind} {name!r}" if isinstance(name, str) and name else f"{kind} #{index}"


# ------------------------------------------------------------------------------------------ the pod


def env_from(spec: Mapping[str, Any], namespace: str, snapshot: Snapshot, gpu_pod: bool,
             kinds: Iterable[str] = ("containers", "initContainers", "ephemeralContainers")
             ) -> tuple[list[Refusal], list[Unresolved]]:
    """What the pod's envFrom sets that it must not (violations), and the sources the webhook cannot read
    (Secrets, ConfigMaps the snapshot does not hold) whose prefix could form an isolation variable."""
    violations: list[Refusal] = []
    unresolved: list[Unresolved] = []
    known = snapshot.config_maps.get(namespace, {})
    answers: dict[tuple[str, str], list[str]] = {}  # (ConfigMap, prefix) -> the variables it refuses
    harmless: dict[str, bool] = {}
    for key, index, where, container in containers(spec, kinds):
        entries = container.get("envFrom")
        if not entries:
            continue
        for entry in list_of(entries):
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
