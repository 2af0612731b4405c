"""The policy in force follows its file: re-read on change at most once a second; a bad edit is survived."""

from __future__ import annotations

import os
from pathlib import Path

from webhook.policyfile.holder import PolicyHolder


def touch(path: Path, text: str, mtime: int) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def loader(path: str | None) -> str:
    if path is None:
        return "defaults"
    text = Path(path).read_text()
    if text.startswith("bad"):
        raise ValueError(f"{path}: field placement: unknown policy {text!r}")
    return text


def test_without_a_file_the_defaults_hold() -> None:
    assert PolicyHolder(None, loader=loader).get() == "defaults"


def test_reloads_on_change_at_most_once_a_second(tmp_path: Path) -> None:
    now = [0.0]
    policy = tmp_path / "policy.yaml"
    touch(policy, "one", 1000)
    failures: list[str] = []
    holder = PolicyHolder(str(policy), loader=loader, clock=lambda: now[0], on_failure=failures.append)
    assert holder.get() == "one"
    touch(policy, "two", 2000)
    now[0] = 0.5
    assert holder.get() == "one"  # not looked at yet
    now[0] = 1.0
    assert holder.get() == "two"
    touch(policy, "bad edit", 3000)
    now[0] = 2.0
    assert holder.get() == "two"  # the previous policy stays in force
    now[0] = 3.0
    assert holder.get() == "two"
    assert failures == [f"{policy}: field placement: unknown policy 'bad edit'"]  # reported once per change
    touch(policy, "three", 4000)
    now[0] = 4.0
    assert holder.get() == "three"


def test_real_policy_file_loads(tmp_path: Path) -> None:
    from webhook.core.policy.model import Policy

    policy = tmp_path / "policy.yaml"
    policy.write_text("{}\n")
    assert isinstance(PolicyHolder(str(policy)).get(), Policy)
    assert isinstance(PolicyHolder(None).get(), Policy)
