"""JSON log lines: the formatter's exact fields, and the batching writer under concurrent admissions."""

from __future__ import annotations

import json
import logging
import os
import threading

from webhook.server.logs import JsonFormatter, JsonLineHandler, admission_fields


def record(**extra: object) -> logging.LogRecord:
    rec = logging.makeLogRecord(
        {"name": "webhook.admission", "levelname": "INFO", "levelno": 20, "msg": "admission", "created": 1764672000.5}
    )
    rec.__dict__.update(extra)
    return rec


def test_formatter_writes_the_message_and_the_extra_fields() -> None:
    fields = admission_fields(
        uid="u",
        namespace="ns",
        pod="p",
        operation="CREATE",
        endpoint="validate",
        verdict="denied",
        reason="quota-exceeded",
        code=403,
        duration_ms=1.23456,
        dry_run=False,
    )
    assert json.loads(JsonFormatter().format(record(**fields))) == {
        "time": "2025-12-02T10:40:00.500+00:00",
        "level": "info",
        "logger": "webhook.admission",
        "msg": "admission",
        "uid": "u",
        "namespace": "ns",
        "pod": "p",
        "operation": "CREATE",
        "endpoint": "validate",
        "verdict": "denied",
        "reason": "quota-exceeded",
        "code": 403,
        "duration_ms": 1.235,
        "dry_run": False,
    }


def test_exceptions_become_one_error_field() -> None:
    try:
        raise KeyError("spec")
    except KeyError:
        import sys

        rec = record(uid="u")
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["uid"] == "u" and entry["error"].endswith("KeyError: 'spec'")


def test_handler_writes_every_line_whole_from_many_threads() -> None:
    read_end, write_end = os.pipe()
    handler = JsonLineHandler(write_end)
    handler.setFormatter(JsonFormatter())
    logger = logging.Logger("fan-in")
    logger.addHandler(handler)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")))
    reader.start()

    def admit(n: int) -> None:
        for i in range(250):
            logger.info("admission", extra={"uid": f"{n}-{i}", "pad": "x" * (i % 7) * 100})

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handler.flush()
    os.close(write_end)
    reader.join(timeout=10)
    os.close(read_end)
    lines = b"".join(chunks).decode().splitlines()
    assert sorted(json.loads(line)["uid"] for line in lines) == sorted(f"{n}-{i}" for n in range(8) for i in range(250))
