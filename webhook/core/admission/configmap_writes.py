"""A CREATE or UPDATE of a ConfigMap that live GPU pods read through `envFrom`: refused when it would give
one of them a variable its admission would have refused (the kubelet reads the ConfigMap again at the
container's next start). Who reads what: `configmap_readers.py`; the one rule of what a key may set:
`envfrom.refused_keys`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.model import EnvReader, Snapshot
from webhook.core.domain.refusal import Refusal
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.limits import ISOLATION_PREFIXES
from webhook.core.policy.model import Policy

from .envfrom import env_from_keys, layer_of, refused_keys
from .scope import is_managed

MAX_REFUSALS = 5


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
        return denied(400, "invalid-config-map", f"ConfigMap {name!r}: data must be a mapping of keys to strings",
                      gpu_pod=False)
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
    return denied(403, "isolation-env-configmap", shown + (f"; and {extra} more such keys" if extra > 0 else ""),
                  gpu_pod=False)
