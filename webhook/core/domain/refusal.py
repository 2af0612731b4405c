"""The one shape of every "no": a rule broken, the HTTP status it earns, and what to tell the user."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    """A rule a request breaks. `code` is 403 (policy) or 422 (invalid request); `rule` is a short stable
    identifier, the metrics reason (e.g. "isolation-env", "invalid-quantity", "quota-exceeded")."""

    rule: str
    code: int
    message: str
