"""`gpu-admission serve`: the admission webhook over HTTPS (gunicorn, threaded worker, keep-alive).

Wires the layers together: cluster files or the embedded demo (or the live watch cache) become the
snapshot source, certificates come from --cert-dir (made for development when absent), and gunicorn
runs the Flask app. One worker process with threads is the default so that the in-process
reservations are shared by every admission; with the live cluster, `--reservations api` keeps them in
ConfigMaps instead, shared by every worker and replica.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from webhook.errors import UserError

DEFAULT_NAMESPACE = "gpu-admission"
DEFAULT_SERVICE = "gpu-admission"
DEFAULT_BIND = "0.0.0.0:8443"
LIVE_SOURCE_MODULE = "webhook.cluster.source"
RESERVATION_STORES = ("memory", "api", "leader")
PEER_URL_ENV = "GPU_ADMISSION_PEER_URL"
RESERVATIONS_ENV = "GPU_ADMISSION_RESERVATIONS"
RECORD_KEY_ENV = "GPU_ADMISSION_RECORD_KEY_FILE"  # the key that seals decision records (the chart's Secret)
PREVIOUS_KEY_FILE = "previous.key"  # beside it during a rotation: still accepted

log = logging.getLogger("webhook.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the admission webhook: POST /mutate and /validate (AdmissionReview v1), GET /healthz, /readyz "
        "and /metrics, over HTTPS only. The default is ONE worker process with --threads threads, so the "
        "reservations of admitted pods are shared by all admissions; several workers would each keep their "
        "own and are refused unless the live cluster keeps them (--reservations api)."
    )
    _source_arguments(parser)
    _server_arguments(parser)
    _reservation_arguments(parser)
    parser.add_argument(
        "--service",
        default=DEFAULT_SERVICE,
        metavar="NAME",
        help="Service name in development certificates (default gpu-admission)",
    )


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the cluster state and the policy come from."""
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="PATH",
        help="cluster objects (YAML/JSON files or directories, repeatable) to answer from; "
        "default: the live cluster with --kubeconfig/--in-cluster, else the embedded demo",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="watch a live cluster with this kubeconfig")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument("--in-cluster", action="store_true", help="watch the cluster this pod runs in")
    parser.add_argument("--policy", metavar="FILE", help="policy YAML, re-read when it changes (default: built-in)")


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    """How the server listens: certificates, addresses, processes and threads, TLS, logging."""
    parser.add_argument(
        "--cert-dir",
        default="certs",
        metavar="DIR",
        help="tls.crt and tls.key; a development CA and certificate are made here when absent (default: certs)",
    )
    parser.add_argument(
        "--bind",
        action="append",
        metavar="HOST:PORT",
        help=f"listen address, repeatable: every address serves the same endpoints (default {DEFAULT_BIND})",
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the listen ports with other serve processes on this host (SO_REUSEPORT): the kernel "
        "spreads new connections over them, as a Service spreads them over replicas",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes (default 1: reservations are in-process, keep one worker)",
    )
    parser.add_argument("--threads", type=int, default=8, metavar="N", help="threads per worker (default 8)")
    parser.add_argument(
        "--client-ca",
        metavar="FILE",
        help="answer /mutate and /validate only to clients presenting a certificate signed by this CA (the API "
        "server's, per its AdmissionConfiguration); the probes and /metrics stay open",
    )
    parser.add_argument("--tls-min", choices=("1.2", "1.3"), default="1.2", help="minimum TLS version (default 1.2)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def _reservation_arguments(parser: argparse.ArgumentParser) -> None:
    """Where admitted pods are recorded until the watch sees them, and who decides."""
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help=f"the webhook's own namespace, never admitted against (default: $POD_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--reservations",
        choices=RESERVATION_STORES,
        default=None,
        help="where admitted pods are recorded until the watch sees them, with the live cluster: memory "
        "(in this process; one replica), leader (replicas elect one decider through a Lease in --namespace, "
        "which keeps them in its process; the others forward reviews to it) or api (ConfigMaps in "
        "--namespace, shared by every replica) (default: $GPU_ADMISSION_RESERVATIONS, else memory)",
    )
    parser.add_argument(
        "--peer-url",
        metavar="URL",
        help="with --reservations leader: where the other replicas reach this one, https://HOST:PORT (default: "
        f"${PEER_URL_ENV}; the chart sets the pod's IP)",
    )
    parser.add_argument(
        "--ledger-budget",
        type=float,
        default=3.5,
        metavar="SECONDS",
        help="with --reservations api: the longest one admission may spend on the shared ledger, retries "
        "included; keep it under the webhooks' timeoutSeconds so that nothing is reserved for a pod the API "
        "server already gave up on (default 3.5, for the chart's 5 s)",
    )


def run(args: argparse.Namespace) -> int:
    from webhook.policyfile.holder import PolicyHolder
    from webhook.server.app import ServerConfig, create_app
    from webhook.server.gunicorn_app import GunicornOptions, serve_forever
    from webhook.server.logs import configure_logging

    configure_logging(args.log_level)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    _check_numbers(args)
    if args.policy:
        from webhook.policyfile.read import load_policy

        load_policy(args.policy)  # a bad policy fails here, with the field named, before serving
    tls_files = _tls_files(args, namespace)
    record_key = _record_key()  # here, before the workers fork: all of them must seal with one key
    source_factory = _source_factory(args, namespace)
    options = GunicornOptions(
        bind=tuple(_binds(args)),
        workers=args.workers,
        threads=args.threads,
        log_level=args.log_level,
        reuse_port=args.reuse_port,
    )

    def app_factory() -> Any:
        # Runs in the worker, after the fork: a live source starts its watch threads here. One policy
        # holder per process, read by the app and by the live source alike.
        policy = PolicyHolder(args.policy)
        config = ServerConfig(
            source=source_factory(policy),
            namespace=namespace,
            policy=policy,
            cert_file=tls_files.cert_file,
            record_key=record_key,
            peer_ca_file=str(Path(args.cert_dir) / "ca.crt") if (Path(args.cert_dir) / "ca.crt").is_file() else None,
            require_client_cert=bool(args.client_ca),
        )
        return create_app(config)

    log.info(
        "serving",
        extra={
            "bind": _binds(args),
            "workers": args.workers,
            "threads": args.threads,
            "namespace": namespace,
            "tls_min": args.tls_min,
        },
    )
    serve_forever(app_factory, options, tls_files)
    return 0


def _record_key() -> bytes | tuple[bytes, ...]:
    """The key in $GPU_ADMISSION_RECORD_KEY_FILE, else a random one (then one replica only: another
    replica could not verify this one's records, and its validation would refuse them). A `previous.key`
    beside it (a rotation in progress) is still accepted: records sealed with it, and reviews other
    replicas sign with it, verify until every replica has the new key."""
    path = os.environ.get(RECORD_KEY_ENV)
    if not path:
        log.warning("$%s not set: decision records are sealed with a random key; run one replica only", RECORD_KEY_ENV)
        return os.urandom(32)
    key = _key_file(Path(path))
    previous = Path(path).with_name(PREVIOUS_KEY_FILE)
    if previous.is_file():
        return key, _key_file(previous)
    return key


def _key_file(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as err:
        raise UserError(f"{path}: cannot read the record key (${RECORD_KEY_ENV}): {err.strerror or err}") from None
    if len(key) < 16:
        raise UserError(f"{path}: the record key (${RECORD_KEY_ENV}) must be at least 16 bytes, got {len(key)}")
    return key


def _check_numbers(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if not 0.1 <= args.ledger_budget <= 30:
        raise UserError(f"--ledger-budget must be from 0.1 to 30 seconds, got {args.ledger_budget:g}")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    for bind in _binds(args):
        host, sep, port = bind.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(f"--bind must be HOST:PORT, got {bind!r}")


def _binds(args: argparse.Namespace) -> list[str]:
    return list(args.bind or [DEFAULT_BIND])


def _tls_files(args: argparse.Namespace, namespace: str) -> Any:
    import ssl

    from webhook.certs.authority import ensure_dev_certificates
    from webhook.server.tls import TlsFiles, build_context

    paths, made = ensure_dev_certificates(Path(args.cert_dir), args.service, namespace)
    if made:
        log.warning(
            "no certificate in %s: made a development CA and serving certificate; the CA is %s",
            args.cert_dir,
            paths.ca_cert.resolve(),
        )
    if args.client_ca and not Path(args.client_ca).is_file():
        raise UserError(f"{args.client_ca}: --client-ca file not found")
    files = TlsFiles(str(paths.cert), str(paths.key), args.client_ca, args.tls_min)
    try:
        build_context(files)
    except (OSError, ssl.SSLError) as err:
        raise UserError(f"{paths.cert}, {paths.key}: cannot load the certificate pair: {err}") from None
    return files


def _reservation_store(args: argparse.Namespace) -> str:
    """--reservations, else $GPU_ADMISSION_RESERVATIONS, else memory."""
    if args.reservations:
        return str(args.reservations)
    kind = os.environ.get(RESERVATIONS_ENV) or "memory"
    if kind not in RESERVATION_STORES:
        raise UserError(f"${RESERVATIONS_ENV} must be memory, api or leader, got {kind!r}")
    return kind


def _peer_url(args: argparse.Namespace) -> str | None:
    url = args.peer_url or os.environ.get(PEER_URL_ENV)
    if url and not url.startswith("https://"):
        raise UserError(f"--peer-url must be https://HOST:PORT, got {url!r}")
    return url or None


def _live_source_builder() -> Any:
    """`webhook.cluster.source.build_source` when that module provides it (imported only when asked for)."""
    if importlib.util.find_spec(LIVE_SOURCE_MODULE) is None:
        return None
    return getattr(importlib.import_module(LIVE_SOURCE_MODULE), "build_source", None)


def _source_factory(args: argparse.Namespace, namespace: str) -> Any:
    """A callable making the snapshot source in the worker from the worker's policy holder; static
    snapshots are loaded now, in the parent."""
    from webhook.server.source import StaticSource

    reservations = _reservation_store(args)
    live = bool(args.kubeconfig or args.in_cluster)
    if live and not args.cluster:
        build_source = _live_source_builder()
        if build_source is not None:
            if reservations == "leader":
                if not _peer_url(args):
                    raise UserError(f"--reservations leader needs --peer-url (or ${PEER_URL_ENV}): where the other "
                                    "replicas reach this one")
                if not os.environ.get(RECORD_KEY_ENV):
                    raise UserError(f"--reservations leader needs ${RECORD_KEY_ENV}: replicas sign the reviews they "
                                    "forward with the record key they share")
            if args.workers > 1 and reservations in ("memory", "leader"):
                raise UserError(
                    f"--workers {args.workers} with --reservations memory: each worker process would keep its "
                    "own reservations and admit past a quota; use --reservations api or --workers 1"
                )

            def live_source(policy: Any = None) -> Any:
                shared = {} if policy is None else {"policy": policy}  # the worker's holder, when given
                return build_source(
                    kubeconfig=args.kubeconfig,
                    context=args.context,
                    in_cluster=args.in_cluster,
                    namespace=namespace,
                    policy_file=args.policy,
                    reservations=reservations,
                    ledger_budget_seconds=args.ledger_budget,
                    peer_url=_peer_url(args),
                    **shared,
                )

            return live_source
        log.warning("the live cluster source is not part of this installation; answering from the demo cluster")
    if reservations in ("api", "leader"):
        static = "--cluster files" if args.cluster else "the embedded demo cluster"
        raise UserError(
            f"--reservations {reservations} needs the live cluster (--in-cluster or --kubeconfig, without --cluster): "
            f"answering from {static}, reservations stay in this process"
        )
    if args.workers > 1:
        raise UserError(
            f"--workers {args.workers}: with a static snapshot each worker process would keep its own "
            "reservations and admit past a quota; use --workers 1 with --threads instead"
        )
    from webhook.cluster.files import demo_objects, read_cluster
    from webhook.cluster.translate import build_snapshot

    if args.cluster:
        # Files that are no cluster (no Node, no Namespace, no kind) would manage no pod: refused, as by `check`.
        managed_all = bool(args.policy) and _policy_manages_all(args.policy)
        objects = read_cluster(args.cluster, need_namespaces=not managed_all)
        description = "cluster files " + ", ".join(args.cluster)
    else:
        objects, description = demo_objects(), "embedded demo cluster"
    try:
        snapshot = build_snapshot(objects)
    except ValueError as err:
        raise UserError(f"{description}: {err}") from None
    source = StaticSource(snapshot, description=description)
    return lambda _policy=None: source


def _policy_manages_all(path: str) -> bool:
    from webhook.policyfile.read import load_policy

    return bool(load_policy(path).managed_namespaces == "all")
