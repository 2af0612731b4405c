"""The record key made once in the cluster, for renders that cannot read it back.

The chart renders the key's Secret itself where it can look the old one up (helm install and upgrade).
A render without access to the cluster (helm template, GitOps tools) cannot, and a key made anew by each
render would change on every sync, leaving records sealed before it unverifiable. There the chart's
certificate Job makes the Secret instead: created only when absent, never changed afterwards, so every
replica and every later sync reads the one key."""

from __future__ import annotations

import base64
import secrets

from webhook.errors import UserError

from .secret import ApiError, CertificateApi, Report, _call, _decoded

KEY = "record.key"
MIN_BYTES = 16  # what `serve` accepts
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def ensure_record_key(api: CertificateApi, namespace: str, name: str, report: Report) -> str:
    """"kept" when the Secret holds a usable key, "created" when this call made it."""
    where = f"Secret {namespace}/{name}"
    existing = _call(where, "read it", lambda: api.read_secret(namespace, name))
    if existing is None:
        key = "".join(secrets.choice(_ALPHABET) for _ in range(48))
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/component": "webhook",
                                        "app.kubernetes.io/part-of": "gpu-admission"}},
                "data": {KEY: base64.b64encode(key.encode()).decode()}}
        try:
            api.create_secret(namespace, body)
        except ApiError as error:
            if error.status != 409:
                raise UserError(f"{where}: cannot create it: {error}") from None
            report(f"{where}: made by someone else meanwhile; keeping theirs")
            existing = _call(where, "read it", lambda: api.read_secret(namespace, name))
        else:
            report(f"{where}: created with a new record key")
            return "created"
    key_bytes = _decoded(existing).get(KEY, b"")
    if len(key_bytes) < MIN_BYTES:
        raise UserError(f"{where}: exists but holds no usable {KEY} ({MIN_BYTES} bytes or more); it is left as "
                        "it is: delete it to have a new key made, or put one there")
    report(f"{where}: kept (a record key is there)")
    return "kept"

