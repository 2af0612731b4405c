"""The policy in force, re-read when its file changes: a ConfigMap update needs no restart.

The file's mtime is looked at no more than once a second; a file that no longer loads leaves the
previous policy in force and is reported, so a typo never takes admissions down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("webhook.server.policy")


def _load_policy(path: str | None) -> Any:
    from .read import load_policy

    return load_policy(path)  # None: the defaults, with any installed scorer plug-ins


class PolicyHolder:
    """Holds the current Policy; `get()` is what every admission calls. One per process: `serve` builds
    it and hands it to the app and to the live cluster source, so both read the same policy."""

    def __init__(
        self,
        path: str | None,
        *,
        loader: Callable[[str | None], Any] = _load_policy,
        clock: Callable[[], float] = time.monotonic,
        check_interval: float = 1.0,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._path = path
        self._loader = loader
        self._clock = clock
        self._interval = check_interval
        self._listeners: list[Callable[[str], None]] = [on_failure] if on_failure is not None else []
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._policy = loader(path)
        self._next_check = clock() + check_interval

    def on_failure(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with the reason each time a changed file fails to load (the server's metric)."""
        self._listeners.append(listener)

    def get(self) -> Any:
        if self._path is None or self._clock() < self._next_check:
            return self._policy
        with self._lock:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._interval
                self._reload_if_changed()
        return self._policy

    def _reload_if_changed(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp or stamp is None:
            return
        assert self._path is not None
        try:
            policy = self._loader(self._path)
        except Exception as err:  # a bad edit must never stop admissions
            self._stamp = stamp  # report once per change, not once a second
            message = " ".join(str(err).split())
            log.error("policy file %s not reloaded, previous policy stays in force: %s", self._path, message)
            for listener in self._listeners:
                listener(message)
            return
        self._policy = policy
        self._stamp = stamp
        log.info("policy reloaded from %s", self._path)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self._path is None:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)
