"""`gpu-admission check`: decide the GPU pods of manifests offline, through the webhook's own functions.

Each workload's pods go through `admit.mutate()`, the patch is applied, and the patched pod through
`admit.validate()`, exactly as the API server would chain the two webhooks. Admitted pods are counted
into the snapshot, so later workloads see the capacity and quota the earlier ones took. The inputs are
read in `check_inputs.py`, the workloads decided in `check_decide.py`, the results written in
`check_report.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from .check_decide import evaluate  # noqa: F401 - the module's API
from .check_report import EXIT_ALLOWED, EXIT_DENIED, EXIT_INPUT, Result, summary  # noqa: F401 - the module's API

OUTPUTS = ("text", "table", "json", "yaml", "junit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="manifest files or directories (*.yaml, *.yml, *.json), or - for stdin"
    )
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="PATH",
        help="cluster objects (Nodes, Namespaces, ResourceQuotas, Pods, GPUInventories); "
        "repeatable; default: the embedded demo cluster",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="read the cluster state from a live cluster instead")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: built-in defaults)")
    parser.add_argument(
        "-n", "--namespace", default="default", help="namespace for manifests that do not set one (default: default)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="text",
        help="text (default), table (one row per workload), json, yaml or junit",
    )
    parser.add_argument(
        "--fail-on-warn", action="store_true", help="exit 1 when any warning is printed, even if every pod is admitted"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="text output: show each patch")


DEMO_CLUSTER = (
    "Deciding against the embedded demo cluster (2 H100 and 2 A100 nodes with 8 GPUs each, 2 L4 and 1 T4 node; "
    "managed namespaces team-a and team-b, see webhook/demo/cluster.yaml)"
)
DEMO_BANNER = (
    f"{DEMO_CLUSTER}; some examples are denied on purpose, so exit code 1 is expected. Pass --cluster or "
    "--kubeconfig to decide against your own cluster."
)
DEMO_NOTE = f"{DEMO_CLUSTER}. Pass --cluster or --kubeconfig to decide against your own cluster."
# The manifests of the source tree's examples/ directory, the ones the demo cluster is made for.
BUNDLED_EXAMPLES = frozenset(
    {
        "01-single-gpu.yaml",
        "02-shared-slice.yaml",
        "03-nvlink-training.yaml",
        "04-inference-deployment.yaml",
        "05-quota-exceeded.yaml",
        "06-too-many-gpus.yaml",
        "07-cores-over-100.yaml",
        "08-isolation-bypass.yaml",
        "09-unmanaged-namespace.yaml",
        "10-service.yaml",
    }
)


def bundled_examples_only(files: Sequence[str]) -> bool:
    """Whether every file read is one of the bundled examples (examples/NN-*.yaml), not the user's own."""
    import os

    return bool(files) and all(
        os.path.basename(f) in BUNDLED_EXAMPLES and os.path.basename(os.path.dirname(os.path.abspath(f))) == "examples"
        for f in files
    )


def _namespace_warnings(results: list[Result], snapshot: Any, policy: Any, args: argparse.Namespace) -> None:
    """A workload's namespace the cluster files (or the live cluster) do not have: its pods are let
    through unchanged, which is rarely what the files were meant to say."""
    if policy.managed_namespaces == "all" or not (args.cluster or args.kubeconfig):
        return
    for r in results:
        if r.error or r.skipped or not r.namespace or r.namespace in snapshot.namespaces:
            continue
        if args.cluster:
            r.warnings.append(
                f"namespace {r.namespace} is not in the cluster files ({', '.join(args.cluster)}), so it is treated "
                f'as not managed: add its Namespace (labelled gpu-admission.io/enabled: "true" to manage it), '
                "check against a namespace they have with -n, or set managedNamespaces: all in --policy"
            )
        else:
            r.warnings.append(
                f"namespace {r.namespace} does not exist in the cluster, so it is treated as not "
                "managed: create it, or check against an existing one with -n"
            )


def run(args: argparse.Namespace) -> int:
    from webhook.workloads import workloads

    from .check_inputs import read_inputs
    from .check_report import exit_code, render_json, render_junit, render_table, render_text, render_yaml

    files, policy, snapshot, documents = read_inputs(args)
    results = evaluate(workloads(documents), snapshot, policy, args.namespace)
    _namespace_warnings(results, snapshot, policy, args)
    if args.output == "json":
        print(render_json(results))
    elif args.output == "yaml":
        print(render_yaml(results))
    elif args.output == "junit":
        print(render_junit(results))
    elif args.output == "table":
        print(render_table(results))
    else:
        if not args.cluster and not args.kubeconfig:
            # "exit 1 is expected" only where it is: the bundled examples, some of them denied.
            denied = exit_code(results) == EXIT_DENIED
            print(DEMO_BANNER if denied and bundled_examples_only(files) else DEMO_NOTE)
        print(render_text(results, args.verbose))
    code = exit_code(results, args.fail_on_warn)
    if args.fail_on_warn and code == EXIT_DENIED and exit_code(results) == EXIT_ALLOWED:
        warned = sum(len(r.warnings) for r in results)
        print(
            f"gpu-admission check: {warned} warning{'s' if warned != 1 else ''}, and --fail-on-warn is set",
            file=sys.stderr,
        )
    return code
