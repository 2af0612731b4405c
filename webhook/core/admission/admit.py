"""The entry points: `mutate()` plans a GPU pod's placement and limits, `validate()` commits to them.

The webhook, `gpu-admission check` and the tests call exactly these two functions, so the offline
answer is the online answer. Mutation plans; validation sees the final pod (after every mutating
webhook) and re-checks quota against the recorded allocation, which the server then reserves.
"""

from __future__ import annotations

from .mutate import mutate
from .validate import validate

__all__ = ["mutate", "validate"]
