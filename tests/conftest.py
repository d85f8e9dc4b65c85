"""Session fixtures: the tiny checkpoint is built once, steps 0-2 run once into a temporary tree.

Tests call the scripts' main() in-process where they check results (fast: no re-import of
torch), and run them as subprocesses where they check exit codes and stderr lines.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omnivoice_export.checkpoints import ensure_built  # noqa: E402


@dataclass
class Pipeline:
    """Paths of one tiny run of steps 0-2."""

    model: Path
    capture: Path
    onnx: Path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny checkpoint, from the git-ignored cache (built on first use)."""
    return ensure_built("tiny")


@pytest.fixture(scope="session")
def pipeline(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """Steps 0, 1 (all modes, all 32 steps) and 2 (dynamo) on tiny. Tests must not modify it:
    copy it first (see `pipeline_copy`)."""
    import capture_reference
    import export_omnivoice
    import make_reference

    root = tmp_path_factory.mktemp("pipeline")
    capture, onnx = root / "capture", root / "onnx"
    make_reference.main(["--model", str(tiny_model), "--out-dir", str(capture)])
    capture_reference.main(["--model", str(tiny_model), "--capture-dir", str(capture)])
    export_omnivoice.main(["--model", str(tiny_model), "--capture-dir", str(capture), "--onnx-dir", str(onnx)])
    return Pipeline(tiny_model, capture, onnx)


@pytest.fixture
def pipeline_copy(pipeline: Pipeline, tmp_path: Path) -> Pipeline:
    """A private copy of the session pipeline's capture/ and onnx/, safe to damage."""
    capture, onnx = tmp_path / "capture", tmp_path / "onnx"
    shutil.copytree(pipeline.capture, capture)
    shutil.copytree(pipeline.onnx, onnx)
    return Pipeline(pipeline.model, capture, onnx)


def run_script(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a pipeline script as a user would; returns the completed process (never raises)."""
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
