"""A CA and a serving certificate for the webhook Service, ECDSA P-256, written atomically.

`gpu-admission certs` (commands/certs.py) makes them; `serve` calls `ensure_dev_certificates` to make a
development pair when its certificate directory is empty; secret.py keeps them in a Secret.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.errors import UserError

CERT, KEY, CA_CERT, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"
DEFAULT_DAYS = 365
DEFAULT_RENEW_BEFORE_DAYS = 30
CA_DAYS = 3650
CLOCK_SKEW = datetime.timedelta(minutes=5)

log = logging.getLogger("webhook.certs")


@dataclass(frozen=True)
class CertificatePaths:
    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / CERT

    @property
    def key(self) -> Path:
        return self.directory / KEY

    @property
    def ca_cert(self) -> Path:
        return self.directory / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.directory / CA_KEY

    def ca_bundle(self) -> str:
        """The base64 PEM of the CA, as `caBundle` in a webhook configuration wants it."""
        return base64.b64encode(self.ca_cert.read_bytes()).decode("ascii")


def subject_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        "localhost",
    ]


def issue_certificates(
    out: Path, service: str, namespace: str, *, days: int = DEFAULT_DAYS, renew: bool = False
) -> CertificatePaths:
    """Write a serving certificate (and a new CA unless `renew`); returns where they are."""
    paths = CertificatePaths(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{out}: cannot create directory: {err.strerror}") from None
    if renew:
        ca_key, ca_cert = _load_ca(paths)
    else:
        ca_key, ca_cert = make_ca(f"{service}.{namespace} webhook CA", max(CA_DAYS, days))
        _write(paths.ca_key, key_pem(ca_key), 0o600)
        _write(paths.ca_cert, cert_pem(ca_cert), 0o644)
    key, cert = make_serving_certificate(ca_key, ca_cert, subject_names(service, namespace), days)
    # Key first: a reader that sees the new certificate already finds the matching key.
    _write(paths.key, key_pem(key), 0o600)
    _write(paths.cert, cert_pem(cert), 0o644)
    return paths


def write_files(out: Path, files: dict[str, bytes]) -> None:
    """Write PEM files into `out` (made if absent); private keys readable by the owner only."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{out}: cannot create directory: {err.strerror}") from None
    for name in sorted(files, key=lambda n: n != KEY):  # the key before the certificate, as below
        _write(out / name, files[name], 0o600 if name in (KEY, CA_KEY) else 0o644)


def ensure_dev_certificates(directory: Path, service: str, namespace: str) -> tuple[CertificatePaths, bool]:
    """The pair in `directory`, made (self-signed CA included) when absent. True when it was made now."""
    paths = CertificatePaths(directory)
    has_cert, has_key = _present(paths.cert), _present(paths.key)
    if has_cert and has_key:
        return paths, False
    if has_cert != has_key:
        present = paths.cert if has_cert else paths.key
        raise UserError(f"{present}: found without its pair ({CERT} and {KEY} go together)")
    issue_certificates(directory, service, namespace)
    return paths, True


def _present(path: Path) -> bool:
    """Whether `path` exists; a directory that cannot be searched is the user's to fix, not a traceback."""
    try:
        return path.exists()
    except OSError as err:
        raise UserError(f"{path.parent}: cannot read the certificate directory: {err.strerror}") from None


def make_ca(common_name: str, days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_serving_certificate(ca_key: Any, ca_cert: Any, names: list[str], days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2] if len(names) > 2 else names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _key_usage(*, cert_sign: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _load_ca(paths: CertificatePaths) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    for required in (paths.ca_cert, paths.ca_key):
        if not required.exists():
            raise UserError(f"{required}: not found; --renew needs the CA made by an earlier `gpu-admission certs`")
    try:
        cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    except ValueError:
        raise UserError(f"{paths.ca_cert}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise UserError(f"{paths.ca_key}: not an unencrypted PEM private key") from None
    if key.public_key() != cert.public_key():
        raise UserError(f"{paths.ca_key}: does not belong to {paths.ca_cert}")
    return key, cert


def key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write(path: Path, data: bytes, mode: int) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old file or the new one, never half."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        raise UserError(f"{path}: cannot write: {err.strerror}") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UserError(f"{path}: cannot write: {err.strerror}") from None
