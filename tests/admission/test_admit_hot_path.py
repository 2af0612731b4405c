"""Shortcuts on the admission path give the answers the full work gives.

Reading a sealed record keeps the parse of a record seen before with another nonce; the server asks for
a pod's group, and the log line for its workload, only when a key that could name one is there.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.domain.names import GROUP_SIZE_ANNOTATION
from webhook.core.placement.group_place import placed_here as _group_of
from webhook.core.placement.groups import group_of, names_no_group
from webhook.core.podspec import record
from webhook.core.podspec.record import Sealed, read_sealed, seal, sealed_text
from webhook.core.podspec.workload import describe
from webhook.core.policy.model import Policy

KEY, SHAPE = b"k" * 32, "team-a|c0=nvidia:1"
REQUIRED = {"key": "metadata.name", "operator": "In", "values": ["gpu-a", "gpu-b"]}


def allocation(node: str = "gpu-a") -> Allocation:
    return Allocation(node, (3,), 1, 20480, 50, "nvidia", "NVIDIA-A100", TopologyClass.SINGLE, 0.0, "default",
                      ("GPU-0000-3",))


def sealed(text: str) -> str:
    """`text` (a JSON object) sealed as the webhook seals a record."""
    return f'{text[:-1]},"seal":"{seal(text, SHAPE, KEY)}"}}'


def read(raw: str) -> Sealed:
    got = read_sealed(raw, SHAPE, KEY)
    assert isinstance(got, Sealed), got
    return got


@pytest.fixture(autouse=True)
def no_kept_parses() -> None:
    record._PARSED.clear()


def test_records_differing_only_in_nonce_each_read_with_their_own_nonce() -> None:
    first = read(sealed_text(allocation(), REQUIRED, SHAPE, KEY, nonce="0b8a9f5e-1234-4c2d-9e1f-aabbccddeeff"))
    second = read(sealed_text(allocation(), REQUIRED, SHAPE, KEY, nonce="11111111-2222-4333-8444-555555555555"))
    assert first.nonce == "0b8a9f5e-1234-4c2d-9e1f-aabbccddeeff"
    assert second.nonce == "11111111-2222-4333-8444-555555555555"
    assert first.allocation == second.allocation == allocation()
    assert first.required == second.required == REQUIRED
    assert len(record._PARSED) == 1  # the second was not parsed again
    third = read(sealed_text(allocation("gpu-b"), REQUIRED, SHAPE, KEY, nonce="22222222"))
    assert third.allocation.node == "gpu-b" and third.nonce == "22222222"


def test_a_kept_parse_hands_out_requirements_the_caller_may_change() -> None:
    raws = [sealed_text(allocation(), REQUIRED, SHAPE, KEY, REQUIRED, nonce=f"{n}abc") for n in range(3)]
    first = read(raws[0])
    assert first.required is not None and first.group_required is not None
    first.required["values"].append("gpu-z")  # type: ignore[index]
    second = read(raws[1])
    assert second.required == REQUIRED and second.group_required == REQUIRED
    second.group_required["values"].clear()  # type: ignore[index]
    assert read(raws[2]).group_required == REQUIRED


def test_a_record_that_names_its_nonce_twice_reads_as_json_reads_it() -> None:
    """json.loads keeps the last of two equal keys (an escape may spell one): the parse of such a record
    is no template for another whose first nonce differs, even when its two nonces agree."""
    body = json.dumps(record.allocation_to_json(allocation()), sort_keys=True, separators=(",", ":"))
    for second_key in ('"nonce"', '"n\\u006fnce"'):
        record._PARSED.clear()
        raws = [sealed(f'{body[:-1]},"nonce":"{first}","required":{{}},{second_key}:"aaa"}}')
                for first in ("aaa", "bbb")]
        assert [read(raw).nonce for raw in raws] == ["aaa", "aaa"]
        assert not record._PARSED


def test_a_malformed_record_is_refused_with_the_same_words_each_time() -> None:
    body = json.dumps({**record.allocation_to_json(allocation()), "cores": 101}, separators=(",", ":"))
    raw = sealed(f'{body[:-1]},"nonce":"abc"}}')
    refusal = "it is malformed (cores: expected 0..100, got 101)"
    assert read_sealed(raw, SHAPE, KEY) == read_sealed(raw, SHAPE, KEY) == refusal


@pytest.mark.parametrize("field,value,message", [
    ("version", True, "version: expected an integer >= 1, got True"),
    ("version", 2, "version: unsupported version 2"),
    ("gpus", [0, True], "gpus: expected a list of GPU indices, got [0, True]"),
    ("gpus", [-1], "gpus: expected a list of GPU indices, got [-1]"),
    ("uuids", ["a", 1], "uuids: expected a list of strings, got ['a', 1]"),
    ("gpuCount", False, "gpuCount: expected an integer >= 0, got False"),
    ("memoryMiB", -1, "memoryMiB: expected an integer >= 0, got -1"),
    ("topology", "", None),
    ("topology", "ring", "topology: unknown class 'ring'"),
    ("vendor", 3, "vendor: expected a string, got 3"),
    ("domain", None, "domain: expected a string, got None"),
])
def test_each_field_of_a_record_is_checked_as_before(field: str, value: Any, message: str | None) -> None:
    data = {**record.allocation_to_json(allocation()), field: value}
    if message is None:
        assert record.allocation_from_json(data).topology is TopologyClass.SINGLE
        return
    with pytest.raises(ValueError) as err:
        record.allocation_from_json(data)
    assert str(err.value) == message


def pod(labels: dict[str, Any], annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": labels, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main"}]}}


@pytest.mark.parametrize("labels,annotations", [
    ({"training.kubeflow.org/job-name": "train"}, {}),
    ({}, {"leaderworkerset.sigs.k8s.io/name": "lws"}),
    ({"jobset.sigs.k8s.io/jobset-name": "js"}, {}),
    ({"ray.io/cluster": "rc"}, {}),
    ({"volcano.sh/job-name": "vj"}, {}),
    ({"scheduling.x-k8s.io/pod-group": "pg"}, {}),
    ({"pod-group.scheduling.sigs.k8s.io/name": "pg"}, {}),
    ({}, {"gpu-admission.io/group": "mine"}),
])
def test_every_key_that_names_a_group_counts(labels: dict[str, Any], annotations: dict[str, Any]) -> None:
    assert not names_no_group(pod(labels, annotations))
    assert group_of(pod(labels, annotations), "team-a") is not None


def test_a_pod_of_no_group_is_seen_without_the_full_look_up() -> None:
    plain = pod({"app": "web", "pod-template-hash": "abc"}, {GROUP_SIZE_ANNOTATION: "not-a-number"})
    assert names_no_group(plain) and names_no_group({"metadata": None})
    with pytest.raises(ValueError):  # the core still refuses the malformed size; the server records no group
        group_of(plain, "team-a")
    assert _group_of(plain, "team-a", Policy()) is None
    grouped = pod({"volcano.sh/job-name": "vj"})
    assert _group_of(grouped, "team-a", Policy()) == group_of(grouped, "team-a")


@pytest.mark.parametrize("labels,expected", [
    ({"app": "web"}, ""),
    ({"job-name": "nightly"}, "Job nightly"),
    ({"app.kubernetes.io/name": "llm", "app.kubernetes.io/part-of": "llminferenceservice"}, "LLMInferenceService llm"),
    ({"app.kubernetes.io/name": "web"}, ""),
    ({"workflows.argoproj.io/workflow": "wf", "app": "x"}, "Workflow wf"),
])
def test_describe_without_a_controller_name_is_empty(labels: dict[str, Any], expected: str) -> None:
    assert describe(labels) == expected
