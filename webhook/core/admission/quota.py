"""Namespace GPU quotas: the three ResourceQuota keys the API server itself ignores, enforced here."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.core.domain.model import QuotaLimits, Snapshot, Usage
from webhook.core.domain.names import QUOTA_CORES, QUOTA_GPUS, QUOTA_MEMORY
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.vendor_quota import UNITS

KEYS = (
    ("gpus", QUOTA_GPUS, ""),
    ("memory_mib", QUOTA_MEMORY, " MiB"),
    ("cores", QUOTA_CORES, "%"),
)
NEAR_LIMIT = 0.9


@dataclass(frozen=True)
class QuotaCheck:
    """The outcome of checking one request against every quota of its namespace."""

    refusal: Refusal | None  # the first quota the request breaks, or None
    warnings: tuple[str, ...] = ()  # quotas it brings near their limit


_NOTHING_USED = Usage()
_WITHIN = QuotaCheck(None)  # frozen: one shared answer for the usual case


def check_quota(namespace: str, asked: Usage, snapshot: Snapshot) -> QuotaCheck:
    """Deny when `asked` on top of what the namespace already uses breaks any of its quotas."""
    quotas = snapshot.quotas.get(namespace, ())
    if not quotas:
        return _WITHIN
    used = snapshot.namespace_usage.get(namespace, _NOTHING_USED)
    warnings: list[str] = []
    for quota in quotas:
        for attr, key, unit, limit in _limits(quota):
            if limit is None:
                continue
            if attr == "keys":
                now, ask = used.key(key), asked.key(key)
            else:
                now, ask = getattr(used, attr), getattr(asked, attr)
            if ask and now + ask > limit:
                room = max(limit - now, 0)
                fix = (
                    f"ask for at most {room}{unit}" if room
                    else f"nothing is left: end other GPU pods in {namespace} or raise the quota"
                )
                return QuotaCheck(Refusal(
                    "quota-exceeded", 403,
                    f"exceeds ResourceQuota {namespace}/{quota.name}: {key} used {now}{unit}, "
                    f"asked {ask}{unit}, limit {limit}{unit}; {fix}",
                ))
            if ask and limit and now + ask >= NEAR_LIMIT * limit:
                pct = round(100 * (now + ask) / limit)
                warnings.append(f"{quota.name}: {key} at {pct}% of quota after this pod")
    return QuotaCheck(None, tuple(warnings)) if warnings else _WITHIN


def _limits(quota: QuotaLimits) -> list[tuple[str, str, str, int | None]]:
    """(field, quota key, unit, limit) of every key the quota sets: NVIDIA's three, then the others."""
    found = [(attr, key, unit, getattr(quota, attr)) for attr, key, unit in KEYS]
    return found + [("keys", key, UNITS.get(key, ""), limit) for key, limit in quota.keys] if quota.keys else found


def gpu_room(namespace: str, snapshot: Snapshot) -> int | None:
    """GPUs the namespace's quotas (`requests.nvidia.com/gpu`) still allow, reservations counted; None
    when no quota limits its GPU count."""
    limits = [q.gpus for q in snapshot.quotas.get(namespace, ()) if q.gpus is not None]
    if not limits:
        return None
    used = snapshot.namespace_usage.get(namespace, _NOTHING_USED).gpus
    return max(min(limits) - used, 0)
