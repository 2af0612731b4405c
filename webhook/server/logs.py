"""Structured logs: one JSON object per line, one line per admission, never the object itself."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

ADMISSION_LOGGER = "webhook.admission"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg", ...extra fields}`; exceptions as one `error` string."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
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


def configure_logging(level: str = "info") -> None:
    """Root logger -> stderr as JSON lines. Called by `serve` only; the app itself configures nothing."""
    handler = logging.StreamHandler()
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
