"""`gpu-admission agent`: discover this node's GPUs with NVML and publish them as its GPUInventory.

Runs as a DaemonSet on GPU nodes. Exit codes: 0 done, 1 a pass failed under --once, 2 bad arguments,
3 no NVML here (no bindings, no library or no driver): a node without GPUs says so in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from webhook.errors import UserError

if TYPE_CHECKING:
    from webhook.agent.metrics import AgentMetrics
    from webhook.agent.publish import InventoryPublisher

EXIT_NO_NVML = 3
DEFAULT_INTERVAL = 60.0
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name; the GPUInventory is named after it (default: $NODE_NAME)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between discovery passes (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument(
        "--print",
        action="store_true",
        help="print the inventory JSON (one line per change) instead of writing the GPUInventory",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics per GPU on this port (/metrics)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--toolkit-config",
        metavar="FILE",
        default=TOOLKIT_CONFIG,
        help="the NVIDIA container toolkit's config.toml, whose NVIDIA_VISIBLE_DEVICES settings the inventory "
        f"reports (default {TOOLKIT_CONFIG}; a missing file: unknown; '' : do not read)",
    )


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    return run_agent(args, stop=stop)


def run_agent(
    args: argparse.Namespace,
    *,
    nvml: Any = None,
    api: Any = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stop: threading.Event | None = None,
) -> int:
    """The agent with its boundaries injectable: `nvml` (a pynvml-like module), `api` (CustomObjectsApi)."""
    from webhook.agent import nvml as nvml_boundary

    node_name = _node_name(args)
    if not args.interval > 0:
        raise UserError(f"--interval: must be a positive number of seconds, got {args.interval:g}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UserError(f"--metrics-port: must be a port number 0..65535, got {args.metrics_port}")
    if args.once and args.metrics_port is not None:
        raise UserError("--metrics-port serves metrics while the agent runs: drop --once")
    try:
        if nvml is None:
            nvml = nvml_boundary.load_nvml()
        nvml_boundary.start(nvml)
    except nvml_boundary.NvmlUnavailable as unavailable:
        raise UserError(str(unavailable), exit_code=EXIT_NO_NVML) from None
    try:
        publisher = None
        if not args.print:
            from webhook.agent.publish import InventoryPublisher

            publisher = InventoryPublisher(api if api is not None else _custom_objects_api(args.kubeconfig), node_name)
        from webhook.agent.metrics import AgentMetrics, serve_metrics

        metrics = AgentMetrics(nvml, node_name)
        agent = Agent(nvml, node_name, publisher, metrics, out or sys.stdout, err or sys.stderr,
                      toolkit_config=getattr(args, "toolkit_config", ""))
        if args.once:
            agent.run_pass(strict=True)
            return 0
        server = None
        if args.metrics_port is not None:
            try:
                server = serve_metrics(metrics.registry, args.metrics_port)
            except OSError as failure:
                raise UserError(f"--metrics-port {args.metrics_port}: {failure.strerror or failure}") from None
        try:
            agent.loop(args.interval, stop or threading.Event())
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
        return 0
    finally:
        nvml_boundary.stop(nvml)


class Agent:
    """One discovery-and-publish pass, repeated. Under --once a failure ends the run; in the loop it is
    logged, counted and retried at the next interval."""

    def __init__(
        self,
        nvml: Any,
        node_name: str,
        publisher: InventoryPublisher | None,
        metrics: AgentMetrics,
        out: TextIO,
        err: TextIO,
        *,
        toolkit_config: str = "",
    ) -> None:
        self.nvml = nvml
        self.toolkit_config = toolkit_config
        self.node_name = node_name
        self.publisher = publisher
        self.metrics = metrics
        self.out = out
        self.err = err
        self.last_printed: dict[str, Any] | None = None

    def run_pass(self, strict: bool = False) -> str:
        """Discover and publish (or print). Returns what happened: printed, created, replaced, unchanged."""
        from webhook.agent.discovery import describe_failure, discover, driver_version
        from webhook.agent.publish import PublishError, inventory_status
        from webhook.core.podspec.inventory import InventoryError, check_inventory

        try:
            spec = discover(self.nvml)
            check_inventory(spec)
        except (self.nvml.NVMLError, InventoryError) as failure:
            return self._failed("discover", describe_failure(failure), strict)
        toolkit = self._toolkit()
        if toolkit is not None:
            spec["toolkit"] = toolkit
        if self.publisher is None:
            if strict or spec != self.last_printed:
                print(json.dumps(spec, separators=(",", ":")), file=self.out, flush=True)
                self.last_printed = spec
                self.metrics.last_success.set(time.time())
                return "printed"
            self.metrics.last_success.set(time.time())
            return "unchanged"
        try:
            action = self.publisher.publish(spec, inventory_status(spec, driver_version(self.nvml)))
        except PublishError as failure:
            return self._failed("publish", str(failure), strict)
        if action != "unchanged":
            self.metrics.writes.labels(action).inc()
            self._log(f"GPUInventory {self.node_name!r} {action}: {len(spec['gpus'])} GPUs")
        self.metrics.last_success.set(time.time())
        return action

    def _toolkit(self) -> dict[str, Any] | None:
        """The node's toolkit settings; None (unknown) without a config file or when it cannot be read:
        a wrong guess would tell the webhook a route is closed when it is open."""
        if not self.toolkit_config:
            return None
        from webhook.agent.toolkit import ToolkitConfigError, read_toolkit

        try:
            return read_toolkit(self.toolkit_config)
        except ToolkitConfigError as failure:
            self._log(f"{failure}; toolkit settings reported as unknown")
            return None

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            self.run_pass()
            stop.wait(interval)

    def _failed(self, stage: str, message: str, strict: bool) -> str:
        self.metrics.failures.labels(stage).inc()
        if strict:
            raise UserError(message, exit_code=1)
        self._log(f"{message}; retrying")
        return "failed"

    def _log(self, message: str) -> None:
        print(f"gpu-admission agent: {message}", file=self.err, flush=True)


def _node_name(args: argparse.Namespace) -> str:
    name = str(args.node_name or os.environ.get("NODE_NAME", ""))
    if not name:
        raise UserError("--node-name: required (or set NODE_NAME, e.g. from the downward API spec.nodeName)")
    if len(name) > 253 or not _NODE_NAME.match(name):
        raise UserError(f"--node-name: {name!r} is not a valid node name (a DNS subdomain)")
    return name


def _custom_objects_api(kubeconfig: str | None) -> Any:
    """A CustomObjectsApi from --kubeconfig, else the in-cluster service account, else ~/.kube/config."""
    from kubernetes import client

    from webhook.cluster.config import load_api_client

    return client.CustomObjectsApi(load_api_client(kubeconfig))
