"""The Flask app factory and its blueprints: admission (/mutate, /validate) and probes (health, metrics).

Everything the app needs arrives in `ServerConfig`; nothing is read from the environment or from
module globals, so tests build as many independent apps as they like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wsgi import get_input_stream

from webhook.core.podspec.record import RecordKey, sealing_key
from webhook.policyfile.holder import PolicyHolder

from . import jsoncodec
from .admission import AdmissionCore, AdmissionHandler, Answer, real_core
from .metrics import AdmissionMetrics
from .peer import PEER_HEADER, PEER_PATHS, Leadership, PeerClient, PeerError, signed
from .review import MAX_BODY_BYTES
from .source import SnapshotSource

EXTENSION = "gpu_admission"
PEER_ENVIRON = "HTTP_" + PEER_HEADER.upper().replace("-", "_")
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
    """The process's policy holder (`serve` shares it with the live source); overrides `policy_file`."""
    record_key: RecordKey | None = None
    """The key that seals decision records; every process and replica of one webhook needs the same one
    (`serve` reads it from $GPU_ADMISSION_RECORD_KEY_FILE, the chart's Secret). None: a random key."""
    peer_ca_file: str | None = None
    """The CA of the serving certificate, trusted with it when reviews are forwarded to the elected decider."""
    require_client_cert: bool = False
    """Answer /mutate and /validate only over a connection that presented a client certificate the TLS
    layer verified (`serve --client-ca`): only the API server may make the webhook reserve anything. The
    probes and /metrics stay open to the kubelet, which presents none."""


def create_app(config: ServerConfig) -> Flask:
    app = Flask("webhook.server")
    app.config["MAX_CONTENT_LENGTH"] = None  # the admission handler enforces its own limit (413)
    metrics = AdmissionMetrics(config.source, config.cert_file)
    policy = config.policy or PolicyHolder(config.policy_file)
    policy.on_failure(lambda _message: metrics.policy_reload_failures.inc())
    metrics.policy = policy.get  # the workload mix gauge shows the policy's mix
    handler = AdmissionHandler(
        source=config.source,
        policy=policy,
        core=config.core or real_core(config.record_key),
        metrics=metrics,
        namespace=config.namespace,
    )
    app.extensions[EXTENSION] = handler
    app.register_blueprint(admission_blueprint(handler, config.require_client_cert))
    app.register_blueprint(probes_blueprint())
    for code in (404, 405):
        app.register_error_handler(code, _status_error)
    peer = None
    if _leadership(config.source) is not None and config.record_key is not None:
        trust = [path for path in (config.cert_file, config.peer_ca_file) if path]
        peer = PeerClient(sealing_key(config.record_key), trust)
    handler.peer = peer
    handler.peer_key = config.record_key
    app.wsgi_app = AdmissionLane(app.wsgi_app, handler, config.require_client_cert)  # type: ignore[method-assign]
    return app


def handler_of(app: Flask) -> AdmissionHandler:
    found: AdmissionHandler = app.extensions[EXTENSION]
    return found


def admission_blueprint(handler: AdmissionHandler, require_client_cert: bool = False) -> Blueprint:
    """/mutate and /validate, bound to their handler (no `current_app` look-up on every request)."""
    bp = Blueprint("admission", __name__)

    @bp.post("/mutate")
    def mutate() -> Response:
        return _admit(handler, "mutate", require_client_cert)

    @bp.post("/validate")
    def validate() -> Response:
        return _admit(handler, "validate", require_client_cert)

    return bp


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
ADMISSION_PATHS = {"/mutate": "mutate", "/validate": "validate"}


class AdmissionLane:
    """WSGI in front of Flask: POST /mutate and /validate go straight to the handler, everything else (the
    probes, wrong methods, unknown paths) to Flask.

    The admission routes need none of Flask's request machinery (context, URL adapter, response object),
    which cost about half as much again as the handler itself (benchmarks/admit_profile.py, the two
    WSGI rows). The routes stay registered in the blueprint on the same code path, so the app answers
    identically without this lane (tests/server/test_server_lane.py compares the two)."""

    def __init__(self, inner: WsgiApp, handler: AdmissionHandler, require_client_cert: bool = False) -> None:
        self.inner = inner
        self.handler = handler
        self.require_client_cert = require_client_cert

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        endpoint = ADMISSION_PATHS.get(path)
        if environ.get("REQUEST_METHOD") != "POST" or (endpoint is None and path not in PEER_PATHS):
            return self.inner(environ, start_response)
        raw_length = environ.get("CONTENT_LENGTH")
        length = int(raw_length) if raw_length and raw_length.isdigit() else None
        stream = get_input_stream(environ, max_content_length=None)
        if endpoint is None:  # a review another replica forwarded: signed, never forwarded again
            answer = _from_peer(self.handler, PEER_PATHS[path], stream, environ, length)
        else:
            answer = (self.require_client_cert and _anonymous(self.handler, endpoint, environ)) or _read_and_handle(
                self.handler, endpoint, stream, environ.get("CONTENT_TYPE"), length)
        body = answer.raw if answer.raw is not None else jsoncodec.dumps(answer.body)
        start_response(_STATUS.get(answer.http_status) or f"{answer.http_status} UNKNOWN",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return (body,)


# Status lines as Flask writes them ("400 BAD REQUEST").
_STATUS = {code: f"{code} {phrase.upper()}" for code, phrase in HTTP_STATUS_CODES.items()}


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


def _status_error(error: HTTPException) -> Response:
    """404 and 405 as a Kubernetes `Status`, like every other error this server answers."""
    code = error.code or 500
    message = f"{request.method} {request.path}: {error.description or error.name}"
    if code == 405:
        message = f"{request.method} {request.path}: method not allowed (admission endpoints take POST)"
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": "NotFound" if code == 404 else "MethodNotAllowed", "message": message}
    response = Response(jsoncodec.dumps(body), code, mimetype="application/json")
    if code == 405 and getattr(error, "valid_methods", None):
        response.headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
    return response


def _admit(handler: AdmissionHandler, endpoint: str, require_client_cert: bool) -> Response:
    refused = require_client_cert and _anonymous(handler, endpoint, request.environ)
    if refused:
        return _json(refused)
    return _json(_read_and_handle(handler, endpoint, request.stream, request.content_type, request.content_length))


def _anonymous(handler: AdmissionHandler, endpoint: str, environ: dict[str, Any]) -> Answer | None:
    """403 for a caller that presented no verified client certificate (the TLS layer checked any it sent
    against --client-ca, so a certificate here is one that CA signed)."""
    sock = environ.get("gunicorn.socket")
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is not None and getpeercert():
        return None
    return handler.forbidden(endpoint, "the admission endpoints answer only the API server: present a client "
                             "certificate signed by the webhook's --client-ca (the API server's AdmissionConfiguration "
                             "kubeConfigFile)")


def _read_and_handle(handler: AdmissionHandler, endpoint: str, stream: Any, content_type: str | None,
                     length: int | None) -> Answer:
    body = _read_body(handler, endpoint, stream, length)
    if isinstance(body, Answer):
        return body
    lead = _leadership(handler.source)
    if lead is not None and not lead.deciding:
        return _forward(handler, endpoint, body, content_type, lead)
    return handler.handle(endpoint, content_type, body, length)


def _read_body(handler: AdmissionHandler, endpoint: str, stream: Any, length: int | None) -> bytes | Answer:
    try:
        if length is not None and length > MAX_BODY_BYTES:
            _discard_body(stream, length)
            return b""  # refused on its declared length, never parsed
        data: bytes = stream.read(MAX_BODY_BYTES + 1)  # at most one byte past the limit
        return data
    except OSError as err:  # the client went silent mid-body (tls.CLIENT_TIMEOUT) or dropped
        return handler.unreadable(endpoint, err)


def _leadership(source: Any) -> Leadership | None:
    """The source's leadership when replicas elect one decider (cluster/leader.py); None: decide here."""
    state = getattr(source, "leadership", None)
    return state() if callable(state) else None


def _forward(handler: AdmissionHandler, endpoint: str, body: bytes, content_type: str | None,
             lead: Leadership) -> Answer:
    """This replica does not decide: the elected decider answers (its answer relayed as it is), or 503."""
    if lead.peer is None or handler.peer is None:
        return handler.unavailable(endpoint, lead.why_not() + "; retry")
    try:
        status, answer = handler.peer.forward(lead.peer, endpoint, body, content_type)
    except PeerError as error:
        return handler.unavailable(endpoint, f"{error}; retry")
    handler.metrics.forwarded.labels(endpoint, str(status)).inc()
    return Answer(status, {}, raw=answer)


def _from_peer(handler: AdmissionHandler, endpoint: str, stream: Any, environ: dict[str, Any],
               length: int | None) -> Answer:
    body = _read_body(handler, endpoint, stream, length)
    if isinstance(body, Answer):
        return body
    if handler.peer_key is None or not signed(handler.peer_key, endpoint, body, environ.get(PEER_ENVIRON)):
        return handler.forbidden(endpoint, "forwarded reviews are taken only from replicas of this webhook")
    lead = _leadership(handler.source)
    if lead is not None and not lead.deciding:
        return handler.unavailable(endpoint, "this replica is not the GPU admission decider (any more); retry")
    return handler.handle(endpoint, environ.get("CONTENT_TYPE"), body, length)


def _discard_body(stream: Any, length: int) -> None:
    """Read a moderately oversized body so that the client, still sending, gets the 413 cleanly.

    Beyond DRAIN_LIMIT nothing is read and the connection is closed after the answer instead.
    """
    if length > DRAIN_LIMIT:
        return
    while stream.read(65536):
        pass


def _json(answer: Answer) -> Response:
    payload: Any = answer.body
    body = answer.raw if answer.raw is not None else jsoncodec.dumps(payload)
    return Response(body, answer.http_status, mimetype="application/json")
