"""Per-request Python cost of the admission handler, in process: no HTTP, no TLS, no gunicorn.

Feeds the realistic GPU pod reviews of `admission_load.py` (same 96-node cluster) straight into
`AdmissionHandler.handle`, the function the Flask view calls, and reports microseconds per request
for /mutate and dry-run /validate (and /mutate through the WSGI app: the admission lane the server runs,
and the Flask route behind it), plus a breakdown of the core's share, with warm caches (a tight loop)
and with the CPU caches flushed before each call (closer to the server, where other work runs between
two admissions). Use it to see what a change saves before paying for the (noisy) load test;
`--profile` prints a cProfile listing instead; `--stages` prints CPU microseconds per stage of the core
and of the server around it, each also as a ratio to parsing the same review in the same run (the
ratios hold while other work slows the machine; the microseconds do not).

    python benchmarks/admit_profile.py [--repeat 3000] [--profile mutate|validate] [--stages [--instructions]]

`--stages --instructions` counts instructions under valgrind instead (benchmarks/callgrind.py): minutes
instead of seconds, but figures that other work on the machine does not move, to compare two versions.
"""

from __future__ import annotations

import argparse
import cProfile
import io
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

import callgrind  # noqa: E402
from admission_load import cluster_objects, review_bodies  # noqa: E402

RECORD_KEY = b"k" * 32  # the server's and the core calls' key: a record sealed by one verifies in the other


def build_app() -> Any:
    from webhook.cluster.translate import build_snapshot
    from webhook.server.app import ServerConfig, create_app
    from webhook.server.source import StaticSource

    source = StaticSource(build_snapshot(cluster_objects()))
    return create_app(ServerConfig(source=source, record_key=RECORD_KEY))


def wsgi_caller(wsgi: Callable[..., Any]) -> Callable[[bytes], Any]:
    """A POST /mutate of the body through a WSGI app, as gunicorn calls it (a fresh environ each time)."""
    from werkzeug.test import EnvironBuilder

    base = EnvironBuilder(path="/mutate", method="POST", data=b"", content_type="application/json").get_environ()

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        pass

    def call(body: bytes) -> Any:
        environ = {**base, "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        return b"".join(wsgi(environ, start_response))

    return call


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


def per_request_us(call: Callable[[bytes], Any], bodies: list[bytes], repeat: int, passes: int = 5) -> float:
    for body in bodies:  # warm-up: placement index, caches
        call(body)
    best = float("inf")
    for _ in range(passes):  # CPU time, best of n: other work on the machine moves wall-clock figures
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


def quiet_server_logging() -> None:
    """The server's logging (`configure_logging`, as `serve` sets it up), written to /dev/null: the line is
    part of the cost (made in the request thread), the terminal is not."""
    from webhook.server import logs

    logs.configure_logging("info")
    assert logs._configured is not None
    logs._configured.fd = os.open(os.devnull, os.O_WRONLY)


Stage = Callable[[int], Any]


def stage_calls(handler: Any, reviews: list[dict[str, Any]], mutate_bodies: list[bytes],
                validate_bodies: list[bytes]) -> list[tuple[str, Stage | None, Stage | None]]:
    """Each stage of a request as (name, call for /mutate, call for /validate); a call takes the index of
    one of the reviews, whose inputs to that stage are prepared here."""
    from webhook.core.admission import admit, dra, envfrom, node_routes, trust
    from webhook.core.admission import mutate as mutation
    from webhook.core.admission.rules import check_policy
    from webhook.core.podspec.podshape import read_pod
    from webhook.core.podspec.record import sealed_text, shape_of
    from webhook.core.podspec.resources import parse_pod
    from webhook.server import jsoncodec
    from webhook.server import review as rv
    from webhook.server.logs import admission_fields, log_admission

    snapshot = handler.source.snapshot()
    policy = handler.policy.get()
    core = handler.core
    admission_log = logging.getLogger("webhook.admission")
    mutate_pods = [r["request"]["object"] for r in reviews]
    validate_pods = [json.loads(b)["request"]["object"] for b in validate_bodies]
    namespaces = [r["request"]["namespace"] for r in reviews]

    def prepared(pods: list[dict[str, Any]]) -> dict[str, list[Any]]:
        views = [read_pod(p) for p in pods]
        requests = [parse_pod(v, ns) for v, ns in zip(views, namespaces, strict=True)]
        screened = [node_routes.screen(dra.with_claims(r, snapshot, policy), snapshot) for r in requests]
        decisions = [admit.mutate(p, snapshot, policy, namespace=ns, record_key=RECORD_KEY)
                     for p, ns in zip(pods, namespaces, strict=True)]
        return {"view": views, "request": requests, "screened": screened, "decision": decisions,
                "normal": [mutation._normalise(r, policy) for r in screened]}

    m, v = prepared(mutate_pods), prepared(validate_pods)
    placements = [mutation._plan(r, snapshot, policy)[1] for r in m["normal"]]
    allocations = [d.allocation for d in m["decision"]]
    requirements = [mutation._required(p, snapshot, policy) for p in placements]
    answers = [handler.handle("mutate", "application/json", b, len(b)).body for b in mutate_bodies]

    def both(make: Callable[[list[dict[str, Any]], list[bytes], dict[str, list[Any]]], Stage | None]
             ) -> tuple[Stage | None, Stage | None]:
        return make(mutate_pods, mutate_bodies, m), make(validate_pods, validate_bodies, v)

    def log_line(i: int) -> None:
        fields = admission_fields(uid="u", namespace=namespaces[i], pod="p", operation="CREATE",
                                  endpoint="mutate", verdict="allowed", reason="admitted", code=200,
                                  duration_ms=1.0, dry_run=False)
        log_admission(admission_log, fields)

    stages: list[tuple[str, Stage | None, Stage | None]] = [
        ("review JSON decode (baseline)", *both(lambda p, b, x: lambda i: jsoncodec.loads(b[i]))),
        ("handler.handle, all", *both(lambda p, b, x: None)),  # filled in below
        ("  core mutate/validate, all", *both(lambda p, b, x: None)),
        ("  server around the core", None, None),
        ("core: read_pod (types, view)", *both(lambda p, b, x: lambda i: read_pod(p[i]))),
        ("core: parse_pod of the view", *both(lambda p, b, x: lambda i: parse_pod(x["view"][i], namespaces[i]))),
        ("core: DRA claims + node routes", *both(lambda p, b, x: lambda i: node_routes.screen(
            dra.with_claims(x["request"][i], snapshot, policy), snapshot))),
        ("core: record seal verify", *both(lambda p, b, x: lambda i: trust.sealed_record(
            p[i], x["screened"][i], RECORD_KEY))),
        ("core: envFrom screen", *both(lambda p, b, x: lambda i: envfrom.screen_gpu(
            p[i], x["screened"][i], snapshot, policy))),
        ("core: policy rules", *both(lambda p, b, x: lambda i: check_policy(x["screened"][i], policy))),
        ("core: placement", lambda i: mutation._plan(m["normal"][i], snapshot, policy), None),
        ("core: patch, record included", lambda i: mutation._patch(
            m["normal"][i], allocations[i], placements[i], snapshot, policy, key=RECORD_KEY), None),
        ("core: record seal", lambda i: sealed_text(allocations[i], requirements[i], shape_of(
            namespaces[i], m["normal"][i].containers), RECORD_KEY), None),
        ("server: envelope checks", *both(lambda p, b, x: lambda i: rv.parse_review(b[i]))),
        ("server: needs a decision", *both(lambda p, b, x: lambda i: core.needs_decision(p[i]))),
        ("server: log line", log_line, log_line),
        ("server: answer JSON encode", lambda i: jsoncodec.dumps(answers[i]), None),
    ]
    for row, (name, _, _) in enumerate(stages):
        if name == "handler.handle, all":
            stages[row] = (name, lambda i: handler.handle("mutate", "application/json", mutate_bodies[i]),
                           lambda i: handler.handle("validate", "application/json", validate_bodies[i]))
        elif name == "  core mutate/validate, all":
            stages[row] = (name, lambda i: admit.mutate(mutate_pods[i], snapshot, policy, namespace=namespaces[i],
                                                        record_key=RECORD_KEY),
                           lambda i: admit.validate(validate_pods[i], snapshot, policy, namespace=namespaces[i],
                                                    record_key=RECORD_KEY))
    return stages


def stage_table(stages: list[tuple[str, Stage | None, Stage | None]], figures: dict[tuple[str, int], float],
                unit: str) -> None:
    """Print each stage's figure for /mutate and /validate and its ratio to decoding the same review
    (measured in the same run, so that the ratio survives a busy machine)."""
    for column in (0, 1):
        if ("handler.handle, all", column) in figures:
            figures["  server around the core", column] = (
                figures["handler.handle, all", column] - figures["  core mutate/validate, all", column])
    print(f"{unit + ' per request (x: ratio to the review decode)':<36} {'/mutate':>16} {'/validate':>16}")
    for name, *_ in stages:
        cells = []
        for column in (0, 1):
            value = figures.get((name, column))
            base = figures["review JSON decode (baseline)", column]
            cells.append(f"{value:8.1f} {value / base:5.2f}x" if value is not None else f"{'-':>15}")
        print(f"{name:<36} {cells[0]:>16} {cells[1]:>16}")


def cpu_figures(stages: list[tuple[str, Stage | None, Stage | None]], items: int,
                repeat: int) -> dict[tuple[str, int], float]:
    """CPU microseconds per call of each stage: the best of many short passes, one that other processes
    on the machine slowed least."""
    indices = [i.to_bytes(1, "big") for i in range(items)]
    figures: dict[tuple[str, int], float] = {}
    for name, *calls in stages:
        for column, call in enumerate(calls):
            if call is not None:
                figures[name, column] = per_request_us(lambda b, c=call: c(b[0]), indices, max(repeat // 10, 64), 30)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3000, help="requests per timed pass (best of 5)")
    parser.add_argument("--profile", choices=("mutate", "validate"), help="print a cProfile listing instead")
    parser.add_argument("--callers", metavar="REGEX", help="with --profile: also show who calls these functions")
    parser.add_argument("--stages", action="store_true", help="print CPU time per stage instead")
    parser.add_argument("--instructions", action="store_true",
                        help="with --stages: count instructions under valgrind instead of timing (slow, but "
                        "the same figures on a busy machine)")
    args = parser.parse_args()
    if args.stages and args.instructions and not callgrind.active():
        counts = callgrind.instruction_counts([__file__, *sys.argv[1:]])
        figures = {(key.rsplit("|", 1)[0], int(key.rsplit("|", 1)[1])): n / 1000 for key, n in counts.items()}
        names = list(dict.fromkeys(k[0] for k in figures))
        names.insert(names.index("  core mutate/validate, all") + 1, "  server around the core")
        stage_table([(name, None, None) for name in names], figures, "thousand instructions")
        return 0
    quiet_server_logging()
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

    if args.stages:
        stages = stage_calls(handler, reviews, mutate_bodies, validate_bodies)
        if callgrind.active():  # the run `--instructions` started under valgrind: count, the parent prints
            callgrind.start()
            for name, *calls in stages:
                for column, call in enumerate(calls):
                    if call is not None:
                        callgrind.count(f"{name}|{column}", call, len(reviews))
            return 0
        stage_table(stages, cpu_figures(stages, len(reviews), args.repeat), "CPU us")
        return 0
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

    from webhook.core.admission import admit

    snapshot = handler.source.snapshot()
    policy = handler.policy.get()
    pods = [r["request"]["object"] for r in reviews]
    namespaces = [r["request"]["namespace"] for r in reviews]
    final_pods = [json.loads(b)["request"]["object"] for b in validate_bodies]

    def core_mutate(i: int) -> Any:
        return admit.mutate(pods[i], snapshot, policy, namespace=namespaces[i], record_key=RECORD_KEY)

    def core_validate(i: int) -> Any:
        return admit.validate(final_pods[i], snapshot, policy, namespace=namespaces[i], record_key=RECORD_KEY)

    indices = [i.to_bytes(1, "big") for i in range(len(pods))]
    lane = app.wsgi_app
    cases: list[tuple[str, Callable[[bytes], Any], list[bytes]]] = [
        ("WSGI /mutate, lane", wsgi_caller(lane), mutate_bodies),
        ("WSGI /mutate, Flask route", wsgi_caller(lane.inner), mutate_bodies),
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
