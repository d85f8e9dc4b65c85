"""The runtime stands alone: it imports none of the toolchain's modules, and it installs
as the distribution omnivoice-onnx (`pip install .` or its wheel) into a venv holding only the
runtime's requirements, where the `omnivoice-onnx` command speaks from an export folder."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import soundfile
from conftest import REPO, import_blocker
from packaging.requirements import Requirement

import omnivoice_onnx

FORBIDDEN = ("torch", "torchaudio", "transformers", "omnivoice", "omnivoice_export", "pydub", "onnx")
# Every module of the package, subcommands included: `omnivoice-onnx --help` imports them all, so
# none may import an extra's package (fastapi, ray) or the toolchain at module level.
RUNTIME_MODULES = sorted(m.name for m in pkgutil.walk_packages(omnivoice_onnx.__path__, "omnivoice_onnx."))


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


@pytest.fixture(scope="module")
def runtime_python(tmp_path_factory) -> Path:
    """The python of a venv holding requirements-runtime.txt and nothing else (the tests install
    omnivoice-onnx into it and uninstall it again). pip sees this workplace's configuration here;
    the file is the whole closure (--no-deps), so nothing beyond it can arrive. The venv gets no pip
    of its own (ensurepip costs seconds): this venv's pip installs into it (`pip --python`)."""
    path = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    install = pip_into(python, "install", "--quiet", "--no-deps", "-r", str(REPO / "requirements-runtime.txt"))
    assert install.returncode == 0, install.stderr
    return python


def pip_into(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args], capture_output=True, text=True)


# The distribution's whole source: what `pip install .` reads (pyproject.toml: package omnivoice_onnx only).
PACKAGE_PAGE = "docs/package.md"  # pyproject's readme: the distribution's description
DISTRIBUTION_SOURCES = ("pyproject.toml", PACKAGE_PAGE, "omnivoice_onnx")
FORBIDDEN_DISTRIBUTIONS = ("torch", "transformers", "omnivoice", "pydub", "onnx")


def source_copy(dst: Path) -> Path:
    """The distribution's sources copied out of the repository, so a build writes nothing into it
    (setuptools leaves build/ and *.egg-info beside the sources) and reads nothing else."""
    dst.mkdir()
    for name in DISTRIBUTION_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dst / name)
    return dst


def check_installed(python: Path, export: Path, work: Path) -> None:
    """The installed command, as a user runs it: --version, and text on stdin to a 16-bit PCM WAV
    with the default --model-dir (./onnx), then the same run with every toolchain module blocked."""
    work.mkdir()
    (work / "onnx").symlink_to(export)  # a folder named onnx in the cwd: no `import onnx` may reach it
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = python.parent / "omnivoice-onnx"
    done = subprocess.run([command, "--version"], capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0 and done.stdout.strip() == f"omnivoice-onnx {omnivoice_onnx.__version__}", done
    done = subprocess.run(
        [python, "-m", "omnivoice_onnx", "--version"], capture_output=True, text=True, env=env, cwd=work
    )
    assert done.stdout.strip() == f"omnivoice-onnx {omnivoice_onnx.__version__}", done.stderr
    speak = ["speak", "--out", "x.wav", "--num-step", "4", "--seed", "1"]
    done = subprocess.run([command, *speak], input="Hello.\n", capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0, done.stderr
    info = soundfile.info(str(work / "x.wav"))
    assert (info.samplerate, info.channels, info.subtype, info.format) == (24000, 1, "PCM_16", "WAV")
    blocked = import_blocker(FORBIDDEN) + textwrap.dedent(f"""
        sys.argv = ["omnivoice-onnx", *{speak!r}]
        from omnivoice_onnx.__main__ import main
        code = main()
        print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r}))
        sys.exit(code)
    """)
    done = subprocess.run([python, "-c", blocked], input="Hello.\n", capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "imported: []"


@pytest.mark.slow
def test_wheel_and_pip_install_dot_need_no_torch(pipeline, runtime_python: Path, tmp_path: Path) -> None:
    """The wheel and `pip install .`, each into a venv with the runtime's
    requirements alone, give `omnivoice-onnx --version` and a 16-bit PCM 24 kHz WAV from text on
    stdin, importing no torch, onnx, transformers, omnivoice, pydub or toolchain module."""
    python = runtime_python
    source = source_copy(tmp_path / "source")
    # The wheel is built by this venv's setuptools (no build isolation: no index needed for it).
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("omnivoice_onnx-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert all(n.startswith(("omnivoice_onnx/", "omnivoice_onnx-")) for n in names), names
    assert "omnivoice_onnx/cli/speak.py" in names and "omnivoice_onnx/audio_out.py" in names
    assert "omnivoice_onnx/serve/web/index.html" in names  # serve's page at / is package data
    # The description is the runtime user's page, as Markdown (the body after METADATA's headers).
    headers, description = metadata.split("\n\n", 1)
    assert "Description-Content-Type: text/markdown" in headers.splitlines()
    assert description.strip() == (REPO / PACKAGE_PAGE).read_text().strip()
    # The ranges the wheel declares admit the versions the tests pin (requirements-runtime.txt).
    pins = [
        Requirement(line)
        for line in (REPO / "requirements-runtime.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    declared = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    core = [req for req in declared if req.marker is None]
    assert sorted(req.name for req in core) == ["numpy", "onnxruntime", "soundfile", "tokenizers"]
    for req in core:
        pinned = [p for p in pins if p.name == req.name and (p.marker is None or p.marker.evaluate())]
        assert pinned and req.specifier.contains(next(iter(pinned[0].specifier)).version), (req, pinned)
    # `pip install .` builds in an isolated environment (setuptools from the index pip is configured with).
    for target, label in ((wheel, "wheel"), (source, "source")):
        done = pip_into(python, "install", "--quiet", "--no-deps", "--force-reinstall", str(target))
        assert done.returncode == 0, done.stderr
        listed = pip_into(python, "list", "--format=freeze").stdout.lower().splitlines()
        assert not [line for line in listed if line.split("==")[0] in FORBIDDEN_DISTRIBUTIONS], listed
        check_installed(python, pipeline.onnx, tmp_path / f"run-{label}")
        assert pip_into(python, "uninstall", "--yes", "omnivoice-onnx").returncode == 0
    assert not list(REPO.glob("*.egg-info"))  # builds happen in the copy, never in the repository


@pytest.mark.slow
def test_infer_onnx_text_in_a_runtime_only_venv(pipeline, runtime_python: Path, tmp_path: Path) -> None:
    """infer_onnx.py --text works with the runtime's requirements alone, beside a folder named onnx
    (the export folder) that `import onnx` would take for the missing package; compare mode says in
    one line which install it needs."""
    python = runtime_python
    work = tmp_path / "work"
    work.mkdir()
    (work / "onnx").symlink_to(pipeline.onnx)
    env = {**os.environ, "PYTHONPATH": str(work)}  # as the repository root on sys.path: onnx/ is importable
    done = subprocess.run(
        [python, REPO / "infer_onnx.py", "--text", "Hello.", "--out", "y.wav", "--num-step", "2", "--onnx-dir", "onnx"],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    assert soundfile.info(str(work / "y.wav")).subtype == "PCM_16"
    done = subprocess.run(
        [python, REPO / "infer_onnx.py", "--onnx-dir", "onnx"], capture_output=True, text=True, env=env, cwd=work
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: compare mode needs the toolchain") and "requirements.txt" in line
