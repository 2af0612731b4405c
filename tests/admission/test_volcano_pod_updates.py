"""Volcano's annotations that choose a pod's GPUs, fixed once the pod is admitted.

Volcano's vGPU plugin keeps the devices whose mode `volcano.sh/vgpu-mode` names (`mig` or `hami-core`),
as HAMi does with `nvidia.com/vgpu-mode`, and reads HAMi's `nvidia.com/use-gputype` lists: an UPDATE that
changes one of them is refused, and the chart's record webhook is sent such updates.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import helm_tool
import pytest
from builders import pod
from isolation_support import SNAP, chain, cpu_pod

from webhook.core.admission.updates import pod_update
from webhook.core.policy.model import Policy

VOLCANO = ("volcano.sh/vgpu-mode", "nvidia.com/vgpu-mode")


def annotated(p: dict[str, Any], **annotations: str) -> dict[str, Any]:
    changed = copy.deepcopy(p)
    changed["metadata"].setdefault("annotations", {}).update(annotations)
    return changed


@pytest.mark.parametrize("name", VOLCANO)
def test_changing_the_vgpu_mode_after_admission_is_refused(name: str) -> None:
    for old in (cpu_pod(), chain(pod({"nvidia.com/gpu": 1}))[1], annotated(cpu_pod(), **{name: "hami-core"})):
        decision = pod_update(annotated(old, **{name: "mig"}), old, SNAP, Policy())
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "gpu-request-changed")
        assert name in decision.message


def test_what_volcano_writes_when_it_binds_is_left_alone() -> None:
    old = chain(pod({"nvidia.com/gpu": 1}))[1]
    new = annotated(old, **{"volcano.sh/gpu-index": "0", "volcano.sh/predicate-time": "1"})
    assert pod_update(new, old, SNAP, Policy()).allowed


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> Any:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    hooks = [w for d in helm.template(kube_version="1.34.0") if d["kind"] == "ValidatingWebhookConfiguration"
             for w in d["webhooks"] if w["name"] == "validate-pod-records.gpu-admission.io"]
    (condition,) = hooks[0]["matchConditions"]
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))

    def evaluate(old: dict[str, Any], new: dict[str, Any]) -> bool:
        return bool(program.evaluate({"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}))

    return evaluate


@pytest.mark.parametrize("name", VOLCANO)
def test_the_record_webhook_is_sent_vgpu_mode_changes(sent: Any, name: str) -> None:
    old = cpu_pod()
    assert sent(old, annotated(old, **{name: "mig"}))
    assert sent(annotated(old, **{name: "hami-core"}), annotated(old, **{name: "mig"}))
    assert sent(annotated(old, **{name: "mig"}), old)
    assert not sent(annotated(old, **{name: "mig"}), annotated(old, **{name: "mig"}))
    assert not sent(old, annotated(old, **{"volcano.sh/gpu-index": "0"}))
