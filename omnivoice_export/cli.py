"""What every pipeline script shares at its edges: arguments, exit codes, one-line errors.

The helpers live once, in the runtime's program edge (omnivoice_onnx.program, which the
`omnivoice-onnx` command uses too); this module re-exports them for the toolchain's scripts and adds what only the
toolchain has: the repository's paths, and the silencing of pydub's import-time warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from omnivoice_onnx.errors import (  # noqa: F401
    DISK_FULL,
    ENVIRONMENT,
    UserError,
    environment_error,
    environment_message,
    os_error_in_chain,
)
from omnivoice_onnx.files import check_input_dir, check_output  # noqa: F401
from omnivoice_onnx.limits import SEED_MAX, SEED_MIN  # noqa: F401
from omnivoice_onnx.program import (  # noqa: F401
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    NUM_STEP,
    SEED,
    THREADS,
    CheckFailed,
    Sigterm,
    Terminated,
    float_range,
    int_range,
    note,
    parse,
    prepare,
    run_main,
    sigterm_raises,
)

# pydub warns at import time when ffmpeg is absent; omnivoice imports pydub at module level but
# only needs it for silence trimming of in-memory arrays, which does not use ffmpeg.
warnings.filterwarnings("ignore", message="Couldn't find ffmpeg or avconv", category=RuntimeWarning)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Step 1's capture (omnivoice_export.capture, which needs torch; infer_onnx.py --text must not).
DEFAULT_CAPTURE_DIR = REPO_ROOT / "capture"


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
