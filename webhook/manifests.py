"""Manifests on disk -> Kubernetes objects -> pod templates with replica counts.

Reads what people keep in git: multi-document YAML, JSON, `kind: List`, directories of them, stdin.
Every error names the file, the document (0-based, as in the results' "FILE:DOC_INDEX") and the field.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from .errors import UserError, where

EXTENSIONS = (".yaml", ".yml", ".json")
STDIN = "-"

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe YAML without the timestamp type: objects stay JSON-compatible, as the API server sends them."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


class _PyLoader(yaml.SafeLoader):
    yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


@dataclass(frozen=True)
class Document:
    """One object from a file. `item` is its position inside a `kind: List`, else None."""

    file: str
    index: int
    data: Mapping[str, Any]
    item: int | None = None

    @property
    def source(self) -> str:
        base = f"{self.file}:{self.index}"
        return base if self.item is None else f"{base}.items[{self.item}]"

    def field(self, path: str) -> str:
        """A field path as users see it in this document (list items are prefixed with items[i])."""
        return path if self.item is None else f"items[{self.item}].{path}" if path else f"items[{self.item}]"

    def error(self, path: str, message: str) -> UserError:
        return UserError(f"{where(self.file, self.index, self.field(path) or None)}: {message}")


@dataclass(frozen=True)
class Workload:
    """The pod a workload runs, ready for admission, and how many of it run at once."""

    source: str
    kind: str
    name: str
    namespace: str | None  # None: not set in the manifest (the caller's default applies)
    pod: Mapping[str, Any]
    replicas: int
    per_node: bool = False  # DaemonSet: one pod on every eligible node; `replicas` is 1
    template_path: str = ""  # JSON pointer of the pod template inside the workload ("" for a Pod)


@dataclass(frozen=True)
class Skipped:
    """A document that holds no pod (Service, ConfigMap, ...), listed so the report accounts for it."""

    source: str
    kind: str
    name: str
    namespace: str | None
    reason: str


def _kind_of(value: object) -> str:
    """A YAML reader's name for a value's type."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def expand_paths(paths: Iterable[str]) -> Iterator[str]:
    """Files as given; directories walked recursively (sorted) for *.yaml, *.yml, *.json."""
    for path in paths:
        if path != STDIN and os.path.isdir(path):
            found: list[str] = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, f) for f in files if f.endswith(EXTENSIONS))
            yield from sorted(found)
        else:
            yield path


def _read(path: str, stdin: TextIO | None) -> str:
    if path == STDIN:
        return (stdin or sys.stdin).read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file or directory") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror or err}") from None


def _yaml_error(text: str, name: str) -> UserError:
    """Re-read with the pure-Python parser so the message is the same with or without libyaml."""
    done = 0
    try:
        for _ in yaml.load_all(text, Loader=_PyLoader):
            done += 1
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f": line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        return UserError(f"{where(name, done)}{line}: invalid YAML: {problem}")
    return UserError(f"{name}: invalid YAML")


def parse_text(text: str, name: str) -> list[Document]:
    """All objects of one file's text; empty documents keep their index but yield nothing."""
    raw: list[tuple[int, Any]] = []
    if name.endswith(".json"):
        try:
            raw.append((0, json.loads(text)))
        except json.JSONDecodeError as err:
            raise UserError(f"{name}: line {err.lineno}: invalid JSON: {err.msg}") from None
    else:
        try:
            raw.extend(enumerate(yaml.load_all(text, Loader=_Loader)))
        except yaml.YAMLError:
            raise _yaml_error(text, name) from None
    documents: list[Document] = []
    for index, data in raw:
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise UserError(f"{where(name, index)}: expected a Kubernetes object (a mapping), got {_kind_of(data)}")
        if data.get("kind") == "List" or (
            isinstance(data.get("kind"), str)
            and str(data["kind"]).endswith("List")
            and isinstance(data.get("items"), list)
        ):
            items = data.get("items")
            if items is None:
                continue
            if not isinstance(items, list):
                raise UserError(f"{where(name, index, 'items')}: expected a list of objects")
            for position, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise UserError(f"{where(name, index, f'items[{position}]')}: expected an object (a mapping)")
                documents.append(Document(name, index, item, position))
        else:
            documents.append(Document(name, index, data))
    return documents


def load_documents(paths: Sequence[str], stdin: TextIO | None = None) -> list[Document]:
    """Every object in the given files, directories (recursive) or "-" (stdin), in order."""
    documents: list[Document] = []
    for path in expand_paths(paths):
        name = "<stdin>" if path == STDIN else path
        documents.extend(parse_text(_read(path, stdin), name))
    return documents


def _count(doc: Document, spec: Mapping[str, Any], key: str, prefix: str, default: int = 1) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise doc.error(f"{prefix}{key}", f"expected a whole number >= 0, got {value!r}")
    return value


def _mapping(doc: Document, value: Any, path: str, required: bool = True) -> Mapping[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        what = "missing" if value is None else f"expected a mapping, got {_kind_of(value)}"
        raise doc.error(path, what)
    return value


# kind -> (path of the pod template as keys, how replicas are counted)
_TEMPLATES: Mapping[str, tuple[tuple[str, ...], str]] = {
    "Pod": ((), "one"),
    "Deployment": (("spec", "template"), "replicas"),
    "StatefulSet": (("spec", "template"), "replicas"),
    "ReplicaSet": (("spec", "template"), "replicas"),
    "ReplicationController": (("spec", "template"), "replicas"),
    "DaemonSet": (("spec", "template"), "per-node"),
    "Job": (("spec", "template"), "job"),
    "CronJob": (("spec", "jobTemplate", "spec", "template"), "job"),
}


def _job_pods(doc: Document, job_spec: Mapping[str, Any], prefix: str) -> int:
    """Pods a Job runs at once: parallelism (default 1), never more than completions."""
    parallel = _count(doc, job_spec, "parallelism", prefix)
    if job_spec.get("completions") is not None:
        return min(parallel, _count(doc, job_spec, "completions", prefix))
    return parallel


def pod_templates(doc: Document) -> Workload | Skipped:
    """The pod a document runs (metadata merged from the workload), or why it runs none."""
    data = doc.data
    kind = str(data.get("kind")) if isinstance(data.get("kind"), str) else ""
    metadata = _mapping(doc, data.get("metadata"), "metadata", required=False)
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    if kind not in _TEMPLATES:
        return Skipped(doc.source, str(kind), name, namespace, f"{kind or 'an object without kind'} runs no pods")
    path, counting = _TEMPLATES[kind]
    node: Any = data
    walked: list[str] = []
    for key in path:
        walked.append(key)
        node = _mapping(doc, node.get(key) if isinstance(node, Mapping) else None, ".".join(walked))
    template = node
    _mapping(doc, template.get("spec"), ".".join([*path, "spec"]))
    pod = {k: copy.deepcopy(v) for k, v in template.items() if k in ("metadata", "spec")}
    pod_meta = dict(_mapping(doc, pod.get("metadata"), ".".join([*path, "metadata"]), required=False))
    if path:
        pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        if not pod_meta.get("name") and not pod_meta.get("generateName"):
            if metadata.get("name"):
                pod_meta["name"] = metadata["name"]
            elif metadata.get("generateName"):
                pod_meta["generateName"] = metadata["generateName"]
    else:
        pod = copy.deepcopy(dict(data))
    if namespace and not pod_meta.get("namespace"):
        pod_meta["namespace"] = namespace
    pod["metadata"] = pod_meta
    if counting == "replicas":
        replicas = _count(doc, _map(data.get("spec")), "replicas", "spec.")
    elif counting == "job":
        job_path = path[:-1]
        job_spec: Any = data
        for key in job_path:
            job_spec = job_spec[key]
        replicas = _job_pods(doc, job_spec, ".".join(job_path) + ".")
    else:
        replicas = 1
    pointer = "".join(f"/{key}" for key in path)
    return Workload(doc.source, kind, name, namespace, pod, replicas, counting == "per-node", pointer)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def workloads(documents: Iterable[Document]) -> list[Workload | Skipped]:
    return [pod_templates(doc) for doc in documents]
