"""Placement contexts are compiled once per policy and kept with it; a changed policy starts afresh."""

from __future__ import annotations

import dataclasses

from builders import A100, node, pod, snapshot

from webhook.core.admission.mutate import _context
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy


def test_a_policy_keeps_its_contexts_and_a_replaced_policy_has_its_own() -> None:
    cluster = snapshot(node("a1", A100, 4))
    request = parse_pod(pod({"nvidia.com/gpu": 1}))
    assert request.gpus == 1
    first = Policy()
    context = _context(request, first, cluster)
    assert _context(request, first, cluster) is context  # compiled once
    spread = dataclasses.replace(first, placement="spread")
    assert spread.compiled is not first.compiled and spread.compiled.contexts == {}
    assert _context(request, spread, cluster).policy == "spread"
    assert _context(request, first, cluster).policy == "binpack"
