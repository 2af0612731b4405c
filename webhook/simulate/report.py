"""Figures from replays: unallocated GPU % at 100 % arrived, the curve per policy, text/JSON/CSV, the plot.

Unallocated GPU % is the FGD paper's measure: 100 - (GPU thousandths allocated / capacity), read when
the GPU request arrived so far equals a given share of the cluster's capacity (linear between pods).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from .replay import Run

AT = 100.0  # the headline point: arrived request = 100 % of capacity

# The FGD paper's published unallocated GPU % at 100 % for its FGD policy (Weng et al., ATC'23), by the
# openb pod list it was measured on; shown beside the `fgd` baseline and the product's figures.
PAPER_FGD: dict[str, float] = {
    "default": 4.77, "gpushare40": 6.04, "gpushare60": 8.75, "multigpu20": 4.47, "multigpu30": 3.64, "multigpu40": 3.09,
    "gpuspec10": 5.34, "gpuspec20": 5.34, "cpu050": 5.00, "cpu100": 4.79,
}


def workload_of(pod_file: str) -> str:
    """The openb workload a pod list file is (`openb_pod_list_default.csv` -> "default"), else ""."""
    match = re.fullmatch(r"openb_pod_list_(.+)\.csv", pod_file)
    return match.group(1) if match else ""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(runs: Sequence[Run], tune: float, pod_file: str = "") -> dict[str, Any]:
    """{"policies": {NAME: {"unallocatedPctAt100", "perSeed", "curve", ...}}}, policies in run order;
    with "paperFgd", the paper's FGD figure, when `pod_file` is an openb pod list it gives one for."""
    by_policy: dict[str, list[Run]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    last = int(math.floor(tune * 100 + 1e-9))
    policies: dict[str, Any] = {}
    for name, group in by_policy.items():
        per_seed = []
        for run in group:
            at = run.unallocated_pct(AT)
            per_seed.append(
                {
                    "seed": run.seed,
                    "unallocatedPctAt100": None if at is None else round(at, 3),
                    "pods": run.pods,
                    "failedPods": run.failed,
                    "unplacedCpuOnlyPods": run.unplaced_cpu_only,
                    "seconds": round(run.seconds, 2),
                }
            )
        curve = []
        for pct in range(0, last + 1):
            values = [v for v in (r.unallocated_pct(pct) for r in group) if v is not None]
            if values:
                curve.append([pct, round(_mean(values), 3)])
        # The seeds' unrounded figures, as the curve's point at 100 % takes them, so that the two agree.
        headline = [v for v in (r.unallocated_pct(AT) for r in group) if v is not None]
        pods = sum(r.pods for r in group)
        seconds = sum(r.seconds for r in group)
        policies[name] = {
            "unallocatedPctAt100": round(_mean(headline), 3) if headline else None,
            "perSeed": per_seed,
            "curve": curve,
            "podsPerSecond": round(pods / seconds, 1) if seconds > 0 else None,
        }
    summary: dict[str, Any] = {"policies": policies}
    paper = PAPER_FGD.get(workload_of(pod_file))
    if paper is not None:
        summary["paperFgd"] = {"workload": workload_of(pod_file), "unallocatedPctAt100": paper}
    return summary


def as_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2) + "\n"


def as_csv(summary: dict[str, Any]) -> str:
    """One row per policy and seed, then one "mean" row per policy."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["policy", "seed", "unallocated_pct_at_100", "pods", "failed_pods"])
    for name, figures in summary["policies"].items():
        for seed in figures["perSeed"]:
            writer.writerow([name, seed["seed"], seed["unallocatedPctAt100"], seed["pods"], seed["failedPods"]])
        writer.writerow([name, "mean", figures["unallocatedPctAt100"], "", ""])
    return out.getvalue()


def as_text(summary: dict[str, Any]) -> str:
    rows = [("policy", "unallocated % at 100 %", "min", "max", "seeds", "failed pods", "pods/s")]
    for name, figures in summary["policies"].items():
        values = [s["unallocatedPctAt100"] for s in figures["perSeed"] if s["unallocatedPctAt100"] is not None]
        failed = sum(s["failedPods"] for s in figures["perSeed"])
        mean = figures["unallocatedPctAt100"]
        rows.append(
            (
                name,
                "n/a" if mean is None else f"{mean:.2f}",
                f"{min(values):.2f}" if values else "n/a",
                f"{max(values):.2f}" if values else "n/a",
                str(len(figures["perSeed"])),
                str(failed),
                f"{figures['podsPerSecond'] or 0:,.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    unplaced = max(
        (sum(s["unplacedCpuOnlyPods"] for s in f["perSeed"]) for f in summary["policies"].values()), default=0
    )
    if unplaced:
        lines.append(f"note: {unplaced} pods asking for no GPU were not placed (not counted as failed)")
    paper = summary.get("paperFgd")
    if paper:
        lines.append(f"FGD paper's published figure ({paper['workload']}): {paper['unallocatedPctAt100']:.2f}")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str, title: str = "") -> None:
    """Unallocated GPU % against arrived workload, one line per policy, as the FGD paper draws it:
    the whole run on the left, the region around full capacity enlarged on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (whole, zoom) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110, gridspec_kw={"width_ratios": [1, 1.3]})
    policies = summary["policies"]
    ranked = sorted(
        policies,
        key=lambda n: (policies[n]["unallocatedPctAt100"] is None, policies[n]["unallocatedPctAt100"] or 0),
    )
    ymax = 5.0
    for name in ranked:
        curve = policies[name]["curve"]
        xs = [p[0] for p in curve]
        ys = [p[1] for p in curve]
        at = policies[name]["unallocatedPctAt100"]
        label = f"{name} ({at:.2f} %)" if at is not None else name
        for axes in (whole, zoom):
            axes.plot(xs, ys, label=label, linewidth=1.8)
        ymax = max(ymax, max((y for x, y in curve if x >= 95), default=0.0))
    for axes in (whole, zoom):
        axes.plot([0, 100, 130], [100, 0, 0], linestyle=":", color="grey", label="ideal")
        axes.axvline(100, linestyle="--", color="grey", alpha=0.6, linewidth=1)
        axes.grid(linestyle="-.", alpha=0.6)
        axes.set_xlabel("Arrived workload (% of cluster GPU capacity)")
    whole.set_ylabel("Unallocated GPU (%)")
    whole.set_xlim(0, None)
    whole.set_ylim(0, 100)
    zoom.set_xlim(80, max((p[0] for n in ranked for p in policies[n]["curve"]), default=130))
    zoom.set_ylim(0, min(30.0, math.ceil(ymax * 1.15)))
    zoom.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
