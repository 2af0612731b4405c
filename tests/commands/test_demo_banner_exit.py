"""The demo cluster's banner says "exit code 1 is expected" only when that is what the run answers: the
bundled examples with some denied, not one bundled example that is admitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.cli import main
from webhook.commands.check import DEMO_BANNER, DEMO_NOTE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def first_line(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str]:
    code = main(["check", *map(str, paths)])
    return code, capsys.readouterr().out.splitlines()[0]


def test_an_admitted_bundled_example_is_not_told_exit_1_is_expected(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = first_line(capsys, EXAMPLES / "01-single-gpu.yaml")
    assert (code, line) == (0, DEMO_NOTE)
    assert "exit code 1" not in line


def test_bundled_examples_with_a_denial_keep_the_banner(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = first_line(capsys, EXAMPLES / "01-single-gpu.yaml", EXAMPLES / "06-too-many-gpus.yaml")
    assert (code, line) == (1, DEMO_BANNER)
