"""`gpu-admission certs --secret`: the webhook's certificate kept in a Secret, its CA in the webhook configurations.

Run by the chart before and after every install or upgrade and daily by a CronJob, so it is
idempotent: a serving certificate that still has long to live is kept, a usable CA is always reused
(the caBundle then never changes), and a configuration whose caBundle is already right is not written.
Every API call goes through `CertificateApi`, so the logic is tested against a fake.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from webhook.errors import UserError

from . import authority as certs

SECRET_TYPE = "kubernetes.io/tls"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
MAX_ATTEMPTS = 5

Report = Callable[[str], None]


class ApiError(Exception):
    """An API call that failed: HTTP status (0 when the server could not be reached) and a short reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}" if status else reason)
        self.status = status
        self.reason = reason


class CertificateApi(Protocol):
    """The API calls the command makes; reads return None for 404, every failure raises ApiError."""

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_secret(self, namespace: str, body: dict[str, Any]) -> None: ...

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...

    def read_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None: ...

    def patch_webhook_configuration(self, kind: str, name: str, patch: list[dict[str, Any]]) -> None: ...


@dataclass(frozen=True)
class Material:
    """The four PEM files the Secret holds."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_cert).decode("ascii")

    def files(self) -> dict[str, bytes]:
        return {certs.CERT: self.cert, certs.KEY: self.key, certs.CA_CERT: self.ca_cert, certs.CA_KEY: self.ca_key}


@dataclass(frozen=True)
class SecretOutcome:
    material: Material
    action: str
    """kept, created or replaced"""
    new_ca: bool


def sync_secret(
    api: CertificateApi,
    namespace: str,
    name: str,
    service: str,
    *,
    days: int,
    renew_before_days: int,
    report: Report,
    now: datetime.datetime | None = None,
) -> SecretOutcome:
    """Make Secret `name` hold a CA and a serving certificate for `service` valid beyond `renew_before_days`."""
    where = f"secret {namespace}/{name}"
    margin = datetime.timedelta(days=renew_before_days)
    for _attempt in range(MAX_ATTEMPTS):
        moment = now or datetime.datetime.now(datetime.UTC)
        secret = _call(where, "read", lambda: api.read_secret(namespace, name))
        data = _decoded(secret)
        ca, ca_problem = _usable_ca(data, moment + margin)
        if ca is not None:
            problem = _serving_problem(data, ca[1], certs.subject_names(service, namespace), moment, margin)
            if problem is None:
                report(f"{where}: serving certificate valid until {_expiry(data)}, kept")
                return SecretOutcome(_material(data), "kept", new_ca=False)
        if secret is not None and secret.get("type", SECRET_TYPE) != SECRET_TYPE:
            raise UserError(
                f"{where}: has type {secret.get('type')}, not {SECRET_TYPE}; delete it or choose another --secret"
            )
        if ca is not None:
            report(f"{where}: {problem}; issuing a new serving certificate with the same CA")
            ca_key, ca_cert = ca
        else:
            report(f"{where}: {ca_problem}; making a new CA and serving certificate")
            ca_key, ca_cert = certs.make_ca(f"{service}.{namespace} webhook CA", max(certs.CA_DAYS, days))
        key, cert = certs.make_serving_certificate(ca_key, ca_cert, certs.subject_names(service, namespace), days)
        material = Material(certs.cert_pem(ca_cert), certs.key_pem(ca_key), certs.cert_pem(cert), certs.key_pem(key))
        body = _secret_body(namespace, name, material, secret)
        try:
            if secret is None:
                api.create_secret(namespace, body)
            else:
                api.replace_secret(namespace, name, body)
        except ApiError as error:
            if error.status == 409:
                report(f"{where}: changed by someone else meanwhile (409 Conflict); reading it again")
                continue
            raise UserError(f"{where}: cannot {'create' if secret is None else 'replace'}: {error}") from None
        action = "created" if secret is None else "replaced"
        report(f"{where}: {action}, serving certificate valid until {_not_after(cert)}")
        return SecretOutcome(material, action, new_ca=ca is None)
    raise UserError(f"{where}: still changed by someone else after {MAX_ATTEMPTS} attempts (409 Conflict)")


def patch_webhooks(
    api: CertificateApi,
    names: Iterable[str],
    service: str,
    namespace: str,
    ca_bundle: str,
    *,
    report: Report,
) -> list[str]:
    """Set caBundle on every webhook calling `service` in `namespace`; returns the configurations written."""
    written: list[str] = []
    for name in names:
        for kind in WEBHOOK_KINDS:
            if _patch_one(api, kind, name, service, namespace, ca_bundle, report):
                written.append(f"{kind}/{name}")
    return written


def _patch_one(
    api: CertificateApi, kind: str, name: str, service: str, namespace: str, ca_bundle: str, report: Report
) -> bool:
    where = f"{kind} {name}"
    for _attempt in range(MAX_ATTEMPTS):
        config = _call(where, "read", lambda: api.read_webhook_configuration(kind, name))
        if config is None:
            report(f"{where}: not found, skipped (it is patched once it exists)")
            return False
        patch, matching = ca_bundle_patch(config, service, namespace, ca_bundle)
        if not matching:
            report(f"{where}: no webhook calls service {namespace}/{service}, nothing to patch")
            return False
        if not patch:
            report(f"{where}: caBundle already current")
            return False
        try:
            api.patch_webhook_configuration(kind, name, patch)
        except ApiError as error:
            if error.status in (409, 422):  # a webhook moved between read and patch: the test op failed
                report(f"{where}: changed meanwhile ({error}); reading it again")
                continue
            raise UserError(f"{where}: cannot patch: {error}") from None
        report(f"{where}: caBundle set on {len(patch) // 2} of {matching} webhook(s)")
        return True
    raise UserError(f"{where}: still changing after {MAX_ATTEMPTS} attempts")


def ca_bundle_patch(
    config: Mapping[str, Any], service: str, namespace: str, ca_bundle: str
) -> tuple[list[dict[str, Any]], int]:
    """A JSON patch setting caBundle where it differs, and how many webhooks call the service.

    Each change is guarded by a test of the webhook's name, so a list reordered since the read fails
    the patch instead of writing the wrong entry.
    """
    patch: list[dict[str, Any]] = []
    matching = 0
    for position, hook in enumerate(config.get("webhooks") or ()):
        client_config = hook.get("clientConfig") or {}
        target = client_config.get("service") or {}
        if target.get("name") != service or target.get("namespace") != namespace:
            continue
        matching += 1
        if client_config.get("caBundle") == ca_bundle:
            continue
        patch.append({"op": "test", "path": f"/webhooks/{position}/name", "value": hook.get("name")})
        patch.append({"op": "add", "path": f"/webhooks/{position}/clientConfig/caBundle", "value": ca_bundle})
    return patch, matching


class KubernetesCertificateApi:
    """`CertificateApi` over a kubernetes `ApiClient`, exchanging plain JSON (no generated models)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _json(lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False), missing=True)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        payload: Any = body  # the client takes a plain dict as readily as its V1Secret model
        _json(lambda: self.core.create_namespaced_secret(namespace, payload, _preload_content=False))

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        payload: Any = body
        _json(lambda: self.core.replace_namespaced_secret(name, namespace, payload, _preload_content=False))

    def read_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        read = getattr(self.admission, f"read_{_snake(kind)}")
        return _json(lambda: read(name, _preload_content=False), missing=True)

    def patch_webhook_configuration(self, kind: str, name: str, patch: list[dict[str, Any]]) -> None:
        write = getattr(self.admission, f"patch_{_snake(kind)}")
        _json(lambda: write(name, patch, _preload_content=False))  # a list body goes as application/json-patch+json


def _snake(kind: str) -> str:
    return {
        "MutatingWebhookConfiguration": "mutating_webhook_configuration",
        "ValidatingWebhookConfiguration": "validating_webhook_configuration",
    }[kind]


def _json(call: Callable[[], Any], *, missing: bool = False) -> dict[str, Any] | None:
    """The JSON of a call's response; None for a 404 when `missing`; ApiError for any failure."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = call()
    except ApiException as error:
        if missing and error.status == 404:
            return None
        raise ApiError(int(error.status or 0), _reason(error)) from None
    except Exception as error:  # connection refused, TLS, timeouts (urllib3 errors)
        raise ApiError(0, f"cannot reach the API server: {type(error).__name__}: {error}") from None
    data = response.data
    try:
        value = json.loads(data) if data else None
    except ValueError:
        raise ApiError(0, "the API server answered with something that is not JSON") from None
    return value if isinstance(value, dict) else None


def _reason(error: Any) -> str:
    try:
        message = json.loads(error.body).get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return f"{error.reason}: {message}" if message else str(error.reason)


def _call(where: str, verb: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ApiError as error:
        raise UserError(f"{where}: cannot {verb}: {error}") from None


def _decoded(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue  # unreadable entries count as absent
    return data


def _usable_ca(data: Mapping[str, bytes], needed_until: datetime.datetime) -> tuple[Any, str]:
    """((key, cert), "") when the Secret's CA can sign, and outlives `needed_until`; else (None, why not)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if certs.CA_CERT not in data or certs.CA_KEY not in data:
        return None, "no CA yet" if not data else f"no {certs.CA_CERT} and {certs.CA_KEY} in it"
    try:
        cert = x509.load_pem_x509_certificate(data[certs.CA_CERT])
        key = serialization.load_pem_private_key(data[certs.CA_KEY], password=None)
    except (ValueError, TypeError):
        return None, f"{certs.CA_CERT} or {certs.CA_KEY} is not readable PEM"
    if key.public_key() != cert.public_key():
        return None, f"{certs.CA_KEY} does not belong to {certs.CA_CERT}"
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        return None, f"{certs.CA_CERT} is not a CA certificate"
    if cert.not_valid_after_utc <= needed_until:
        return None, f"the CA expires on {cert.not_valid_after_utc:%Y-%m-%d}, within the renewal margin"
    return (key, cert), ""


def _serving_problem(
    data: Mapping[str, bytes],
    ca_cert: Any,
    names: list[str],
    now: datetime.datetime,
    margin: datetime.timedelta,
) -> str | None:
    """Why the Secret's serving certificate must be replaced, or None when it can stay."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if certs.CERT not in data or certs.KEY not in data:
        return f"no {certs.CERT} and {certs.KEY}"
    try:
        cert = x509.load_pem_x509_certificate(data[certs.CERT])
        key = serialization.load_pem_private_key(data[certs.KEY], password=None)
    except (ValueError, TypeError):
        return f"{certs.CERT} or {certs.KEY} is not readable PEM"
    if key.public_key() != cert.public_key():
        return f"{certs.KEY} does not belong to {certs.CERT}"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except Exception:  # InvalidSignature, or ValueError/TypeError for a mismatched issuer or key type
        return f"{certs.CERT} was not issued by the CA in {certs.CA_CERT}"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        present = set(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        present = set()
    missing = [n for n in names if n not in present]
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    if cert.not_valid_before_utc > now + certs.CLOCK_SKEW:
        return f"the serving certificate is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    left = cert.not_valid_after_utc - now
    if left <= margin:
        return f"the serving certificate expires in {max(left.days, 0)} days (renewed {margin.days} days before)"
    return None


def _material(data: Mapping[str, bytes]) -> Material:
    return Material(data[certs.CA_CERT], data[certs.CA_KEY], data[certs.CERT], data[certs.KEY])


def _expiry(data: Mapping[str, bytes]) -> str:
    from cryptography import x509

    return _not_after(x509.load_pem_x509_certificate(data[certs.CERT]))


def _not_after(cert: Any) -> str:
    return f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"


def _secret_body(namespace: str, name: str, material: Material, current: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Secret to write: the existing labels and annotations kept, its resourceVersion as precondition."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if current is not None:
        old = current.get("metadata") or {}
        for field in ("labels", "annotations", "resourceVersion"):
            if old.get(field):
                metadata[field] = old[field]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": SECRET_TYPE,
        "data": {k: base64.b64encode(v).decode("ascii") for k, v in material.files().items()},
    }
