"""`gpu-admission check` reports: text, JSON and JUnit, and the exit code, from the decided results.

Input errors (a file or document that could not be read or decided) are results of their own in every
format, next to the decisions of the other documents."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING
from xml.etree import ElementTree

if TYPE_CHECKING:
    from .check import Result

EXIT_ALLOWED, EXIT_DENIED, EXIT_INPUT = 0, 1, 2


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
