"""The Helm chart, rendered by the real helm v4 binary and checked object by object.

Every scenario is rendered once per module; documents are validated against the Kubernetes API schemas
(strict: unknown fields fail) and then held to the install contract: namespace exclusions, webhook
settings, least-privilege RBAC, hardened containers, and names that agree across Service, webhook
configurations and certificates.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_tool
import kubernetes_validate
import pytest
import yaml

from webhook.cli import build_parser
from webhook.core.policy.model import parse_policy

NAMESPACE = "gpu-admission"
RELEASE = "gpu"
FULLNAME = "gpu-gpu-admission"
NEWEST_SCHEMA = kubernetes_validate.latest_version()
SCHEMA_VERSIONS = ("1.30", NEWEST_SCHEMA)
# Custom resources of other projects: the Kubernetes schemas do not describe them. Nothing else skips.
KINDS_WITHOUT_SCHEMA = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
MONITORING_ON = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    }
}
PROMETHEUS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
NETWORK_POLICY = {"enabled": True, "apiServerCIDRs": ["10.0.0.0/24", "10.0.1.5/32"], "extraFrom": [PROMETHEUS_PEER]}
OWN_KEY = {"webhook": {"recordKey": {"existingSecret": "team-made-key"}}}
SCENARIOS: dict[str, tuple[dict[str, Any], str | None]] = {
    "default": ({}, None),
    # Renders that cannot read the cluster and have no certificate Job name a record key made once.
    "cert-manager": ({"certificates": {"mode": "certManager"}, **OWN_KEY}, None),
    "cert-manager-own-issuer": (
        {
            "certificates": {
                "mode": "certManager",
                "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
            },
            **OWN_KEY,
        },
        None,
    ),
    "builtin": ({"certificates": {"mode": "builtin"}}, None),
    "existing-secret": (
        {"certificates": {"mode": "existingSecret", "existingSecret": {"name": "my-tls", "caBundle": CA_BUNDLE}},
         **OWN_KEY},
        None,
    ),
    "ha": ({"webhook": {"replicas": 2}}, None),
    "single": ({"webhook": {"replicas": 1}}, None),
    "ledger": ({"webhook": {"reservations": "api"}}, None),
    "own-key": ({"webhook": {"recordKey": {"existingSecret": "team-made-key"}}}, None),
    "agent-off": ({"agent": {"enabled": False}}, None),
    "monitoring": (MONITORING_ON, None),
    "network-policy": ({"webhook": {"networkPolicy": NETWORK_POLICY}}, None),
    "all-except": ({"namespaceSelection": {"mode": "allExcept", "excludedNamespaces": ["monitoring"]}}, None),
    "kube-1.29": ({}, "1.29.0"),
    "kube-1.34": ({}, "1.34.0"),
}
METRICS = {
    "gpu_admission_admission_duration_seconds",
    "gpu_admission_decisions_total",
    "gpu_admission_requests_in_flight",
    "gpu_admission_snapshot_age_seconds",
    "gpu_admission_cache_stale",
    "gpu_admission_quota_used",
    "gpu_admission_quota_limit",
    "gpu_admission_gpus_allocated",
    "gpu_admission_gpus_free",
    "gpu_admission_certificate_expiry_seconds",
    "gpu_admission_errors_total",
    "gpu_admission_largest_written_object_bytes",
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> helm_tool.Helm:
    return helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def rendered(helm: helm_tool.Helm) -> dict[str, list[dict[str, Any]]]:
    return {
        name: helm.template(values, release=RELEASE, namespace=NAMESPACE, kube_version=kube)
        for name, (values, kube) in SCENARIOS.items()
    }


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_webhooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hooks = [
        w
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for w in one(docs, kind)["webhooks"]
    ]
    return [w for w in hooks if w["rules"][0]["resources"] == ["pods"]]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield f"{d['kind']}/{d['metadata']['name']}", spec["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield f"CronJob/{d['metadata']['name']}", spec["jobTemplate"]["spec"]["template"]["spec"]


def container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("scenario", ["default", "cert-manager", "existing-secret", "ha", "monitoring"])
def test_lint_strict(helm: helm_tool.Helm, tmp_path: Path, scenario: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(SCENARIOS[scenario][0]))
    out = helm.run("lint", "--strict", str(helm_tool.CHART), "--namespace", NAMESPACE, "--values", str(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_document_validates_strictly(
    rendered: dict[str, list[dict[str, Any]]], scenario: str, version: str
) -> None:
    checked = set()
    for doc in rendered[scenario]:
        if (doc["apiVersion"], doc["kind"]) in KINDS_WITHOUT_SCHEMA:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} against {version}: {err.message} at {err.path}")
        checked.add(doc["kind"])
    assert checked >= {
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ConfigMap",
        "ClusterRole",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "PodDisruptionBudget",
    }


def test_schema_less_kinds_appear_only_where_expected(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {
        name: {(d["apiVersion"], d["kind"]) for d in docs} & KINDS_WITHOUT_SCHEMA for name, docs in rendered.items()
    }
    assert kinds["default"] == set()
    assert kinds["cert-manager"] == {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
    assert kinds["cert-manager-own-issuer"] == {("cert-manager.io/v1", "Certificate")}
    assert kinds["monitoring"] == {k for k in KINDS_WITHOUT_SCHEMA if k[0].startswith("monitoring")}


def test_crd_is_shipped_in_crds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    crd = one(rendered["default"], "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "gpuinventories.gpu-admission.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert (Path(helm_tool.CHART) / "crds" / "gpuinventory.yaml").is_file()


@pytest.mark.parametrize("scenario", ["default", "all-except", "kube-1.29"])
def test_pod_webhooks_never_match_system_or_release_namespaces(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    hooks = pod_webhooks(rendered[scenario])
    assert [w["name"] for w in hooks] == ["mutate-pods.gpu-admission.io", "validate-pods.gpu-admission.io",
                                          "validate-pod-records.gpu-admission.io"]
    for hook in hooks:
        expressions = hook["namespaceSelector"]["matchExpressions"]
        names = [e for e in expressions if e["key"] == "kubernetes.io/metadata.name"]
        assert len(names) == 1 and names[0]["operator"] == "NotIn"
        assert {"kube-system", "kube-node-lease", NAMESPACE} <= set(names[0]["values"])


def test_release_namespace_is_excluded_wherever_installed(helm: helm_tool.Helm) -> None:
    docs = helm.template(namespace="gpu-system")
    for hook in pod_webhooks(docs):
        values = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert values == ["kube-system", "kube-node-lease", "gpu-system"]
        assert hook["clientConfig"]["service"]["namespace"] == "gpu-system"


def test_opt_in_and_all_except_selectors(rendered: dict[str, list[dict[str, Any]]]) -> None:
    opt_in = pod_webhooks(rendered["default"])[0]["namespaceSelector"]["matchExpressions"][1]
    assert opt_in == {"key": "gpu-admission.io/enabled", "operator": "In", "values": ["true"]}
    all_except = pod_webhooks(rendered["all-except"])[0]["namespaceSelector"]["matchExpressions"]
    assert all_except[0]["values"] == ["kube-system", "kube-node-lease", NAMESPACE, "monitoring"]
    assert all_except[1] == {"key": "gpu-admission.io/enabled", "operator": "NotIn", "values": ["false"]}


def test_webhook_settings(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    mutating = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    validating = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    for hook in mutating + validating:
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["timeoutSeconds"] == 5
        assert hook["admissionReviewVersions"] == ["v1"]
    # Enforcement fails closed; a skipped mutation is caught (and explained) by the validating webhook.
    assert [w["failurePolicy"] for w in mutating + validating] == ["Ignore", "Ignore", "Fail", "Fail", "Fail", "Fail",
                                                                   "Fail", "Fail"]
    assert [w["reinvocationPolicy"] for w in mutating] == ["IfNeeded", "IfNeeded"]
    assert mutating[0]["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert mutating[0]["clientConfig"]["service"]["path"] == "/mutate"
    inventories = validating[1]
    assert inventories["rules"] == [
        {
            "apiGroups": ["gpu-admission.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["gpuinventories"],
            "scope": "Cluster",
        }
    ]
    claims = validating[2]
    assert claims["name"] == "validate-resourceclaims.gpu-admission.io"
    assert claims["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        }
    ]
    # Claims live in tenant namespaces: the pod webhooks' namespace selection applies to them too.
    assert claims["namespaceSelector"] == validating[0]["namespaceSelector"]
    assert [w["clientConfig"]["service"]["path"] for w in validating] == ["/validate"] * 6
    # `kubectl debug`: ephemeral containers are mutated (NVIDIA_VISIBLE_DEVICES=void) and validated like
    # any container, in the namespaces the pod webhooks select, every request (no matchConditions).
    ephemeral_rule = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                       "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}]
    for hook, path in ((mutating[1], "/mutate"), (validating[3], "/validate")):
        assert hook["rules"] == ephemeral_rule
        assert hook["clientConfig"]["service"]["path"] == path
        assert hook["namespaceSelector"] == validating[0]["namespaceSelector"]
        assert "matchConditions" not in hook


def test_failure_policies_and_timeout_come_from_values(helm: helm_tool.Helm) -> None:
    docs = helm.template(
        {
            "webhook": {
                "timeoutSeconds": 3,
                "failurePolicy": {"mutating": "Ignore", "validating": "Fail", "inventories": "Ignore"},
            }
        }
    )
    mutating = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    validating = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert [w["failurePolicy"] for w in mutating + validating] == ["Ignore", "Ignore", "Fail", "Ignore", "Fail", "Fail",
                                                                   "Fail", "Fail"]
    assert {w["timeoutSeconds"] for w in mutating + validating} == {3}


@pytest.mark.parametrize(("scenario", "present"), [("kube-1.29", False), ("kube-1.34", True), ("default", True)])
def test_match_conditions_only_where_the_cluster_supports_them(
    rendered: dict[str, list[dict[str, Any]]], scenario: str, present: bool
) -> None:
    for hook in pod_webhooks(rendered[scenario]):
        assert ("matchConditions" in hook) is present
    inventories = one(rendered[scenario], "ValidatingWebhookConfiguration")["webhooks"][1]
    assert "matchConditions" not in inventories
    claims = one(rendered[scenario], "ValidatingWebhookConfiguration")["webhooks"][2]
    expected = [{"name": "claim-spec-written",
                 "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec"}]
    assert claims.get("matchConditions") == (expected if present else None)


def test_match_conditions_start_at_1_30_exactly(helm: helm_tool.Helm) -> None:
    for version, present in (("1.29.15", False), ("1.30.0", True)):
        hooks = pod_webhooks(helm.template(kube_version=version))
        assert all(("matchConditions" in w) is present for w in hooks), version


def test_match_conditions_can_be_turned_off(helm: helm_tool.Helm) -> None:
    hooks = pod_webhooks(helm.template({"webhook": {"skipPodsWithoutGpu": False}}, kube_version="1.34.0"))
    assert all("matchConditions" not in w for w in hooks)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_rbac_wildcards(rendered: dict[str, list[dict[str, Any]]], scenario: str) -> None:
    for doc in rendered[scenario]:
        for rule in doc.get("rules", []) if doc["kind"] in ("Role", "ClusterRole") else []:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"{doc['kind']}/{doc['metadata']['name']} {field}"


def rules_of(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return one(docs, kind, name)["rules"]


def test_rbac_is_least_privilege(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    assert rules_of(docs, "ClusterRole", f"{FULLNAME}-webhook") == [
        {
            "apiGroups": [""],
            "resources": ["nodes", "pods", "namespaces", "resourcequotas"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": ["gpu-admission.io"], "resources": ["gpuinventories"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["kubeflow.org", "jobset.x-k8s.io", "ray.io", "batch.volcano.sh", "scheduling.volcano.sh",
                          "scheduling.x-k8s.io"],
            "resources": ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs", "jobsets",
                          "rayclusters", "jobs", "podgroups"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["karpenter.sh", "cluster.x-k8s.io"],
            "resources": ["nodepools", "machinedeployments", "machinesets", "machinepools"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]},
    ]
    assert rules_of(docs, "ClusterRole", f"{FULLNAME}-agent") == [
        {
            "apiGroups": ["gpu-admission.io"],
            "resources": ["gpuinventories"],
            "verbs": ["get", "create", "update", "patch"],
        },
    ]
    for name in (f"{FULLNAME}-certs", f"{FULLNAME}-certs-hook"):
        assert rules_of(docs, "ClusterRole", name) == [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
                "resourceNames": [FULLNAME],
                "verbs": ["get", "patch"],
            },
        ]
        assert rules_of(docs, "Role", name) == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": [f"{FULLNAME}-tls"],
                "verbs": ["get", "update", "patch"],
            },
            # the record key, which a render without the cluster leaves to the Job: made once, then read
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{FULLNAME}-record-key"],
             "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        ]
    # Three replicas elect one decider, which keeps reservations in memory: the Lease, nothing else.
    assert rules_of(docs, "Role", f"{FULLNAME}-reservations") == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    # One replica keeps them in its own memory: no write access at all.
    assert find(rendered["single"], "Role", f"{FULLNAME}-reservations") == []
    # The ConfigMap ledger: ConfigMaps only.
    assert rules_of(rendered["ledger"], "Role", f"{FULLNAME}-reservations") == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]}
    ]


def test_bindings_grant_chart_roles_to_chart_service_accounts(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["ha"]
    accounts = {d["metadata"]["name"] for d in find(docs, "ServiceAccount")}
    bindings = find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    assert len(bindings) == 7
    for binding in bindings:
        assert one(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        assert [(s["kind"], s["namespace"]) for s in binding["subjects"]] == [("ServiceAccount", NAMESPACE)]
        assert binding["subjects"][0]["name"] in accounts


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_is_non_root_and_read_only(rendered: dict[str, list[dict[str, Any]]], scenario: str) -> None:
    specs = list(pod_specs(rendered[scenario]))
    assert len(specs) >= 2
    for where, spec in specs:
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532, where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], where


def test_webhook_deployment(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = one(rendered["default"], "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert deployment["spec"]["replicas"] == 3
    assert c["args"][:2] == ["serve", "--in-cluster"]
    assert "--cert-dir=/etc/gpu-admission/tls" in c["args"]
    assert "--policy=/etc/gpu-admission/policy/policy.yaml" in c["args"]
    # Highly available by default: one elected decider, the others forward to it at the pod's address.
    assert "--reservations=leader" in c["args"] and "--peer-url=https://$(POD_IP):8443" in c["args"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    anti = spec["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}}]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone",
                                            "labelSelector": {"matchLabels": selector}}}]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    priority = one(rendered["default"], "PriorityClass")
    assert spec["priorityClassName"] == priority["metadata"]["name"] and priority["value"] == 1000000000
    assert one(rendered["default"], "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    # Whole-directory mounts: a subPath mount would never see a renewed certificate or an edited policy.
    assert all("subPath" not in m for m in c["volumeMounts"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{FULLNAME}-tls"
    assert [i["key"] for i in volumes["tls"]["secret"]["items"]] == ["tls.crt", "tls.key"]
    assert volumes["policy"]["configMap"]["name"] == f"{FULLNAME}-policy"
    single = one(rendered["single"], "Deployment")
    assert not any(a.startswith("--reservations") for a in single["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "affinity" not in single["spec"]["template"]["spec"]
    assert single["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert one(rendered["single"], "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


KONNECTIVITY_AGENTS = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
     "podSelector": {"matchLabels": {label: "konnectivity-agent"}}}
    for label in ("k8s-app", "app")
]


def test_network_policy_admits_only_the_listed_peers_to_the_server(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # On by default, but a render that cannot read the API server's addresses (helm template) has none to
    # admit: it renders no policy rather than one that would shut the API server out.
    assert find(rendered["default"], "NetworkPolicy") == []
    docs = rendered["network-policy"]
    spec = one(docs, "NetworkPolicy")["spec"]
    assert spec["podSelector"] == one(docs, "Deployment")["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {
            "ports": [{"port": "https", "protocol": "TCP"}],
            "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "10.0.1.5/32"}},
                     *KONNECTIVITY_AGENTS, PROMETHEUS_PEER,
                     {"podSelector": spec["podSelector"]}],  # replicas forward to the elected decider
        }
    ]


def test_high_availability_shares_reservations(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["ha"]
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert "--reservations=leader" in container(docs, "Deployment", FULLNAME)["args"]
    assert one(docs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 1,
        "selector": one(docs, "Deployment")["spec"]["selector"],
    }
    ledger = container(rendered["ledger"], "Deployment", FULLNAME)["args"]
    assert "--reservations=api" in ledger and "--ledger-budget=4" in ledger


def test_service_client_config_and_certificates_agree(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for scenario in ("builtin", "cert-manager", "existing-secret"):
        docs = rendered[scenario]
        service = one(docs, "Service")
        assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        for hook in [
            w
            for k in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
            for w in one(docs, k)["webhooks"]
        ]:
            ref = hook["clientConfig"]["service"]
            assert (ref["name"], ref["namespace"], ref["port"]) == (name, namespace, 443), scenario
        assert service["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    certificate = one(rendered["cert-manager"], "Certificate", f"{FULLNAME}-serving")
    svc = f"{FULLNAME}.{NAMESPACE}.svc"
    assert certificate["spec"]["dnsNames"] == [FULLNAME, f"{FULLNAME}.{NAMESPACE}", svc, f"{svc}.cluster.local"]
    for job in (one(rendered["builtin"], "Job"), one(rendered["builtin"], "CronJob")):
        spec = (
            job["spec"]["template"]["spec"]
            if job["kind"] == "Job"
            else job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        )
        args = spec["containers"][0]["args"]
        assert args[0] == "certs"
        assert f"--service={FULLNAME}" in args and f"--namespace={NAMESPACE}" in args
        assert f"--secret={FULLNAME}-tls" in args and f"--patch-webhook={FULLNAME}" in args


def test_certificate_modes_supply_the_ca_bundle(rendered: dict[str, list[dict[str, Any]]]) -> None:
    def configurations(scenario: str) -> list[dict[str, Any]]:
        docs = rendered[scenario]
        return [one(docs, "MutatingWebhookConfiguration"), one(docs, "ValidatingWebhookConfiguration")]

    for conf in configurations("cert-manager"):
        assert conf["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{FULLNAME}-serving"}
    for conf in configurations("existing-secret"):
        assert {w["clientConfig"]["caBundle"] for w in conf["webhooks"]} == {CA_BUNDLE}
        assert "annotations" not in conf["metadata"]
    for conf in configurations("builtin"):  # patched in by the hook Job
        assert all("caBundle" not in w["clientConfig"] for w in conf["webhooks"])
    volume = one(rendered["existing-secret"], "Deployment")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["secret"]["secretName"] == "my-tls"
    assert find(rendered["existing-secret"], "Job") == find(rendered["cert-manager"], "Job") == []


def test_builtin_certificate_hooks_run_around_install_and_upgrade(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["builtin"]
    job = one(docs, "Job")
    events = "pre-install,pre-upgrade,post-install,post-upgrade"
    assert job["metadata"]["annotations"]["helm.sh/hook"] == events
    hook_objects = [d for d in docs if d["metadata"]["name"] == f"{FULLNAME}-certs-hook"]
    assert sorted(d["kind"] for d in hook_objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    for d in hook_objects:  # in place before the Job, gone after it
        assert d["metadata"]["annotations"]["helm.sh/hook"] == events
        assert int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
            job["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
    cron = one(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert "--renew-before-days=60" in cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_agent_daemonset(rendered: dict[str, list[dict[str, Any]]], helm: helm_tool.Helm) -> None:
    spec = one(rendered["default"], "DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert c["args"] == ["agent", "--node-name=$(NODE_NAME)", "--metrics-port=9402",
                         "--toolkit-config=/etc/nvidia-container-runtime/config.toml"]
    assert "resources" in c and "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert "runtimeClassName" not in spec
    with_runtime = helm.template({"agent": {"runtimeClassName": "nvidia"}})
    assert one(with_runtime, "DaemonSet")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    off = rendered["agent-off"]
    assert find(off, "DaemonSet") == [] and find(off, "ClusterRole", f"{FULLNAME}-agent") == []
    assert find(off, "ServiceAccount", f"{FULLNAME}-agent") == []


def test_policy_config_map_is_a_valid_policy(rendered: dict[str, list[dict[str, Any]]], helm: helm_tool.Helm) -> None:
    def policy_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
        return yaml.safe_load(one(docs, "ConfigMap", f"{FULLNAME}-policy")["data"]["policy.yaml"])

    assert policy_of(rendered["default"]) == {"managedNamespaces": "labelled"}
    assert policy_of(rendered["all-except"]) == {"managedNamespaces": "all"}
    custom = {"defaults": {"placement": "spread"}, "namespaces": {"team-a": {"maxGpusPerPod": 4}}}
    data = policy_of(helm.template({"policy": custom}))
    assert data == {**custom, "managedNamespaces": "labelled"}
    assert parse_policy(data).rule("team-a").max_gpus_per_pod == 4
    assert parse_policy(policy_of(rendered["default"])).managed_namespaces == "labelled"


def test_monitoring_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["monitoring"]
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("https", "https", "/metrics")
    assert endpoint["tlsConfig"]["serverName"] == f"{FULLNAME}.{NAMESPACE}.svc"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": f"{FULLNAME}-tls", "key": "ca.crt"}
    assert one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    alerts = {r["alert"]: r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) >= {
        "GpuAdmissionSlowAdmissions",
        "GpuAdmissionErrors",
        "GpuAdmissionCacheStale",
        "GpuAdmissionCertificateExpiring",
        "GpuAdmissionQuotaNearlyFull",
    }
    assert (
        "> 1" in alerts["GpuAdmissionSlowAdmissions"]["expr"] and "0.99" in alerts["GpuAdmissionSlowAdmissions"]["expr"]
    )
    assert "14 * 86400" in alerts["GpuAdmissionCertificateExpiring"]["expr"]
    assert ">= 0.9" in alerts["GpuAdmissionQuotaNearlyFull"]["expr"]
    dashboard = json.loads(next(iter(one(docs, "ConfigMap", f"{FULLNAME}-dashboard")["data"].values())))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = " ".join(exprs + [r["expr"] for r in alerts.values()])
    names = set(re.findall(r"gpu_admission_[a-z_]+", used))
    names = {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
    assert names <= METRICS and len(names) >= 9
    assert find(rendered["default"], "ServiceMonitor") == find(rendered["default"], "PrometheusRule") == []


def test_notes_explain_opt_in_and_emergency_removal(helm: helm_tool.Helm) -> None:
    out = helm.run("install", RELEASE, str(helm_tool.CHART), "--dry-run=client", "--namespace", NAMESPACE)
    assert "kubectl label namespace TEAM gpu-admission.io/enabled=true" in out
    assert f"kubectl delete mutatingwebhookconfiguration {FULLNAME}" in out
    assert f"kubectl delete validatingwebhookconfiguration {FULLNAME}" in out


def test_clusters_older_than_supported_are_refused(helm: helm_tool.Helm) -> None:
    with pytest.raises(helm_tool.HelmError) as err:
        helm.template(kube_version="1.26.9")
    assert "chart requires kubeVersion: >=1.27.0-0 which is incompatible with Kubernetes v1.26.9" in str(err.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook": {"replicas": -1}}, "at '/webhook/replicas': minimum: got -1, want 0"),
        (
            {"certificates": {"mode": "selfSigned"}},
            "at '/certificates/mode': value must be one of 'certManager', 'builtin', 'existingSecret'",
        ),
        (
            {"certificates": {"mode": "existingSecret", "existingSecret": {"name": "tls"}}},
            "at '/certificates/existingSecret/caBundle': minLength: got 0, want 1",
        ),
        ({"webhook": {"timeoutSeconds": 31}}, "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
        ({"webhook": {"failurePolicy": {"mutating": "ignore"}}}, "at '/webhook/failurePolicy/mutating'"),
        ({"webhook": {"replica": 2}}, "additional properties 'replica' not allowed"),
        ({"webhook": {"replicas": 2, "reservations": "memory"}}, "webhook.reservations: memory keeps reservations"),
        (
            {"webhook": {"networkPolicy": {"whenAddressesUnknown": "fail"}}},
            "webhook.networkPolicy: the API server's addresses are unknown",
        ),
        ({"webhook": {"networkPolicy": {"apiServerCIDRs": [""]}}}, "at '/webhook/networkPolicy/apiServerCIDRs/0'"),
    ],
)
def test_bad_values_fail_naming_the_value(helm: helm_tool.Helm, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_tool.HelmError) as err:
        helm.template(values)
    assert message in str(err.value)


def parse_cli(args: list[str]) -> str | None:
    """None when `gpu-admission` accepts `args`, else argparse's complaint."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(args)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("default", "Deployment"),
        ("default", "DaemonSet"),
        ("ha", "Deployment"),
        ("builtin", "Job"),
    ],
)
def test_the_cli_accepts_the_chart_arguments(
    rendered: dict[str, list[dict[str, Any]]], scenario: str, kind: str
) -> None:
    for where, spec in pod_specs(rendered[scenario]):
        if where.startswith(kind + "/"):
            assert parse_cli(spec["containers"][0]["args"]) is None, where


def test_every_value_is_documented() -> None:
    """Each key of values.yaml has a comment right above it, sits inside a commented key, or is a section
    whose keys are all documented."""
    nodes: list[dict[str, Any]] = []  # {"name", "line", "commented", "parent", "children"}
    stack: list[tuple[int, dict[str, Any]]] = []
    previous = ""
    for number, line in enumerate((helm_tool.CHART / "values.yaml").read_text().splitlines(), 1):
        key = re.match(r"^( *)([A-Za-z][\w./-]*):", line)
        if key:
            indent = len(key.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else None
            node = {
                "name": key.group(2),
                "line": number,
                "commented": previous.lstrip().startswith("#"),
                "parent": parent,
                "children": [],
            }
            if parent is not None:
                parent["children"].append(node)
            nodes.append(node)
            stack.append((indent, node))
        if line.strip():
            previous = line

    def inside_commented(node: dict[str, Any] | None) -> bool:
        return node is not None and (node["commented"] or inside_commented(node["parent"]))

    def documented(node: dict[str, Any]) -> bool:
        if inside_commented(node):
            return True
        return bool(node["children"]) and all(documented(c) for c in node["children"])

    assert [f"values.yaml:{n['line']}: {n['name']}" for n in nodes if not documented(n)] == []
    assert len(nodes) > 100


def test_long_release_names_stay_within_kubernetes_limits(helm: helm_tool.Helm) -> None:
    docs = helm.template(release="release-" + "x" * 45)  # helm's longest release name: 53
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
    # The CronJob controller appends an 11-character suffix to name each Job.
    assert len(one(docs, "CronJob")["metadata"]["name"]) <= 52


def test_a_record_key_made_outside_the_chart_is_mounted_and_none_is_rendered(
    rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Rendered without the cluster (helm template, GitOps), `lookup` finds nothing and each render would
    make a new key: with existingSecret no key is rendered at all, and every replica mounts that Secret."""
    docs = rendered["own-key"]
    assert find(docs, "Secret", f"{FULLNAME}-record-key") == []
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["record-key"]["secret"]["secretName"] == "team-made-key"
    default = {v["name"]: v for v in one(rendered["default"], "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert default["record-key"]["secret"]["secretName"] == f"{FULLNAME}-record-key"
    # without existingSecret, a render without the cluster leaves that Secret to the certificate Job
    assert find(rendered["default"], "Secret", f"{FULLNAME}-record-key") == []

