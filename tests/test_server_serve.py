"""`gpu-admission serve` wiring: argument checks, certificates made on first start, the snapshot source."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from server_support import cluster_objects

from webhook import serve
from webhook.errors import UserError
from webhook.server.source import StaticSource


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_one_worker_with_threads() -> None:
    args = parse()
    assert (args.bind, args.workers, args.threads, args.tls_min, args.cert_dir) == (
        "0.0.0.0:8443",
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
