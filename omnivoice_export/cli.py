"""What every pipeline script shares at its edges: arguments, exit codes, one-line errors.

The helpers live once, in the runtime (omnivoice_onnx.cliutil, which the `omnivoice-onnx` command
uses too); this module re-exports them for the toolchain's scripts and adds what only the
toolchain has: the repository's paths, and the silencing of pydub's import-time warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from omnivoice_onnx.cliutil import (  # noqa: F401
    DISK_FULL,
    ENVIRONMENT,
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    NUM_STEP,
    SEED,
    SEED_MAX,
    SEED_MIN,
    THREADS,
    CheckFailed,
    Sigterm,
    Terminated,
    check_input_dir,
    check_output,
    environment_error,
    environment_message,
    float_range,
    int_range,
    note,
    os_error_in_chain,
    parse,
    parse_subset,
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
