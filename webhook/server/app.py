"""The Flask app factory and its blueprints: admission (/mutate, /validate) and probes (health, metrics).

Everything the app needs arrives in `ServerConfig`; nothing is read from the environment or from
module globals, so tests build as many independent apps as they like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST

from . import jsoncodec
from .admission import AdmissionCore, AdmissionHandler, Answer, real_core
from .metrics import AdmissionMetrics
from .policyholder import PolicyHolder
from .review import MAX_BODY_BYTES
from .source import SnapshotSource

EXTENSION = "gpu_admission"
DRAIN_LIMIT = 4 * MAX_BODY_BYTES


@dataclass(frozen=True)
class ServerConfig:
    source: SnapshotSource
    """Where the cluster picture comes from and where reservations go."""
    namespace: str = "gpu-admission"
    """The server's own namespace: its pods are always allowed unchanged (as are kube-system's)."""
    policy_file: str | None = None
    """The policy YAML, re-read when it changes; None: the default policy."""
    cert_file: str | None = None
    """The serving certificate, for the expiry metric; None: no such metric."""
    core: AdmissionCore | None = None
    """The decision functions; None: the real allocation core."""
    policy: PolicyHolder | None = None
    """A ready-made policy holder (tests); overrides `policy_file`."""
    record_key: bytes | None = None
    """The key that seals decision records; every process and replica of one webhook needs the same one
    (`serve` reads it from $GPU_ADMISSION_RECORD_KEY_FILE, the chart's Secret). None: a random key."""


def create_app(config: ServerConfig) -> Flask:
    app = Flask("webhook.server")
    app.config["MAX_CONTENT_LENGTH"] = None  # the admission handler enforces its own limit (413)
    metrics = AdmissionMetrics(config.source, config.cert_file)
    policy = config.policy or PolicyHolder(
        config.policy_file, on_failure=lambda _message: metrics.policy_reload_failures.inc()
    )
    metrics.policy = policy.get  # the workload mix gauge shows the policy's mix
    handler = AdmissionHandler(
        source=config.source,
        policy=policy,
        core=config.core or real_core(config.record_key),
        metrics=metrics,
        namespace=config.namespace,
    )
    app.extensions[EXTENSION] = handler
    app.register_blueprint(admission_blueprint(handler))
    app.register_blueprint(probes_blueprint())
    return app


def handler_of(app: Flask) -> AdmissionHandler:
    found: AdmissionHandler = app.extensions[EXTENSION]
    return found


def admission_blueprint(handler: AdmissionHandler) -> Blueprint:
    """/mutate and /validate, bound to their handler (no `current_app` look-up on every request)."""
    bp = Blueprint("admission", __name__)

    @bp.post("/mutate")
    def mutate() -> Response:
        return _admit(handler, "mutate")

    @bp.post("/validate")
    def validate() -> Response:
        return _admit(handler, "validate")

    return bp


def probes_blueprint() -> Blueprint:
    bp = Blueprint("probes", __name__)

    @bp.get("/healthz")
    def healthz() -> Response:
        """Alive: the process answers HTTP. Deliberately checks nothing else."""
        return Response("ok\n", 200, mimetype="text/plain")

    @bp.get("/readyz")
    def readyz() -> Response:
        ready, why = handler_of(current_app).source.ready()
        return Response(f"{'ok' if ready else 'not ready'}: {why}\n", 200 if ready else 503, mimetype="text/plain")

    @bp.get("/metrics")
    def metrics() -> Response:
        return Response(handler_of(current_app).metrics.exposition(), 200, content_type=CONTENT_TYPE_LATEST)

    return bp


def _admit(handler: AdmissionHandler, endpoint: str) -> Response:
    length = request.content_length
    try:
        if length is not None and length > MAX_BODY_BYTES:
            _discard_body(length)
            body = b""  # refused on its declared length, never parsed
        else:
            body = request.stream.read(MAX_BODY_BYTES + 1)  # at most one byte past the limit
    except OSError as err:  # the client went silent mid-body (tls.CLIENT_TIMEOUT) or dropped
        return _json(handler.unreadable(endpoint, err))
    return _json(handler.handle(endpoint, request.content_type, body, length))


def _discard_body(length: int) -> None:
    """Read a moderately oversized body so that the client, still sending, gets the 413 cleanly.

    Beyond DRAIN_LIMIT nothing is read and the connection is closed after the answer instead.
    """
    if length > DRAIN_LIMIT:
        return
    stream = request.stream
    while stream.read(65536):
        pass


def _json(answer: Answer) -> Response:
    payload: Any = answer.body
    return Response(jsoncodec.dumps(payload), answer.http_status, mimetype="application/json")
