"""`gpu-admission completion bash|zsh`: the script completes commands, each command's options and
choices, and file names, as bash runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def complete(words: list[str], cwd: str = "/") -> list[str]:
    script = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    line = " ".join(f"'{w}'" for w in words)
    probe = f"""{script}
COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _gpu_admission; printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=cwd, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to run the completion script")
def test_bash_completes_commands_options_choices_and_files(tmp_path: Path) -> None:
    assert complete(["gpu-admission", "ch"]) == ["check"]
    assert complete(["gpu-admission", "check", "--fa"]) == ["--fail-on-warn"]
    assert complete(["gpu-admission", "serve", "--reuse"]) == ["--reuse-port"]
    assert complete(["gpu-admission", "completion", ""]) == ["bash", "zsh"]
    (tmp_path / "jobs.yaml").write_text("")
    assert complete(["gpu-admission", "check", "jo"], cwd=str(tmp_path)) == ["jobs.yaml"]


def test_zsh_loads_it_through_bashcompinit() -> None:
    script = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "completion", "zsh"], capture_output=True, text=True, check=True
    ).stdout
    assert "bashcompinit" in script and "complete -o filenames -F _gpu_admission gpu-admission" in script


def test_an_unknown_shell_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "completion", "fish"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice: 'fish'" in done.stderr
