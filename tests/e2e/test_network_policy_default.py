"""The chart's default NetworkPolicy, rendered against the real API server: it admits the addresses the
cluster's own `kubernetes` Service points at (where the API server calls webhooks from), and the API
server accepts the object. No network plugin runs here, so what the policy blocks is the plugin's part."""

from __future__ import annotations

from typing import Any

import yaml
from e2e.controlplane import ControlPlane
from e2e.harness import helm
from helm_tool import CHART
from kubernetes import client

NAMESPACE = "np-default"
APPLIED = "np-applied"


def render(plane: ControlPlane, *values: str) -> list[dict[str, Any]]:
    out = helm(plane, "template", "np", str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
               "--set", "image.repository=localhost/gpu-admission", *values)
    return [d for d in yaml.safe_load_all(out) if d]


def policy_cidrs(policy: dict[str, Any]) -> set[str]:
    return {p["ipBlock"]["cidr"] for p in policy["spec"]["ingress"][0]["from"] if "ipBlock" in p}


def network_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "NetworkPolicy")


def test_the_default_policy_admits_the_addresses_the_api_server_advertises(
        plane: ControlPlane, admin: client.ApiClient) -> None:
    # This control plane serves on loopback, which Endpoints may not hold, so it runs without its endpoint
    # reconciler; the objects that reconciler keeps are written here as it writes them (documentation
    # addresses, RFC 5737 and 3849).
    core, discovery = client.CoreV1Api(admin), client.DiscoveryV1Api(admin)
    assert all(d["kind"] != "NetworkPolicy" for d in render(plane)), "no addresses known: no policy"
    core.create_namespaced_endpoints("default", {
        "metadata": {"name": "kubernetes"},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}, {"ip": "192.0.2.11"}],
                     "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]})
    assert policy_cidrs(network_policy(render(plane))) == {"192.0.2.10/32", "192.0.2.11/32"}
    discovery.create_namespaced_endpoint_slice("default", {
        "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["2001:db8::10"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]})
    policy = network_policy(render(plane))
    assert policy_cidrs(policy) == {"2001:db8::10/128"}, "the EndpointSlice is read first"
    # Nothing else outside the control plane: the tunnel agents in kube-system and the replicas themselves.
    others = [p for p in policy["spec"]["ingress"][0]["from"] if "ipBlock" not in p]
    assert others and all(
        p.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": "kube-system"}
        or set(p) == {"podSelector"} for p in others)
    # The API server takes the object as rendered (in a namespace of its own: helm owns the rendered one).
    core.create_namespace({"metadata": {"name": APPLIED}})
    policy["metadata"]["namespace"] = APPLIED
    created = client.NetworkingV1Api(admin).create_namespaced_network_policy(APPLIED, policy)
    assert created.spec.pod_selector.match_labels["app.kubernetes.io/component"] == "webhook"
    core.delete_namespaced_endpoints("kubernetes", "default")
    discovery.delete_namespaced_endpoint_slice("kubernetes", "default")


def test_given_addresses_win_over_the_lookup(plane: ControlPlane) -> None:
    policy = network_policy(render(plane, "--set", "webhook.networkPolicy.apiServerCIDRs={10.1.2.3/32}"))
    assert policy_cidrs(policy) == {"10.1.2.3/32"}
