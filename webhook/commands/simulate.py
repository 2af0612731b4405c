"""`gpu-admission simulate`: replay a GPU cluster trace through the placement policies (FGD's procedure)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from webhook.errors import UserError

if TYPE_CHECKING:
    from webhook.simulate.replay import Mix

# The core's policies (webhook.core.placement.place.POLICIES), named here so that --help stays import-free.
POLICY_NAMES = ("random", "best-fit", "dot-product", "binpack", "spread", "fewest-tasks", "fragmentation",
                "fgd")  # fgd: the FGD paper's own scoring, the baseline (webhook/core/placement/fgd.py)
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_{}.csv"
# Where the trace is published, and the two commands that fetch only its folder.
TRACE_HINT = (
    "the trace is published in github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv: "
    "git clone --depth 1 --filter=blob:none --sparse https://github.com/alibaba/clusterdata && "
    "git -C clusterdata sparse-checkout set cluster-trace-gpu-v2023, then pass "
    "--trace-dir clusterdata/cluster-trace-gpu-v2023/csv"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", metavar="FILE", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument(
        "--pods", metavar="FILE", help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])"
    )
    parser.add_argument(
        "--trace-dir",
        metavar="DIR",
        help=f"directory of the Alibaba openb trace: --nodes defaults to DIR/{NODE_FILE} and --pods to "
        f"DIR/{POD_FILE.format('WORKLOAD')} (the trace: github.com/alibaba/clusterdata, folder "
        "cluster-trace-gpu-v2023/csv; the error without files says how to fetch it)",
    )
    parser.add_argument(
        "--workload", default="default", help="pod list in --trace-dir: default, gpushare40, multigpu20, ..."
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help=f"placement policy, repeatable ({', '.join(POLICY_NAMES)}; 'all' for every one); default: fragmentation",
    )
    parser.add_argument(
        "--mix",
        default="learn",
        metavar="learn|default|FILE",
        help="the fragmentation policy's workload mix: learn (from the pods as they arrive, as the webhook "
        "does; the default), default (the neutral mix), or the workloadMix of a policy FILE",
    )
    parser.add_argument("--seeds", default="42-51", help="seeds: 42-51, or 42,43,50 (default: 42-51)")
    parser.add_argument(
        "--tune", type=float, default=1.3, help="arrived GPU request as a multiple of capacity (default: 1.3)"
    )
    parser.add_argument("-o", "--output", choices=("text", "json", "csv"), default="text")
    parser.add_argument("--plot", metavar="FILE.png", help="draw unallocated GPU %% against arrived workload")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per CPU)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `42,43,50` (or a mix: `1-3,7`) -> the seeds, in order, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                low, high = int(part[:cut]), int(part[cut + 1 :])
                if high < low:
                    raise ValueError
                values = list(range(low, high + 1))
            else:
                values = [int(part)]
        except ValueError:
            raise UserError(f"--seeds: {part!r} is not a seed or a range like 42-51") from None
        seeds.extend(v for v in values if v not in seeds)
    if not seeds:
        raise UserError("--seeds: no seeds given")
    return seeds


def parse_policies(names: list[str] | None) -> list[str]:
    if not names:
        return ["fragmentation"]
    chosen: list[str] = []
    for name in names:
        for item in (n.strip() for n in name.split(",")):
            if item == "all":
                chosen.extend(p for p in POLICY_NAMES if p not in chosen)
            elif item not in POLICY_NAMES:
                raise UserError(f"--policy: unknown policy {item!r} (known: {', '.join(POLICY_NAMES)}, all)")
            elif item not in chosen:
                chosen.append(item)
    return chosen


def parse_mix(text: str) -> Mix:
    """--mix: learn | default | a policy file, whose workloadMix (a list, learn or default) is used."""
    from webhook.core.placement.context import WorkloadShape
    from webhook.policyfile.read import load_policy

    if text in ("learn", "default"):
        return text
    if not Path(text).is_file():
        raise UserError(f"--mix: {text!r} is neither learn, default nor a policy file")
    policy = load_policy(text, {})
    if policy.workload_mix_source != "fixed":
        return policy.workload_mix_source
    return tuple(WorkloadShape(e.gpus, e.milli, e.weight) for e in policy.workload_mix)


def _files(args: argparse.Namespace) -> tuple[Path, Path]:
    nodes = args.nodes
    pods = args.pods
    if args.trace_dir:
        base = Path(args.trace_dir)
        if not base.is_dir():
            raise UserError(f"--trace-dir: {base} is not a directory; {TRACE_HINT}")
        nodes = nodes or base / NODE_FILE
        pods = pods or base / POD_FILE.format(args.workload)
        if not args.nodes and not Path(nodes).is_file():
            raise UserError(f"--trace-dir: {base} has no {NODE_FILE}; {TRACE_HINT}")
    if not nodes or not pods:
        raise UserError(f"give --nodes FILE and --pods FILE, or --trace-dir DIR; {TRACE_HINT}")
    return Path(nodes), Path(pods)


def run(args: argparse.Namespace) -> int:
    from webhook.simulate.report import as_csv, as_json, as_text, plot, summarize
    from webhook.simulate.runner import run_trials
    from webhook.simulate.trace import load_nodes, load_pods

    if not 0 < args.tune <= 10:
        raise UserError(f"--tune: {args.tune} is outside 0..10")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise UserError(f"--plot: {args.plot} must name a .png file")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so before the run, not after
        raise UserError("--plot draws with matplotlib, which is not installed: pip install 'gpu-admission[plot]'")
    seeds = parse_seeds(args.seeds)
    policies = parse_policies(args.policy)
    mix = parse_mix(args.mix)
    node_file, pod_file = _files(args)
    nodes = load_nodes(node_file)
    pods = load_pods(pod_file)
    if not any(g.healthy for n in nodes for g in n.gpus):
        raise UserError(f"{node_file}: no GPUs in the cluster")
    runs = run_trials(
        nodes, pods, policies, seeds, args.tune, jobs=args.jobs or None, show_progress=not args.no_progress, mix=mix
    )
    summary = summarize(runs, args.tune, pod_file.name)  # the file names the paper's figures to show
    if args.output == "json":
        sys.stdout.write(as_json(summary))
    elif args.output == "csv":
        sys.stdout.write(as_csv(summary))
    else:
        sys.stdout.write(as_text(summary))
    if args.plot:
        try:
            plot(summary, args.plot, title=f"{pod_file.name} on {node_file.name}, seeds {args.seeds}")
        except OSError as err:
            raise UserError(f"--plot: cannot write {args.plot}: {err.strerror or err}") from None
    return 0
