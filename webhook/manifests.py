"""Manifests on disk -> Kubernetes objects (the pod templates in them: webhook.workloads).

Reads what people keep in git: multi-document YAML, JSON, `kind: List`, directories of them, stdin.
Every error names the file, the document (0-based, as in the results' "FILE:DOC_INDEX") and the field.
Read leniently (`problems=`), a broken file or document becomes a Problem of its own and the rest is
still read, so one bad document never hides the others from `check`.
"""

from __future__ import annotations

import json
import os
import re
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

    def error(self, path: str, message: str) -> DocumentError:
        field = self.field(path)
        return DocumentError(f"{where(self.file, self.index, field or None)}: {message}", self.source, field, message)


class DocumentError(UserError):
    """A UserError about one document, keeping its parts apart for the report's error results."""

    def __init__(self, text: str, source: str, field: str, detail: str) -> None:
        super().__init__(text)
        self.source, self.field, self.detail = source, field, detail


@dataclass(frozen=True)
class Problem:
    """A file or document that could not be read or decided: a result of its own in every report."""

    source: str  # FILE or FILE:DOC_INDEX
    field: str  # "" when the whole file or document is at fault
    message: str  # without the source and field
    text: str  # the full one-line message: "FILE: document N: field F: message"
    kind: str = ""
    name: str = ""
    namespace: str | None = None
    index: int = -1  # the document's position in its file; -1: the whole file


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
        line = f": line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        return UserError(f"{where(name, done)}{line}: invalid YAML: {problem}")
    return UserError(f"{name}: invalid YAML")


_SEPARATOR = re.compile(r"^---(?=[ \t]|$)", re.MULTILINE)


def _chunks(text: str) -> list[tuple[int, int, str]]:
    """(document index, first line, text) of each document, split at `---` lines: the fallback when the
    stream as a whole does not parse, so the documents around a broken one are still read."""
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    pieces = [(0, text[: starts[0]] if starts else text)] + [
        (start, text[start:end]) for start, end in zip(starts, [*starts[1:], len(text)][: len(starts)], strict=True)
    ]
    chunks: list[tuple[int, int, str]] = []
    index = 0
    for position, (offset, piece) in enumerate(pieces):
        if (
            position == 0
            and starts
            and not any(line.strip() and not line.lstrip().startswith(("#", "%")) for line in piece.splitlines())
        ):
            continue  # comments before the first `---` are no document
        chunks.append((index, text.count("\n", 0, offset), piece))
        index += 1
    return chunks


def _parse_yaml_leniently(text: str, name: str, problems: list[Problem]) -> list[tuple[int, Any]]:
    raw: list[tuple[int, Any]] = []
    for index, first_line, chunk in _chunks(text):
        try:
            loaded = list(yaml.load_all(chunk, Loader=_Loader))
        except yaml.YAMLError:
            try:
                list(yaml.load_all(chunk, Loader=_PyLoader))
                problem, line = "invalid YAML", ""
            except yaml.YAMLError as err:
                mark = getattr(err, "problem_mark", None)
                line = f"line {first_line + mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
                problem = f"invalid YAML: {getattr(err, 'problem', None) or str(err).splitlines()[0]}"
            message = line + problem
            problems.append(Problem(f"{name}:{index}", "", message, f"{where(name, index)}: {message}", index=index))
            continue
        raw.append((index, loaded[0] if loaded else None))
    return raw


def parse_text(text: str, name: str, problems: list[Problem] | None = None) -> list[Document]:
    """All objects of one file's text; empty documents keep their index but yield nothing.

    Without `problems` the first error is raised; with it, each broken document is added there as a
    Problem and the others are still returned."""
    raw: list[tuple[int, Any]] = []
    if name.endswith(".json"):
        try:
            raw.append((0, json.loads(text)))
        except json.JSONDecodeError as err:
            message = f"line {err.lineno}, column {err.colno}: invalid JSON: {err.msg}"
            error = UserError(f"{name}: {message}")
            if problems is None:
                raise error from None
            problems.append(Problem(name, "", message, str(error)))
            return []
    else:
        try:
            raw.extend(enumerate(yaml.load_all(text, Loader=_Loader)))
        except yaml.YAMLError:
            if problems is None:
                raise _yaml_error(text, name) from None
            raw = _parse_yaml_leniently(text, name, problems)
    documents: list[Document] = []
    for index, data in raw:
        try:
            documents.extend(_objects(name, index, data))
        except DocumentError as err:
            if problems is None:
                raise
            problems.append(Problem(err.source, err.field, err.detail, str(err), index=index))
    return documents


def _objects(name: str, index: int, data: Any) -> list[Document]:
    """The objects of one document: itself, or the items of a `kind: List`."""
    documents: list[Document] = []
    if data is None:
        return documents
    at = Document(name, index, {})
    if not isinstance(data, Mapping):
        raise at.error("", f"expected a Kubernetes object (a mapping), got {_kind_of(data)}")
    if data.get("kind") == "List" or (
        isinstance(data.get("kind"), str) and str(data["kind"]).endswith("List") and isinstance(data.get("items"), list)
    ):
        items = data.get("items")
        if items is None:
            return documents
        if not isinstance(items, list):
            raise at.error("items", "expected a list of objects")
        for position, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise at.error(f"items[{position}]", "expected an object (a mapping)")
            documents.append(Document(name, index, item, position))
    else:
        documents.append(Document(name, index, data))
    return documents


def load_documents(
    paths: Sequence[str], stdin: TextIO | None = None, problems: list[Problem] | None = None
) -> list[Document]:
    """Every object in the given files, directories (recursive) or "-" (stdin), in order.

    With `problems`, unreadable files and broken documents are collected there instead of raised."""
    documents: list[Document] = []
    for path in expand_paths(paths):
        name = "<stdin>" if path == STDIN else path
        try:
            text = _read(path, stdin)
        except UserError as err:
            if problems is None:
                raise
            problems.append(Problem(name, "", str(err).removeprefix(f"{name}: "), str(err)))
            continue
        documents.extend(parse_text(text, name, problems))
    return documents


def read_all(paths: Sequence[str], stdin: TextIO | None = None) -> list[Document | Problem]:
    """Documents and problems in input order."""
    out: list[Document | Problem] = []
    for path in expand_paths(paths):
        problems: list[Problem] = []
        found: list[Document | Problem] = [*load_documents([path], stdin, problems), *problems]
        out.extend(sorted(found, key=lambda entry: entry.index))  # stable: a List's items keep their order
    return out
