"""A decision record replayed or edited on a running pod.

The record is written at CREATE. A pod's owner may update its annotations, so a copy of another pod's
sealed record (same namespace and GPU shape) on a running pod would move its usage to other GPUs of the
node, and the GPU it really uses would look free. Closed twice: the validating webhook refuses any UPDATE
that adds, changes or removes the record, and accounting trusts no GPU index that two pods present.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import celpy
import helm_tool
import jsonpatch
import pytest
from server_support import cluster_objects

from webhook.cluster.translate import build_snapshot
from webhook.core import admit
from webhook.core.policy import Policy
from webhook.core.record import ANNOTATION
from webhook.core.trust import record_update
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
from webhook.server.policyholder import PolicyHolder
from webhook.server.source import StaticSource

RECORDS_HOOK = "validate-pod-records.gpu-admission.io"
WHOLE = {"nvidia.com/gpu": "1"}


def running(name: str, record: str | None = None, node: str = "gpu-a") -> dict[str, Any]:
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "labels": {}},
                           "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda"}]},
                           "status": {"phase": "Running"}}
    if record is not None:
        pod["metadata"]["annotations"] = {ANNOTATION: record}
    return pod


def update_review(old: dict[str, Any], new: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-update", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "name": new["metadata"]["name"], "operation": "UPDATE", "userInfo": {"username": "alice"},
        "object": new, "oldObject": old}}


def answer(endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    config = ServerConfig(source=StaticSource(build_snapshot(cluster_objects())), namespace="gpu-admission",
                          core=real_core(), policy=PolicyHolder(None, loader=lambda _path: Policy()))
    response = create_app(config).test_client().post(endpoint, data=json.dumps(review),
                                                     content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


# --------------------------------------------------------------------------- (a) UPDATEs of the record


def test_the_core_refuses_adding_changing_or_removing_the_record() -> None:
    a, b = '{"gpus":[0]}', '{"gpus":[3]}'
    assert record_update(running("p", a), running("p", a)).allowed
    assert record_update(running("p"), running("p")).allowed
    for old, new, verb in ((None, a, "adds"), (a, b, "changes"), (a, None, "removes")):
        decision = record_update(running("p", new), running("p", old))
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "record-changed")
        assert verb in decision.message and ANNOTATION in decision.message


def test_the_validating_webhook_refuses_a_copied_record_on_a_running_pod() -> None:
    victim, copied = admitted_pair()
    thief = copy.deepcopy(victim)
    thief["metadata"]["annotations"][ANNOTATION] = copied["metadata"]["annotations"][ANNOTATION]
    refused = answer("/validate", update_review(victim, thief))
    assert (refused["allowed"], refused["status"]["code"], refused["status"]["reason"]) == (False, 403,
                                                                                          "record-changed")
    assert "changes" in refused["status"]["message"]
    # Removing it is refused too; an update that leaves it alone (a label) passes the fast path.
    stripped = copy.deepcopy(victim)
    del stripped["metadata"]["annotations"][ANNOTATION]
    assert answer("/validate", update_review(victim, stripped))["allowed"] is False
    labelled = copy.deepcopy(victim)
    labelled["metadata"]["labels"]["team"] = "x"
    assert answer("/validate", update_review(victim, labelled)) == {"uid": "u-update", "allowed": True}
    # The mutating webhook has nothing to say about updates; the webhook's own namespace is never judged.
    assert answer("/mutate", update_review(victim, thief)) == {"uid": "u-update", "allowed": True}
    assert answer("/validate", update_review(victim, thief, namespace="gpu-admission"))["allowed"] is True


@pytest.fixture(scope="module")
def chart_docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    return {"1.34": helm.template(kube_version="1.34.0"), "1.29": helm.template(kube_version="1.29.0")}


def hooks_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for d in docs if d["kind"] == "ValidatingWebhookConfiguration" for w in d["webhooks"]}


def test_the_chart_registers_pod_updates_that_touch_the_record(chart_docs: dict[str, list[dict[str, Any]]]) -> None:
    hooks = hooks_of(chart_docs["1.34"])
    hook = hooks[RECORDS_HOOK]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["namespaceSelector"] == hooks["validate-pods.gpu-admission.io"]["namespaceSelector"]
    assert hook["failurePolicy"] == "Fail"
    # Without matchConditions every pod UPDATE would come: fail open then, not block label edits.
    old = hooks_of(chart_docs["1.29"])[RECORDS_HOOK]
    assert "matchConditions" not in old and old["failurePolicy"] == "Ignore"


def test_only_updates_that_touch_the_record_are_sent(chart_docs: dict[str, list[dict[str, Any]]]) -> None:
    (condition,) = hooks_of(chart_docs["1.34"])[RECORDS_HOOK]["matchConditions"]
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))

    def sent(old: dict[str, Any], new: dict[str, Any]) -> bool:
        return bool(program.evaluate({"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}))

    a, b = '{"gpus":[0]}', '{"gpus":[3]}'
    other = running("p")
    other["metadata"]["annotations"] = {"note": "x"}
    assert not sent(running("p"), running("p"))
    assert not sent(running("p", a), running("p", a))
    assert not sent(running("p"), other) and not sent(other, running("p"))
    assert sent(running("p"), running("p", a)) and sent(other, running("p", a))
    assert sent(running("p", a), running("p", b))
    assert sent(running("p", a), running("p")) and sent(running("p", a), other)


def admitted_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Two pods of one shape (a whole GPU each) admitted onto gpu-a, one after the other, each as stored
    after both webhooks: they hold different GPUs."""
    pods: list[dict[str, Any]] = []
    for name in ("victim", "donor"):
        snap = build_snapshot([*cluster_objects(), *pods])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a", "labels": {}},
               "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": dict(WHOLE)}}]}}
        decision = admit.mutate(pod, snap, Policy())
        assert decision.allowed, decision.message
        final = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
        final["metadata"]["uid"] = f"uid-{name}"
        assert decision.allocation is not None and decision.allocation.node == "gpu-a"
        final["spec"]["nodeName"] = "gpu-a"
        final["status"] = {"phase": "Running"}
        pods.append(final)
    records = [json.loads(p["metadata"]["annotations"][ANNOTATION]) for p in pods]
    assert records[0]["gpus"] != records[1]["gpus"]
    return pods[0], pods[1]
