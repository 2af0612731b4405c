"""What each value-object idiom of the admission path costs, against the frozen slots dataclass.

The domain's values are frozen slots dataclasses. Four made on every admission are not, each for a
measured reason; this prints the cost of making each one as it is made, beside making the same fields
as a frozen slots dataclass (and, for the request, its own `__init__` and `evolve`), in one run:

* `PodRequest`: its fields copied from a blank request's `__dict__` (`podspec.resources.parse_pod`);
* `PodView` / `ContainerView`: plain slots dataclasses, read-only by convention (`podspec.view`);
* `NodeConstraints`: a plain class with slots that hashes itself once (`placement.nodeconstraints`);
* `Toleration`: a NamedTuple.

    python benchmarks/value_objects.py [--number 20000]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from dataclasses import dataclass, fields, make_dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))


def frozen_twin(cls: type) -> Any:
    """A frozen slots dataclass with the same field names (the baseline idiom)."""
    names = [f.name for f in fields(cls)]
    return make_dataclass(f"Frozen{cls.__name__}", names, frozen=True, slots=True)


def best_us(call: Any, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=20000, help="calls per timed pass (best of 5)")
    args = parser.parse_args()

    from admission_load import review_bodies

    from webhook.core.domain.podview import ContainerView, PodView
    from webhook.core.domain.request import PodRequest
    from webhook.core.placement.nodeconstraints import NodeConstraints, Toleration
    from webhook.core.podspec import resources
    from webhook.core.podspec.view import checked_view

    pod = review_bodies()[0]["request"]["object"]
    view = checked_view(pod)
    request = resources.parse_pod(view, "team-a")
    request_fields = {f.name: getattr(request, f.name) for f in fields(PodRequest) if f.init}
    blank = resources._BLANK_REQUEST.__dict__

    def copied() -> PodRequest:
        made = blank.copy()
        made.update(request_fields)
        new: PodRequest = object.__new__(PodRequest)
        object.__setattr__(new, "__dict__", made)
        return new

    frozen_request = make_dataclass("FrozenPodRequest", list(request_fields), frozen=True, slots=True)
    pod_values = [getattr(view, f.name) for f in fields(PodView)]
    container_values = [getattr(view.containers[0], f.name) for f in fields(ContainerView)]
    frozen_view, frozen_container = frozen_twin(PodView), frozen_twin(ContainerView)
    tolerations = (Toleration("a", "Exists", "", "NoSchedule"), Toleration("b", "Equal", "x", ""))

    @dataclass(frozen=True, slots=True)
    class FrozenConstraints:
        selector: tuple[Any, ...]
        required: Any
        preferred: tuple[Any, ...]
        tolerations: tuple[Any, ...]

    frozen_toleration = make_dataclass("FrozenToleration", ["key", "operator", "value", "effect"], frozen=True,
                                       slots=True)
    rows = [
        ("PodRequest: blank __dict__ copied", copied,
         lambda: frozen_request(**request_fields)),
        ("PodRequest: its own __init__", lambda: PodRequest(**request_fields),
         lambda: frozen_request(**request_fields)),
        ("PodRequest: evolve of every field", lambda: request.evolve(**request_fields),
         lambda: frozen_request(**request_fields)),
        ("PodView: plain slots dataclass", lambda: PodView(*pod_values), lambda: frozen_view(*pod_values)),
        ("ContainerView: plain slots dataclass", lambda: ContainerView(*container_values),
         lambda: frozen_container(*container_values)),
        ("NodeConstraints: plain class, hashed once",
         lambda: hash(NodeConstraints((), None, (), tolerations)),
         lambda: hash(FrozenConstraints((), None, (), tolerations))),
        ("Toleration: NamedTuple", lambda: Toleration("a", "Exists", "", "NoSchedule"),
         lambda: frozen_toleration("a", "Exists", "", "NoSchedule")),
    ]
    print(f"{'value (as made on the admission path)':44} {'us':>7} {'frozen dataclass us':>20} {'ratio':>6}")
    for name, made, baseline in rows:
        ours, theirs = best_us(made, args.number), best_us(baseline, args.number)
        print(f"{name:44} {ours:7.2f} {theirs:20.2f} {ours / theirs:6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
