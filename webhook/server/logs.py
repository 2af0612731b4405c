"""Structured logs: one JSON object per line, one line per admission, never the object itself."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import time
from typing import Any

from . import jsoncodec

ADMISSION_LOGGER = "webhook.admission"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


FIELDS = "fields"  # extra={FIELDS: {...}}: the line's fields in one dict, cheaper than one attribute each


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg", ...extra fields}`; exceptions as one `error` string.

    Extra fields come as attributes of the record (`extra={"uid": ...}`) or, for the admission line
    written on every request, as one dict under `extra={FIELDS: {...}}`; both print flat."""

    def format(self, record: logging.LogRecord) -> str:
        entry = _head(record.created, record.levelname.lower(), record.name, record.getMessage())
        fields = record.__dict__.get(FIELDS)
        if type(fields) is dict:
            entry.update(fields)
        else:
            for key, value in record.__dict__.items():
                if key not in _STANDARD and key[0] != "_":
                    entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return jsoncodec.dumps(entry, default=str).decode()


def _head(created: float, level: str, logger: str, msg: str) -> dict[str, Any]:
    """The fields every line starts with."""
    return {"time": _timestamp(created), "level": level, "logger": logger, "msg": msg}


_second: tuple[int, str] = (-1, "")


def _timestamp(created: float) -> str:
    """ISO 8601 in UTC with milliseconds; the part up to the second is formatted once per second."""
    global _second
    whole = int(created)
    second, prefix = _second
    if whole != second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, prefix)
    return f"{prefix}.{int((created - whole) * 1000):03d}+00:00"


class JsonLineHandler(logging.Handler):
    """Formats in the calling thread, writes from one background thread in batches.

    A request thread never blocks on a lock, an event or write(2), each of which would hand the GIL to
    another thread mid-request: it appends to a deque, and the writer, waking every 50 ms while lines
    come, joins whatever is pending into one write. Each wake-up takes the GIL from a request thread,
    so it is rare: at hundreds of admissions a second one write carries dozens of lines. Pending lines
    are written at interpreter exit; a process killed outright loses at most the last 50 ms.
    The writer thread is started in the process that first logs, so a fork (gunicorn's workers) gets
    its own.
    """

    INTERVAL = 0.05
    IDLE_INTERVAL = 0.2

    def __init__(self, fd: int | None = None) -> None:
        super().__init__()
        self.fd = sys.stderr.fileno() if fd is None else fd
        self._pending: collections.deque[bytes] = collections.deque()
        self._owner = -1  # pid whose writer thread is running
        self._pid = os.getpid()  # this process's, kept across forks: getpid(2) on every line costs a syscall
        self._start_lock = threading.Lock()
        self._drain_lock = threading.Lock()
        atexit.register(self.flush)
        os.register_at_fork(after_in_child=self._forget_parent)

    def createLock(self) -> None:  # noqa: N802 - logging's name
        self.lock = None  # deque appends are atomic; no handler lock for threads to queue on

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append((self.format(record) + "\n").encode("utf-8", "replace"))
        except Exception:
            self.handleError(record)
            return
        if self._owner != self._pid:
            self._start_writer()

    def write_entry(self, entry: dict[str, Any]) -> None:
        """Queue one line made of `entry`, with no LogRecord (see `log_admission`)."""
        self._pending.append(jsoncodec.dumps(entry, default=str) + b"\n")
        if self._owner != self._pid:
            self._start_writer()

    def flush(self) -> None:
        """Write whatever is pending now, in the calling thread."""
        self._drain()

    def _forget_parent(self) -> None:
        """In a forked child: the parent writes its own pending lines; this process starts afresh."""
        self._pending.clear()
        self._owner = -1
        self._pid = os.getpid()
        self._start_lock = threading.Lock()
        self._drain_lock = threading.Lock()

    def _start_writer(self) -> None:
        with self._start_lock:
            if self._owner == os.getpid():
                return
            self._owner = os.getpid()
            threading.Thread(target=self._run, name="json-log-writer", daemon=True).start()

    def _run(self) -> None:
        pause = self.INTERVAL
        while True:
            # Sleep after a write too: a writer that drained again at once would wake for every line
            # and take the GIL from the request threads hundreds of times more often.
            time.sleep(pause)
            # Idle: wake less often, up to IDLE_INTERVAL.
            pause = self.INTERVAL if self._drain() else min(pause * 2, self.IDLE_INTERVAL)

    def _drain(self) -> bool:
        with self._drain_lock:  # the writer and flush() only; a flush waits for a write in progress
            chunks = []
            while True:
                try:
                    chunks.append(self._pending.popleft())
                except IndexError:
                    break
            if not chunks:
                return False
            view = memoryview(b"".join(chunks))
            try:
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError:
                pass  # nowhere left to report it
            return True


_configured: JsonLineHandler | None = None  # the root handler configure_logging installed


def configure_logging(level: str = "info") -> None:
    """Root logger -> stderr as JSON lines. Called by `serve` only; the app itself configures nothing."""
    global _configured
    handler = _configured = JsonLineHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The JSON lines carry none of the caller's file and line, thread or process: skip collecting them
    # (the logging HOWTO's "Optimization" settings), which is a third of what a record costs.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


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


def log_admission(logger: logging.Logger, fields: dict[str, Any]) -> None:
    """The admission line: what `logger.info("admission", extra={FIELDS: fields})` writes.

    When the line can only reach the handler `configure_logging` installed (the server as `serve` runs
    it), the entry goes to that handler directly: the LogRecord and the dozen calls of the logging chain
    cost more than a decision once other work has evicted them from the CPU cache. Anywhere else (tests,
    an application's own handlers or filters), through logging as usual."""
    handler = _configured
    if handler is not None and logger.isEnabledFor(logging.INFO) and _only_route(logger, handler):
        entry = _head(time.time(), "info", logger.name, "admission")
        entry.update(fields)
        handler.write_entry(entry)
    else:
        logger.info("admission", extra={FIELDS: fields})


def _only_route(logger: logging.Logger, handler: logging.Handler) -> bool:
    """Whether a record from `logger` would reach `handler` and nothing else, unfiltered."""
    node: Any = logger
    while node is not None:
        if node.filters or node.disabled:
            return False
        if node.handlers:
            return node.handlers == [handler] and not handler.filters and handler.level <= logging.INFO
        if not node.propagate:
            return False
        node = node.parent
    return False
