"""The runtime stands alone: it imports none of the toolchain's modules, and it synthesises from an
export folder in an empty venv holding only requirements-runtime.txt (issue 13)."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omnivoice_onnx

from conftest import REPO, import_blocker

FORBIDDEN = ("torch", "torchaudio", "transformers", "omnivoice", "omnivoice_export", "pydub", "onnx")
RUNTIME_MODULES = sorted(f"omnivoice_onnx.{m.name}" for m in pkgutil.iter_modules(omnivoice_onnx.__path__))

# Synthesis from the export folder alone: design mode, 4 steps, a fixed seed.
SYNTHESIS = textwrap.dedent("""
    import sys
    import numpy as np
    from omnivoice_onnx import OmniVoiceOnnx
    tts = OmniVoiceOnnx.from_dir(sys.argv[1])
    audio = tts.generate("Hello there.", language="English", instruct="male, low pitch",
                         generation_config={"num_step": 4}, seed=7)[0]
    assert audio.ndim == 1 and audio.dtype == np.float32 and np.isfinite(audio).all() and audio.size > 0
    print("synthesised", audio.size, "samples;", sorted(m for m in sys.modules if m.split(".")[0] in
          {"torch", "torchaudio", "transformers", "omnivoice", "omnivoice_export", "pydub", "onnx"}))
""")


def test_runtime_imports_without_the_toolchain() -> None:
    # Every runtime module imported in a fresh interpreter in which the toolchain's modules
    # cannot be imported at all: a lazy import inside a function would fail too.
    blocker = import_blocker(FORBIDDEN) + textwrap.dedent(f"""
        import importlib
        for name in {RUNTIME_MODULES!r}:
            importlib.import_module(name)
        print("imported", len({RUNTIME_MODULES!r}))
    """)
    result = subprocess.run([sys.executable, "-c", blocker], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(RUNTIME_MODULES) >= 3


@pytest.mark.slow
def test_runtime_synthesises_from_an_empty_venv(pipeline, tmp_path: Path) -> None:
    # pip sees this workplace's configuration here; requirements-runtime.txt is the whole closure
    # (--no-deps), so nothing beyond it can arrive.
    # The venv gets no pip of its own (ensurepip costs seconds): this venv's pip installs into it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    install = subprocess.run([*pip, "install", "--quiet", "--no-deps", "-r", str(REPO / "requirements-runtime.txt")],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    listed = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert not any(line.lower().startswith(("torch", "transformers", "omnivoice", "pydub")) for line in listed.splitlines())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([python, "-c", SYNTHESIS, str(pipeline.onnx)], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[]"), result.stdout
