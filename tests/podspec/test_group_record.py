"""The allocation record's group keys: present only for grouped pods, read back, and the sealed group
requirement."""

from __future__ import annotations

import json

import pytest

from webhook.core.domain.model import Allocation, TopologyClass
from webhook.core.podspec.record import allocation_from_json, allocation_to_json, read_sealed, seal, sealed_text

KEY = b"k" * 32
SHAPE = "ml|c0=nvidia:4"
GROUPED = Allocation("n1", (0, 1, 2, 3), 4, 81559, 100, "nvidia", "H100", TopologyClass.NVLINK, 0.03, "binpack",
                     group="ml/lws/vllm/0", domain="nvidia.com/gpu.clique=c1")
IN_C1 = {"key": "nvidia.com/gpu.clique", "operator": "In", "values": ["c1"]}


def test_group_and_domain_are_recorded_only_when_set() -> None:
    data = allocation_to_json(GROUPED)
    assert (data["group"], data["domain"]) == ("ml/lws/vllm/0", "nvidia.com/gpu.clique=c1")
    assert allocation_from_json(json.loads(json.dumps(data))) == GROUPED
    plain = allocation_to_json(Allocation("n1", (0,), 1, 81559, 100, "nvidia", "H100", TopologyClass.SINGLE, 0.0, "x"))
    assert "group" not in plain and "domain" not in plain


@pytest.mark.parametrize("key", ["group", "domain"])
def test_group_keys_of_the_wrong_type_are_errors_naming_them(key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}: expected a string"):
        allocation_from_json({**allocation_to_json(GROUPED), key: 3})


def test_the_group_requirement_is_sealed_with_the_record() -> None:
    text = sealed_text(GROUPED, None, SHAPE, KEY, IN_C1)
    sealed = read_sealed(text, SHAPE, KEY)
    assert not isinstance(sealed, str)
    assert sealed.allocation == GROUPED and sealed.required is None and sealed.group_required == IN_C1
    edited = text.replace('"values":["c1"]', '"values":["c2"]')
    assert read_sealed(edited, SHAPE, KEY) == (
        "its seal does not verify: someone other than this webhook wrote or changed it")


def test_a_sealed_group_requirement_that_is_not_an_object_is_no_record() -> None:
    body = sealed_text(GROUPED, None, SHAPE, KEY)
    unsealed = body[: body.rindex(',"seal"')] + ',"groupRequired":"c1"}'
    forged = f'{unsealed[:-1]},"seal":"{seal(unsealed, SHAPE, KEY)}"}}'
    assert read_sealed(forged, SHAPE, KEY) == "groupRequired: expected an object"
