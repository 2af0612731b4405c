"""DRA ResourceClaims and ResourceClaimTemplates in the input: run no pods, but the webhook decides them
when they are written (core/dra_objects.py), so `check` decides them with the same function."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.admission.dra import CLAIM_KINDS

DRA_GROUP = "resource.k8s.io"


@dataclass(frozen=True)
class ClaimObject:
    """A claim or claim template document, decided as the validating webhook decides its CREATE."""

    source: str
    kind: str
    name: str
    namespace: str | None
    obj: Mapping[str, Any]


def is_claim_object(group: str | None, kind: object) -> bool:
    """A resource.k8s.io claim kind (any version); without apiVersion, the kind's name alone."""
    return group in (DRA_GROUP, None) and kind in CLAIM_KINDS


def admission_request(item: ClaimObject, namespace: str) -> dict[str, Any]:
    """The AdmissionRequest the API server would send for creating the object in `namespace`."""
    return {"operation": "CREATE", "namespace": namespace, "kind": {"group": DRA_GROUP, "kind": item.kind},
            "object": item.obj}
