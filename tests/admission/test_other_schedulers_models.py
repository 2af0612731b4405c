"""A pod handed to another scheduler (HAMi's, Volcano's, KAI's) in a namespace with allowedModels gets
the restriction in the forms that scheduler reads: a required node affinity term on the GPU model label
(every one of them honours node affinity), sealed in the record, and HAMi's `nvidia.com/use-gputype`, which
its scheduler checks card by card."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
from builders import A100, H100, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.policy.model import Policy, parse_policy

SNAP = snapshot(node("a1", A100, 8), node("h1", H100, 8))
ONLY_H100 = parse_policy({"namespaces": {"team-a": {"allowedModels": ["H100"]}}})
PRODUCT = "nvidia.com/gpu.product"


def scheduled_by(scheduler: str, **annotations: str) -> dict[str, Any]:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["schedulerName"] = scheduler
    if annotations:
        p["metadata"]["annotations"] = dict(annotations)
    return p


def required_terms(p: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = p["spec"].get("affinity", {}).get("nodeAffinity", {})
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))


@pytest.mark.parametrize("scheduler", ["hami-scheduler", "volcano", "kai-scheduler"])
def test_allowed_models_reach_the_other_scheduler_as_node_affinity_and_hamis_annotation(scheduler: str) -> None:
    p = scheduled_by(scheduler)
    decision = admit.mutate(p, SNAP, ONLY_H100)
    assert decision.allowed
    final = jsonpatch.apply_patch(p, list(decision.patch))
    terms = required_terms(final)
    assert terms and all(
        {"key": PRODUCT, "operator": "In", "values": [H100[0]]} in t["matchExpressions"] for t in terms
    )
    assert final["metadata"]["annotations"]["nvidia.com/use-gputype"] == "H100"
    record = json.loads(final["metadata"]["annotations"]["gpu-admission.io/allocation"])
    assert record["required"] == {"key": PRODUCT, "operator": "In", "values": [H100[0]]}
    assert admit.validate(final, SNAP, ONLY_H100).allowed
    assert admit.mutate(final, SNAP, ONLY_H100).patch == ()  # reinvocation: nothing more
    # The term removed after the mutation (another webhook, or the user in a dry run replayed): refused.
    stripped = json.loads(json.dumps(final))
    del stripped["spec"]["affinity"]
    refused = admit.validate(stripped, SNAP, ONLY_H100)
    assert (refused.allowed, refused.reason) == (False, "affinity-changed")


def test_a_pod_naming_its_own_allowed_models_keeps_its_annotation() -> None:
    p = scheduled_by("hami-scheduler", **{"nvidia.com/use-gputype": "H100-80GB"})
    final = jsonpatch.apply_patch(p, list(admit.mutate(p, SNAP, ONLY_H100).patch))
    assert final["metadata"]["annotations"]["nvidia.com/use-gputype"] == "H100-80GB"
    assert required_terms(final)


def test_a_pod_naming_only_forbidden_models_is_refused() -> None:
    decision = admit.mutate(scheduled_by("hami-scheduler", **{"nvidia.com/use-gputype": "A100"}), SNAP, ONLY_H100)
    assert (decision.allowed, decision.reason) == (False, "model-not-allowed")


def test_without_allowed_models_the_other_scheduler_places_freely() -> None:
    p = scheduled_by("hami-scheduler")
    final = jsonpatch.apply_patch(p, list(admit.mutate(p, SNAP, Policy()).patch))
    assert not required_terms(final) and "nvidia.com/use-gputype" not in final["metadata"]["annotations"]
