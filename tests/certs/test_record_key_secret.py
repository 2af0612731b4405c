"""The record key the certificate Job makes for renders that cannot read the cluster: made once, kept by
every later run (each GitOps sync runs the Job again), never overwritten, and refused where unusable."""

from __future__ import annotations

import argparse
import base64

import pytest
from fake_certificate_api import NS, FakeApi

from webhook.certs.record_key import ensure_record_key
from webhook.certs.secret import ApiError
from webhook.cli import build_parser
from webhook.commands import certs
from webhook.errors import UserError

NAME = "gpu-gpu-admission-record-key"


def key_of(api: FakeApi) -> bytes:
    return base64.b64decode(api.secrets[(NS, NAME)]["data"]["record.key"])


def test_made_once_then_kept_by_every_later_run() -> None:
    api, said = FakeApi(), []
    assert ensure_record_key(api, NS, NAME, said.append) == "created"
    first = key_of(api)
    assert len(first) >= 32 and first.isalnum()
    for _ in range(3):
        assert ensure_record_key(api, NS, NAME, said.append) == "kept"
    assert key_of(api) == first
    assert [verb for verb, _ in api.calls].count("create") == 1 and "replace" not in dict(api.calls)


def test_two_jobs_at_once_keep_the_first_key() -> None:
    api = FakeApi()
    theirs = {"metadata": {"name": NAME, "namespace": NS},
              "data": {"record.key": base64.b64encode(b"k" * 40).decode()}}
    api.before_write = lambda: (api.put_secret(dict(theirs, metadata=dict(theirs["metadata"])))
                                if (NS, NAME) not in api.secrets else None)
    assert ensure_record_key(api, NS, NAME, lambda _: None) == "kept"
    assert key_of(api) == b"k" * 40


def test_a_secret_without_a_usable_key_is_left_alone_and_named() -> None:
    api = FakeApi()
    api.put_secret({"metadata": {"name": NAME, "namespace": NS},
                    "data": {"record.key": base64.b64encode(b"short").decode()}})
    with pytest.raises(UserError, match=f"Secret {NS}/{NAME}: exists but holds no usable record.key"):
        ensure_record_key(api, NS, NAME, lambda _: None)
    assert key_of(api) == b"short"


def test_a_refused_create_is_a_clear_error() -> None:
    api = FakeApi()
    api.fail["create"] = ApiError(403, "Forbidden")
    with pytest.raises(UserError, match="cannot create it: HTTP 403 Forbidden"):
        ensure_record_key(api, NS, NAME, lambda _: None)


def test_the_command_makes_only_the_key_when_asked_only_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    parser: argparse.ArgumentParser = build_parser()
    args = parser.parse_args(["certs", "--service", "svc", "--namespace", NS, "--record-key-secret", NAME])
    api = FakeApi()
    assert certs.run(args, api) == 0
    assert len(key_of(api)) >= 32 and all(target == f"Secret {NS}/{NAME}" for _, target in api.calls)
