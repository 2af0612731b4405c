"""Admission latency and throughput under load, against a no-op endpoint in the same gunicorn + TLS setup.

Starts `gpu-admission serve` on a generated cluster (96 GPU nodes) and, in the identical gunicorn
configuration (same worker class, workers, threads, keep-alive, TLS context), a Flask app whose
POST /mutate reads the body and returns a fixed answer (the target's baseline), and the same no-op
answering POST in front of Flask, as the webhook's admission lane does (the strictest comparison, shown
beside it). All get the same concurrent keep-alive HTTPS load of realistic GPU pod reviews, driven by
`wrk` (Debian package) with a Lua script, or by a Python load generator when wrk is missing. Prints p50,
p99 and requests/s for each and the ratios.

Two loads: saturation (every connection sends its next request as soon as the answer arrives) for
throughput, and a paced load (each connection pauses between requests) for latency at a busy but
sustainable rate. No-op and webhook runs alternate for --rounds rounds and the median is reported, and
the servers' own CPU time per request is measured, because other work on a small machine moves the
wall-clock figures from run to run.

    python benchmarks/admission_load.py [--duration 10] [--connections 8] [--rounds 3] [--python-load]

Targets: p99 <= 10 ms and throughput >= 60 % of the no-op endpoint.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from e2e_server import free_port, post_json, running_server  # noqa: E402
from server_support import fixture_review, gpu_node, with_gpu  # noqa: E402

LUA = """
local bodies = {}
for line in io.lines("%(bodies)s") do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  return wrk.format(nil, nil, nil, bodies[(i %% #bodies) + 1])
end
%(delay)s
"""
NAMESPACES = ("team-a", "team-b", "team-c", "team-d")


def cluster_objects() -> list[dict[str, Any]]:
    """64 NVLink H100 nodes with inventories, 32 A100 nodes known from labels only, four opted-in teams."""
    objects = [gpu_node(f"h100-{i:03d}") for i in range(64)]
    objects += [gpu_node(f"a100-{i:03d}", model="NVIDIA-A100-SXM4-40GB", memory=40960) for i in range(32)]
    for ns in NAMESPACES:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"gpu-admission.io/enabled": "true"}},
            }
        )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": ns},
                "spec": {"hard": {"requests.nvidia.com/gpu": "512", "limits.nvidia.com/gpumem": "40960000"}},
            }
        )
    return objects


def review_bodies() -> list[dict[str, Any]]:
    """GPU pod CREATE reviews as the API server sends them: whole cards 1-8, and shared slices."""
    shapes: list[tuple[int, dict[str, str]]] = [
        (1, {}),
        (2, {}),
        (4, {}),
        (8, {}),
        (1, {"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}),
        (2, {"nvidia.com/gpumem": "10000"}),
        (1, {"nvidia.com/gpucores": "50"}),
    ]
    base = fixture_review("pod-create-kubectl-mutating-phase.appscope.json")
    bodies = []
    for i in range(64):
        gpus, extra = shapes[i % len(shapes)]
        review = with_gpu(base, gpus, extra)
        namespace = NAMESPACES[i % len(NAMESPACES)]
        review["request"]["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        review["request"]["namespace"] = namespace
        review["request"]["object"]["metadata"]["namespace"] = namespace
        review["request"]["object"]["metadata"]["name"] = f"train-{i}"
        bodies.append(review)
    return bodies


def validating_bodies(server: Any, reviews: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The mutated pods as the validating webhook sees them, as dry runs (so the load records nothing)."""
    import jsonpatch

    from webhook.server.review import decode_patch

    conn = server.connection()
    result = []
    for i, review in enumerate(reviews):
        _, answer = post_json(conn, "/mutate", review)
        pod = jsonpatch.apply_patch(review["request"]["object"], decode_patch(answer["response"]))
        pod["metadata"]["uid"] = f"pod-{i}"
        final = json.loads(json.dumps(review))
        final["request"]["object"] = pod
        final["request"]["dryRun"] = True
        result.append(final)
    conn.close()
    return result


def run_wrk(
    url: str, bodies_file: Path, workdir: Path, duration: int, connections: int, pause_ms: int
) -> dict[str, float]:
    script = workdir / "bodies.lua"
    delay = f"delay = function() return {pause_ms} end" if pause_ms else ""
    script.write_text(LUA % {"bodies": bodies_file, "delay": delay})
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pattern = r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\b"
    percent = {m.group(1): _ms(m.group(2), m.group(3)) for m in re.finditer(pattern, out, re.M)}
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "p50": percent["50"],
        "p99": percent["99"],
        "rps": total / duration,
        "requests": float(total),
        "errors": float(errors.group(1)) if errors else 0.0,
    }


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_python_load(
    port: int, ca: Path, path: str, bodies_file: Path, duration: int, connections: int, pause_ms: int
) -> dict[str, float]:
    bodies = bodies_file.read_bytes().splitlines()
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def worker(offset: int) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=30)
        mine: list[float] = []
        i = offset
        while time.monotonic() < stop:
            started = time.perf_counter()
            conn.request("POST", path, body=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            mine.append((time.perf_counter() - started) * 1000.0)
            if response.status != 200:
                with lock:
                    errors[0] += 1
            i += 1
            if pause_ms:
                time.sleep(pause_ms / 1000.0)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(len(latencies) * 0.99)],
        "rps": len(latencies) / duration,
        "requests": float(len(latencies)),
        "errors": float(errors[0]),
    }


def serve_noop(bind: str, cert_dir: str, work_ms: str = "0") -> None:
    """The baseline: the same gunicorn settings and TLS context as `serve`, an app that does nothing
    (or, to calibrate, spends `work_ms` of CPU in Python per request)."""
    from flask import Flask, Response, request

    from webhook.server.gunicorn_app import GunicornOptions, serve_forever
    from webhook.server.logs import configure_logging
    from webhook.server.tls import TlsFiles

    work = float(work_ms) / 1000.0 if work_ms != "lane" else 0.0
    answer = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "noop", "allowed": True}},
        separators=(",", ":"),
    )

    def factory() -> Flask:
        app = Flask("noop")
        if work_ms == "lane":  # POST answered in front of Flask, as the webhook's admission lane does
            inner = app.wsgi_app
            fixed = answer.encode()

            def lane(environ: dict[str, Any], start_response: Any) -> Any:
                if environ.get("REQUEST_METHOD") != "POST":
                    return inner(environ, start_response)
                environ["wsgi.input"].read()
                start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(fixed)))])
                return (fixed,)

            app.wsgi_app = lane  # type: ignore[method-assign]

        @app.post("/mutate")
        @app.post("/validate")
        def noop() -> Response:
            request.get_data()
            if work:
                started = time.thread_time()
                while time.thread_time() - started < work:
                    pass
            return Response(answer, 200, mimetype="application/json")

        @app.get("/readyz")
        def ready() -> str:
            return "ok"

        return app

    configure_logging("info")
    serve_forever(factory, GunicornOptions(bind=bind), TlsFiles(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds of load per run (default 5)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent keep-alive connections (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported (default 3)")
    parser.add_argument(
        "--pace-ms", type=int, default=20, help="paced load: pause of each connection between requests, ms (default 20)"
    )
    parser.add_argument("--python-load", action="store_true", help="use the Python load generator even if wrk exists")
    parser.add_argument(
        "--calibrate-ms",
        type=float,
        default=0.0,
        help="also measure the no-op app spending this much Python CPU per request (ms)",
    )
    parser.add_argument("--serve-noop", nargs=3, metavar=("BIND", "CERT_DIR", "WORK_MS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_noop:
        serve_noop(*args.serve_noop)
        return 0
    from webhook.certs.authority import issue_certificates

    use_wrk = shutil.which("wrk") is not None and not args.python_load
    host_before = HostState.now()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cert_dir = work / "certs"
        issue_certificates(cert_dir, "gpu-admission", "gpu-admission")
        cluster = work / "cluster.json"
        cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()}))
        reviews = review_bodies()
        mutate_file = work / "mutate.jsonl"
        mutate_file.write_text("\n".join(json.dumps(r, separators=(",", ":")) for r in reviews) + "\n")
        validate_file = work / "validate.jsonl"

        def load(port: int, path: str, bodies: Path, pause_ms: int) -> dict[str, float]:
            if use_wrk:
                url = f"https://127.0.0.1:{port}{path}"
                return run_wrk(url, bodies, work, args.duration, args.connections, pause_ms)
            return run_python_load(port, cert_dir / "ca.crt", path, bodies, args.duration, args.connections, pause_ms)

        noop_port, lane_port, calibrated_port = free_port(), free_port(), free_port()
        baselines = [("0", noop_port), ("lane", lane_port)]
        baselines += [(str(args.calibrate_ms), calibrated_port)] if args.calibrate_ms else []
        noops = [
            subprocess.Popen(
                [sys.executable, __file__, "--serve-noop", f"127.0.0.1:{port}", str(cert_dir), work_ms],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for work_ms, port in baselines
        ]
        noop = noops[0]
        try:
            for _, port in baselines:
                _wait(port, cert_dir / "ca.crt")
            with running_server(work, cert_dir, ["--cluster", str(cluster)]) as server:
                validate_file.write_text(
                    "\n".join(json.dumps(r, separators=(",", ":")) for r in validating_bodies(server, reviews)) + "\n"
                )
                plan = [
                    ("no-op /mutate", noop_port, noop.pid, "/mutate", mutate_file, 0),
                    ("webhook /mutate", server.port, server.process.pid, "/mutate", mutate_file, 0),
                    ("webhook /validate dry-run", server.port, server.process.pid, "/validate", validate_file, 0),
                    ("no-op /mutate, lane", lane_port, noops[1].pid, "/mutate", mutate_file, 0),
                    ("no-op /mutate, paced", noop_port, noop.pid, "/mutate", mutate_file, args.pace_ms),
                    ("webhook /mutate, paced", server.port, server.process.pid, "/mutate", mutate_file, args.pace_ms),
                    (
                        "webhook /validate, paced",
                        server.port,
                        server.process.pid,
                        "/validate",
                        validate_file,
                        args.pace_ms,
                    ),
                ]
                if args.calibrate_ms:
                    plan.append(
                        (
                            f"no-op + {args.calibrate_ms:g} ms Python",
                            calibrated_port,
                            noops[2].pid,
                            "/mutate",
                            mutate_file,
                            0,
                        )
                    )
                for _, port, _, path, bodies, _ in plan[:3]:  # warm-up: imports, placement index, TLS
                    load(port, path, bodies, 0)
                samples: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in plan}
                for _ in range(args.rounds):
                    for name, port, group, path, bodies, pause in plan:
                        before = cpu_seconds(group)
                        result = load(port, path, bodies, pause)
                        result["cpu_ms"] = (cpu_seconds(group) - before) * 1000.0 / max(result["requests"], 1.0)
                        samples[name].append(result)
        finally:
            for process in noops:
                process.terminate()
                process.wait(timeout=15)
    results = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in samples.items()
    }
    report(results, "wrk" if use_wrk else "python", args, host_before)
    return 0


class HostState:
    """How busy and how fast the machine is: other work on a shared host moves every figure, and the
    webhook's (larger working set) more than the no-op's, so the report says what the host was doing."""

    def __init__(self, load: tuple[float, ...], stolen: int, ticks: int, loop_ms: float) -> None:
        self.load, self.stolen, self.ticks, self.loop_ms = load, stolen, ticks, loop_ms

    @classmethod
    def now(cls) -> HostState:
        return cls(os.getloadavg(), *_cpu_ticks(), _python_loop_ms())

    def describe_since(self, before: HostState) -> str:
        ticks = self.ticks - before.ticks
        stolen = (self.stolen - before.stolen) / ticks if ticks > 0 else 0.0
        loads = (" ".join(f"{x:.2f}" for x in state.load) for state in (before, self))
        return (
            f"load average {next(loads)} before, {next(loads)} after; CPU time taken by other tenants of the host "
            f"(steal) {stolen:.1%}; a fixed Python loop took {before.loop_ms:.1f} ms before, {self.loop_ms:.1f} after"
        )


def _cpu_ticks() -> tuple[int, int]:
    """Steal ticks and all ticks of the machine so far (the first line of /proc/stat; zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def _python_loop_ms() -> float:
    """CPU time of a fixed pure-Python loop, best of three: this host's speed for Python right now."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        total = 0
        for i in range(200_000):
            total += i % 7
        best = min(best, time.process_time() - started)
    return best * 1000.0


def cpu_seconds(process_group: int) -> float:
    """User + system CPU seconds of every live process in a process group (a gunicorn master and workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == process_group:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def _wait(port: int, ca: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        context = ssl.create_default_context(cafile=str(ca))
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=2)
        try:
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
        finally:
            conn.close()
    raise RuntimeError("the no-op server did not start")


def report(results: dict[str, dict[str, float]], driver: str, args: argparse.Namespace, host: HostState) -> None:
    print(
        f"load: {driver}, {args.connections} keep-alive HTTPS connections, {args.duration} s per run, "
        f"median of {args.rounds} alternating rounds; paced runs pause {args.pace_ms} ms between requests; "
        "both servers: gunicorn gthread, 1 worker x 8 threads, TLS, keep-alive"
    )
    print(f"machine: {os.cpu_count()} CPUs, {HostState.now().describe_since(host)}")
    print(f"{'run':<28} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'server CPU ms/req':>18} {'non-200':>8}")
    for name, r in results.items():
        print(f"{name:<28} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['rps']:>8.0f} {r['cpu_ms']:>18.3f} {r['errors']:>8.0f}")
    base, paced_base = results["no-op /mutate"], results["no-op /mutate, paced"]
    for name, r in results.items():
        if name.startswith("no-op + "):
            print(f"calibration: {name} reaches {r['rps'] / base['rps']:.0%} of the no-op's throughput")
    for name, paced in (
        ("webhook /mutate", "webhook /mutate, paced"),
        ("webhook /validate dry-run", "webhook /validate, paced"),
    ):
        r, p = results[name], results[paced]
        share = r["rps"] / base["rps"]
        cpu_share = base["cpu_ms"] / r["cpu_ms"]
        lane_share = r["rps"] / results["no-op /mutate, lane"]["rps"]
        print(
            f"{name}: throughput {share:.0%} of the no-op's (target >= 60%: {'met' if share >= 0.6 else 'NOT met'}; "
            f"{lane_share:.0%} of a no-op that also answers in front of Flask); "
            f"CPU per request {r['cpu_ms'] / base['cpu_ms']:.2f}x the no-op's (capacity share {cpu_share:.0%}); "
            f"p99 at saturation {r['p99']:.2f} ms ({r['p99'] / base['p99']:.2f}x no-op), "
            f"paced at {p['rps']:.0f} req/s {p['p99']:.2f} ms ({p['p99'] / paced_base['p99']:.2f}x no-op; "
            f"target <= 10 ms: {'met' if p['p99'] <= 10 else 'NOT met'})"
        )


if __name__ == "__main__":
    sys.exit(main())
