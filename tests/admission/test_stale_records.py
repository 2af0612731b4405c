"""A sealed record never lets a pod do what the current policy would refuse: a record made before the
namespace's allowedModels changed (or copied from such a pod) is refused, not followed."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
from builders import A100, H100, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.policy.model import Policy, parse_policy

SNAP = snapshot(node("a1", A100, 8), node("h1", H100, 8))
RECORD = "gpu-admission.io/allocation"


def admitted(policy: Policy) -> tuple[dict[str, Any], dict[str, Any]]:
    p = pod({"nvidia.com/gpu": 1})
    decision = admit.mutate(p, SNAP, policy)
    assert decision.allowed
    final = jsonpatch.apply_patch(p, list(decision.patch))
    assert admit.validate(final, SNAP, policy).allowed
    return final, json.loads(final["metadata"]["annotations"][RECORD])


def only(models: list[str], **defaults: Any) -> Policy:
    return parse_policy({"defaults": defaults, "namespaces": {"team-a": {"allowedModels": models}}})


@pytest.mark.parametrize("defaults", [{}, {"maxAffinityNodes": 1}])  # required term of models, or of nodes
def test_a_record_made_before_allowed_models_changed_is_refused(defaults: dict[str, Any]) -> None:
    final, record = admitted(parse_policy({"defaults": defaults}))
    forbidden = record["model"]
    other = H100[0] if "A100" in forbidden else A100[0]
    stricter = only([other], **defaults)
    for decision in (admit.validate(final, SNAP, stricter), admit.mutate(final, SNAP, stricter)):
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "record-stale")
        assert forbidden in decision.message and "allowedModels" in decision.message


def test_a_record_whose_required_term_still_offers_a_forbidden_model_is_refused() -> None:
    final, record = admitted(Policy())
    assert record["required"]["values"] == ["a1", "h1"]  # node names here (few nodes), one of each model
    decision = admit.validate(final, SNAP, only([record["model"]]))  # the recorded model stays allowed
    assert (decision.allowed, decision.reason) == (False, "record-stale")


def test_a_record_made_under_the_current_restriction_passes() -> None:
    policy = only(["H100"])
    final, record = admitted(policy)
    assert "H100" in record["model"] and record["required"]["values"] == ["h1"]
    assert admit.validate(final, SNAP, policy).allowed
    assert admit.mutate(final, SNAP, policy).patch == ()  # the reinvocation changes nothing
