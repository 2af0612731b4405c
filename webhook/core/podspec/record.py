"""The decision annotation `gpu-admission.io/allocation`: the allocation as JSON, both ways, sealed.

The record is the product's word, never the user's: the mutation signs it (`seal`, an HMAC-SHA256 under
a key only the webhook holds, over the record, the namespace and the pod's GPU count per container), and
a record whose seal does not verify is no record at all. A pod can carry a sealed record only by having
gone through this webhook with the same GPU shape in the same namespace (or by copying one from such a
pod, which asks for what that pod asked). The format is a contract: keys are stable, unknown keys are
ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.domain.names import ALLOCATION
from webhook.core.domain.request import ContainerRequest

ANNOTATION = ALLOCATION  # the decision record
SEAL = "seal"
REQUIRED = "required"
GROUP_REQUIRED = "groupRequired"  # the group's domain requirement (core/group_place.py), when required
# Unique per admission (the server passes the AdmissionReview's uid): two pods presenting one record are
# a copy, and accounting then trusts neither's GPU indices (cluster/held.py).
NONCE = "nonce"
AWAITING_POOL, AWAITING_REQUEST = "awaitingPool", "awaitingProvisioningRequest"
_SEAL_KEY = f',"{SEAL}":"'
# Built once: json.dumps with options makes a new encoder on every call. Stateless, so shared safely.
_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def allocation_to_json(allocation: Allocation) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": allocation.version,
        "node": allocation.node,
        "gpus": list(allocation.gpus),
        "uuids": list(allocation.uuids),
        "gpuCount": allocation.gpu_count,
        "memoryMiB": allocation.memory_mib,
        "cores": allocation.cores,
        "vendor": allocation.vendor,
        "model": allocation.model,
        "topology": allocation.topology.value,
        "loss": allocation.loss,
        "policy": allocation.policy,
    }
    if allocation.mig:  # MIG devices of one profile; absent for cards, so the usual record is unchanged
        record["mig"] = allocation.mig
    # Host CPU and memory the pod requests, counted on its node by the ledger: only when requested.
    if allocation.cpu_milli:
        record["cpuMilli"] = allocation.cpu_milli
    if allocation.host_memory_mib:
        record["hostMemoryMiB"] = allocation.host_memory_mib
    if allocation.containers:  # only when the containers' slices differ: the usual record is unchanged
        record["containers"] = [{"name": n, "init": i, "gpus": g, "memoryMiB": m, "cores": c}
                                for n, i, g, m, c in allocation.containers]
    if allocation.group:  # a multi-pod group's pods only: the usual record is unchanged
        record["group"] = allocation.group
    if allocation.domain:  # "label=value" of the topology domain the group lives in
        record["domain"] = allocation.domain
    # A pod admitted to wait for a node (core/placement/capacity.py): the pool it waits for, or the
    # ProvisioningRequest; absent for every other pod.
    if allocation.awaiting_pool:
        record[AWAITING_POOL] = allocation.awaiting_pool
    if allocation.awaiting_request:
        record[AWAITING_REQUEST] = allocation.awaiting_request
    return record


def _containers(data: Mapping[str, Any]) -> tuple[tuple[str, bool, int, int, int], ...]:
    raw = data.get("containers", [])
    if not isinstance(raw, list):
        raise ValueError(f"containers: expected a list, got {raw!r}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("init", False), bool):
            raise ValueError(f"containers[{i}]: expected an object with name, init, gpus, memoryMiB, cores")
        cores = _int(entry, "cores", 0)
        if cores > 100:
            raise ValueError(f"containers[{i}].cores: expected 0..100, got {cores}")
        out.append((_str(entry, "name"), entry.get("init", False), _int(entry, "gpus", 0),
                    _int(entry, "memoryMiB", 0), cores))
    return tuple(out)


def _int(data: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


_TOPOLOGY_CLASSES = {t.value: t for t in TopologyClass}


def allocation_from_json(data: Any) -> Allocation:
    """Parse the annotation's decoded JSON; ValueError names the key that is wrong. Each field is tested
    inline, and only a value that fails goes through _int / _str for the message (a call per field costs
    more than the test), in the order the fields were always checked in."""
    if not isinstance(data, Mapping):
        raise ValueError("expected a JSON object")
    version = data.get("version")
    if type(version) is not int or version != 1:  # type(): not bool
        version = _int(data, "version", 1)
        if version != 1:
            raise ValueError(f"version: unsupported version {version}")
    node = data.get("node")
    if node is not None and not isinstance(node, str):
        raise ValueError(f"node: expected a string or null, got {node!r}")
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list) or (gpus and (set(map(type, gpus)) != _INT or min(gpus) < 0)):  # not bool
        raise ValueError(f"gpus: expected a list of GPU indices, got {gpus!r}")
    uuids = data.get("uuids", [])
    if not isinstance(uuids, list) or (uuids and set(map(type, uuids)) != _STR):
        raise ValueError(f"uuids: expected a list of strings, got {uuids!r}")
    count = data.get("gpuCount")
    if type(count) is not int or count < 0:
        count = _int(data, "gpuCount", 0)
    cores = data.get("cores")
    if type(cores) is not int or cores < 0:
        cores = _int(data, "cores", 0)
    if cores > 100:
        raise ValueError(f"cores: expected 0..100, got {cores}")
    topology_name = data.get("topology", "")
    if type(topology_name) is not str:
        topology_name = _str(data, "topology")
    topology_name = topology_name or "single"
    topology = _TOPOLOGY_CLASSES.get(topology_name)  # a dict: the Enum call costs more than the rest
    if topology is None:
        raise ValueError(f"topology: unknown class {topology_name!r}")
    loss = data.get("loss", 0.0)
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 1:
        raise ValueError(f"loss: expected a number in 0..1, got {loss!r}")
    memory = data.get("memoryMiB")
    if type(memory) is not int or memory < 0:
        memory = _int(data, "memoryMiB", 0)
    vendor, model, policy = data.get("vendor", ""), data.get("model", ""), data.get("policy", "")
    if type(vendor) is not str:
        vendor = _str(data, "vendor")
    if type(model) is not str:
        model = _str(data, "model")
    if type(policy) is not str:
        policy = _str(data, "policy")
    containers = _containers(data) if "containers" in data else ()
    mig = data.get("mig", "")
    if type(mig) is not str:
        mig = _str(data, "mig")
    cpu_milli = _int(data, "cpuMilli", 0) if "cpuMilli" in data else 0
    host_memory_mib = _int(data, "hostMemoryMiB", 0) if "hostMemoryMiB" in data else 0
    group, domain = data.get("group", ""), data.get("domain", "")
    if type(group) is not str:
        group = _str(data, "group")
    if type(domain) is not str:
        domain = _str(data, "domain")
    pool = _str(data, AWAITING_POOL) if AWAITING_POOL in data else ""
    request = _str(data, AWAITING_REQUEST) if AWAITING_REQUEST in data else ""
    return Allocation(node=node, gpus=tuple(gpus), gpu_count=count, memory_mib=memory, cores=cores, vendor=vendor,
                      model=model, topology=topology, loss=float(loss), policy=policy, uuids=tuple(uuids),
                      version=version, containers=containers, mig=mig, cpu_milli=cpu_milli,
                      host_memory_mib=host_memory_mib, group=group, domain=domain,
                      awaiting_pool=pool, awaiting_request=request)


_INT, _STR = {int}, {str}


@lru_cache(maxsize=1024)
def canonical(allocation: Allocation) -> str:
    """The record's canonical JSON (sorted keys, no spaces), without the seal. Memoised: the standard
    library's encoder costs more than the rest of a patch, and the same allocation recurs."""
    return _CANONICAL.encode(allocation_to_json(allocation))


def shape_of(namespace: str, containers: Iterable[ContainerRequest]) -> str:
    """What the seal binds a record to besides itself: the namespace and each container's GPU vendor and
    count (what a mutation leaves in place), so that a record cannot move to another namespace or shape."""
    return namespace + "|" + ";".join(f"{'i' if c.init else 'c'}{c.index}={c.gpu.vendor}:{c.gpu.count}"
                                      for c in containers if c.gpu is not None)


# The key that seals records, or the keys a rotation keeps (the first seals; any of them verifies).
RecordKey = bytes | tuple[bytes, ...]


def sealing_key(key: RecordKey) -> bytes:
    return key[0] if isinstance(key, tuple) else key


def seal(text: str, shape: str, key: bytes) -> str:
    """HMAC-SHA256 (128 bits, hex) of the record's text and the pod's shape."""
    mac = _keyed(key).copy()
    mac.update(f"{text}\n{shape}".encode())
    return mac.digest()[:16].hex()


@lru_cache(maxsize=8)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC with the key already absorbed, copied for each record: setting the key up costs more than
    hashing a record."""
    return hmac.new(key, digestmod=hashlib.sha256)


def sealed_text(allocation: Allocation, required: Mapping[str, Any] | None, shape: str, key: RecordKey,
                group_required: Mapping[str, Any] | None = None, nonce: str = "") -> str:
    """The annotation's value: the canonical record, the node requirement the mutation ANDed into the
    pod's affinity (`required`, when it wrote one; `group_required`, the group's domain, likewise), and
    the seal over them, as the last key. `nonce`, when given, goes right after the record's own keys."""
    text = canonical(allocation)
    if nonce:
        text = f'{text[:-1]},"{NONCE}":{_CANONICAL.encode(nonce)}}}'
    if required is not None:
        text = f'{text[:-1]},"{REQUIRED}":{_requirement_json(required)}}}'
    if group_required is not None:
        text = f'{text[:-1]},"{GROUP_REQUIRED}":{_requirement_json(group_required)}}}'
    return f'{text[:-1]},"{SEAL}":"{seal(text, shape, sealing_key(key))}"}}'


def _requirement_json(required: Mapping[str, Any]) -> str:
    values = required.get("values")
    if required.keys() == {"key", "operator", "values"} and isinstance(values, list):
        try:
            return _requirement_text(required["key"], required["operator"], tuple(values))
        except TypeError:  # a value that cannot be a cache key
            pass
    return _CANONICAL.encode(required)


@lru_cache(maxsize=1024)
def _requirement_text(key: Any, operator: Any, values: tuple[Any, ...]) -> str:
    """Memoised: one requirement per eligible set, and the encoder costs more than the seal."""
    return _CANONICAL.encode({"key": key, "operator": operator, "values": list(values)})


class Sealed(NamedTuple):
    """A record whose seal verified: the allocation and the node requirement it carries (or None)."""

    allocation: Allocation
    required: Mapping[str, Any] | None
    group_required: Mapping[str, Any] | None = None
    nonce: str = ""


def read_sealed(raw: object, shape: str, key: RecordKey) -> Sealed | str:
    """The record of an annotation value whose seal verifies, else why it is not this webhook's. The seal
    covers the exact text before it (what sealed_text wrote), so it is checked before anything is parsed."""
    if not isinstance(raw, str):
        return "it is not a string"
    at = raw.rfind(_SEAL_KEY)
    given = raw[at + len(_SEAL_KEY):-2] if at > 0 and raw.endswith('"}') else ""
    keys = key if isinstance(key, tuple) else (key,)
    if len(given) != 32 or not given.isascii() or not any(
            hmac.compare_digest(given, seal(raw[:at] + "}", shape, k)) for k in keys):
        return "its seal does not verify: someone other than this webhook wrote or changed it"
    # Pods with one allocation (node, GPUs, requirement) carry one record but for its nonce: the parse of
    # the rest is kept, keyed by the text without the nonce and where it stood.
    start, end = _nonce_span(raw, at)
    first = start + len(_NONCE_MEMBER)
    nonce = raw[first:end]
    # A nonce that is its own JSON text (a UUID, hex digits): any other such one parses alike.
    if end < 0 or not nonce.isascii() or not (nonce.isalnum() or nonce.replace("-", "").isalnum()):
        return _parsed(raw)
    cache_key = (start, raw[:start] + raw[end:at])
    known = _PARSED.get(cache_key)
    if known is None:
        parsed = _parsed(raw)
        # Kept only when that member is the record's one "nonce" (no escapes, named once): then any text
        # with this key is this one with another plain nonce there, and parses the same but for it.
        if (isinstance(parsed, str) or parsed.nonce != nonce or raw.count('"nonce"', 0, at) != 1
                or "\\" in raw):
            return parsed
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[cache_key] = parsed.allocation, _fresh(parsed.required), _fresh(parsed.group_required)
        return parsed
    allocation, required, group_required = known
    # The requirements are the caller's own, as a parse gives them (a patch may carry them on).
    return Sealed(allocation, _fresh(required), _fresh(group_required), nonce)


_NONCE_MEMBER = f',"{NONCE}":"'


def _nonce_span(raw: str, at: int) -> tuple[int, int]:
    """Where the nonce member starts in a record's text and where its value ends (-1 when none), before
    position `at` (the seal)."""
    start = raw.find(_NONCE_MEMBER, 0, at)
    return start, raw.find('"', start + len(_NONCE_MEMBER), at) if start > 0 else -1


def record_nonce(raw: object) -> str:
    """The nonce a record's text carries, unverified ("" when none): the key its mutation's plan is held
    under until the validation of the same pod (cluster/source.py `LiveSource.plan`)."""
    if not isinstance(raw, str):
        return ""
    at = raw.rfind(_SEAL_KEY)
    start, end = _nonce_span(raw, at if at > 0 else len(raw))
    return raw[start + len(_NONCE_MEMBER):end] if end > 0 else ""
_PARSED: dict[tuple[int, str], tuple[Allocation, Mapping[str, Any] | None, Mapping[str, Any] | None]] = {}
_PARSED_MAX = 1024


def _fresh(value: Any) -> Any:
    """A copy of a parsed JSON value, as json.loads would make it anew (strings, numbers shared)."""
    if type(value) is dict:
        copy = value.copy()
        for name, item in value.items():
            if type(item) not in _ATOMS:
                copy[name] = _fresh(item)
        return copy
    if type(value) is list:
        return value.copy() if _ATOMS.issuperset(map(type, value)) else [_fresh(item) for item in value]
    return value


_ATOMS = frozenset((str, int, float, bool, type(None)))


def _parsed(raw: str) -> Sealed | str:
    """The sealed text `raw`, parsed: the record, or why it is malformed."""
    try:
        data = json.loads(raw)
        allocation = allocation_from_json(data)
    except (ValueError, TypeError, RecursionError) as err:  # sealed, so never: a key that changed meaning
        return f"it is malformed ({err})"
    required = data.get(REQUIRED)
    if required is not None and not isinstance(required, Mapping):
        return f"{REQUIRED}: expected an object"
    group_required = data.get(GROUP_REQUIRED)
    if group_required is not None and not isinstance(group_required, Mapping):
        return f"{GROUP_REQUIRED}: expected an object"
    nonce = data.get(NONCE, "")
    if not isinstance(nonce, str):
        return f"{NONCE}: expected a string"
    return Sealed(allocation, required, group_required, nonce)
