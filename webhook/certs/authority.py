"""`gpu-admission certs`: a CA and a serving certificate for the webhook Service, written atomically.

ECDSA P-256 throughout. `--renew` keeps the CA (so the caBundle in the webhook configurations stays
valid) and replaces only the serving certificate. `--secret` keeps them in a Secret instead, renewing
only when due (`certsecret.py`, the chart's certificate Job). `serve` calls `ensure_dev_certificates`
to make a development pair when its certificate directory is empty.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import sys
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

log = logging.getLogger("webhook.certs.authority")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Make a CA and a serving certificate for the webhook Service and print the base64 caBundle. "
        "With --secret the pair lives in a kubernetes.io/tls Secret: a usable CA there is reused and a "
        "serving certificate with more than --renew-before-days left is kept, so running it again changes "
        "nothing until renewal is due. --patch-webhook puts the CA into the webhook configurations."
    )
    parser.add_argument("--service", required=True, help="name of the webhook's Service")
    parser.add_argument("--namespace", required=True, help="namespace of the Service (and of --secret)")
    parser.add_argument(
        "--out", metavar="DIR", help="directory for tls.crt, tls.key, ca.crt, ca.key (with --secret: a copy)"
    )
    parser.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"serving certificate lifetime (default {DEFAULT_DAYS})",
    )
    parser.add_argument(
        "--renew",
        action="store_true",
        help="keep the CA in DIR (ca.crt, ca.key) and replace only the serving certificate (without --secret)",
    )
    parser.add_argument(
        "--secret", metavar="NAME", help="keep the certificates in this Secret of --namespace (read, then written)"
    )
    parser.add_argument(
        "--renew-before-days",
        type=int,
        metavar="D",
        help=f"with --secret: issue a new serving certificate once D days or fewer remain "
        f"(default {DEFAULT_RENEW_BEFORE_DAYS}, at most half of --days)",
    )
    parser.add_argument(
        "--patch-webhook",
        action="append",
        default=[],
        metavar="NAME",
        help="set caBundle in the Mutating- and ValidatingWebhookConfiguration NAME on the webhooks that call "
        "--service in --namespace (repeatable; a configuration that does not exist yet is skipped)",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def run(args: argparse.Namespace, api: Any = None) -> int:
    """`api`: a `certsecret.CertificateApi` (tests); None builds one from --kubeconfig or the pod's account."""
    renew_before = _check_arguments(args)
    if args.secret:
        from .secret import sync_secret

        api = api or _kubernetes_api(args)
        outcome = sync_secret(
            api,
            args.namespace,
            args.secret,
            args.service,
            days=args.days,
            renew_before_days=renew_before,
            report=_report,
        )
        if args.out:
            write_files(Path(args.out), outcome.material.files())
        bundle = outcome.material.ca_bundle()
    else:
        paths = issue_certificates(Path(args.out), args.service, args.namespace, days=args.days, renew=args.renew)
        bundle = paths.ca_bundle()
    if args.patch_webhook:
        from .secret import patch_webhooks

        api = api or _kubernetes_api(args)
        patch_webhooks(api, args.patch_webhook, args.service, args.namespace, bundle, report=_report)
    print(bundle)
    return 0


def _check_arguments(args: argparse.Namespace) -> int:
    """The renewal margin in days, after checking the options fit together."""
    if args.days < 1:
        raise UserError(f"--days must be at least 1, got {args.days}")
    if not args.out and not args.secret:
        raise UserError("give --out DIR, --secret NAME, or both")
    if args.secret and args.renew:
        raise UserError("--renew is for --out without --secret: with --secret a usable CA is always reused")
    if args.renew_before_days is None:
        return min(DEFAULT_RENEW_BEFORE_DAYS, int(args.days) // 2)
    if not args.secret:
        raise UserError("--renew-before-days applies to --secret only")
    if not 0 <= args.renew_before_days < args.days:
        raise UserError(
            f"--renew-before-days must be from 0 to less than --days ({args.days}), got {args.renew_before_days}"
        )
    return int(args.renew_before_days)


def _kubernetes_api(args: argparse.Namespace) -> Any:
    from webhook.cluster.config import load_api_client

    from .secret import KubernetesCertificateApi

    return KubernetesCertificateApi(load_api_client(args.kubeconfig, args.context))


def _report(message: str) -> None:
    print(f"gpu-admission certs: {message}", file=sys.stderr, flush=True)


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
