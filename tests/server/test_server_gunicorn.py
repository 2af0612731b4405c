"""The gunicorn configuration `serve` runs with: threaded worker, keep-alive, TLS through the reloading context."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from webhook.certs import authority as certs
from webhook.server.gunicorn_app import (
    AdmissionServer,
    GunicornOptions,
    JsonLogger,
    gunicorn_settings,
    quiet_client_timeouts,
)
from webhook.server.tls import ReloadingContext, TlsFiles


def test_settings_load_into_gunicorn(tmp_path: Path) -> None:
    pair = certs.issue_certificates(tmp_path, "gpu-admission", "gpu-admission")
    tls = ReloadingContext(TlsFiles(str(pair.cert), str(pair.key)))
    options = GunicornOptions(bind="127.0.0.1:9443", threads=4)
    server = AdmissionServer(lambda: "the app", gunicorn_settings(options, tls))
    cfg = server.cfg
    assert (cfg.worker_class_str, cfg.workers, cfg.threads, cfg.keepalive) == ("gthread", 1, 4, 75)
    assert cfg.address == [("127.0.0.1", 9443)]
    assert cfg.is_ssl and cfg.certfile == str(pair.cert) and cfg.keyfile == str(pair.key)
    assert cfg.ssl_context(cfg, lambda: None) is tls.context()  # every new connection asks the reloading context
    assert cfg.logger_class is JsonLogger and cfg.accesslog is None
    assert server.load() == "the app"


def test_worker_init_sets_the_gil_switch_interval() -> None:
    hook = gunicorn_settings(GunicornOptions(switch_interval=0.002), None)["post_worker_init"]
    before = sys.getswitchinterval()
    try:
        hook(object())
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)


def test_plain_settings_without_tls() -> None:
    settings = gunicorn_settings(GunicornOptions(switch_interval=0), None)
    assert "certfile" not in settings and "ssl_context" not in settings and "post_worker_init" not in settings


def record_with(error: BaseException) -> logging.LogRecord:
    try:
        raise error
    except BaseException:
        return logging.LogRecord(
            "gunicorn.error", logging.ERROR, __file__, 1, "Socket error processing request.", (), sys.exc_info()
        )


def test_a_client_timeout_is_one_info_line_without_a_traceback() -> None:
    record = record_with(TimeoutError("The read operation timed out"))
    assert quiet_client_timeouts(record)
    assert (record.levelno, record.levelname, record.getMessage()) == (
        logging.INFO,
        "INFO",
        "client went silent mid-request; connection closed",
    )
    assert record.exc_info is None


def test_other_socket_errors_keep_their_traceback() -> None:
    record = record_with(OSError(5, "Input/output error"))
    assert quiet_client_timeouts(record)
    assert (record.levelno, record.getMessage()) == (logging.ERROR, "Socket error processing request.")
    assert record.exc_info is not None
