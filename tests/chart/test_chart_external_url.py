"""`webhook.url`: the webhook served outside the cluster (the end-to-end suite runs the chart this way)."""

from __future__ import annotations

from typing import Any

import helm_tool
import pytest

CA = "QUJD"
EXTERNAL = {
    "webhook": {"url": "https://admission.example.com:9443/gpu/", "recordKey": {"existingSecret": "outside-key"}},
    "certificates": {"mode": "existingSecret", "existingSecret": {"caBundle": CA}},
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> helm_tool.Helm:
    return helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def test_every_webhook_calls_the_url_with_its_path_and_no_server_runs_in_the_cluster(helm: helm_tool.Helm) -> None:
    docs = helm.template(EXTERNAL, kube_version="1.36.3")
    configs = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    hooks = [w for config in configs for w in config["webhooks"]]
    assert len(hooks) == 8
    for hook in hooks:
        client = hook["clientConfig"]
        assert "service" not in client and client["caBundle"] == CA
        path = "/mutate" if hook["name"].startswith("mutate") else "/validate"
        assert client["url"] == "https://admission.example.com:9443/gpu" + path
    assert not kinds(docs) & {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    # what the server outside still needs: its account and rights and its policy (its record key is the
    # Secret named, made once: a render without the cluster cannot keep a key it makes)
    assert {"ServiceAccount", "ClusterRole", "ConfigMap"} <= kinds(docs) and "Secret" not in kinds(docs)


def test_the_in_cluster_default_is_unchanged(helm: helm_tool.Helm) -> None:
    docs = helm.template({}, kube_version="1.36.3")
    assert {"Deployment", "Service"} <= kinds(docs)
    hooks = [w for d in docs if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]]
    assert all("url" not in w["clientConfig"] and w["clientConfig"]["service"]["port"] == 443 for w in hooks)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"webhook": {"url": "https://127.0.0.1:9443"}}, "set certificates.mode=existingSecret"),
        (
            {"webhook": {"url": "https://127.0.0.1:9443"}, "certificates": {"mode": "certManager"}},
            "set certificates.mode=existingSecret",
        ),
        (
            {"webhook": {"url": "https://127.0.0.1:9443"}, "certificates": EXTERNAL["certificates"]},
            "set webhook.recordKey.existingSecret",
        ),
        ({"webhook": {"url": "http://127.0.0.1:9443"}, **{k: v for k, v in EXTERNAL.items() if k != "webhook"}}, "url"),
        (
            {"webhook": {"url": "https://host/path?query=1"}, **{k: v for k, v in EXTERNAL.items() if k != "webhook"}},
            "url",
        ),
    ],
)
def test_a_url_the_api_server_could_not_use_fails_at_render_time(
    helm: helm_tool.Helm, values: dict[str, Any], expected: str
) -> None:
    with pytest.raises(helm_tool.HelmError) as err:
        helm.template(values, kube_version="1.36.3")
    assert expected in str(err.value)


def test_the_secret_name_is_still_required_for_the_in_cluster_server(helm: helm_tool.Helm) -> None:
    with pytest.raises(helm_tool.HelmError) as err:
        helm.template({"certificates": EXTERNAL["certificates"]}, kube_version="1.36.3")
    assert "existingSecret/name" in str(err.value)
