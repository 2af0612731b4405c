"""`gpu-admission check` decides ResourceClaim and ResourceClaimTemplate documents as the validating
webhook decides their creation (core/dra_objects.py): a claim no pod could ever have counted is denied."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from webhook.cli import main

CLUSTER = textwrap.dedent("""
    apiVersion: v1
    kind: List
    items:
    - apiVersion: v1
      kind: Node
      metadata:
        name: h100-0
        labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559",
                 nvidia.com/gpu.count: "8"}
      status:
        allocatable: {cpu: "200", memory: 2000Gi, nvidia.com/gpu: "8"}
    - apiVersion: v1
      kind: Namespace
      metadata: {name: ml, labels: {gpu-admission.io/enabled: "true"}}
    - apiVersion: v1
      kind: Namespace
      metadata: {name: free}
""")


def claim(kind: str, name: str, request: str, namespace: str = "ml") -> str:
    spec = "spec:\n  spec:\n    devices:\n      requests:\n" if kind == "ResourceClaimTemplate" else \
        "spec:\n  devices:\n    requests:\n"
    indent = "      " if kind == "ResourceClaimTemplate" else "    "
    body = textwrap.indent(textwrap.dedent(request).strip(), indent)
    return (f"apiVersion: resource.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
            f"{spec}{body}\n")


ALL = """
- name: gpus
  exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}
"""
ADMIN = """
- name: watch
  exactly: {deviceClassName: gpu.nvidia.com, adminAccess: true}
"""
ONE = """
- name: gpu
  exactly: {deviceClassName: gpu.nvidia.com, count: 1}
"""


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: str) -> tuple[int, list[dict]]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    manifests = tmp_path / "deploy"
    manifests.mkdir()
    for i, doc in enumerate(docs):
        (manifests / f"{i}.yaml").write_text(doc)
    code = main(["check", "--cluster", str(tmp_path / "cluster.yaml"), "-o", "json", str(manifests)])
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)["results"]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize(("request_text", "reason"), [(ALL, "dra-all-devices"), (ADMIN, "dra-admin-access")])
def test_claims_no_pod_could_count_are_denied(tmp_path: Path, capsys, kind: str, request_text: str,
                                              reason: str) -> None:
    code, results = run(tmp_path, capsys, claim(kind, "bad", request_text))
    assert code == 1
    [result] = results
    assert (result["kind"], result["name"], result["namespace"]) == (kind, "bad", "ml")
    assert (result["allowed"], result["skipped"], result["reason"]) == (False, False, reason)
    assert result["code"] in (403, 422) and result["message"]


def test_a_countable_claim_is_admitted_and_an_unmanaged_one_passes(tmp_path: Path, capsys) -> None:
    code, results = run(tmp_path, capsys, claim("ResourceClaimTemplate", "one", ONE),
                        claim("ResourceClaim", "anything", ALL, namespace="free"))
    assert code == 0
    one, free = results
    assert (one["allowed"], one["reason"], one["skipped"]) == (True, "admitted", False)
    assert (free["allowed"], free["managed"], free["reason"]) == (True, False, "not-managed")


def test_text_output_names_the_denied_template(tmp_path: Path, capsys) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "t.yaml").write_text(claim("ResourceClaimTemplate", "every-gpu", ALL) + "---\n"
                                     + claim("ResourceClaimTemplate", "one", ONE))
    code = main(["check", "--cluster", str(tmp_path / "cluster.yaml"), str(tmp_path / "t.yaml")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0].startswith("DENY   ResourceClaimTemplate ml/every-gpu: 403 dra-all-devices: ")
    source = f"[{tmp_path}/t.yaml:1]"
    assert lines[1] == f"ALLOW  ResourceClaimTemplate ml/one: 1 GPU(s), counted when a pod uses it  {source}"
