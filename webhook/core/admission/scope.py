"""Which namespaces and pods the webhook manages."""

from __future__ import annotations

from webhook.core.domain.model import Snapshot
from webhook.core.policy.model import Policy

DEFAULT_SCHEDULERS = ("", "default-scheduler")


def is_managed(namespace: str, snapshot: Snapshot, policy: Policy) -> bool:
    """Labelled namespaces (or every namespace but kube-system, in the policy's "all" mode)."""
    if namespace == "kube-system":
        return False
    if policy.managed_namespaces == "all":
        return True
    ns = snapshot.namespaces.get(namespace)
    return ns is not None and ns.managed
