"""Make PyPI's CUDA-built torchaudio importable beside the CPU build of torch.

PyPI only ships torchaudio wheels whose compiled extension links against libc10_cuda. Beside the
CPU torch wheel that extension cannot load, and torchaudio's import fails. torchaudio supports
running without its extension (``torchaudio._extension`` checks whether the library file exists),
and the only function omnivoice needs, ``torchaudio.functional.resample``, is pure PyTorch.

This module renames the unloadable libraries to ``*.so.cuda-only`` (reversible: rename them back),
prints each file it touches, then proves the result by resampling a sine. It changes nothing when
the extension loads (a CUDA torch), so it is safe to run after every install::

    python -m omnivoice_export.torchaudio_cpu
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import torch

DISABLED_SUFFIX = ".cuda-only"


def _extension_dir() -> Path:
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None:
        raise SystemExit("torchaudio is not installed: run `make venv` (pip install -r requirements.txt)")
    return Path(spec.origin).parent / "lib"


def _loads(library: Path) -> bool:
    try:
        torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    except OSError:
        return False
    return True


def disable_unloadable_extension() -> list[Path]:
    """Rename every torchaudio extension library that cannot load here; return the renamed ones."""
    renamed = []
    for library in sorted(_extension_dir().glob("*.so")):
        if not _loads(library):
            target = library.with_name(library.name + DISABLED_SUFFIX)
            library.rename(target)
            renamed.append(target)
    return renamed


def check_resample() -> float:
    """Import torchaudio and resample a 440 Hz sine 16 kHz -> 24 kHz; return the max error."""
    import torchaudio.functional as AF

    t16 = torch.arange(16000, dtype=torch.float64) / 16000
    t24 = torch.arange(24000, dtype=torch.float64) / 24000
    out = AF.resample(torch.sin(2 * math.pi * 440 * t16), 16000, 24000)
    expected = torch.sin(2 * math.pi * 440 * t24)
    # Ignore the filter's edge transients; compare the steady middle.
    return float((out[1000:-1000] - expected[1000:-1000]).abs().max())


def main() -> None:
    for path in disable_unloadable_extension():
        print(
            f"torchaudio_cpu: disabled CUDA-only extension {path.name[: -len(DISABLED_SUFFIX)]} "
            f"(renamed to {path.name}; torch is a CPU build)"
        )
    error = check_resample()
    if error > 1e-2:
        sys.exit(f"torchaudio_cpu: resample check failed (max error {error:.2e}); reinstall torchaudio")
    print(f"torchaudio_cpu: torchaudio imports; resample 16k->24k max error {error:.1e}")


if __name__ == "__main__":
    main()
