"""Reading the policy file from disk, with custom scorers from the `gpu_admission.scorers` entry points."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import yaml

from webhook.core.policy.model import Policy, PolicyError, parse_policy
from webhook.errors import UserError

SCORER_GROUP = "gpu_admission.scorers"


def discover_scorers() -> dict[str, Callable[..., float]]:
    """Scorers installed by other packages: `[project.entry-points."gpu_admission.scorers"] name = "mod:func"`."""
    scorers: dict[str, Callable[..., float]] = {}
    for ep in entry_points(group=SCORER_GROUP):
        try:
            scorers[ep.name] = ep.load()
        except Exception as err:  # a broken plugin must name itself, not crash the server
            raise UserError(f"entry point {SCORER_GROUP}:{ep.name} ({ep.value}) failed to load: {err}") from None
    return scorers


def load_policy(path: str | Path | None, scorers: dict[str, Callable[..., float]] | None = None) -> Policy:
    """The policy in `path` (None: the defaults). UserError names the file and the field."""
    if scorers is None:
        scorers = discover_scorers()
    if path is None:
        return parse_policy({}, scorers)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"{path}: cannot read policy file: {err.strerror or err}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UserError(f"{path}: document 0: invalid YAML{where}: {getattr(err, 'problem', err)}") from None
    if len(docs) > 1:
        raise UserError(f"{path}: expected one YAML document, found {len(docs)}")
    try:
        return parse_policy(docs[0] if docs else {}, scorers)
    except PolicyError as err:
        raise UserError(f"{path}: document 0: field {err}") from None
