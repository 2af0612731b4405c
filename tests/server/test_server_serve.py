"""`gpu-admission serve` wiring: argument checks, certificates made on first start, the snapshot source."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from server_support import cluster_objects

from webhook.commands import serve
from webhook.errors import UserError
from webhook.server.source import StaticSource


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_one_worker_with_threads() -> None:
    args = parse()
    assert (serve._binds(args), args.workers, args.threads, args.tls_min, args.cert_dir) == (
        ["0.0.0.0:8443"],
        1,
        8,
        "1.2",
        "certs",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--bind", "8443"], "--bind must be HOST:PORT, got '8443'"),
        (["--bind", "0.0.0.0:99999"], "--bind must be HOST:PORT, got '0.0.0.0:99999'"),
    ],
)
def test_bad_numbers_are_user_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UserError) as caught:
        serve._check_numbers(parse(*argv))
    assert str(caught.value) == message


def test_several_workers_with_a_static_snapshot_are_refused() -> None:
    with pytest.raises(UserError) as caught:
        serve._source_factory(parse("--workers", "2"), "gpu-admission")
    assert str(caught.value) == (
        "--workers 2: with a static snapshot each worker process would keep its own reservations and admit "
        "past a quota; use --workers 1 with --threads instead"
    )


def test_cluster_files_become_a_static_source(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()}))
    source = serve._source_factory(parse("--cluster", str(path)), "gpu-admission")()
    assert isinstance(source, StaticSource)
    assert sorted(source.snapshot().nodes) == ["gpu-a", "gpu-b"]
    assert source.ready() == (True, f"cluster files {path}: 2 nodes, 0 reservations")


def test_without_cluster_files_the_demo_is_served() -> None:
    source = serve._source_factory(parse(), "gpu-admission")()
    ready, why = source.ready()
    assert ready and why.startswith("embedded demo cluster: ") and len(source.snapshot().nodes) > 0


def test_development_certificates_are_made_when_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert_dir = tmp_path / "certs"
    files = serve._tls_files(parse("--cert-dir", str(cert_dir)), "gpu-admission")
    assert (files.cert_file, files.key_file, files.client_ca, files.min_version) == (
        str(cert_dir / "tls.crt"),
        str(cert_dir / "tls.key"),
        None,
        "1.2",
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"no certificate in {cert_dir}: made a development CA and serving certificate; "
        f"the CA is {(cert_dir / 'ca.crt').resolve()}"
    ]


def test_missing_client_ca_and_broken_pairs_are_user_errors(tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    with pytest.raises(UserError, match=r"^/nonexistent/ca.crt: --client-ca file not found$"):
        serve._tls_files(parse("--cert-dir", str(cert_dir), "--client-ca", "/nonexistent/ca.crt"), "ns")
    (cert_dir / "tls.key").write_text("garbage")
    with pytest.raises(UserError, match=r"tls.key: cannot load the certificate pair"):
        serve._tls_files(parse("--cert-dir", str(cert_dir)), "ns")


def test_reservations_default_to_memory_and_reach_the_live_source(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def build_source(**kwargs: Any) -> str:
        calls.append(kwargs)
        return "live"

    monkeypatch.setattr(serve, "_live_source_builder", lambda: build_source)
    monkeypatch.delenv("GPU_ADMISSION_RESERVATIONS", raising=False)
    assert serve._source_factory(parse("--in-cluster"), "gpu-admission")() == "live"
    assert serve._source_factory(parse("--in-cluster", "--reservations", "api", "--workers", "2"), "ns")() == "live"
    monkeypatch.setenv("GPU_ADMISSION_RESERVATIONS", "api")
    kubeconfig = parse("--kubeconfig", "kc", "--context", "c", "--ledger-budget", "9")
    assert serve._source_factory(kubeconfig, "ns")() == "live"
    assert calls == [
        {
            "kubeconfig": None,
            "context": None,
            "in_cluster": True,
            "namespace": "gpu-admission",
            "policy_file": None,
            "reservations": "memory",
            "ledger_budget_seconds": 3.5,
            "peer_url": None,
        },
        {
            "kubeconfig": None,
            "context": None,
            "in_cluster": True,
            "namespace": "ns",
            "policy_file": None,
            "reservations": "api",
            "ledger_budget_seconds": 3.5,
            "peer_url": None,
        },
        {
            "kubeconfig": "kc",
            "context": "c",
            "in_cluster": False,
            "namespace": "ns",
            "policy_file": None,
            "reservations": "api",
            "ledger_budget_seconds": 9.0,
            "peer_url": None,
        },
    ]


def test_the_live_source_is_built_with_the_chosen_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `build_source` (not started) gets the store `--reservations` names."""
    from webhook.cluster import source as live
    from webhook.cluster.reservations import ApiStore, InProcessStore

    monkeypatch.setattr("webhook.cluster.config.load_api_client", lambda *a, **k: object())
    monkeypatch.setattr("webhook.cluster.kube.KubeLister.__init__", lambda self, api_client: None)

    def build(**kwargs: Any) -> Any:
        return live.build_source(**kwargs, start=False, freeze_gc=False)

    monkeypatch.setattr(serve, "_live_source_builder", lambda: build)
    memory = serve._source_factory(parse("--in-cluster"), "gpu-admission")()
    api = serve._source_factory(parse("--in-cluster", "--reservations=api"), "gpu-admission")()
    assert isinstance(memory.ledger.store, InProcessStore)
    assert isinstance(api.ledger.store, ApiStore)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--cluster", "x.yaml", "--reservations", "api"],
            "--reservations api needs the live cluster (--in-cluster or --kubeconfig, without --cluster): "
            "answering from --cluster files, reservations stay in this process",
        ),
        (
            ["--in-cluster", "--cluster", "x.yaml", "--reservations", "api"],
            "--reservations api needs the live cluster (--in-cluster or --kubeconfig, without --cluster): "
            "answering from --cluster files, reservations stay in this process",
        ),
        (
            ["--reservations", "api"],
            "--reservations api needs the live cluster (--in-cluster or --kubeconfig, without --cluster): "
            "answering from the embedded demo cluster, reservations stay in this process",
        ),
        (
            ["--in-cluster", "--workers", "3"],
            "--workers 3 with --reservations memory: each worker process would keep its own reservations and "
            "admit past a quota; use --reservations api or --workers 1",
        ),
    ],
)
def test_reservation_stores_that_cannot_work_are_refused(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "_live_source_builder", lambda: lambda **kwargs: pytest.fail("no source expected"))
    monkeypatch.delenv("GPU_ADMISSION_RESERVATIONS", raising=False)
    with pytest.raises(UserError) as caught:
        serve._source_factory(parse(*argv), "gpu-admission")
    assert str(caught.value) == message


def test_a_bad_reservations_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADMISSION_RESERVATIONS", "redis")
    with pytest.raises(UserError) as caught:
        serve._source_factory(parse("--in-cluster"), "gpu-admission")
    assert str(caught.value) == "$GPU_ADMISSION_RESERVATIONS must be memory, api or leader, got 'redis'"


def test_an_unknown_reservation_store_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--reservations", "redis")
    expected = "argument --reservations: invalid choice: 'redis' (choose from 'memory', 'api', 'leader')"
    assert expected in capsys.readouterr().err


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`gpu-admission` in a child process: what an operator sees, exit code and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *argv], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_cert_dir_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 300)
    result = run_cli("serve", "--cert-dir", str(too_long), "--bind", "127.0.0.1:1")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"gpu-admission serve: error: {too_long}: cannot read the certificate directory: File name too long\n"
    )


def test_a_cert_dir_without_permission_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    real_exists = Path.exists

    def exists(path: Path) -> bool:  # what a non-root process sees in a directory it may not search
        if path.parent == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_exists(path)

    monkeypatch.setattr(Path, "exists", exists)
    with pytest.raises(UserError) as caught:
        serve._tls_files(parse("--cert-dir", str(locked)), "ns")
    assert str(caught.value) == f"{locked}: cannot read the certificate directory: Permission denied"


def test_a_cert_dir_that_is_a_file_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError) as caught:
        serve._tls_files(parse("--cert-dir", str(tmp_path / "file")), "ns")
    assert str(caught.value).startswith(f"{tmp_path / 'file'}: cannot create directory: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory: covered by the PermissionError test above")
def test_a_cert_dir_without_permission_as_a_real_user(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        result = run_cli("serve", "--cert-dir", str(locked), "--bind", "127.0.0.1:1")
    finally:
        locked.chmod(0o700)
    assert (result.returncode, result.stderr) == (
        2,
        f"gpu-admission serve: error: {locked}: cannot read the certificate directory: Permission denied\n",
    )


def test_the_worker_builds_one_policy_holder_for_the_app_and_the_live_source(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from webhook.cluster.cache import ClusterCache
    from webhook.cluster.reservations import InProcessStore, Ledger
    from webhook.cluster.source import LiveSource
    from webhook.policyfile.holder import PolicyHolder
    from webhook.server.app import EXTENSION, ServerConfig, create_app

    built: list[LiveSource] = []

    def build_source(**kwargs: Any) -> LiveSource:
        holder = kwargs["policy"]
        built.append(LiveSource(ClusterCache(), Ledger(InProcessStore()), holder.get))
        return built[-1]

    monkeypatch.setattr(serve, "_live_source_builder", lambda: build_source)
    path = tmp_path / "policy.yaml"
    path.write_text("defaults:\n  placement: binpack\n")
    holder = PolicyHolder(str(path), check_interval=0.0)
    source = serve._source_factory(parse("--in-cluster", "--policy", str(path)), "gpu-admission")(holder)
    app = create_app(ServerConfig(source=source, policy=holder))
    handler = app.extensions[EXTENSION]
    assert handler.policy is holder and built == [source]
    path.write_text("defaults:\n  placement: spread\n")
    os.utime(path, (2_000_000_000, 2_000_000_000))
    assert handler.policy.get().placement == source.policy().placement == "spread"  # one reload, seen by both


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("services:\n  web:\n    image: nginx\n", "not a Kubernetes object"),
        ("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n", "Node"),
    ],
)
def test_serve_refuses_cluster_files_that_are_no_cluster(tmp_path: Path, content: str, message: str) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(content)
    result = run_cli("serve", "--cluster", str(cluster), "--cert-dir", str(tmp_path / "certs"), "--bind", "127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert str(cluster) in result.stderr and message in result.stderr and "Traceback" not in result.stderr
