"""JSON on the request path: orjson's speed, the standard library's answers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.server import jsoncodec


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": [1, 2.5, "x", null, true], "e": 1E5, "z": -0}',
        '{"name": "gr\u00fcn-\u6f22"}'.encode(),
        b'{"big": 123456789012345678901234567890}',  # beyond 64 bits: orjson would read a float
        b'{"low": -9223372036854775809, "high": 18446744073709551616}',
        b'{"edge": [-9223372036854775808, 18446744073709551615]}',
        b'{"n": NaN, "i": -Infinity, "huge": 1e999}',  # json.loads accepts these; orjson does not
        b'\xef\xbb\xbf{"bom": 1}',
        b'{"lone": "\\ud800", "pair": "\\ud83d\\ude00"}',
        b'{"dup": 1, "dup": 2}',
    ],
)
def test_loads_gives_what_the_standard_library_gives(text: bytes) -> None:
    assert repr(jsoncodec.loads(text)) == repr(json.loads(text))  # repr: NaN != NaN, equal reprs


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": }', b"[1,]", b'{"a": 1} x', b"\xff\xfe\x00", b'"\x01"'])
def test_loads_refuses_what_the_standard_library_refuses_with_its_message(text: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        jsoncodec.loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_deep_nesting_is_refused_as_the_standard_library_refuses_it() -> None:
    with pytest.raises(RecursionError):
        jsoncodec.loads(b"[" * 100_000 + b"]" * 100_000)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_loads_agrees_with_the_standard_library_on_any_document(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        want = repr(json.loads(text))
    except ValueError as err:
        with pytest.raises(ValueError) as ours:
            jsoncodec.loads(text)
        assert str(ours.value) == str(err)
        return
    assert repr(jsoncodec.loads(text)) == want


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
