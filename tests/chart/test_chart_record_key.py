"""The key that seals decision records: the chart makes one Secret that every server pod mounts, and
`serve` reads it before its workers fork, so that all of them (and all replicas) verify each other's records."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import helm_tool
import pytest

from webhook.commands import serve
from webhook.errors import UserError

FULLNAME = "gpu-gpu-admission"


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    return helm.template({"webhook": {"replicas": 2}}, release="gpu", namespace="gpu-admission")


def test_every_replica_mounts_the_one_record_key(docs: list[dict[str, Any]]) -> None:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "record-key")
    volume = next(v for v in spec["volumes"] if v["name"] == "record-key")
    assert volume["secret"]["secretName"] == f"{FULLNAME}-record-key" and mount["readOnly"] is True
    assert env[serve.RECORD_KEY_ENV] == f"{mount['mountPath']}/record.key"


def test_a_render_without_the_cluster_leaves_the_key_to_the_certificate_job(docs: list[dict[str, Any]]) -> None:
    # helm template cannot look up the key an earlier render made: a key of its own would change on every
    # GitOps sync. The pre-install Job makes the Secret once instead, and may read only that one back.
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == f"{FULLNAME}-record-key"]
    job = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == f"{FULLNAME}-certs")
    assert "pre-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    assert f"--record-key-secret={FULLNAME}-record-key" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == f"{FULLNAME}-certs-hook")
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{FULLNAME}-record-key"],
            "verbs": ["get"]} in role["rules"]
    renew = next(d for d in docs if d["kind"] == "CronJob")
    renew_args = renew["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--record-key-secret={FULLNAME}-record-key" in renew_args  # recreated if someone deletes it


def test_serve_reads_the_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "record.key"
    path.write_bytes(b"0123456789abcdefghij\n")
    monkeypatch.setenv(serve.RECORD_KEY_ENV, str(path))
    assert serve._record_key() == b"0123456789abcdefghij"
    path.write_bytes(b"short")
    with pytest.raises(UserError, match="at least 16 bytes"):
        serve._record_key()
    monkeypatch.setenv(serve.RECORD_KEY_ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match="cannot read the record key"):
        serve._record_key()


def test_without_the_key_file_serve_makes_a_random_key_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(serve.RECORD_KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="webhook.commands.serve"):
        first, second = serve._record_key(), serve._record_key()
    assert len(first) == 32 and first != second
    assert "run one replica only" in caplog.text
