"""Kubernetes resource quantities ("1", "500m", "2Gi", "1e3") as exact fractions.

Exact arithmetic keeps "0.1" + "0.2" honest and lets callers decide how to round (CPU up to the
millicore, memory up to the MiB). Absurd inputs (huge exponents, hundreds of digits) are refused
before any arithmetic, so a hostile manifest cannot make the parser slow.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_QUANTITY = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

MAX_DIGITS = 40
MAX_EXPONENT = 30
MIB = 2**20
MAX_MEMO_CHARS = 64


class QuantityError(ValueError):
    """The value is not a Kubernetes quantity; the message says why in a few words."""


def parse_quantity(value: object) -> Fraction:
    """An int, a float or a quantity string as an exact fraction. Raises QuantityError."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        if abs(value) >= 10 ** (MAX_DIGITS + MAX_EXPONENT):
            raise QuantityError(f"{value} is out of range")
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite number")
        return parse_quantity(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a number or a quantity string, got {type(value).__name__}")
    # Pods repeat the same few quantities ("1", "4Gi") and Fraction arithmetic is the costliest step
    # of parsing a pod, so short strings are memoised (long ones could only fill the memo with junk).
    return _parse_short(value) if len(value) <= MAX_MEMO_CHARS else _parse_text(value)


@lru_cache(maxsize=1024)
def _parse_short(value: str) -> Fraction:
    return _parse_text(value)  # Fractions are immutable: sharing one between callers is safe


def _parse_text(value: str) -> Fraction:
    text = value.strip()
    match = _QUANTITY.fullmatch(text)
    if match is None:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise QuantityError(f"{shown!r} is not a Kubernetes quantity")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    if len(number) > MAX_DIGITS:
        raise QuantityError(f"{text[:40]!r} has too many digits")
    if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"{text!r} is out of range")
        scale = Fraction(10) ** exponent
    else:
        scale = _SUFFIX[suffix]
    result = Fraction(number) * scale
    return -result if sign == "-" else result


def cpu_milli(value: object) -> int:
    """CPU cores -> millicores, rounded up as the scheduler does."""
    return math.ceil(parse_quantity(value) * 1000)


def memory_mib(value: object) -> int:
    """Bytes -> MiB, rounded up."""
    return math.ceil(parse_quantity(value) / MIB)


def format_quantity(value: int, suffix: str = "") -> str:
    """`value` with a suffix from the Kubernetes table ("" for none); the inverse of parse_quantity."""
    if suffix not in _SUFFIX:
        raise QuantityError(f"unknown suffix {suffix!r}")
    return f"{value}{suffix}"


def suffix_scale(suffix: str) -> Fraction:
    """The multiplier of a suffix ("Gi" -> 2**30)."""
    return _SUFFIX[suffix]


SUFFIXES: tuple[str, ...] = tuple(_SUFFIX)
