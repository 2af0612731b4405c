"""The chart's schema for `policy` is the server's own field list (core/policy/model.py POLICY_FIELDS), so
a misspelled field fails `helm install` instead of crash-looping the pods. Regenerate the schema after
adding a field: `PYTHONPATH=tests python tests/chart/test_chart_policy_schema.py`."""

from __future__ import annotations

import json
import sys
from typing import Any

import helm_tool
import pytest

from webhook.core.policy.model import POLICY_FIELDS

SCHEMA = helm_tool.CHART / "values.schema.json"


def _node(path: str) -> dict[str, Any]:
    if path == "namespaces":
        return {"type": "object", "additionalProperties": _node("namespaces.*")}
    if path in POLICY_FIELDS:
        keys = POLICY_FIELDS[path]
        prefix = f"{path}." if path else ""
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {key: _node(prefix + key) for key in keys},
        }
    if f"{path}[]" in POLICY_FIELDS:
        items = {"type": "array", "items": _node(f"{path}[]")}
        return {"anyOf": [{"type": "string"}, items]} if path == "workloadMix" else items
    return {}  # a value: the server checks it (and names the field) when it loads the policy


def policy_schema() -> dict[str, Any]:
    return {**_node(""), "type": ["object", "null"]}  # null: the built-in defaults, as {} is


def test_the_charts_policy_schema_is_the_servers_field_list() -> None:
    assert json.loads(SCHEMA.read_text())["properties"]["policy"] == policy_schema()


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> helm_tool.Helm:
    return helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ({"defaults": {"placment": "binpack"}}, "/policy/defaults"),
        ({"namespaces": {"team-a": {"maxGpus": 8}}}, "/policy/namespaces/team-a"),
        ({"stale": {"after": 30}}, "/policy/stale"),
        ({"defaults": {"tolerations": [{"key": "x", "opertor": "Exists"}]}}, "/policy/defaults/tolerations/0"),
        ({"workloadMix": [{"gpu": 1, "weight": 2}]}, "/policy/workloadMix"),
        ({"limits": {}}, "/policy"),
    ],
)
def test_a_misspelled_policy_field_fails_at_render_time(
    helm: helm_tool.Helm, policy: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm_tool.HelmError) as err:
        helm.template({"policy": policy})
    assert where in str(err.value) and "additional properties" in str(err.value).lower()


def test_a_correct_policy_renders(helm: helm_tool.Helm) -> None:
    policy = {
        "defaults": {"placement": "binpack", "tolerations": [{"key": "x", "operator": "Exists"}]},
        "namespaces": {"team-a": {"maxGpusPerPod": 8, "allowedModels": ["H100"]}},
        "workloadMix": "learn",
        "stale": {"afterSeconds": 60},
    }
    docs = helm.template({"policy": policy})
    assert any(d["kind"] == "ConfigMap" and "policy.yaml" in d.get("data", {}) for d in docs)


if __name__ == "__main__":
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["policy"] = policy_schema()
    SCHEMA.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n")
    sys.exit(0)
