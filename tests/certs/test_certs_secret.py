"""`gpu-admission certs --secret ... --patch-webhook ...`, the chart's certificate Job, against a fake API.

No API server runs here. `FakeApi` keeps Secrets and webhook configurations as the API server would
(resourceVersion preconditions with 409 Conflict, 404 for what does not exist, JSON patches applied with
`jsonpatch`, a failed `test` op as 422) and records every call, so the tests assert exactly what the
command reads and writes. The real kubernetes-client boundary is exercised over HTTP in
test_certs_secret_http.py.
"""

from __future__ import annotations

import argparse
import base64
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from fake_certificate_api import (
    CONFIG,
    MUTATING,
    NS,
    SECRET,
    SERVICE,
    VALIDATING,
    FakeApi,
    chart_args,
    install_configs,
    webhook,
)

from webhook.certs import authority as certs
from webhook.certs.secret import ApiError, ca_bundle_patch
from webhook.commands import certs as certs_command
from webhook.errors import UserError

SANS = [SERVICE, f"{SERVICE}.{NS}", f"{SERVICE}.{NS}.svc", f"{SERVICE}.{NS}.svc.cluster.local", "localhost"]










def run(api: FakeApi, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, list[str]]:
    """(stdout, stderr lines) of one run; the command must succeed."""
    parser = argparse.ArgumentParser()
    certs_command.add_arguments(parser)
    api.calls.clear()
    assert certs_command.run(parser.parse_args(argv), api=api) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err.splitlines()


def fail(api: FakeApi, argv: list[str]) -> str:
    parser = argparse.ArgumentParser()
    certs_command.add_arguments(parser)
    with pytest.raises(UserError) as caught:
        certs_command.run(parser.parse_args(argv), api=api)
    return str(caught.value)


def cert_of(files: dict[str, bytes], name: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(files[name])


def days_left(cert: x509.Certificate) -> float:
    return (cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).total_seconds() / 86400


def seed_secret(api: FakeApi, files: dict[str, bytes], type_: str = "kubernetes.io/tls") -> None:
    api.put_secret(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NS, "labels": {"team": "platform"}},
            "type": type_,
            "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
        }
    )


def pair(tmp_path: Path, days: int, service: str = SERVICE) -> dict[str, bytes]:
    """A CA and serving certificate as `gpu-admission certs --out` makes them."""
    out = tmp_path / f"pair-{days}-{service}"
    certs.issue_certificates(out, service, NS, days=days)
    return {name: (out / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt", "ca.key")}


def test_fresh_install_creates_the_secret_and_skips_configurations_not_made_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi()
    out, err = run(api, chart_args(tmp_path / "out"), capsys)
    assert api.calls == [
        ("read", f"Secret {NS}/{SECRET}"),
        ("create", f"Secret {NS}/{SECRET}"),
        ("read", f"{MUTATING} {CONFIG}"),
        ("read", f"{VALIDATING} {CONFIG}"),
    ]
    secret = api.secrets[(NS, SECRET)]
    assert (secret["type"], sorted(secret["data"])) == ("kubernetes.io/tls", ["ca.crt", "ca.key", "tls.crt", "tls.key"])
    files = api.secret_files()
    ca, leaf = cert_of(files, "ca.crt"), cert_of(files)
    leaf.verify_directly_issued_by(ca)
    assert (
        leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        == SANS
    )
    assert 364.9 < days_left(leaf) <= 365
    assert out == base64.b64encode(files["ca.crt"]).decode() + "\n"
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == files
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()} == {
        "tls.crt": 0o644,
        "tls.key": 0o600,
        "ca.crt": 0o644,
        "ca.key": 0o600,
    }
    assert err[0] == f"gpu-admission certs: secret {NS}/{SECRET}: no CA yet; making a new CA and serving certificate"
    assert err[1].startswith(f"gpu-admission certs: secret {NS}/{SECRET}: created, serving certificate valid until ")
    assert err[2:] == [
        f"gpu-admission certs: {MUTATING} {CONFIG}: not found, skipped (it is patched once it exists)",
        f"gpu-admission certs: {VALIDATING} {CONFIG}: not found, skipped (it is patched once it exists)",
    ]


def test_post_install_keeps_the_secret_and_patches_only_the_webhooks_of_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi()
    first, _ = run(api, chart_args(), capsys)  # pre-install
    version = api.secrets[(NS, SECRET)]["metadata"]["resourceVersion"]
    install_configs(api, ca_bundle="c3RhbGU=")  # helm creates them, with a stale bundle
    second, err = run(api, chart_args(), capsys)  # post-install
    assert second == first
    bundle = first.strip()
    assert api.secrets[(NS, SECRET)]["metadata"]["resourceVersion"] == version  # not written again
    assert api.calls == [
        ("read", f"Secret {NS}/{SECRET}"),
        ("read", f"{MUTATING} {CONFIG}"),
        ("patch", f"{MUTATING} {CONFIG}"),
        ("read", f"{VALIDATING} {CONFIG}"),
        ("patch", f"{VALIDATING} {CONFIG}"),
    ]
    bundles = {
        hook["name"]: hook["clientConfig"]["caBundle"]
        for kind in (MUTATING, VALIDATING)
        for hook in api.configs[(kind, CONFIG)]["webhooks"]
    }
    assert bundles == {
        "mutate-pods.gpu-admission.io": bundle,
        "validate-pods.gpu-admission.io": bundle,
        "other.example.com": "b3RoZXI=",
        "validate-inventories.gpu-admission.io": bundle,
    }
    assert err[1:] == [
        f"gpu-admission certs: {MUTATING} {CONFIG}: caBundle set on 1 of 1 webhook(s)",
        f"gpu-admission certs: {VALIDATING} {CONFIG}: caBundle set on 2 of 2 webhook(s)",
    ]
    # The daily CronJob run: nothing to renew, nothing to patch, nothing written.
    third, err = run(api, chart_args(), capsys)
    assert third == first
    assert [verb for verb, _ in api.calls] == ["read", "read", "read"]
    assert err[0].startswith(f"gpu-admission certs: secret {NS}/{SECRET}: serving certificate valid until ")
    assert err[0].endswith(", kept")
    assert err[1:] == [
        f"gpu-admission certs: {MUTATING} {CONFIG}: caBundle already current",
        f"gpu-admission certs: {VALIDATING} {CONFIG}: caBundle already current",
    ]


def test_a_certificate_close_to_expiry_is_renewed_with_the_same_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi()
    old = pair(tmp_path, days=59)
    seed_secret(api, old)
    install_configs(api, ca_bundle=base64.b64encode(old["ca.crt"]).decode())
    out, err = run(api, chart_args(), capsys)
    new = api.secret_files()
    assert (new["ca.crt"], new["ca.key"]) == (old["ca.crt"], old["ca.key"])
    assert new["tls.key"] != old["tls.key"]
    cert_of(new).verify_directly_issued_by(cert_of(new, "ca.crt"))
    assert 364.9 < days_left(cert_of(new)) <= 365
    assert out == base64.b64encode(old["ca.crt"]).decode() + "\n"
    secret = api.secrets[(NS, SECRET)]
    assert secret["metadata"]["labels"] == {"team": "platform"}  # kept on replace
    assert api.calls == [
        ("read", f"Secret {NS}/{SECRET}"),
        ("replace", f"Secret {NS}/{SECRET}"),
        ("read", f"{MUTATING} {CONFIG}"),
        ("read", f"{VALIDATING} {CONFIG}"),
    ]  # same CA: the configurations are already right
    assert err[0] == (
        f"gpu-admission certs: secret {NS}/{SECRET}: the serving certificate expires in 58 days (renewed 60 days "
        "before); issuing a new serving certificate with the same CA"
    )


def test_a_certificate_with_time_left_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    old = pair(tmp_path, days=62)
    seed_secret(api, old)
    run(api, chart_args(), capsys)
    assert api.secret_files() == old
    assert [verb for verb, _ in api.calls] == ["read", "read", "read"]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda f, other: f.pop("tls.crt"), "no tls.crt and tls.key"),
        (lambda f, other: f.update({"tls.key": other["tls.key"]}), "tls.key does not belong to tls.crt"),
        (
            lambda f, other: f.update({"tls.crt": other["tls.crt"], "tls.key": other["tls.key"]}),
            "tls.crt was not issued by the CA in ca.crt",
        ),
        (lambda f, other: f.update({"tls.crt": b"garbage"}), "tls.crt or tls.key is not readable PEM"),
    ],
)
def test_the_ca_is_reused_whatever_is_wrong_with_the_serving_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[..., Any], problem: str
) -> None:
    api = FakeApi()
    files = pair(tmp_path, days=300)
    damage(files, pair(tmp_path, days=300, service="other"))
    seed_secret(api, files)
    _, err = run(api, chart_args(), capsys)
    new = api.secret_files()
    assert new["ca.crt"] == files["ca.crt"]
    cert_of(new).verify_directly_issued_by(cert_of(new, "ca.crt"))
    assert err[0] == (
        f"gpu-admission certs: secret {NS}/{SECRET}: {problem}; issuing a new serving certificate with the same CA"
    )


def test_a_certificate_for_another_service_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    seed_secret(api, pair(tmp_path, days=300, service="old-name"))
    _, err = run(api, chart_args(), capsys)
    assert err[0] == (
        f"gpu-admission certs: secret {NS}/{SECRET}: the serving certificate does not name {', '.join(SANS[:4])}; "
        "issuing a new serving certificate with the same CA"
    )
    names = cert_of(api.secret_files()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == SANS


def test_an_unusable_ca_is_replaced_and_the_new_bundle_patched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi()
    files, other = pair(tmp_path, days=300), pair(tmp_path, days=300, service="other")
    files["ca.key"] = other["ca.key"]
    seed_secret(api, files)
    install_configs(api, ca_bundle=base64.b64encode(files["ca.crt"]).decode())
    out, err = run(api, chart_args(), capsys)
    new = api.secret_files()
    assert new["ca.crt"] not in (files["ca.crt"], other["ca.crt"])
    assert out == base64.b64encode(new["ca.crt"]).decode() + "\n"
    assert err[0] == (
        f"gpu-admission certs: secret {NS}/{SECRET}: ca.key does not belong to ca.crt; "
        "making a new CA and serving certificate"
    )
    assert [verb for verb, _ in api.calls] == ["read", "replace", "read", "patch", "read", "patch"]


def test_a_conflicting_write_is_retried_on_a_fresh_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    seed_secret(api, pair(tmp_path, days=5))
    interfered: list[str] = []

    def someone_else_writes() -> None:
        if not interfered:  # once: bump the resourceVersion, as a concurrent update would
            interfered.append("x")
            api.put_secret(api.secrets[(NS, SECRET)])

    api.before_write = someone_else_writes
    _, err = run(api, chart_args(), capsys)
    assert api.calls[:4] == [
        ("read", f"Secret {NS}/{SECRET}"),
        ("replace", f"Secret {NS}/{SECRET}"),
        ("read", f"Secret {NS}/{SECRET}"),
        ("replace", f"Secret {NS}/{SECRET}"),
    ]
    assert err[1] == (
        f"gpu-admission certs: secret {NS}/{SECRET}: changed by someone else meanwhile (409 Conflict); reading it again"
    )
    assert days_left(cert_of(api.secret_files())) > 364


def test_a_secret_created_meanwhile_by_another_run_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    theirs = pair(tmp_path, days=300)

    def another_job_creates_it() -> None:
        api.before_write = None
        seed_secret(api, theirs)

    api.before_write = another_job_creates_it
    out, _ = run(api, chart_args(), capsys)
    assert api.secret_files() == theirs
    assert out == base64.b64encode(theirs["ca.crt"]).decode() + "\n"
    assert [verb for verb, _ in api.calls] == ["read", "create", "read", "read", "read"]


def test_endless_conflicts_end_in_one_line(tmp_path: Path) -> None:
    api = FakeApi()
    seed_secret(api, pair(tmp_path, days=5))
    api.before_write = lambda: api.put_secret(api.secrets[(NS, SECRET)])
    assert fail(api, chart_args()) == (
        f"secret {NS}/{SECRET}: still changed by someone else after 5 attempts (409 Conflict)"
    )
    assert [verb for verb, _ in api.calls] == ["read", "replace"] * 5


def test_a_patch_that_finds_the_webhooks_moved_is_retried(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    run(api, chart_args(), capsys)
    install_configs(api)
    moved: list[bool] = []

    def someone_reorders_the_webhooks() -> None:
        if api.calls[-1] == ("patch", f"{VALIDATING} {CONFIG}") and not moved:
            moved.append(True)
            hooks = api.configs[(VALIDATING, CONFIG)]["webhooks"]
            hooks.insert(0, hooks.pop())

    api.before_write = someone_reorders_the_webhooks
    _, err = run(api, chart_args(), capsys)
    assert [verb for verb, _ in api.calls] == ["read", "read", "patch", "read", "patch", "read", "patch"]
    assert err[2].startswith(f"gpu-admission certs: {VALIDATING} {CONFIG}: changed meanwhile (HTTP 422 Invalid: ")
    assert err[3] == f"gpu-admission certs: {VALIDATING} {CONFIG}: caBundle set on 2 of 2 webhook(s)"
    bundle = base64.b64encode(api.secret_files()["ca.crt"]).decode()
    hooks = {h["name"]: h["clientConfig"].get("caBundle") for h in api.configs[(VALIDATING, CONFIG)]["webhooks"]}
    assert hooks == {
        "validate-inventories.gpu-admission.io": bundle,
        "validate-pods.gpu-admission.io": bundle,
        "other.example.com": "b3RoZXI=",
    }


def test_the_patch_is_guarded_and_touches_only_what_differs() -> None:
    config = {
        "webhooks": [
            webhook("a", ca_bundle="Y3VycmVudA=="),
            webhook("b", namespace="elsewhere"),
            webhook("c"),
        ]
    }
    assert ca_bundle_patch(config, SERVICE, NS, "Y3VycmVudA==") == (
        [
            {"op": "test", "path": "/webhooks/2/name", "value": "c"},
            {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "Y3VycmVudA=="},
        ],
        2,
    )
    assert ca_bundle_patch({"webhooks": [webhook("b", service="x")]}, SERVICE, NS, "Y3VycmVudA==") == ([], 0)


def test_a_configuration_without_the_service_is_left_alone(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    api.configs[(MUTATING, CONFIG)] = {"metadata": {"name": CONFIG}, "webhooks": [webhook("x", service="other")]}
    _, err = run(api, chart_args(), capsys)
    assert ("patch", f"{MUTATING} {CONFIG}") not in api.calls
    assert f"gpu-admission certs: {MUTATING} {CONFIG}: no webhook calls service {NS}/{SERVICE}, nothing to patch" in err


@pytest.mark.parametrize(
    ("verb", "message"),
    [
        ("read", f"secret {NS}/{SECRET}: cannot read: HTTP 403 Forbidden: secrets is forbidden"),
        ("create", f"secret {NS}/{SECRET}: cannot create: HTTP 403 Forbidden: secrets is forbidden"),
        ("patch", f"{MUTATING} {CONFIG}: cannot patch: HTTP 403 Forbidden: secrets is forbidden"),
    ],
)
def test_api_failures_are_one_line(verb: str, message: str) -> None:
    api = FakeApi()
    install_configs(api)
    api.fail[verb] = ApiError(403, "Forbidden: secrets is forbidden")
    assert fail(api, chart_args()) == message


def test_an_unreachable_api_server_is_one_line() -> None:
    api = FakeApi()
    api.fail["read"] = ApiError(0, "cannot reach the API server: MaxRetryError: connection refused")
    assert fail(api, chart_args()) == (
        f"secret {NS}/{SECRET}: cannot read: cannot reach the API server: MaxRetryError: connection refused"
    )


def test_a_secret_of_another_type_is_not_overwritten(tmp_path: Path) -> None:
    api = FakeApi()
    seed_secret(api, {"password": b"x"}, type_="Opaque")
    assert fail(api, chart_args()) == (
        f"secret {NS}/{SECRET}: has type Opaque, not kubernetes.io/tls; delete it or choose another --secret"
    )
    assert [verb for verb, _ in api.calls] == ["read"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([f"--service={SERVICE}", f"--namespace={NS}"], "give --out DIR, --secret NAME, or both"),
        (
            [*chart_args(), "--renew"],
            "--renew is for --out without --secret: with --secret a usable CA is always reused",
        ),
        ([*chart_args(), "--days=60"], "--renew-before-days must be from 0 to less than --days (60), got 60"),
        (
            [*chart_args(), "--renew-before-days=-1"],
            "--renew-before-days must be from 0 to less than --days (365), got -1",
        ),
        (
            [f"--service={SERVICE}", f"--namespace={NS}", "--out=/tmp/x", "--renew-before-days=3"],
            "--renew-before-days applies to --secret only",
        ),
    ],
)
def test_options_that_do_not_fit_together(argv: list[str], message: str) -> None:
    api = FakeApi()
    assert fail(api, argv) == message
    assert api.calls == []


def test_out_alone_can_patch_the_configurations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    install_configs(api)
    argv = [f"--service={SERVICE}", f"--namespace={NS}", f"--out={tmp_path}", f"--patch-webhook={CONFIG}"]
    out, _ = run(api, argv, capsys)
    assert out == base64.b64encode((tmp_path / "ca.crt").read_bytes()).decode() + "\n"
    assert [verb for verb, _ in api.calls] == ["read", "patch", "read", "patch"]
    assert api.secrets == {}
