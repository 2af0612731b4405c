"""The live source's background threads: one reflector per kind, and a maintenance loop (the placement
index of a new snapshot built before an admission needs it, finished reservations deleted, the cache's
objects moved out of the garbage collector's way once it has synced). `source.build_source` starts them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from .cache import ClusterCache

log = logging.getLogger("webhook.cluster.source")  # the source's logger: its lines keep their name


class Kept(Protocol):
    """What the upkeep needs of the source it keeps (`source.LiveSource`)."""

    cache: ClusterCache

    def prune(self) -> int: ...


class Upkeep:
    """Background threads: one reflector per kind, and a maintenance loop that builds the placement
    index of a new snapshot before an admission needs it, deletes finished reservations, and once the
    cache has synced moves its objects out of the garbage collector's way (`gc.freeze`)."""

    def __init__(
        self,
        source: Kept,
        reflectors: Iterable[Any],
        *,
        prune_every: float = 15.0,
        tick: float = 0.25,
        freeze_gc: bool = True,
    ) -> None:
        self.freeze_gc = freeze_gc
        self.source = source
        self.reflectors = list(reflectors)
        self.prune_every = prune_every
        self.tick = tick
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for reflector in self.reflectors:
            reflector.stop = self.stop
            thread = threading.Thread(target=reflector.run, name=f"watch-{reflector.kind}", daemon=True)
            thread.start()
            self.threads.append(thread)
        keeper = threading.Thread(target=self._maintain, name="cache-upkeep", daemon=True)
        keeper.start()
        self.threads.append(keeper)

    def close(self, timeout: float = 5.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _maintain(self) -> None:
        import gc

        from webhook.core.placement.state import index_of

        frozen = not self.freeze_gc
        next_prune = time.monotonic() + self.prune_every
        while not self.stop.wait(self.tick):
            try:
                if self.source.cache.synced():
                    index_of(self.source.cache.snapshot())
                    if not frozen:
                        gc.collect()
                        gc.freeze()
                        frozen = True
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + self.prune_every
                    self.source.prune()
            except Exception as error:  # an API hiccup while pruning: the next round retries
                log.warning("cache upkeep failed: %s", error)
