"""Quota keys beyond NVIDIA's three: MIG profiles, Hygon's and Cambricon's, as the systems that enforce
them spell them, so that a DCU, MLU or MIG pod is never charged as a whole `nvidia.com/gpu`.

* MIG: `requests.nvidia.com/mig-<profile>`, devices (the API server enforces it itself, as for any
  extended resource; the webhook checks it too so that `check` predicts the answer).
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
HYGON = ("requests.hygon.com/dcunum", "limits.hygon.com/dcumem", "limits.hygon.com/dcucores")
CAMBRICON = ("requests.cambricon.com/vmlu", "limits.cambricon.com/mlu.smlu.vmemory",
             "limits.cambricon.com/mlu.smlu.vcore")
CAMBRICON_MEMORY_UNIT = 256  # MiB per cambricon.com/<model>.smlu.vmemory, HAMi's MemoryFactor
_CAMBRICON_KEY = re.compile(r"limits\.cambricon\.com/[A-Za-z0-9][-A-Za-z0-9_]*\.smlu\.(vmemory|vcore)")
UNITS = {HYGON[1]: " MiB", CAMBRICON[1]: " MiB", HYGON[2]: "%", CAMBRICON[2]: "%"}


def quota_key(key: str, value: int) -> tuple[str, int] | None:
    """A ResourceQuota `spec.hard` key of these, normalised, with its limit in usage units; else None."""
    if key.startswith(MIG_KEY) and len(key) > len(MIG_KEY):
        return key, value
    if key in HYGON or key == CAMBRICON[0]:
        return key, value
    match = _CAMBRICON_KEY.fullmatch(key)
    if match is None:
        return None
    if match.group(1) == "vmemory":
        return CAMBRICON[1], value * CAMBRICON_MEMORY_UNIT
    return CAMBRICON[2], value
