"""Running the app under gunicorn from Python: threaded workers, keep-alive, TLS with live reload.

The defaults are one worker process with threads: in-process reservations then live in one place,
so every admission sees the pods admitted just before it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]
from gunicorn.glogging import Logger  # type: ignore[import-untyped]

from .logs import JsonFormatter
from .tls import ReloadingContext, TlsFiles

OPTIONAL_SETTINGS = frozenset({"control_socket_disable"})
FIRST_DATA_SECONDS = 1.0
KEEPALIVE_SECONDS = 75  # longer than the API server's idle connection reuse, so connections stay warm


@dataclass(frozen=True)
class GunicornOptions:
    bind: str | tuple[str, ...] = "0.0.0.0:8443"
    """One address, or several that serve alike."""
    reuse_port: bool = False
    """SO_REUSEPORT: several processes on one host share the port, the kernel spreading connections."""
    workers: int = 1
    threads: int = 8
    keepalive: int = KEEPALIVE_SECONDS
    timeout: int = 30
    """Seconds a worker may stay silent before the arbiter restarts it (threads keep it talking)."""
    graceful_timeout: int = 10
    log_level: str = "info"
    backlog: int = 2048
    max_requests: int = 0
    """Recycle a worker after this many requests (0: never; recycling would drop in-process reservations)."""
    switch_interval: float = 0.005
    """Seconds a thread may hold the GIL while others wait (0: leave Python's). Shorter slices shorten the
    wait behind a long request, but every forced hand-over costs all requests: at 0.001 the server
    answered a third fewer requests per second, at no better tail latency (benchmarks/admission_load.py)."""


def gunicorn_settings(options: GunicornOptions, tls: ReloadingContext | None) -> dict[str, Any]:
    """The gunicorn settings for these options (plain HTTP when `tls` is None: tests and benchmarks only)."""
    settings: dict[str, Any] = {
        "bind": [options.bind] if isinstance(options.bind, str) else list(options.bind),
        "reuse_port": options.reuse_port,
        "workers": options.workers,
        "threads": options.threads,
        "worker_class": "gthread",
        "keepalive": options.keepalive,
        "timeout": options.timeout,
        "graceful_timeout": options.graceful_timeout,
        "loglevel": options.log_level,
        "backlog": options.backlog,
        "max_requests": options.max_requests,
        "accesslog": None,  # the app writes one structured line per admission instead
        "logger_class": JsonLogger,
        "errorlog": "-",
        "proc_name": "gpu-admission",
        # Heartbeat files in memory: works with a read-only root filesystem.
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") else None,
        "forwarded_allow_ips": "",
        # gunicorn 25+: no control socket in $HOME (read-only root filesystem, several servers per host).
        "control_socket_disable": True,
    }
    if options.switch_interval > 0:
        settings["post_worker_init"] = _GilSwitchInterval(options.switch_interval)
    if tls is not None:
        settings["certfile"] = tls.files.cert_file
        settings["keyfile"] = tls.files.key_file
        settings["ssl_context"] = tls.gunicorn_hook
    return settings


class _GilSwitchInterval:
    """gunicorn's post_worker_init hook: shorter GIL slices, so a request never waits long for its thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, _worker: Any) -> None:
        sys.setswitchinterval(self.seconds)


class JsonLogger(Logger):  # type: ignore[misc]
    """gunicorn's own messages as JSON lines too; no access log (the app logs each admission)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(JsonFormatter())
            handler.addFilter(quiet_client_timeouts)

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


def quiet_client_timeouts(record: logging.LogRecord) -> bool:
    """A client that went silent mid-request (tls.CLIENT_TIMEOUT) is its own problem, not a server
    error: gunicorn logs it with a traceback; it becomes one line at info level."""
    if record.exc_info and isinstance(record.exc_info[1], TimeoutError):
        record.msg, record.args = "client went silent mid-request; connection closed", ()
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
    return True


class AdmissionServer(BaseApplication):  # type: ignore[misc]
    """gunicorn driven programmatically: the app is built by `app_factory` inside each worker."""

    def __init__(self, app_factory: Callable[[], Any], settings: dict[str, Any]) -> None:
        self._app_factory = app_factory
        self._settings = settings
        super().__init__()

    def load_config(self) -> None:
        assert self.cfg is not None
        for key, value in self._settings.items():
            if key in OPTIONAL_SETTINGS and key not in self.cfg.settings:
                continue  # an older gunicorn without that feature
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._app_factory()


def _shorten_first_data_wait(seconds: float) -> None:
    """gunicorn's gthread worker holds a thread up to 5 s for a new connection's first bytes before
    parking it in the poller; idle connections could so stall every thread. A shorter wait bounds that."""
    from gunicorn.workers import gthread  # type: ignore[import-untyped]

    if isinstance(getattr(gthread, "DEFAULT_WORKER_DATA_TIMEOUT", None), (int, float)):
        gthread.DEFAULT_WORKER_DATA_TIMEOUT = min(gthread.DEFAULT_WORKER_DATA_TIMEOUT, seconds)


def serve_forever(app_factory: Callable[[], Any], options: GunicornOptions, tls_files: TlsFiles | None) -> None:
    """Run until SIGTERM/SIGINT; gunicorn owns the process from here."""
    tls = ReloadingContext(tls_files) if tls_files is not None else None
    _shorten_first_data_wait(FIRST_DATA_SECONDS)
    AdmissionServer(app_factory, gunicorn_settings(options, tls)).run()
