"""`gpu-admission check` reports: text, JSON and JUnit, and the exit code, from the decided results.

Input errors (a file or document that could not be read or decided) are results of their own in every
format, next to the decisions of the other documents."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree

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

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "kind": self.kind, "name": self.name, "namespace": self.namespace,
            "group": self.group, "role": self.role, "managed": self.managed, "allowed": self.allowed, "code": self.code,
            "message": self.message, "reason": self.reason, "replicas": self.replicas, "warnings": self.warnings,
            "notes": self.notes, "foundBy": "walking" if self.walked else "kind", "patch": self.patch,
            "allocation": self.allocation, "skipped": self.skipped, "error": self.error, "field": self.error_field,
            "pods": self.pods,
        }


def exit_code(results: Sequence[Result]) -> int:
    """2 if any input error (a GPU workload that could not be decided is one), else 1 if any denial, else 0."""
    if any(r.error for r in results):
        return EXIT_INPUT
    return EXIT_DENIED if any(not r.allowed for r in results) else EXIT_ALLOWED


def summary(results: Sequence[Result]) -> dict[str, int]:
    return {
        "allowed": sum(1 for r in results if r.allowed and not r.skipped),
        "denied": sum(1 for r in results if not r.allowed and not r.error),
        "skipped": sum(1 for r in results if r.skipped),
        "errors": sum(1 for r in results if r.error),
    }


def target(r: Result) -> str:
    """"PyTorchJob ml/train: Worker x4", "Pod team-a/p", "Namespace ml" (cluster-scoped)."""
    from webhook.workloads import display_kind

    name = r.name or "(unnamed)"
    kind = display_kind(r.group, r.kind) if r.group else r.kind
    text = f"{kind or '(no kind)'} " + (f"{r.namespace}/{name}" if r.namespace else name)
    if r.role:
        text += f": {r.role}"
    if r.replicas > 1:
        text += f" x{r.replicas}"
    return text


def render_text(results: Sequence[Result], verbose: bool) -> str:
    lines = []
    for r in results:
        if r.error:
            where = f"field {r.error_field}: " if r.error_field else ""
            head = f"{target(r)}: " if r.kind else ""
            lines.append(f"ERROR  {head}{where}{r.message}  [{r.source}]")
            continue
        if r.skipped:
            lines.append(f"SKIP   {target(r)}: {r.message}  [{r.source}]")
            continue
        if not r.managed:
            verdict, detail = "ALLOW", f"namespace {r.namespace} is not managed: unchanged"
        elif r.reason == "not-gpu-pod":
            verdict, detail = "ALLOW", "asks for no GPU: unchanged"
        elif r.allowed and r.group == "resource.k8s.io":  # a claim: its GPUs count when a pod uses it
            verdict, detail = "ALLOW", r.message or "asks for no GPU"
        elif r.allowed:
            alloc = r.allocation or {}
            where = f"node {alloc['node']}" if alloc.get("node") else "waits for a free node"
            gpus = f"{alloc.get('gpuCount', 0)} GPU" + ("s" if alloc.get("gpuCount", 0) != 1 else "")
            detail = f"{where}, {gpus} x {alloc.get('memoryMiB')} MiB/{alloc.get('cores')}%, {alloc.get('topology')}"
            if alloc.get("mig"):  # MIG devices: the scheduler picks among the nodes offering the profile
                detail = (f"on a node offering nvidia.com/mig-{alloc['mig']}, {alloc.get('gpuCount', 0)} MIG "
                          f"device(s) x {alloc.get('memoryMiB')} MiB")
            if r.replicas > 1:
                detail = f"{r.message}; {gpus} x {alloc.get('memoryMiB')} MiB/{alloc.get('cores')}% each"
            verdict = "ALLOW"
        else:
            verdict, detail = "DENY", f"{r.code} {r.reason}: {r.message}"
        lines.append(f"{verdict:<6} {target(r)}: {detail}  [{r.source}]")
        lines.extend(f"       note: {n}" for n in r.notes)
        lines.extend(f"       warning: {w}" for w in r.warnings)
        if verbose and r.patch:
            lines.extend("       " + json.dumps(op, sort_keys=True) for op in r.patch)
    s = summary(results)
    errors = f", {s['errors']} input error" + ("s" if s["errors"] != 1 else "") if s["errors"] else ""
    lines.append(f"{s['allowed']} allowed, {s['denied']} denied{errors}, {s['skipped']} skipped")
    return "\n".join(lines)


def render_json(results: Sequence[Result]) -> str:
    return json.dumps({"results": [r.to_json() for r in results], "summary": summary(results)}, indent=2)


def render_junit(results: Sequence[Result]) -> str:
    s = summary(results)
    suite = ElementTree.Element("testsuite", name="gpu-admission check", tests=str(len(results)),
                                failures=str(s["denied"]), skipped=str(s["skipped"]), errors=str(s["errors"]))
    for r in results:
        case = ElementTree.SubElement(suite, "testcase", classname=r.source,
                                      name=target(r) if r.kind or not r.error else r.source)
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
