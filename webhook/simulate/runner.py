"""Runs every (policy, seed) replay, in worker processes when there are several, with a progress bar."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from queue import Empty
from typing import Any, TextIO, cast

from webhook.core.domain.model import Node

from .fgd_replay import NAME as FGD
from .fgd_replay import fgd_replay, kinds_of
from .replay import LEARN, Mix, Run, capacity_milli, replay, workload
from .trace import TracePod


@dataclass(frozen=True)
class Trial:
    policy: str
    seed: int
    mix: Mix = LEARN


class Progress:
    """One line on stderr: runs done, pods placed, pods per second. Redrawn in place on a terminal."""

    def __init__(self, total_pods: int, total_runs: int, stream: TextIO | None = None, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.enabled and self.stream.isatty()
        self.total_pods = max(1, total_pods)
        self.total_runs = total_runs
        self.pods = 0
        self.runs = 0
        self.started = time.perf_counter()
        self.drawn = 0.0

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.pods / elapsed if elapsed > 0 else 0.0

    def advance(self, pods: int) -> None:
        self.pods += pods
        now = time.perf_counter()
        if self.tty and now - self.drawn >= 0.2:
            self.drawn = now
            self._draw("\r")

    def finished(self, run: Run) -> None:
        self.runs += 1
        if not self.enabled:
            return
        if self.tty:
            self._draw("\r")
        else:
            self.stream.write(
                f"simulate: {run.policy} seed {run.seed}: {run.pods} pods, {run.failed} failed, "
                f"{run.pods / run.seconds if run.seconds else 0:.0f} pods/s ({self.runs}/{self.total_runs})\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._draw("\r")
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, lead: str) -> None:
        width = 30
        done = min(1.0, self.pods / self.total_pods)
        bar = "#" * int(done * width) + "-" * (width - int(done * width))
        self.stream.write(
            f"{lead}[{bar}] {100 * done:5.1f}%  runs {self.runs}/{self.total_runs}  "
            f"{self.pods} pods  {self.rate:,.0f} pods/s"
        )
        self.stream.flush()


def _replay(nodes: Sequence[Node], pods: Sequence[TracePod], arrivals: Sequence[TracePod], trial: Trial,
            progress: Callable[[int], None]) -> Run:
    """One trial: the FGD paper's own scoring for `fgd` (its mix is the whole trace's), else the core's."""
    if trial.policy == FGD:
        return fgd_replay(nodes, arrivals, kinds_of(pods), trial.seed, progress=progress)
    return replay(nodes, arrivals, trial.policy, trial.seed, mix=trial.mix, progress=progress)


def run_trials(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float,
    *,
    jobs: int | None = None,
    show_progress: bool = True,
    stream: TextIO | None = None,
    mix: Mix = LEARN,
) -> list[Run]:
    """Every policy on every seed; results in (policy, seed) order. `mix`: the fragmentation policy's
    workload mix (replay.replay)."""
    trials = [Trial(p, s, mix) for p in policies for s in seeds]
    capacity = capacity_milli(nodes)
    expected = sum(len(workload(pods, capacity, s, tune)) for s in seeds) * len(policies)
    progress = Progress(expected, len(trials), stream, show_progress)
    workers = min(jobs or os.cpu_count() or 1, len(trials))
    results: dict[Trial, Run] = {}
    try:
        if workers <= 1:
            for trial in trials:
                arrivals = workload(pods, capacity, trial.seed, tune)
                run = _replay(nodes, pods, arrivals, trial, progress.advance)
                results[trial] = run
                progress.finished(run)
                gc.collect()  # the trial's memos, before the next one builds its own
        else:
            _run_parallel(nodes, pods, tune, trials, workers, progress, results)
    finally:
        progress.close()
    return [results[t] for t in trials]


def _run_parallel(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    tune: float,
    trials: list[Trial],
    workers: int,
    progress: Progress,
    results: dict[Trial, Run],
) -> None:
    """Each trial in a process of its own, at most `workers` at a time. A replay leaves a few million memo
    objects behind: a process that exits lets them go at once, where freeing or collecting them would take
    a tenth of the run. A process that dies without an answer (killed, out of memory) is an error."""
    context = get_context("spawn" if sys.platform == "darwin" else "fork")
    queue = context.Queue()
    waiting = list(reversed(trials))
    running: dict[Connection, tuple[Trial, Any]] = {}  # result pipe -> (trial, process)
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                trial = waiting.pop()
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(  # type: ignore[attr-defined]
                    target=_trial_process, args=(nodes, pods, tune, trial, queue, writer), daemon=True
                )
                process.start()
                writer.close()
                running[reader] = (trial, process)
            for ready in wait(list(running), timeout=0.2):
                reader = cast(Connection, ready)
                trial, process = running.pop(reader)
                try:
                    outcome, value = reader.recv()
                except EOFError:
                    process.join()
                    raise RuntimeError(f"simulate: the process replaying {trial.policy} seed {trial.seed} "
                                       f"ended with exit code {process.exitcode} and no result") from None
                process.join()
                if outcome == "error":
                    raise value
                results[trial] = value
                progress.finished(value)
            _drain(queue, progress)
    finally:
        for _, process in running.values():
            process.kill()
            process.join()
    _drain(queue, progress)


def _trial_process(nodes: Sequence[Node], pods: Sequence[TracePod], tune: float, trial: Trial, queue: Any,
                   result: Any) -> None:
    try:
        arrivals = workload(pods, capacity_milli(nodes), trial.seed, tune)
        answer: tuple[str, object] = ("ok", _replay(nodes, pods, arrivals, trial, queue.put))
    except Exception as error:  # handed to the parent, which raises it
        answer = ("error", error)
    try:
        result.send(answer)
    except Exception as error:  # an exception that does not pickle
        result.send(("error", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({error})")))
    result.close()


def _drain(queue: Any, progress: Progress) -> None:
    while True:
        try:
            progress.advance(queue.get_nowait())
        except Empty:
            return
