"""List-then-watch of one kind of object, the way client-go's reflector does it.

The loop only sees plain dicts: a list (`{"metadata": {"resourceVersion": ..}, "items": [..]}`) and
watch events (`{"type": .., "object": {..}}`), exactly as the API server sends them. The functions that
fetch them are injected, so the recorded streams of the tests drive the same code as a live cluster.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

# kind -> the list response as dicts, page by page (`{"metadata": {"resourceVersion": ..}, "items": [..]}`)
ListFn = Callable[[str], Iterable[Mapping[str, Any]]]
# (kind, resourceVersion to start from, server-side timeout in seconds) -> watch events as dicts
StreamFn = Callable[[str, str, int], Iterable[Mapping[str, Any]]]


class Gone(Exception):
    """The resourceVersion we watch from is too old (HTTP 410): only a fresh list can catch up."""


class WatchSink(Protocol):
    """What receives the objects of one kind: the cache."""

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list: the complete set of objects of `kind` now (consumed one item at a time)."""

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED event."""

    def heard(self, kind: str) -> None:
        """The server proved the watch alive (an event, a bookmark, a list, a clean end of stream)."""


@dataclass
class Backoff:
    """Exponential back-off with full jitter, reset after a success."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * self.factor ** min(self._attempt, 64))
        self._attempt += 1
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._attempt = 0


def status_code(error: BaseException) -> int | None:
    """The HTTP status of a kubernetes-client ApiException (or anything with `.status`), else None."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


class Reflector:
    """Keeps one kind of object flowing into a sink: list, watch from the list's resourceVersion,
    resume from the last seen resourceVersion when a stream ends, re-list on 410 Gone, back off on errors.
    """

    def __init__(
        self,
        kind: str,
        list_fn: ListFn,
        stream_fn: StreamFn,
        sink: WatchSink,
        *,
        watch_timeout: int = 60,
        backoff: Backoff | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.stream_fn = stream_fn
        self.sink = sink
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.stop = stop or threading.Event()
        self.resource_version = ""
        self.needs_list = True
        self.lists = 0  # how many times the kind was listed (1 + re-lists)

    def run(self) -> None:
        """Loop until `stop` is set (and carry on where it stopped when called again)."""
        while not self.stop.is_set():
            try:
                if self.needs_list:
                    self.list_once()
                self.watch_once()
                self.backoff.reset()
            except Gone:
                log.info("watch of %s: resourceVersion %s expired, listing again", self.kind, self.resource_version)
                self.needs_list = True
            except Exception as error:  # network errors, API errors, bad payloads: back off and retry
                if status_code(error) == 410:
                    self.needs_list = True
                    continue
                delay = self.backoff.next_delay()
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.kind, error, delay)
                self.stop.wait(delay)

    def list_once(self) -> None:
        """List every object of the kind and hand the complete set to the sink."""
        versions: list[str] = []

        def items() -> Iterator[Mapping[str, Any]]:
            for page in self.list_fn(self.kind):
                versions.append(str((page.get("metadata") or {}).get("resourceVersion") or ""))
                yield from page.get("items") or ()

        self.sink.replace(self.kind, items())
        self.resource_version = versions[-1] if versions else ""
        self.needs_list = False
        self.lists += 1
        self.sink.heard(self.kind)

    def watch_once(self) -> None:
        """Consume one watch stream from the current resourceVersion until the server closes it."""
        for event in self.stream_fn(self.kind, self.resource_version, self.watch_timeout):
            if self.stop.is_set():
                return
            self.handle(event)
        self.sink.heard(self.kind)

    def handle(self, event: Mapping[str, Any]) -> None:
        event_type = event.get("type")
        obj = event.get("object") or {}
        if event_type == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(obj.get("message", "resourceVersion too old"))
            raise RuntimeError(f"watch error {code}: {obj.get('message', '')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.apply(self.kind, event_type, obj)
        elif event_type != "BOOKMARK":
            raise RuntimeError(f"unknown watch event type {event_type!r}")
        if version:
            self.resource_version = str(version)
        self.sink.heard(self.kind)
