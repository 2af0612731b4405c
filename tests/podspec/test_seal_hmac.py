"""The record's seal is HMAC-SHA256 as the standard library computes it, for keys of every length
(a key longer than SHA-256's block is hashed first, a shorter one padded)."""

from __future__ import annotations

import hmac

import pytest

from webhook.core.podspec.record import seal


@pytest.mark.parametrize("key", [b"", b"k", b"k" * 32, b"\xff" * 63, bytes(range(64)), b"x" * 65, bytes(range(200))])
@pytest.mark.parametrize("text", ["", "{}", '{"node":"a1","gpus":[0]}', "é\u2603"])
def test_seal_is_hmac_sha256_of_text_and_shape(key: bytes, text: str) -> None:
    expected = hmac.digest(key, f"{text}\nteam-a|c0=nvidia:1".encode(), "sha256")[:16].hex()
    assert seal(text, "team-a|c0=nvidia:1", key) == expected


def test_the_same_key_seals_the_same_way_twice_and_another_key_differently() -> None:
    first = seal("{}", "ns|", b"k" * 32)
    assert seal("{}", "ns|", b"k" * 32) == first
    assert seal("{}", "ns|", b"j" * 32) != first
