"""Quota keys beyond NVIDIA's three: MIG profiles, other advertised NVIDIA resources, Hygon's and
Cambricon's, as the systems that enforce them spell them, so that a DCU, MLU, MIG or shared pod is never
charged as a whole `nvidia.com/gpu`.

* MIG: `requests.nvidia.com/mig-<profile>`, devices (the API server enforces it itself, as for any
  extended resource; the webhook checks it too so that `check` predicts the answer).
* Any other resource NVIDIA's device plugin advertises under a name of its own (time-slicing or MPS
  replicas, `nvidia.com/gpu.shared`; a `rename`d resource, `nvidia.com/gpu-10gb`): `requests.<name>`,
  devices, the key the API server enforces for it; as for MIG devices, never `requests.nvidia.com/gpu`,
  whose devices a replica does not take.
* Hygon: `requests.hygon.com/dcunum` (devices), and HAMi's `limits.hygon.com/dcumem` (MiB x devices)
  and `limits.hygon.com/dcucores` (% x devices), which only HAMi's scheduler and this webhook enforce.
* Cambricon: `requests.cambricon.com/vmlu`, and HAMi's `limits.cambricon.com/<model>.smlu.vmemory`
  (HAMi multiplies the limit by its memory factor, 256 MiB) and `.smlu.vcore`. HAMi manages one model
  name (its chart's `mlu`); every model's key is read as that one.

Usage is kept under these normalised keys, memory in MiB (`model.usage_of`).
"""

from __future__ import annotations

import re

MIG_KEY = "requests.nvidia.com/mig-"
MIG_RESOURCE = "nvidia.com/mig-"
_NVIDIA_REQUESTS = "requests.nvidia.com/"
# NVIDIA names that are no device a plugin advertises under a name of its own: the three keys read as
# quota fields, HAMi's memory percentage and task priority.
_NVIDIA_OWN = frozenset({"", "gpu", "gpumem", "gpumem-percentage", "gpucores", "priority"})
HYGON = ("requests.hygon.com/dcunum", "limits.hygon.com/dcumem", "limits.hygon.com/dcucores")
CAMBRICON = ("requests.cambricon.com/vmlu", "limits.cambricon.com/mlu.smlu.vmemory",
             "limits.cambricon.com/mlu.smlu.vcore")
CAMBRICON_MEMORY_UNIT = 256  # MiB per cambricon.com/<model>.smlu.vmemory, HAMi's MemoryFactor
_CAMBRICON_KEY = re.compile(r"limits\.cambricon\.com/[A-Za-z0-9][-A-Za-z0-9_]*\.smlu\.(vmemory|vcore)")
UNITS = {HYGON[1]: " MiB", CAMBRICON[1]: " MiB", HYGON[2]: "%", CAMBRICON[2]: "%"}


def device_resource(kind: str) -> str:
    """The resource a pod's device kind names: `nvidia.com/mig-<profile>` for a MIG profile ("3g.20gb"),
    the kind itself for any other resource a device plugin advertises ("nvidia.com/gpu.shared"). A
    profile never holds a "/", a resource name always does."""
    return kind if "/" in kind else MIG_RESOURCE + kind


def device_quota_key(kind: str) -> str:
    """The quota key that counts devices of a kind: `requests.` and its resource, as the API server reads it."""
    return "requests." + device_resource(kind)


def quota_key(key: str, value: int) -> tuple[str, int] | None:
    """A ResourceQuota `spec.hard` key of these, normalised, with its limit in usage units; else None."""
    if key.startswith(_NVIDIA_REQUESTS) and key[len(_NVIDIA_REQUESTS):] not in _NVIDIA_OWN:
        return key, value  # MIG profiles' keys among them
    if key in HYGON or key == CAMBRICON[0]:
        return key, value
    match = _CAMBRICON_KEY.fullmatch(key)
    if match is None:
        return None
    if match.group(1) == "vmemory":
        return CAMBRICON[1], value * CAMBRICON_MEMORY_UNIT
    return CAMBRICON[2], value
