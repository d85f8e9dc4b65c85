"""`make venv`'s two steps that can go wrong on a user's machine: installing PyTorch's CPU build,
and proving the finished venv imports what the pipeline needs.

Why a module and not two pip lines: PyPI's Linux wheel of torch 2.13.0 is the CUDA build. Installed
with `--no-deps` (as the venv is), its NVIDIA libraries are missing and `import torch` fails with
`libcudnn.so.9: cannot open shared object file`. The CPU build (`2.13.0+cpu`) lives on PyTorch's own
wheel index, which pip must be given for torch alone: named for the whole requirements file, an
unreachable index costs ~8 s of retries for every package (investigation log). Both steps
end in one line naming the fix, never in a venv that looks installed but cannot import torch.

This module imports only the standard library at the top, so it runs before anything is installed::

    python -m omnivoice_export.install torch --index-url https://download.pytorch.org/whl/cpu
    python -m omnivoice_export.install verify
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH_REQUIREMENTS = REPO_ROOT / "requirements-torch.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The modules whose import proves the venv: the model code, the one torchaudio function upstream
# uses, the exporter's backend and the runtime.
VERIFIED_MODULES = (
    "transformers",
    "omnivoice.models.omnivoice",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "soundfile",
    "tokenizers",
)


def fail(message: str) -> None:
    """One line on stderr, exit 1 (make stops; the venv's stamp is not written)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def pip_error(output: str) -> str:
    """pip's last ERROR line (its reason), or its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1].removeprefix("ERROR: ")


def install_torch(index_url: str, log: Path) -> None:
    """pip install requirements-torch.txt with PyTorch's index beside the user's own (PyPI)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--extra-index-url",
        index_url,
        "-r",
        str(TORCH_REQUIREMENTS),
    ]
    print(f"installing torch (CPU build) from {index_url} and the user's pip index; log: {log}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        fail(
            f"pip could not install PyTorch's CPU build ({pip_error(result.stdout + result.stderr)}); "
            f"let pip reach {index_url} (or a mirror: make venv TORCH_INDEX=URL), or put "
            f"torch-2.13.0+cpu's wheel in a folder and run PIP_FIND_LINKS=FOLDER make venv; details in {log}"
        )


def verify() -> None:
    """Import torch, make torchaudio's resample work, import the rest; one line on the first failure."""
    try:
        import torch
    except ImportError as exc:
        cuda = "libcudnn" in str(exc) or "libcu" in str(exc)
        fail(
            f"torch does not import ({exc})"
            + (
                "; this is PyTorch's CUDA build without its NVIDIA libraries: the CPU build is needed, "
                f"rm -rf .venv and re-run make venv (it installs torch from {CPU_INDEX})"
                if cuda
                else "; rm -rf .venv and re-run make venv"
            )
        )
    from omnivoice_export import torchaudio_cpu

    torchaudio_cpu.main()
    for name in VERIFIED_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import-time failure is a broken install, reported as one line
            fail(
                f"{name} does not import ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "rm -rf .venv and re-run make venv"
            )
    print(f"install verified: torch {torch.__version__}, torchaudio resample, {', '.join(VERIFIED_MODULES)} import")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    torch_cmd = commands.add_parser("torch", help="install requirements-torch.txt from PyTorch's wheel index")
    torch_cmd.add_argument(
        "--index-url",
        default=CPU_INDEX,
        help="PyTorch's CPU wheel index (or a mirror of it), given to pip as an extra index",
    )
    torch_cmd.add_argument(
        "--log",
        type=Path,
        default=REPO_ROOT / ".venv" / "pip-torch.log",
        help="where pip's output goes (printed only as its last error line)",
    )
    commands.add_parser("verify", help="import everything the pipeline needs; fix torchaudio's CPU extension")
    args = parser.parse_args(argv)
    if args.command == "torch":
        install_torch(args.index_url, args.log)
    else:
        verify()


if __name__ == "__main__":
    main()
