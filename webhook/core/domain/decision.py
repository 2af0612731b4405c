"""What the core answers: a `Decision`, made by `allowed`, `denied` and `patched` (the names
controller-runtime's admission package gives them), and the one shape of every "no" on the way to it,
`Refusal`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import Allocation
from .refusal import Refusal

MAX_WARNING = 119  # the API server shows warnings under 120 characters; longer ones are cut to fit


def warning(text: str) -> str:
    """`text` as a warning the API server shows whole."""
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 3] + "..."


@dataclass(frozen=True)
class Decision:
    """The result of every admission entry point of the core. Made by the functions below."""

    allowed: bool
    code: int = 200
    message: str = ""
    reason: str = "allowed"  # short stable identifier, used as the metrics label
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()  # JSONPatch operations (RFC 6902)
    allocation: Allocation | None = None
    managed: bool = True  # the object's namespace is one the webhook manages
    gpu_pod: bool = True  # the object asks for a GPU (metrics count those apart)


def allowed(reason: str = "allowed", message: str = "", *, warnings: tuple[str, ...] = (),
            allocation: Allocation | None = None, managed: bool = True, gpu_pod: bool = True) -> Decision:
    """Admit unchanged."""
    return Decision(True, 200, message, reason, warnings, (), allocation, managed, gpu_pod)


def patched(patch: tuple[Mapping[str, Any], ...], allocation: Allocation | None, message: str = "",
            reason: str = "admitted", *, warnings: tuple[str, ...] = (), managed: bool = True,
            gpu_pod: bool = True) -> Decision:
    """Admit with these JSONPatch operations applied."""
    return Decision(True, 200, message, reason, warnings, patch, allocation, managed, gpu_pod)


def with_patch(decision: Decision, patch: tuple[Mapping[str, Any], ...]) -> Decision:
    """`decision` with these operations (dataclasses.replace costs three times more, on every admission)."""
    d = decision
    return Decision(d.allowed, d.code, d.message, d.reason, d.warnings, patch, d.allocation, d.managed, d.gpu_pod)


def denied(code: int, reason: str, message: str, *, warnings: tuple[str, ...] = (), managed: bool = True,
           gpu_pod: bool = True) -> Decision:
    """Refuse, with the HTTP status the API server shows and a message the user can act on."""
    return Decision(False, code, message, reason, warnings, (), None, managed, gpu_pod)


def refused(refusal: Refusal, *, message: str | None = None, warnings: tuple[str, ...] = (),
            managed: bool = True, gpu_pod: bool = True) -> Decision:
    """Refuse for a broken rule (its message, unless `message` says more)."""
    return denied(refusal.code, refusal.rule, refusal.message if message is None else message,
                  warnings=warnings, managed=managed, gpu_pod=gpu_pod)
