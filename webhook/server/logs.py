"""Structured logs: one JSON object per line, one line per admission, never the object itself."""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
from typing import Any

ADMISSION_LOGGER = "webhook.admission"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg", ...extra fields}`; exceptions as one `error` string."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class JsonLineHandler(logging.Handler):
    """Writes each record as one line with one write(2): no handler lock for the threads to queue on.

    A short line written in one call reaches a pipe or an O_APPEND file whole, so concurrent admissions
    never interleave; only lines longer than PIPE_BUF (tracebacks) take a lock.
    """

    ATOMIC_BYTES = 4096

    def __init__(self, fd: int | None = None) -> None:
        super().__init__()
        self.fd = sys.stderr.fileno() if fd is None else fd
        self._long_lines = threading.Lock()

    def createLock(self) -> None:  # noqa: N802 - logging's name
        self.lock = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            if len(data) <= self.ATOMIC_BYTES:
                self._write(data)
            else:
                with self._long_lines:
                    self._write(data)
        except Exception:
            self.handleError(record)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def configure_logging(level: str = "info") -> None:
    """Root logger -> stderr as JSON lines. Called by `serve` only; the app itself configures nothing."""
    handler = JsonLineHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def admission_fields(
    *,
    uid: str,
    namespace: str,
    pod: str,
    operation: str,
    endpoint: str,
    verdict: str,
    reason: str,
    code: int,
    duration_ms: float,
    dry_run: bool,
) -> dict[str, Any]:
    """The fields of the one admission line: identifiers and outcome, no object content."""
    return {
        "uid": uid,
        "namespace": namespace,
        "pod": pod,
        "operation": operation,
        "endpoint": endpoint,
        "verdict": verdict,
        "reason": reason,
        "code": code,
        "duration_ms": round(duration_ms, 3),
        "dry_run": dry_run,
    }
