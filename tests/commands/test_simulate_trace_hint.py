"""`gpu-admission simulate` without the trace on disk says where the trace is published and how to fetch
it, instead of naming a path that exists on no user's machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.cli import main

PUBLISHED = "github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv"
FETCH = "sparse-checkout set cluster-trace-gpu-v2023"


@pytest.mark.parametrize("argv", [[], ["--trace-dir", "missing"], ["--trace-dir", "."]])
def test_no_trace_names_where_it_is_published_and_how_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty folder: no trace files in it
    assert main(["simulate", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert PUBLISHED in err and FETCH in err and "Traceback" not in err


def test_help_names_where_the_trace_is_published(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "github.com/alibaba/clusterdata" in " ".join(capsys.readouterr().out.split())
