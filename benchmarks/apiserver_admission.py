"""Pod creates through a real kube-apiserver with the chart's webhooks, against the same API server
without them, in one run.

Builds (or reuses) the control plane of tests/e2e, installs the chart with `helm`, serves the webhook on
127.0.0.1 behind one URL and creates the same pod (one GPU, `nvidia.com/gpumem`) in namespaces the
webhooks select and in namespaces they do not (the baseline: the API server without webhooks). Clients are
plain keep-alive HTTPS connections, so the client costs the same in both. Prints, per phase, p50/p90/p99
as the client sees them, pods/s, the API server's own mean time in each webhook
(`apiserver_admission_webhook_admission_duration_seconds`) and ConfigMap writes per admitted pod, each as
a ratio to the baseline of the same run; ends with one JSON line.

    python benchmarks/apiserver_admission.py [--replicas 1,3] [--sequential 100] [--burst 300] [--launch 512]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from e2e.controlplane import ControlPlane, free_port, spawn, start_control_plane, stop_process  # noqa: E402
from e2e.harness import (  # noqa: E402
    Webhook,
    api_client,
    create_inventory,
    create_namespace,
    create_node,
    demo_objects,
    install,
)

TIMEOUT_SECONDS = 5  # the chart's webhook.timeoutSeconds
THREADS = 16
NOOP_LABEL = "bench.gpu-admission.io/noop"


def serve_noop(bind: str, cert_dir: str) -> None:
    """The floor of the serving stack: the same gunicorn settings and TLS as `serve`, answering each
    review with the least any webhook does (read the uid; the mutating one adds one annotation, so the
    API server applies a patch as it does for ours)."""
    import base64

    import orjson

    from webhook.server.gunicorn_app import GunicornOptions, serve_forever
    from webhook.server.logs import configure_logging
    from webhook.server.tls import TlsFiles

    patch = base64.b64encode(b'[{"op":"add","path":"/metadata/annotations","value":{"noop":"1"}}]').decode()

    def factory() -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Any:
            review = orjson.loads(environ["wsgi.input"].read())
            response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
            if environ.get("PATH_INFO") == "/mutate":
                response.update(patchType="JSONPatch", patch=patch)
            body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return (body,)

        return app

    configure_logging("warning")
    serve_forever(factory, GunicornOptions(bind=bind), TlsFiles(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"))


def register_noop(admin: Any, port: int, ca_bundle: str) -> None:
    """Webhook configurations like the chart's pod CREATE pair, at the no-op server, for namespaces
    labelled NOOP_LABEL."""
    from kubernetes import client

    def hook(path: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": f"{path}-pods.noop.gpu-admission.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS, "failurePolicy": "Fail", "matchPolicy": "Equivalent",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/{path}", "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {NOOP_LABEL: "true"}}, **extra,
        }

    api = client.AdmissionregistrationV1Api(admin)
    api.create_mutating_webhook_configuration(
        {"metadata": {"name": "bench-noop"}, "webhooks": [hook("mutate", reinvocationPolicy="IfNeeded")]})
    api.create_validating_webhook_configuration({"metadata": {"name": "bench-noop"}, "webhooks": [hook("validate")]})


def pod_body(name: str) -> bytes:
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
    }
    return json.dumps(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}
    ).encode()


class Client:
    """One keep-alive HTTPS connection to the API server with the admin's client certificate."""

    def __init__(self, plane: ControlPlane) -> None:
        user = yaml.safe_load(plane.admin_kubeconfig.read_text())["users"][0]["user"]
        context = ssl.create_default_context(cafile=str(plane.ca_file))
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        self.conn = http.client.HTTPSConnection("127.0.0.1", plane.api_port, context=context, timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"} if body else {}
        self.conn.request(method, path, body=body, headers=headers)
        answer = self.conn.getresponse()
        return answer.status, answer.read()

    def create(self, namespace: str, name: str) -> tuple[float, int, bytes]:
        start = time.perf_counter()
        status, body = self.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(name))
        return time.perf_counter() - start, status, body


def webhook_seconds(plane: ControlPlane) -> dict[str, tuple[float, float]]:
    """(sum, count) of the API server's admission time per webhook name, over every operation."""
    status, text = Client(plane).request("GET", "/metrics")
    totals: dict[str, list[float]] = {}
    pattern = re.compile(r"^apiserver_admission_webhook_admission_duration_seconds_(sum|count)\{([^}]*)\} (\S+)$")
    for line in text.decode().splitlines():
        match = pattern.match(line)
        if not match:
            continue
        name = re.search(r'name="([^"]+)"', match.group(2))
        if name is None:
            continue
        entry = totals.setdefault(name.group(1), [0.0, 0.0])
        entry[0 if match.group(1) == "sum" else 1] += float(match.group(3))
    return {k: (v[0], v[1]) for k, v in totals.items()}


def configmap_writes(plane: ControlPlane) -> float:
    _, text = Client(plane).request("GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'resource="configmaps"' in line
            and re.search(r'verb="(POST|PUT|PATCH|DELETE)"', line)
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


PROGRAMS = {"kube-apiserver": "apiserver", "etcd": "etcd", "gpu-admission": "webhook"}
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[str, float]:
    """CPU seconds used so far by the control plane, our webhook, the no-op webhook and this client,
    summed over each program's processes (threads included; gone processes are not counted)."""
    totals: dict[str, float] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                comm, rest = stat.read().rsplit(")", 1)
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        name = PROGRAMS.get(comm.split("(", 1)[1])
        if int(entry) == me:
            name = "client"
        elif b"--serve-noop" in command:
            name = "noop webhook"
        elif name is None and b"gpu-admission" in command and b"serve" in command:
            name = "webhook"
        if name is not None:
            fields = rest.split()
            totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return totals


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Phase:
    """One measured run of creates: client latencies, statuses, wall time, the API server's webhook time."""

    def __init__(self, plane: ControlPlane, label: str) -> None:
        self.plane, self.label = plane, label
        self.latencies: list[float] = []
        self.failures = 0
        self.wall = 0.0  # seconds, summed over runs
        self.jobs = 0
        self.spent: dict[str, float] = {}  # the API server's seconds in each webhook, over every run
        self.written = 0.0
        self.cpu: dict[str, float] = {}  # CPU seconds of each program on the host, over every run
        self.messages: list[str] = []  # the API server's answers to the creates that failed

    def run(self, jobs: list[tuple[str, str]], threads: int) -> Phase:
        before, writes_before = webhook_seconds(self.plane), configmap_writes(self.plane)
        cpu_before = process_cpu()
        lock = threading.Lock()
        queue = list(reversed(jobs))

        def work() -> None:
            client = Client(self.plane)
            while True:
                with lock:
                    if not queue:
                        return
                    namespace, name = queue.pop()
                seconds, status, body = client.create(namespace, name)
                with lock:
                    self.latencies.append(seconds)
                    self.failures += status != 201
                    if status != 201:
                        self.messages.append(body.decode(errors="replace"))

        start = time.perf_counter()
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.wall += time.perf_counter() - start
        self.jobs += len(jobs)
        for name, (total, _count) in webhook_seconds(self.plane).items():
            spent = total - before.get(name, (0.0, 0.0))[0]
            if spent > 0:
                self.spent[name] = self.spent.get(name, 0.0) + spent
        self.written += configmap_writes(self.plane) - writes_before
        for name, seconds in process_cpu().items():
            spent = seconds - cpu_before.get(name, 0.0)
            if spent > 0:
                self.cpu[name] = self.cpu.get(name, 0.0) + spent
        return self

    def cpu_per_pod(self) -> dict[str, float]:
        """CPU milliseconds per created pod of each program on the host (2 cores shared by all)."""
        return {name: round(spent / self.jobs * 1000, 2) for name, spent in sorted(self.cpu.items())
                if spent / self.jobs >= 0.00005}

    @property
    def webhooks(self) -> dict[str, float]:
        return {name: spent / self.jobs for name, spent in self.spent.items()}

    @property
    def writes(self) -> float:
        return self.written / self.jobs

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall

    def row(self, baseline: Phase | None) -> str:
        p50, p90, p99 = (percentile(self.latencies, q) * 1000 for q in (0.5, 0.9, 0.99))
        text = f"{self.label:<40} p50 {p50:6.2f} p90 {p90:6.2f} p99 {p99:7.2f} ms  {self.rate:7.1f} pods/s"
        if baseline is not None:
            b50 = percentile(baseline.latencies, 0.5) * 1000
            text += f"  p50 +{p50 - b50:5.2f} ms  rate x{self.rate / baseline.rate:4.2f}"
        mean = sum(self.webhooks.values()) * 1000
        if mean:
            parts = ", ".join(f"{k.split('.')[0]} {v * 1000:.2f}" for k, v in sorted(self.webhooks.items()))
            text += f"  webhooks {mean:.2f} ms/create ({parts})"
        late = sum(1 for s in self.latencies if s > TIMEOUT_SECONDS - 1)
        if late or self.failures:
            text += f"  late {late} failed {self.failures}"
        if self.writes:
            text += f"  configmap writes/pod {self.writes:.2f}"
        cpu = self.cpu_per_pod()
        text += "\n" + " " * 41 + "CPU ms/pod: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        return text

    def summary(self, baseline: Phase | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
            "p90_ms": round(percentile(self.latencies, 0.9) * 1000, 2),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2),
            "pods_per_s": round(self.rate, 1),
            "webhook_ms_per_create": round(sum(self.webhooks.values()) * 1000, 2),
            "late": sum(1 for s in self.latencies if s > TIMEOUT_SECONDS - 1),
            "failed": self.failures,
            "configmap_writes_per_pod": round(self.writes, 2),
            "cpu_ms_per_pod": self.cpu_per_pod(),
        }
        if baseline is not None:
            out["rate_ratio"] = round(self.rate / baseline.rate, 2)
            out["p50_over_baseline_ms"] = round(out["p50_ms"] - percentile(baseline.latencies, 0.5) * 1000, 2)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,3", help="replica counts to measure (default 1,3)")
    parser.add_argument("--sequential", type=int, default=100, help="sequential creates per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=300, help=f"pods per burst ({THREADS} client threads)")
    parser.add_argument("--launch", type=int, default=512, help="pods of the job-launch burst into one namespace")
    parser.add_argument("--serve-noop", nargs=2, metavar=("BIND", "CERT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_noop:
        serve_noop(*args.serve_noop)
        return 0
    replica_counts = [int(r) for r in args.replicas.split(",")]

    plane = start_control_plane(scheduler=False)
    results: dict[str, Any] = {"machine": "see docs/performance.md", "replicas": {}}
    webhook: Webhook | None = None
    noop: subprocess.Popen[bytes] | None = None
    try:
        admin = api_client(plane.admin_kubeconfig)
        webhook = install(plane, admin, values={})
        for inventory in demo_objects("GPUInventory"):
            create_inventory(admin, inventory)
        for node in demo_objects("Node"):
            create_node(admin, node)
        counter = iter(range(10**9))

        def names(namespaces: list[str], count: int) -> list[tuple[str, str]]:
            return [(namespaces[i % len(namespaces)], f"p{next(counter)}") for i in range(count)]

        noop_port = free_port()
        noop = spawn([sys.executable, __file__, "--serve-noop", f"127.0.0.1:{noop_port}", str(webhook.cert_dir)],
                     plane.workdir / "noop.log")
        register_noop(admin, noop_port, base64.b64encode((webhook.cert_dir / "ca.crt").read_bytes()).decode())
        for i in range(20):
            create_namespace(admin, f"off-{i}", managed=False)
            create_namespace(admin, f"on-{i}")
            create_namespace(admin, f"noop-{i}", managed=False)
            client.CoreV1Api(admin).patch_namespace(f"noop-{i}", {"metadata": {"labels": {NOOP_LABEL: "true"}}})
        Phase(plane, "warm-up").run(names(["on-0", "off-0", "noop-0"], 60), 4)
        for replicas in replica_counts:
            webhook.scale(replicas, "memory" if replicas == 1 else "leader")  # the chart's default for each
            Phase(plane, "warm-up").run(names(["on-0"], 8 * replicas), replicas * 2)
            results["replicas"][replicas] = measure(plane, webhook, args, names, replicas)
    finally:
        if noop is not None:
            stop_process(noop)
        if webhook is not None:
            webhook.stop()
        plane.stop()
    print(json.dumps(results))
    return 0


MODES = (("off", "no webhook"), ("noop", "no-op webhooks"), ("on", "our webhooks"))


def measure(
    plane: ControlPlane, webhook: Webhook, args: argparse.Namespace, names: Callable[..., Any], replicas: int
) -> dict[str, Any]:
    """Each phase without webhooks, with the no-op pair (the serving stack's floor) and with ours, one
    after the other in the same minute, so that drift hits all three alike."""
    print(f"\n== {replicas} webhook replica(s)")
    seq = {mode: Phase(plane, f"sequential, {label}") for mode, label in MODES}
    for _ in range(args.rounds):
        for mode, phase in seq.items():
            phase.run(names([f"{mode}-0"], args.sequential), 1)
    out = report("sequential", seq)
    for label, count in (("one namespace", 1), ("20 namespaces", 20)):
        burst = {
            mode: Phase(plane, f"burst {args.burst}, {label}, {text}").run(
                names([f"{mode}-{i}" for i in range(count)], args.burst), THREADS)
            for mode, text in MODES
        }
        out.update(report(f"burst_{count}ns", burst))
    launch = {
        mode: Phase(plane, f"launch {args.launch}, one namespace, {text}").run(
            names([f"{mode}-0"], args.launch), THREADS)
        for mode, text in MODES
    }
    out.update(report("launch", launch))
    return out


def report(key: str, phases: dict[str, Phase]) -> dict[str, Any]:
    off = phases["off"]
    print(off.row(None))
    print(phases["noop"].row(off))
    print(phases["on"].row(off))
    return {key: phases["on"].summary(off), f"{key}_noop": phases["noop"].summary(off),
            f"{key}_baseline": off.summary(None)}


if __name__ == "__main__":
    sys.exit(main())
