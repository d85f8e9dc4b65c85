"""`make venv`'s own steps: the torch install stops with one line naming the fix where pip finds
no CPU build, and the finished venv verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_install(
    *args: str, python: str = sys.executable, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "omnivoice_export.install", *args], cwd=REPO, capture_output=True, text=True, env=env
    )


def test_torch_install_without_a_cpu_build_is_one_line(tmp_path: Path) -> None:
    # A new venv whose pip has no index at all sees no torch==2.13.0+cpu, as on a machine whose
    # pip reaches PyPI only: nothing is installed, and the error names both ways to get the build.
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "1"}
    log = tmp_path / "pip.log"
    result = run_install(
        "torch",
        "--index-url",
        (tmp_path / "no-index").as_uri(),
        "--log",
        str(log),
        python=str(tmp_path / "venv" / "bin" / "python"),
        env=env,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: pip could not install PyTorch's CPU build")
    assert "torch==2.13.0+cpu" in errors[0] and "TORCH_INDEX=" in errors[0] and "PIP_FIND_LINKS=" in errors[0]
    assert "Traceback" not in result.stderr and log.is_file()


def test_verify_passes_in_this_venv() -> None:
    result = run_install("verify")
    assert result.returncode == 0, result.stderr
    assert "install verified: torch 2.13.0" in result.stdout
    assert "Couldn't find ffmpeg" not in result.stderr


def test_torch_requirement_is_the_cpu_build() -> None:
    pins = [line.split("#")[0].strip() for line in (REPO / "requirements-torch.txt").read_text().splitlines()]
    assert "torch==2.13.0+cpu" in pins
    assert not any(
        line.startswith(("torch==", "torchaudio==")) for line in (REPO / "requirements.txt").read_text().splitlines()
    )
