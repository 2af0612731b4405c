"""Rotating the key that seals decision records: while replicas move to the new key, the replaced one is
still accepted (records it sealed verify, reviews a replica signs with it are taken), new records are
sealed with the new key, and a key that is neither is refused as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.cluster.translate import build_snapshot
from webhook.commands import serve
from webhook.core.admission import admit
from webhook.core.policy.model import Policy
from webhook.server.peer import signature, signed

OLD, NEW, OTHER = b"o" * 32, b"n" * 32, b"x" * 32
POLICY = Policy(managed_namespaces="all")
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h1", "labels": {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
SNAP = build_snapshot([NODE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}])


def pod() -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}}


def mutated(key: Any) -> dict[str, Any]:
    decision = admit.mutate(pod(), SNAP, POLICY, namespace="team-a", record_key=key)
    assert decision.allowed, decision.message
    return jsonpatch.apply_patch(copy.deepcopy(pod()), list(decision.patch))


def test_records_sealed_with_the_replaced_key_verify_during_the_rotation() -> None:
    before = mutated(OLD)  # admitted by a replica that still has only the old key
    assert admit.validate(before, SNAP, POLICY, namespace="team-a", record_key=(NEW, OLD)).allowed
    refused = admit.validate(before, SNAP, POLICY, namespace="team-a", record_key=NEW)
    assert not refused.allowed and refused.reason == "annotation-not-sealed"
    assert not admit.validate(before, SNAP, POLICY, namespace="team-a", record_key=(NEW, OTHER)).allowed


def test_new_records_are_sealed_with_the_new_key() -> None:
    after = mutated((NEW, OLD))
    assert admit.validate(after, SNAP, POLICY, namespace="team-a", record_key=NEW).allowed
    assert not admit.validate(after, SNAP, POLICY, namespace="team-a", record_key=OLD).allowed


def test_forwarded_reviews_signed_with_either_key_are_taken() -> None:
    body = json.dumps({"request": {"uid": "u"}}).encode()
    assert signed((NEW, OLD), "validate", body, signature(OLD, "validate", body))
    assert signed((NEW, OLD), "validate", body, signature(NEW, "validate", body))
    assert not signed((NEW, OLD), "validate", body, signature(OTHER, "validate", body))


def test_serve_reads_the_previous_key_beside_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "record.key").write_bytes(NEW)
    monkeypatch.setenv(serve.RECORD_KEY_ENV, str(tmp_path / "record.key"))
    assert serve._record_key() == NEW
    (tmp_path / "previous.key").write_bytes(OLD + b"\n")
    assert serve._record_key() == (NEW, OLD)
    (tmp_path / "previous.key").write_bytes(b"short")
    with pytest.raises(Exception, match="at least 16 bytes"):
        serve._record_key()


def test_the_plan_key_is_read_from_the_record_without_parsing_it() -> None:
    from webhook.core.podspec.record import ANNOTATION, record_nonce

    decision = admit.mutate(pod(), SNAP, POLICY, namespace="team-a", record_key=NEW, nonce="3f2a-9c")
    patched = jsonpatch.apply_patch(copy.deepcopy(pod()), list(decision.patch))
    assert record_nonce(patched["metadata"]["annotations"][ANNOTATION]) == "3f2a-9c"
    assert record_nonce(mutated(NEW)["metadata"]["annotations"][ANNOTATION]) == ""  # sealed without one
    assert record_nonce(None) == record_nonce('{"nonce":"x"}') == ""
