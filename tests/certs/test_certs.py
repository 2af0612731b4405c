"""`gpu-admission certs`: the CA and serving certificate, their names, key types, modes and renewal."""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.certs import authority as certs
from webhook.commands import certs as certs_command
from webhook.errors import UserError


def run_certs(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser()
    certs_command.add_arguments(parser)
    assert certs_command.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_writes_a_ca_and_a_serving_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    printed = run_certs(
        capsys, "--service", "gpu-admission", "--namespace", "gpu-system", "--out", str(out), "--days", "30"
    )
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert printed == base64.b64encode((out / "ca.crt").read_bytes()).decode() + "\n"
    for name in ("tls.key", "ca.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    ca, leaf = load(out / "ca.crt"), load(out / "tls.crt")
    leaf.verify_directly_issued_by(ca)
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(leaf.public_key().curve, ec.SECP256R1)
    assert isinstance(ca.public_key().curve, ec.SECP256R1)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "gpu-admission",
        "gpu-admission.gpu-system",
        "gpu-admission.gpu-system.svc",
        "gpu-admission.gpu-system.svc.cluster.local",
        "localhost",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    lifetime = leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=29, hours=23) < lifetime <= datetime.timedelta(days=30)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp file left behind


def test_renew_keeps_the_ca_and_replaces_the_leaf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--service", "wh", "--namespace", "ns", "--out", str(tmp_path))
    first_bundle = run_certs(capsys, *args)
    ca_before, leaf_before = (tmp_path / "ca.crt").read_bytes(), (tmp_path / "tls.crt").read_bytes()
    key_before = (tmp_path / "tls.key").read_bytes()
    assert run_certs(capsys, *args, "--renew") == first_bundle
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    assert (tmp_path / "tls.crt").read_bytes() != leaf_before
    assert (tmp_path / "tls.key").read_bytes() != key_before
    load(tmp_path / "tls.crt").verify_directly_issued_by(load(tmp_path / "ca.crt"))
    # Without --renew a new CA is made.
    assert run_certs(capsys, *args) != first_bundle


def test_renew_without_a_ca_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        certs.issue_certificates(tmp_path, "wh", "ns", renew=True)
    assert str(caught.value) == (
        f"{tmp_path / 'ca.crt'}: not found; --renew needs the CA made by an earlier `gpu-admission certs`"
    )


def test_renew_refuses_a_key_of_another_ca(tmp_path: Path) -> None:
    certs.issue_certificates(tmp_path / "a", "wh", "ns")
    certs.issue_certificates(tmp_path / "b", "wh", "ns")
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    with pytest.raises(UserError, match="ca.key: does not belong to .*ca.crt"):
        certs.issue_certificates(tmp_path / "a", "wh", "ns", renew=True)


def test_days_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    certs_command.add_arguments(parser)
    args = parser.parse_args(["--service", "s", "--namespace", "n", "--out", str(tmp_path), "--days", "0"])
    with pytest.raises(UserError, match="^--days must be at least 1, got 0$"):
        certs_command.run(args)


def test_dev_certificates_are_made_once(tmp_path: Path) -> None:
    paths, made = certs.ensure_dev_certificates(tmp_path / "certs", "gpu-admission", "gpu-admission")
    assert made and paths.cert.exists() and paths.key.exists() and paths.ca_cert.exists()
    before = paths.cert.read_bytes()
    again, made_again = certs.ensure_dev_certificates(tmp_path / "certs", "gpu-admission", "gpu-admission")
    assert (again, made_again) == (paths, False)
    assert paths.cert.read_bytes() == before


def test_a_lone_certificate_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    with pytest.raises(UserError, match=r"tls.crt: found without its pair \(tls.crt and tls.key go together\)"):
        certs.ensure_dev_certificates(tmp_path, "s", "n")
