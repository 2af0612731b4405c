"""Every metric the chart's alerts and dashboard query is one the server really exports.

The PrometheusRule and the Grafana dashboard are rendered by the real helm binary; the server is the
real Flask app (real allocation core, demo cluster, a serving certificate) after a few admissions.
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_tool
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_support import gpu_pod_review

from webhook.certs import authority as certs
from webhook.cluster.files import demo_objects
from webhook.cluster.translate import build_snapshot
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

METRIC = re.compile(r"\bgpu_admission_[a-z_]+")
MONITORING_ON = {"monitoring": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}


@pytest.fixture(scope="module")
def chart_exprs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The PromQL expressions per place that runs them: each alert, and the dashboard."""
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    docs = helm.template(MONITORING_ON)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (dashboard_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    exprs = {r["alert"]: [r["expr"]] for g in rule["spec"]["groups"] for r in g["rules"]}
    exprs["dashboard"] = _exprs(json.loads(next(iter(dashboard_map["data"].values()))))
    return exprs


@pytest.fixture(scope="module")
def chart_queries(chart_exprs: dict[str, list[str]]) -> dict[str, set[str]]:
    """Metric sample names per place that queries them."""
    return {where: set(METRIC.findall(" ".join(exprs))) for where, exprs in chart_exprs.items()}


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in _exprs(value)]
    return []


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/metrics after a mutation, a validation and a bad request."""
    paths = certs.issue_certificates(tmp_path_factory.mktemp("certs"), "gpu-admission", "gpu-admission", days=30)
    source = StaticSource(build_snapshot(demo_objects()), description="demo")
    app = create_app(ServerConfig(source=source, namespace="gpu-admission", cert_file=str(paths.cert)))
    client = app.test_client()
    for endpoint in ("/mutate", "/validate"):
        assert client.post(endpoint, json=gpu_pod_review(namespace="team-a")).status_code == 200
    assert client.post("/validate", data=b"{", content_type="application/json").status_code == 400
    return str(client.get("/metrics").get_data(as_text=True))


@pytest.fixture(scope="module")
def exported(metrics_text: str) -> tuple[set[str], set[str]]:
    """(metric family names, sample names) in /metrics."""
    families = list(text_string_to_metric_families(metrics_text))
    return {f.name for f in families}, {s.name for f in families for s in f.samples}


def test_the_chart_queries_metrics(chart_queries: dict[str, set[str]]) -> None:
    assert set(chart_queries) == {
        "GpuAdmissionWebhookDown",
        "GpuAdmissionSlowAdmissions",
        "GpuAdmissionErrors",
        "GpuAdmissionCacheStale",
        "GpuAdmissionCertificateExpiring",
        "GpuAdmissionQuotaNearlyFull",
        "GpuAdmissionStateObjectNearLimit",
        "dashboard",
    }
    assert set().union(*chart_queries.values()) == {
        "gpu_admission_admission_duration_seconds_bucket",
        "gpu_admission_admission_duration_seconds_count",
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


def test_every_metric_the_chart_queries_is_exported(
    chart_queries: dict[str, set[str]], exported: tuple[set[str], set[str]]
) -> None:
    families, sample_names = exported
    for where, names in chart_queries.items():
        for name in sorted(names):
            # A counter's family is named without `_total`; histogram series carry a suffix.
            family = re.sub(r"_(total|bucket|count|sum)$", "", name)
            assert family in families, f"{where}: {name} is not exported"
            if name.endswith(("_bucket", "_count", "_sum")):
                assert name in sample_names, f"{where}: {name} has no sample"


def test_admissions_are_counted_under_the_names_the_chart_uses(exported: tuple[set[str], set[str]]) -> None:
    _families, sample_names = exported
    assert {
        "gpu_admission_admission_duration_seconds_bucket",
        "gpu_admission_admission_duration_seconds_count",
        "gpu_admission_decisions_total",
        "gpu_admission_requests_in_flight",
        "gpu_admission_cache_stale",
        "gpu_admission_snapshot_age_seconds",
        "gpu_admission_quota_used",
        "gpu_admission_quota_limit",
        "gpu_admission_gpus_allocated",
        "gpu_admission_gpus_free",
        "gpu_admission_certificate_expiry_seconds",
    } <= sample_names


def test_every_label_the_chart_groups_by_is_exported(chart_exprs: dict[str, list[str]], metrics_text: str) -> None:
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    checked = 0
    for where, exprs in chart_exprs.items():
        for expr in exprs:
            grouped = {g.strip() for found in re.findall(r"by \(([^)]*)\)", expr) for g in found.split(",")}
            offered = set().union(*(labels.get(name, set()) for name in METRIC.findall(expr)))
            assert grouped <= offered, f"{where}: {expr} groups by {sorted(grouped - offered)}, not exported"
            checked += len(grouped)
    assert checked >= 10
