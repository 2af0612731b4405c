"""A decision record replayed or edited on a running pod.

The record is written at CREATE. A pod's owner may update its annotations, so a copy of another pod's
sealed record (same namespace and GPU shape) on a running pod would move its usage to other GPUs of the
node, and the GPU it really uses would look free. Closed twice: the validating webhook refuses any UPDATE
that adds, changes or removes the record, and accounting trusts no GPU index that two pods present.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import celpy
import helm_tool
import jsonpatch
import pytest
from isolation_support import answer, update_review
from server_support import cluster_objects

from webhook.cluster.cache import ClusterCache
from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.admission.trust import nonce_of, record_update
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
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


# --------------------------------------------------------------------------- (b) a nonce in every record


def mutate_review(uid: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a",
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod}}


def test_the_server_seals_a_nonce_per_admission_and_keeps_it_on_reinvocation() -> None:
    config = ServerConfig(source=StaticSource(build_snapshot(cluster_objects())), namespace="gpu-admission",
                          core=real_core(), policy=PolicyHolder(None, loader=lambda _path: Policy()))
    client = create_app(config).test_client()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": dict(WHOLE)}}]}}
    records, finals = [], []
    for uid in ("0b6c3f1e-1111-4a5b-9c8d-000000000001", "0b6c3f1e-1111-4a5b-9c8d-000000000002"):
        body = client.post("/mutate", data=json.dumps(mutate_review(uid, pod)), content_type="application/json")
        ops = json.loads(base64.b64decode(body.get_json()["response"]["patch"]))
        final = jsonpatch.apply_patch(pod, ops)
        finals.append(final)
        records.append(json.loads(final["metadata"]["annotations"][ANNOTATION]))
    assert [r["nonce"] for r in records] == ["0b6c3f1e-1111-4a5b-9c8d-000000000001",
                                             "0b6c3f1e-1111-4a5b-9c8d-000000000002"]
    # The other keys of the record are the usual ones.
    assert {k: v for k, v in records[0].items() if k != "seal"} == {
        k: v for k, v in records[1].items() if k != "seal"} | {"nonce": records[0]["nonce"]}
    # Reinvoked (another review uid): the pod keeps its record, nonce included.
    again = client.post("/mutate", data=json.dumps(mutate_review("ffff", finals[0])), content_type="application/json")
    assert "patch" not in again.get_json()["response"]
    assert nonce_of("not a uuid/" * 20) == nonce_of("not a uuid/" * 20) != "not a uuid/" * 20


def test_the_nonce_is_under_the_seal(live_snapshot: Snapshot) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": dict(WHOLE)}}]}}
    snap = live_snapshot
    decision = admit.mutate(pod, snap, Policy(), nonce="n-1")
    final = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
    assert json.loads(final["metadata"]["annotations"][ANNOTATION])["nonce"] == "n-1"
    assert admit.validate(final, snap, Policy()).allowed
    forged = copy.deepcopy(final)
    forged["metadata"]["annotations"][ANNOTATION] = final["metadata"]["annotations"][ANNOTATION].replace("n-1", "n-2")
    assert admit.validate(forged, snap, Policy()).reason == "annotation-not-sealed"


def three_on_one_node() -> list[dict[str, Any]]:
    """Three whole-GPU pods admitted one after another onto gpu-a, each with its own nonce."""
    pods: list[dict[str, Any]] = []
    for i in range(3):
        snap = build_snapshot([*cluster_objects(), *pods])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "team-a"},
               "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": dict(WHOLE)}}]}}
        decision = admit.mutate(pod, snap, Policy(), nonce=f"nonce-{i}")
        assert decision.allowed and decision.allocation is not None and decision.allocation.node == "gpu-a"
        final = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
        final["metadata"]["uid"] = f"uid-{i}"
        final["spec"]["nodeName"] = "gpu-a"
        final["status"] = {"phase": "Running"}
        pods.append(final)
    return pods


def tasks_by_gpu(pods: list[dict[str, Any]]) -> dict[int, int]:
    return {json.loads(p["metadata"]["annotations"][ANNOTATION])["gpus"][0]: 1 for p in pods}


def cache_of(objects: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache()
    for kind, plural in {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas",
                         "Pod": "pods"}.items():
        cache.replace(plural, [o for o in objects if o.get("kind") == kind])
    return cache


def test_a_replayed_record_frees_no_gpu_in_accounting() -> None:
    pods = three_on_one_node()
    real = tasks_by_gpu(pods)  # the GPU each pod really uses
    assert len(real) == 3
    thief = copy.deepcopy(pods[0])  # p0 presents p2's record (an UPDATE the webhook did not see)
    thief["metadata"]["annotations"][ANNOTATION] = pods[2]["metadata"]["annotations"][ANNOTATION]
    replayed = [thief, pods[1], pods[2]]
    trusted_gpu = json.loads(pods[1]["metadata"]["annotations"][ANNOTATION])["gpus"][0]
    cache = cache_of([*cluster_objects(), *pods])
    cache.apply("pods", "MODIFIED", thief)
    for usage in (build_snapshot([*cluster_objects(), *replayed]).usage["gpu-a"], cache.snapshot().usage["gpu-a"]):
        tasks = [g.tasks for g in usage.gpus]
        # Three pods, three GPUs: no GPU counted twice, none of the three freed, the trusted one in place.
        assert sum(tasks) == 3 and max(tasks) == 1, tasks
        assert tasks[trusted_gpu] == 1 and sum(g.exclusive for g in usage.gpus) == 3
    # Without the nonce (records sealed before it existed) the copy still moves the usage: what (a) stops.
    legacy = [copy.deepcopy(p) for p in replayed]
    for p in legacy:
        record = json.loads(p["metadata"]["annotations"][ANNOTATION])
        record.pop("nonce")
        p["metadata"]["annotations"][ANNOTATION] = json.dumps(record)
    assert max(g.tasks for g in build_snapshot([*cluster_objects(), *legacy]).usage["gpu-a"].gpus) == 2


def test_distinct_nonces_keep_their_indices() -> None:
    pods = three_on_one_node()
    usage = build_snapshot([*cluster_objects(), *pods]).usage["gpu-a"]
    assert {i for i, g in enumerate(usage.gpus) if g.tasks} == set(tasks_by_gpu(pods))
