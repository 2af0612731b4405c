"""What Helm users expect of a chart: a render that cannot install fails at once and says why, the
ServiceAccounts and RBAC can be brought by the user, and the security contexts can be overridden."""

from __future__ import annotations

import base64
from typing import Any

import helm_tool
import pytest


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> helm_tool.Helm:
    return helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> helm_tool.Helm:
    """helm with the chart's values exactly as shipped (no image repository added)."""
    return helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-shipped"), image=None)


def pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for d in docs:
        spec = d.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template:
            found.append(template["spec"])
    return found


def test_the_shipped_values_fail_at_render_time_saying_how_to_build_and_push_the_image(
    shipped: helm_tool.Helm,
) -> None:
    for command in (("template", "r"), ("install", "r", "--dry-run=client")):
        with pytest.raises(helm_tool.HelmError) as err:
            shipped.run(*command, str(helm_tool.CHART), "--namespace", "gpu-admission")
        text = str(err.value)
        assert "image.repository is required" in text
        assert "docker build -t REGISTRY/gpu-admission:0.1.0 ." in text and "--set image.repository=" in text
    docs = shipped.template({"image": {"repository": "registry.example.com/team/gpu-admission"}})
    images = {c["image"] for spec in pods(docs) for c in spec["containers"]}
    assert images == {"registry.example.com/team/gpu-admission:0.1.0"}


def test_the_user_may_bring_the_service_accounts_and_rbac(helm: helm_tool.Helm) -> None:
    docs = helm.template({"serviceAccount": {"create": False, "name": "gpu-sa"}, "rbac": {"create": False}})
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} - {
        # the built-in certificate Job keeps its own account and rights, scoped to its Secret
        *(d["kind"] for d in docs if "certs" in d["metadata"]["name"]),
    }
    accounts = {spec.get("serviceAccountName") for spec in pods(docs)}
    assert {"gpu-sa", "gpu-sa-agent"} <= accounts


def test_a_named_account_is_bound_by_the_charts_rbac(helm: helm_tool.Helm) -> None:
    docs = helm.template({"serviceAccount": {"name": "gpu-sa"}})
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert {"gpu-sa", "gpu-sa-agent"} <= accounts
    subjects = {s["name"] for d in docs if d["kind"].endswith("Binding") for s in d["subjects"]}
    assert {"gpu-sa", "gpu-sa-agent"} <= subjects


def test_security_contexts_are_restricted_by_default_and_overridable(helm: helm_tool.Helm) -> None:
    for spec in pods(helm.template({})):
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
    custom = {"podSecurityContext": {"runAsUser": 1000, "fsGroup": None}, "securityContext": {"privileged": None}}
    for spec in pods(helm.template(custom)):
        assert spec["securityContext"]["runAsUser"] == 1000 and "fsGroup" not in spec["securityContext"]
        assert all("privileged" not in c["securityContext"] for c in spec["containers"])
        assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in spec["containers"])


def test_client_auth_mounts_the_api_servers_ca_and_passes_it_to_the_server(helm: helm_tool.Helm) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
    docs = helm.template({"webhook": {"clientAuth": {"caBundle": base64.b64encode(pem.encode()).decode()}}})
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-client-ca"))
    assert config["data"]["ca.crt"] == pem
    server = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = server["containers"][0]
    assert "--client-ca=/etc/gpu-admission/client-ca/ca.crt" in container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "client-ca")
    assert mount["mountPath"] == "/etc/gpu-admission/client-ca"
    assert any(
        v["name"] == "client-ca" and v["configMap"]["name"] == config["metadata"]["name"] for v in server["volumes"]
    )
    plain = next(d for d in helm.template({}) if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert not any(a.startswith("--client-ca") for a in plain["containers"][0]["args"])


def test_helm_show_readme_tells_how_to_install(helm: helm_tool.Helm) -> None:
    readme = helm.run("show", "readme", str(helm_tool.CHART))
    assert "docker build -t REGISTRY/gpu-admission" in readme
    assert "--set image.repository=REGISTRY/gpu-admission" in readme
    assert "gpu-admission.io/enabled=true" in readme
