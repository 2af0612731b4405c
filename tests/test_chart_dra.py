"""The chart's webhook for DRA claims: its matchConditions expression, evaluated with a CEL interpreter."""

from __future__ import annotations

from typing import Any

import celpy
import helm_tool
import pytest


@pytest.fixture(scope="module")
def sends(tmp_path_factory: pytest.TempPathFactory) -> Any:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    docs = helm.template(kube_version="1.34.0")
    hooks = [w for d in docs if d["kind"] == "ValidatingWebhookConfiguration" for w in d["webhooks"]
             if w["name"] == "validate-resourceclaims.gpu-admission.io"]
    assert len(hooks) == 1
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in hooks[0]["matchConditions"]]

    def evaluate(operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
        activation = {"request": celpy.json_to_cel({"operation": operation}), "object": celpy.json_to_cel(obj),
                      "oldObject": celpy.json_to_cel(old)}
        return all(bool(p.evaluate(activation)) for p in programs)

    return evaluate


CLAIM = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "g", "exactly": {
    "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}


def test_creates_and_spec_changes_are_sent_metadata_updates_are_not(sends: Any) -> None:
    assert sends("CREATE", CLAIM, None)
    finalised = {**CLAIM, "metadata": {"name": "c", "finalizers": ["resource.kubernetes.io/delete-protection"]}}
    assert not sends("UPDATE", finalised, CLAIM)
    changed = {**CLAIM, "spec": {"devices": {"requests": []}}}
    assert sends("UPDATE", changed, CLAIM)
