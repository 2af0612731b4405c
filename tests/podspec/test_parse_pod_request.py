"""parse_pod builds its PodRequest without calling __init__: the result must be a complete request, the
same as one made by the constructor from the same values."""

from __future__ import annotations

import dataclasses

from webhook.core.domain.request import PodRequest
from webhook.core.podspec.resources import parse_pod


def _pod() -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "team-a", "uid": "u1",
                         "annotations": {"gpu-admission.io/placement": "spread"}},
            "spec": {"schedulerName": "volcano",
                     "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2",
                                                                              "nvidia.com/gpumem": "4000",
                                                                              "cpu": "2", "memory": "1Gi"}}}]}}


def test_a_parsed_request_has_every_field_and_equals_the_constructed_one() -> None:
    request = parse_pod(_pod())
    # Every field a parse fills (`derived`, a cache of what placement derives from `raw`, is none of them:
    # a new request starts without one).
    names = [f.name for f in dataclasses.fields(PodRequest) if f.init]
    assert sorted(set(vars(request)) - {"derived"}) == sorted(names)
    rebuilt = PodRequest(**{name: getattr(request, name) for name in names})
    assert rebuilt == request and repr(rebuilt) == repr(request)
    assert (request.namespace, request.name, request.uid, request.gpus, request.memory_mib) == (
        "team-a", "p", "u1", 2, 4000)
    assert (request.placement, request.scheduler_name, request.cpu_milli, request.memory_mib_host) == (
        "spread", "volcano", 2000, 1024)


def test_a_parsed_request_evolves_and_is_replaced_like_any_other() -> None:
    request = parse_pod(_pod())
    assert request.evolve(gpus=1).gpus == 1 and request.gpus == 2
    assert dataclasses.replace(request, name="q").name == "q"
