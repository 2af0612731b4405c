"""Kinds check does not know: pod templates found by walking the object, so a custom resource that
embeds a pod template (`template: {spec: {containers: [...]}}`) or a pod spec (`containers: [{image}]`)
is still decided, never passed unseen. Its pod count is a guess (a sibling `replicas`, else 1), noted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .model import Builder

_MAX_DEPTH = 24


def _is_pod_spec(value: Any) -> bool:
    containers = value.get("containers") if isinstance(value, Mapping) else None
    return (isinstance(containers, list) and bool(containers)
            and all(isinstance(c, Mapping) and "image" in c for c in containers))


def find(node: Any, path: str = "", depth: int = 0,
         seen: set[int] | None = None) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(path, {metadata, spec} template, the mapping holding it) for each pod template or pod spec.

    Each object is visited once: YAML aliases can make a value appear many times, or contain itself."""
    seen = set() if seen is None else seen
    if depth > _MAX_DEPTH or id(node) in seen:
        return
    if isinstance(node, (Mapping, list)):
        seen.add(id(node))
    if isinstance(node, Mapping):
        template = node.get("template")
        if isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping) and isinstance(
            template["spec"].get("containers"), list
        ):
            yield f"{path}.template".lstrip("."), template, node
            others = {k: v for k, v in node.items() if k != "template"}
        elif _is_pod_spec(node) and path:
            yield path.lstrip("."), {"spec": node}, node
            return
        else:
            others = dict(node)
        for key, value in others.items():
            if depth == 0 and key in ("metadata", "status"):
                continue
            yield from find(value, f"{path}.{key}", depth + 1, seen)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from find(value, f"{path}[{index}]", depth + 1, seen)


def walk(b: Builder) -> bool:
    """Add every pod template found in the document; whether any was."""
    for path, template, holder in find(b.doc.data):
        replicas = holder.get("replicas")
        if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0:
            note = f"found by walking: {b.kind} is not a kind check knows; count from its replicas ({replicas})"
        else:
            replicas = 1
            note = f"found by walking: {b.kind} is not a kind check knows; decided as 1 pod"
        b.template(template, path, replicas, path, notes=(note,), walked=True)
    return bool(b.found)
