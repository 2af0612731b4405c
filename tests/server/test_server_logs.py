"""JSON log lines: the formatter's exact fields, and the batching writer under concurrent admissions."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterator

import pytest

from webhook.server import logs
from webhook.server.logs import (
    FIELDS,
    JsonFormatter,
    JsonLineHandler,
    admission_fields,
    configure_logging,
    log_admission,
)


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


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[JsonLineHandler, int]]:
    """`configure_logging` as `serve` calls it, writing to a pipe; the root logger restored afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    monkeypatch.setattr(logs, "_configured", None)
    configure_logging("info")
    handler = logs._configured
    assert handler is not None
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    handler.fd = write_end
    yield handler, read_end
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    os.close(write_end)
    os.close(read_end)


def written(handler: JsonLineHandler, read_end: int) -> list[dict[str, object]]:
    """The lines written since the last call (the pipe is non-blocking: none is an empty list)."""
    handler.flush()
    try:
        data = os.read(read_end, 1 << 20)
    except BlockingIOError:
        return []
    return [json.loads(line) for line in data.decode().splitlines()]


FIELDS_OF_ONE = admission_fields(
    uid="u", namespace="ns", pod="p", operation="CREATE", endpoint="mutate", verdict="allowed",
    reason="admitted", code=200, duration_ms=0.5, dry_run=True,
)  # fmt: skip


def test_the_admission_line_reads_the_same_on_the_direct_path(configured: tuple[JsonLineHandler, int]) -> None:
    handler, read_end = configured
    admission = logging.getLogger("webhook.admission")
    log_admission(admission, FIELDS_OF_ONE)  # direct: only the configured handler would see it
    admission.info("admission", extra={FIELDS: FIELDS_OF_ONE})  # through logging
    direct, logged = written(handler, read_end)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", str(direct.pop("time")))
    logged.pop("time")
    assert direct == logged
    assert list(direct) == ["level", "logger", "msg", *FIELDS_OF_ONE]


def test_the_admission_line_honours_levels_filters_and_other_handlers(
    configured: tuple[JsonLineHandler, int],
) -> None:
    handler, read_end = configured
    admission = logging.getLogger("webhook.admission")
    admission.setLevel(logging.WARNING)
    try:
        log_admission(admission, FIELDS_OF_ONE)
        assert written(handler, read_end) == []
    finally:
        admission.setLevel(logging.NOTSET)
    seen: list[logging.LogRecord] = []
    admission.addFilter(lambda rec: seen.append(rec) or True)
    try:
        log_admission(admission, {**FIELDS_OF_ONE, "uid": "filtered"})
    finally:
        admission.filters.clear()
    assert [rec.__dict__[FIELDS]["uid"] for rec in seen] == ["filtered"]
    assert [line["uid"] for line in written(handler, read_end)] == ["filtered"]
    extra = logging.Handler()
    extra.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(extra)
    try:
        log_admission(admission, {**FIELDS_OF_ONE, "uid": "both"})
    finally:
        logging.getLogger().removeHandler(extra)
    assert seen[-1].__dict__[FIELDS]["uid"] == "both"
    assert [line["uid"] for line in written(handler, read_end)] == ["both"]
