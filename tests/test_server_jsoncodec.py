"""Encoding on the request path: orjson's speed, yet every value the standard library writes is written."""

from __future__ import annotations

import json

import pytest

from webhook.server import jsoncodec


@pytest.mark.parametrize(
    "value",
    [
        {"uid": "u", "allowed": True, "patch": "eyJvcCI6ImFkZCJ9", "warnings": ["gr\u00fcn"]},
        [{"op": "add", "path": "/spec/tolerations", "value": [{"tolerationSeconds": 10**30}]}],
        {1: "integer key"},
        {"t": (1, 2)},
        {"lone": "\ud800"},  # a decoded review can hold a lone surrogate escape
    ],
)
def test_dumps_writes_compact_json_that_reads_back_to_the_same_value(value: object) -> None:
    out = jsoncodec.dumps(value)
    assert isinstance(out, bytes)
    assert b", " not in out and b": " not in out
    assert json.loads(out) == json.loads(json.dumps(value))


def test_dumps_uses_default_for_unknown_types_on_both_paths() -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing"

    assert json.loads(jsoncodec.dumps({"x": Thing()}, default=str)) == {"x": "thing"}
    assert json.loads(jsoncodec.dumps({"x": Thing(), "big": 10**30}, default=str)) == {"x": "thing", "big": 10**30}
    with pytest.raises(TypeError):
        jsoncodec.dumps({"x": Thing()})
