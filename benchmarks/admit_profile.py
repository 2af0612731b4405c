"""Per-request Python cost of the admission handler, in process: no HTTP, no TLS, no gunicorn.

Feeds the realistic GPU pod reviews of `admission_load.py` (same 96-node cluster) straight into
`AdmissionHandler.handle`, the function the Flask view calls, and reports microseconds per request
for /mutate and dry-run /validate, plus a breakdown of the core's share, with warm caches (a tight loop)
and with the CPU caches flushed before each call (closer to the server, where other work runs between
two admissions). Use it to see what a change saves before paying for the (noisy) load test;
`--profile` prints a cProfile listing instead.

    python benchmarks/admit_profile.py [--repeat 3000] [--profile mutate|validate]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from admission_load import cluster_objects, review_bodies  # noqa: E402


def build_app() -> Any:
    from webhook.cluster.translate import build_snapshot
    from webhook.server.app import ServerConfig, create_app
    from webhook.server.source import StaticSource

    source = StaticSource(build_snapshot(cluster_objects()))
    return create_app(ServerConfig(source=source))


def validating_bodies(handler: Any, reviews: list[dict[str, Any]]) -> list[bytes]:
    """The mutated pods as dry-run validating reviews (so repeating them records nothing)."""
    import jsonpatch

    from webhook.server.review import decode_patch

    result = []
    for i, review in enumerate(reviews):
        answer = handler.handle("mutate", "application/json", json.dumps(review).encode())
        pod = jsonpatch.apply_patch(review["request"]["object"], decode_patch(answer.body["response"]))
        pod["metadata"]["uid"] = f"pod-{i}"
        final = json.loads(json.dumps(review))
        final["request"]["object"] = pod
        final["request"]["dryRun"] = True
        result.append(json.dumps(final, separators=(",", ":")).encode())
    return result


def per_request_us(call: Callable[[bytes], Any], bodies: list[bytes], repeat: int) -> float:
    for body in bodies:  # warm-up: placement index, caches
        call(body)
    best = float("inf")
    for _ in range(5):  # CPU time, best of 5: other work on the machine moves wall-clock figures
        started = time.process_time()
        for i in range(repeat):
            call(bodies[i % len(bodies)])
        best = min(best, (time.process_time() - started) / repeat)
    return best * 1e6


_EVICT = bytearray(32 * 1024 * 1024)  # larger than the caches of the machines this runs on


def cold_request_us(call: Callable[[bytes], Any], bodies: list[bytes], repeat: int) -> float:
    """Mean time per call when the CPU caches were flushed just before it, as in the server, where TLS,
    HTTP parsing and the kernel run between two admissions: the same code then takes about twice as long."""
    for body in bodies:
        call(body)
    total = 0.0
    for i in range(repeat):
        _EVICT[::64] = b"\x01" * (len(_EVICT) // 64)  # touch every cache line
        started = time.perf_counter()
        call(bodies[i % len(bodies)])
        total += time.perf_counter() - started
    return total / repeat * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3000, help="requests per timed pass (best of 3)")
    parser.add_argument("--profile", choices=("mutate", "validate"), help="print a cProfile listing instead")
    parser.add_argument("--callers", metavar="REGEX", help="with --profile: also show who calls these functions")
    args = parser.parse_args()
    from webhook.server.logs import JsonFormatter, JsonLineHandler

    # The log line is part of the cost (formatted in the request thread), the terminal is not.
    log_handler = JsonLineHandler(os.open(os.devnull, os.O_WRONLY))
    log_handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(log_handler)
    logging.getLogger().setLevel(logging.INFO)
    app = build_app()
    from webhook.server.app import handler_of

    handler = handler_of(app)
    reviews = review_bodies()
    mutate_bodies = [json.dumps(r, separators=(",", ":")).encode() for r in reviews]
    validate_bodies = validating_bodies(handler, reviews)
    # Everything admitted above stays reserved; the mutate reviews below are answered the same each time.

    def call_mutate(body: bytes) -> Any:
        return handler.handle("mutate", "application/json", body, len(body))

    def call_validate(body: bytes) -> Any:
        return handler.handle("validate", "application/json", body, len(body))

    if args.profile:
        call, bodies = (call_mutate, mutate_bodies) if args.profile == "mutate" else (call_validate, validate_bodies)
        for body in bodies:
            call(body)
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(args.repeat):
            call(bodies[i % len(bodies)])
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats("tottime")
        stats.print_stats(35)
        if args.callers:
            stats.print_callers(args.callers)
        return 0

    from webhook.core import admit
    from webhook.core.policy import Policy

    snapshot = handler.source.snapshot()
    policy = Policy()
    pods = [r["request"]["object"] for r in reviews]
    namespaces = [r["request"]["namespace"] for r in reviews]
    final_pods = [json.loads(b)["request"]["object"] for b in validate_bodies]

    def core_mutate(i: int) -> Any:
        return admit.mutate(pods[i], snapshot, policy, namespace=namespaces[i])

    def core_validate(i: int) -> Any:
        return admit.validate(final_pods[i], snapshot, policy, namespace=namespaces[i])

    indices = [i.to_bytes(1, "big") for i in range(len(pods))]
    cases: list[tuple[str, Callable[[bytes], Any], list[bytes]]] = [
        ("handler /mutate", call_mutate, mutate_bodies),
        ("handler /validate dry-run", call_validate, validate_bodies),
        ("core admit.mutate", lambda b: core_mutate(b[0]), indices),
        ("core admit.validate", lambda b: core_validate(b[0]), indices),
        ("json.loads of a review", json.loads, mutate_bodies),
    ]
    cold = max(args.repeat // 5, 100)
    print(f"{'':<28} {'warm caches':>16} {'flushed caches':>18}")
    for name, call, bodies in cases:
        warm_us = per_request_us(call, bodies, args.repeat)
        cold_us = cold_request_us(call, bodies, cold)
        print(f"{name:<28} {warm_us:10.1f} us/req {cold_us:12.1f} us/req")
    return 0


if __name__ == "__main__":
    sys.exit(main())
