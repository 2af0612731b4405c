"""Speed and quality of the trace replay: the default openb trace, 10 seeds, every CPU.

Prints wall time and pods/s of the fragmentation policy (target: the 10 seeds in under 60 s) beside the
best-fit baseline measured in the same run, and the unallocated GPU % of each at 100 % arrived. With
--paper, also the fragmentation policy driven by the ATC'23 paper's measure instead of this product's
(the benchmark swaps the measure function in; worker processes inherit the swap).

    python benchmarks/simulate_trace.py [TRACE_DIR] [--seeds 42-51] [--workload default] [--paper]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import webhook.core.placement.fragmentation as fragmentation
from webhook.commands.simulate import NODE_FILE, POD_FILE, parse_seeds
from webhook.simulate.report import summarize
from webhook.simulate.runner import run_trials
from webhook.simulate.trace import load_nodes, load_pods

TARGET_SECONDS = 60.0


def measure(trace: Path, workload: str, policy: str, seeds: list[int]) -> tuple[float, int, float]:
    nodes = load_nodes(trace / NODE_FILE)
    pods = load_pods(trace / POD_FILE.format(workload))
    started = time.perf_counter()
    runs = run_trials(nodes, pods, [policy], seeds, 1.3, show_progress=False)
    wall = time.perf_counter() - started
    summary = summarize(runs, 1.3)
    return wall, sum(r.pods for r in runs), summary["policies"][policy]["unallocatedPctAt100"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="../shared/traces/alibaba-gpu-v2023")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--paper", action="store_true", help="also run the paper's fragmentation measure")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    trace = Path(args.trace)
    print(f"trace {trace / POD_FILE.format(args.workload)}, seeds {args.seeds}, {os.cpu_count()} CPUs")
    results = {}
    for policy in ("best-fit", "fragmentation"):
        wall, pods, unallocated = measure(trace, args.workload, policy, seeds)
        results[policy] = wall
        print(f"{policy:14} {wall:7.1f} s  {pods / wall:8,.0f} pods/s  unallocated at 100 %: {unallocated:.2f} %")
    if args.paper:
        # The scorer reads each option's value through `expected` (its per-mix memo left unset here).
        ours = fragmentation.expected

        def paper(found: fragmentation.Measured, mix: object) -> float:
            return fragmentation._paper_fragmentation(found.model, found.state, mix)  # type: ignore[arg-type]

        fragmentation.expected = paper  # type: ignore[assignment]
        try:
            wall, pods, unallocated = measure(trace, args.workload, "fragmentation", seeds)
        finally:
            fragmentation.expected = ours  # type: ignore[assignment]
        print(
            f"{'paper measure':14} {wall:7.1f} s  {pods / wall:8,.0f} pods/s  unallocated at 100 %: {unallocated:.2f} %"
        )
    ratio = results["fragmentation"] / results["best-fit"]
    verdict = "within" if results["fragmentation"] <= TARGET_SECONDS else "OVER"
    print(f"fragmentation / best-fit time: {ratio:.2f}x; {verdict} the {TARGET_SECONDS:.0f} s target")


if __name__ == "__main__":
    main()
