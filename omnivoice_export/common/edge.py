"""The toolchain's side of the program edge: the repository's folders and the flags that name them.

Exit codes, run_main, CheckFailed and the range types are the runtime's program edge
(omnivoice_onnx.program), which every step script, the bench and the `omnivoice-onnx` command
import themselves; this module adds what only the toolchain has: where the checkout keeps step 1's
capture and step 2's export, the flags that point at them (declared here once for the seven step
scripts and the bench), and the comma-separated subsets the steps take (--graphs, --modes ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omnivoice_onnx.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CAPTURE_DIR = REPO_ROOT / "capture"  # step 1's capture, which steps 2-6 read
DEFAULT_ONNX_DIR = REPO_ROOT / "onnx"  # step 2's export, which steps 3-6 read and extend


def add_onnx_dir(parser: argparse.ArgumentParser | Any, help: str, **options: Any) -> None:
    """--model-dir (the runtime's name for a bundle) or --onnx-dir: the export folder, dest
    `onnx_dir`; `options` (default, required) as argparse takes them."""
    options.setdefault("default", DEFAULT_ONNX_DIR)
    parser.add_argument("--model-dir", "--onnx-dir", dest="onnx_dir", type=Path, help=help, **options)


def add_capture_dir(parser: argparse.ArgumentParser | Any, help: str, **options: Any) -> None:
    """--capture-dir: step 1's capture folder; `options` (default) as argparse takes them."""
    options.setdefault("default", DEFAULT_CAPTURE_DIR)
    parser.add_argument("--capture-dir", type=Path, help=help, **options)


def parse_subset(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """A comma-separated subset of `choices` (e.g. --graphs transformer,decoder), each named once,
    or a UserError. A repeated name is refused: `--graphs decoder,decoder` would export the decoder
    twice into one staging file and install it twice."""
    picked = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(picked) - set(choices))
    if unknown or not picked:
        raise UserError(
            f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}", f"choose from {', '.join(choices)}"
        )
    repeated = sorted({item for item in picked if picked.count(item) > 1})
    if repeated:
        raise UserError(
            f"{flag}: {', '.join(repeated)} given more than once", f"name each of {', '.join(choices)} at most once"
        )
    return picked
