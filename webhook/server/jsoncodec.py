"""JSON on the request path: orjson where it gives the same answer, the standard library elsewhere.

Decoding the review and encoding the patch, the answer and the log line cost several times less with
orjson, but it is stricter than `json`:
- decoding, it refuses NaN, Infinity, lone surrogate escapes, a byte order mark and nesting beyond 1024
  levels, which `json` accepts (or refuses with its own message): those go to `json`, so what is
  accepted and how a refusal reads do not change. It also reads an integer outside 64 bits as a float,
  silently; a body with 19 or more digits in a row (the shortest such integer) is read by `json`;
- encoding, it refuses integers beyond 64 bits, keys that are not strings and lone surrogates, all of
  which a decoded review can carry: those values are written by `json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # -9223372036854775809 is the shortest integer orjson cannot hold


def loads(data: bytes) -> Any:
    """Parse JSON exactly as `json.loads` would; raises what it raises (ValueError, RecursionError)."""
    if _LONG_NUMBER not in data.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON as UTF-8 bytes (non-ASCII characters as UTF-8, not escaped)."""
    try:
        return orjson.dumps(value, default=default)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, default=default, separators=(",", ":")).encode()  # ASCII: non-ASCII escaped
