"""`gpu-admission check` reports: text, table, JSON, YAML and JUnit, and the exit code, from the decided results.

Input errors (a file or document that could not be read or decided) are results of their own in every
format, next to the decisions of the other documents."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree

from webhook.core.domain.vendor_quota import device_resource

EXIT_ALLOWED, EXIT_DENIED, EXIT_INPUT = 0, 1, 2


@dataclass
class Result:
    """One decided document (or pod template), or one input error, as every report format shows it."""

    source: str
    kind: str
    name: str
    namespace: str  # "" for cluster-scoped objects
    managed: bool = True
    allowed: bool = True
    code: int = 200
    message: str = ""
    reason: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[Mapping[str, Any]] = field(default_factory=list)
    allocation: dict[str, Any] | None = None
    replicas: int = 1
    skipped: bool = False
    nodes: list[str] = field(default_factory=list)
    role: str = ""  # the pod template's role in its workload ("Worker", "head", ...)
    notes: list[str] = field(default_factory=list)  # how the pods were found and counted
    walked: bool = False  # found by walking a kind check does not know
    error: bool = False  # an input error: the document could not be read or decided (exit code 2)
    error_field: str = ""  # with `error`: the field at fault ("" for the whole file or document)
    group: str = ""  # API group of a decided workload: text writes "Job (batch.volcano.sh)"
    pods: list[dict[str, Any]] = field(default_factory=list)  # each pod decided: name, verdict, allocation
    warning_pods: dict[str, list[int]] = field(default_factory=dict)  # warning -> the pods (1-based) that drew it

    @classmethod
    def input_error(cls, source: str, kind: str, name: str, namespace: str, message: str, field: str,
                    code: int = 0, **more: Any) -> Result:
        """A document check could not read or decide: refused, with the field at fault (exit code 2)."""
        return cls(source, kind, name, namespace, managed=False, allowed=False, code=code, reason="input-error",
                   message=message, error=True, error_field=field, **{"replicas": 0, **more})

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "group": self.group,
            "role": self.role,
            "managed": self.managed,
            "allowed": self.allowed,
            "code": self.code,
            "message": self.message,
            "reason": self.reason,
            "replicas": self.replicas,
            "warnings": self.warnings,
            "notes": self.notes,
            "foundBy": "walking" if self.walked else "kind",
            "patch": self.patch,
            "allocation": self.allocation,
            "skipped": self.skipped,
            "error": self.error,
            "field": self.error_field,
            "pods": self.pods,
        }


def exit_code(results: Sequence[Result], fail_on_warn: bool = False) -> int:
    """2 if any input error (a GPU workload that could not be decided is one), else 1 if any denial (or,
    with `fail_on_warn`, any warning), else 0."""
    if any(r.error for r in results):
        return EXIT_INPUT
    if any(not r.allowed for r in results) or (fail_on_warn and any(r.warnings for r in results)):
        return EXIT_DENIED
    return EXIT_ALLOWED


def summary(results: Sequence[Result]) -> dict[str, int]:
    return {
        "allowed": sum(1 for r in results if r.allowed and not r.skipped),
        "denied": sum(1 for r in results if not r.allowed and not r.error),
        "skipped": sum(1 for r in results if r.skipped),
        "errors": sum(1 for r in results if r.error),
    }


def target(r: Result) -> str:
    """ "PyTorchJob ml/train: Worker x4", "Pod team-a/p", "Namespace ml" (cluster-scoped)."""
    from webhook.workloads import display_kind

    name = r.name or "(unnamed)"
    kind = display_kind(r.group, r.kind) if r.group else r.kind
    text = f"{kind or '(no kind)'} " + (f"{r.namespace}/{name}" if r.namespace else name)
    if r.role:
        text += f": {r.role}"
    if r.replicas > 1:
        text += f" x{r.replicas}"
    return text


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("s" if count != 1 else "")


def _memory(value: object) -> str:
    """ "20000 MiB"; a card whose memory the cluster does not state (no label, no inventory): "memory unknown"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return f"{value} MiB"
    return "memory unknown"


def slice_text(alloc: Mapping[str, Any]) -> str:
    """ "1 GPU x 20000 MiB/50%", "2 GPUs x memory unknown/100%": what each pod gets, with nothing unset shown."""
    count = alloc.get("gpuCount")
    count = count if isinstance(count, int) else 0
    kind = alloc.get("mig")
    if kind:  # a MIG profile ("3g.20gb"), or the full name of another advertised resource
        devices = "device(s)" if "/" in str(kind) else "MIG device(s)"
        return f"{count} {devices} x {_memory(alloc.get('memoryMiB'))}"
    cores = alloc.get("cores")
    return f"{_plural(count, 'GPU')} x {_memory(alloc.get('memoryMiB'))}" + (
        f"/{cores}%" if isinstance(cores, int) else ""
    )


def allowed_detail(r: Result) -> str:
    """What an admitted result got: its node, GPUs, memory, cores and link topology, each only when known."""
    alloc = r.allocation
    if alloc is None:  # admitted without an allocation: the webhook's own words, never an empty slot
        return f"no GPU allocated ({r.reason}: {r.message})" if r.message else f"no GPU allocated ({r.reason})"
    if r.replicas > 1:
        return f"{r.message}; {slice_text(alloc)} each"
    if alloc.get("mig"):  # MIG or shared devices: the scheduler picks among the nodes offering the resource
        return f"on a node offering {device_resource(str(alloc['mig']))}, {slice_text(alloc)}"
    where = f"node {alloc['node']}" if alloc.get("node") else _waits_for(alloc)
    topology = f", {alloc['topology']}" if alloc.get("topology") else ""
    return f"{where}, {slice_text(alloc)}{topology}"


def _waits_for(alloc: Mapping[str, Any]) -> str:
    """Where an admitted pod with no node yet waits: the pool or ProvisioningRequest its record names."""
    if alloc.get("awaitingPool"):
        return f"waits for a new node of {alloc['awaitingPool']}"
    if alloc.get("awaitingProvisioningRequest"):
        return f"waits for the node of ProvisioningRequest {alloc['awaitingProvisioningRequest']}"
    return "waits for a free node"


def verdict_of(r: Result) -> tuple[str, str]:
    """("ALLOW", detail), ("DENY", detail), ("SKIP", reason) or ("ERROR", message) of one result."""
    if r.error:
        where = f"field {r.error_field}: " if r.error_field else ""
        return "ERROR", where + r.message
    if r.skipped:
        return "SKIP", r.message
    if not r.managed:
        return "ALLOW", f"namespace {r.namespace} is not managed: unchanged"
    if r.reason == "not-gpu-pod":
        return "ALLOW", "asks for no GPU: unchanged"
    if r.allowed and r.group == "resource.k8s.io":  # a claim: its GPUs count when a pod uses it
        return "ALLOW", r.message or "asks for no GPU"
    if r.allowed:
        return "ALLOW", allowed_detail(r)
    return "DENY", f"{r.code} {r.reason}: {r.message}"


def render_text(results: Sequence[Result], verbose: bool) -> str:
    lines = []
    for r in results:
        verdict, detail = verdict_of(r)
        if r.error:
            head = f"{target(r)}: " if r.kind else ""
            lines.append(f"ERROR  {head}{detail}  [{r.source}]")
            continue
        lines.append(f"{verdict:<6} {target(r)}: {detail}  [{r.source}]")
        if r.skipped:
            continue
        lines.extend(f"       note: {n}" for n in r.notes)
        lines.extend(f"       warning: {w}" for w in warnings_of(r))
        if verbose and r.patch:
            lines.extend("       " + json.dumps(op, sort_keys=True) for op in r.patch)
    lines.append(summary_line(results))
    return "\n".join(lines)


def summary_line(results: Sequence[Result]) -> str:
    s = summary(results)
    errors = f", {_plural(s['errors'], 'input error')}" if s["errors"] else ""
    return f"{s['allowed']} allowed, {s['denied']} denied{errors}, {s['skipped']} skipped"


def warnings_of(r: Result) -> list[str]:
    """Each warning with the workload it concerns, and for a workload of several pods the pods that drew it:
    "Deployment ml/web (pods 2-3 of 3): ..."."""
    out = []
    for warning in r.warnings:
        who = target(r)
        pods = r.warning_pods.get(warning)
        if r.replicas > 1 and pods and len(pods) < r.replicas:
            who += f" ({_pods_text(pods, r.replicas)})"
        out.append(f"{who}: {warning}")
    return out


def _pods_text(pods: Sequence[int], total: int) -> str:
    """1-based pod numbers -> "pod 2 of 3", "pods 2-3 of 3", "pods 1, 3 of 4"."""
    if len(pods) == 1:
        return f"pod {pods[0]} of {total}"
    if list(pods) == list(range(pods[0], pods[-1] + 1)):
        return f"pods {pods[0]}-{pods[-1]} of {total}"
    return f"pods {', '.join(map(str, pods))} of {total}"


def report_data(results: Sequence[Result]) -> dict[str, Any]:
    """The results and their summary, as -o json and -o yaml write them."""
    return {"results": [r.to_json() for r in results], "summary": summary(results)}


def render_json(results: Sequence[Result]) -> str:
    return json.dumps(report_data(results), indent=2)


def render_yaml(results: Sequence[Result]) -> str:
    import yaml

    return str(yaml.safe_dump(report_data(results), sort_keys=False, default_flow_style=False)).rstrip("\n")


TABLE_COLUMNS = (
    "RESULT",
    "KIND",
    "NAMESPACE",
    "NAME",
    "PODS",
    "NODE",
    "GPUS",
    "MEMORY",
    "CORES",
    "REASON",
    "WARNINGS",
    "SOURCE",
)


def table_row(r: Result) -> tuple[str, ...]:
    """One result as -o table shows it: "<none>" where a column does not apply, as kubectl writes it."""
    from webhook.workloads import display_kind

    none = "<none>"
    verdict, _ = verdict_of(r)
    alloc = r.allocation if r.allowed and r.managed else None
    alloc = alloc or {}
    node = ",".join(sorted(set(r.nodes))) if r.nodes else str(alloc.get("node") or none)
    count = alloc.get("gpuCount")
    gpus = (f"{count}x{alloc['mig']}" if alloc.get("mig") else str(count)) if isinstance(count, int) else none
    memory = _memory(alloc.get("memoryMiB")).replace("memory unknown", "unknown").replace(" ", "") if alloc else none
    cores = f"{alloc['cores']}%" if isinstance(alloc.get("cores"), int) and not alloc.get("mig") else none
    kind = (display_kind(r.group, r.kind) if r.group else r.kind) or none
    name = (r.name or none) + (f":{r.role}" if r.role else "")
    reason = "not-managed" if not r.managed and not r.error and not r.skipped else r.reason or none
    return (
        verdict,
        kind.replace(" ", ""),
        r.namespace or none,
        name,
        str(r.replicas),
        node,
        gpus,
        memory,
        cores,
        reason,
        str(len(r.warnings)),
        r.source,
    )


def render_table(results: Sequence[Result]) -> str:
    """Columns as `kubectl get` prints them, then the summary line; the messages are in -o text."""
    rows = [TABLE_COLUMNS, *(table_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([*lines, summary_line(results)])


def render_junit(results: Sequence[Result]) -> str:
    s = summary(results)
    suite = ElementTree.Element(
        "testsuite",
        name="gpu-admission check",
        tests=str(len(results)),
        failures=str(s["denied"]),
        skipped=str(s["skipped"]),
        errors=str(s["errors"]),
    )
    for r in results:
        case = ElementTree.SubElement(
            suite, "testcase", classname=r.source, name=target(r) if r.kind or not r.error else r.source
        )
        if r.error:
            error = ElementTree.SubElement(case, "error", message=r.message, type="input-error")
            error.text = (f"field {r.error_field}: " if r.error_field else "") + r.message
        elif r.skipped:
            ElementTree.SubElement(case, "skipped", message=r.message)
        elif not r.allowed:
            failure = ElementTree.SubElement(case, "failure", message=r.message, type=r.reason)
            failure.text = f"code {r.code}: {r.message}"
        out = [*(f"note: {n}" for n in r.notes), *r.warnings]
        if out:
            ElementTree.SubElement(case, "system-out").text = "\n".join(out)
    ElementTree.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suite, encoding="unicode")
