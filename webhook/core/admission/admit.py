"""The entry points: `mutate()` plans a GPU pod's placement and limits, `validate()` commits to them.

The webhook, `gpu-admission check` and the tests call exactly these two functions, so the offline
answer is the online answer. Mutation plans; validation sees the final pod (after every mutating
webhook) and re-checks quota against the recorded allocation, which the server then reserves.
`Mutation` and `Validation` are the same two decisions in steps, for a server that holds a shared lock
only while the step that reads nodes' and namespaces' usage runs.
"""

from __future__ import annotations

from .mutate import Mutation, mutate
from .validate import Validation, validate

__all__ = ["Mutation", "Validation", "mutate", "validate"]
