"""What every script shares at its edges: arguments, exit codes, one-line errors.

Users run these scripts by hand for minutes at a time. An expected problem (a wrong path, a stale
capture, a missing provider) must end in one line on stderr that names the problem and the fix,
with a documented exit code; files.py makes sure it never leaves a half-written artefact behind.
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from pathlib import Path
from typing import Callable

from omnivoice_onnx.errors import UserError

# pydub warns at import time when ffmpeg is absent; omnivoice imports pydub at module level but
# only needs it for silence trimming of in-memory arrays, which does not use ffmpeg.
warnings.filterwarnings("ignore", message="Couldn't find ffmpeg or avconv", category=RuntimeWarning)

EXIT_CHECK_FAILED = 1  # a parity/end-to-end check ran and failed: a finding, not a crash
EXIT_BAD_INPUT = 2  # the user's input is wrong or missing; the message says how to fix it
EXIT_INTERRUPTED = 130  # Ctrl-C; artefacts from before the run are intact

REPO_ROOT = Path(__file__).resolve().parent.parent


class CheckFailed(Exception):
    """A check ran to completion and failed; exit code 1."""


EXIT_CODES_HELP = (f"exit codes: 0 success, {EXIT_CHECK_FAILED} a check ran and failed, {EXIT_BAD_INPUT} bad or "
                   f"missing input (the message names the fix), {EXIT_INTERRUPTED} interrupted (Ctrl-C); "
                   "errors are one line on stderr, --debug shows the traceback")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Add --debug and the exit codes (in the --help epilog), then parse: every script's parser
    ends with this."""
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of its one-line summary")
    parser.epilog = EXIT_CODES_HELP
    return parser.parse_args(argv)


def parse_subset(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """A comma-separated subset of `choices` (e.g. --graphs transformer,decoder), or a UserError."""
    picked = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(picked) - set(choices))
    if unknown or not picked:
        raise UserError(f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}",
                        f"choose from {', '.join(choices)}")
    return picked


def note(message: str, level: str = "note") -> None:
    """A one-line diagnostic on stderr that does not stop the run (`note: ...`, `warning: ...`)."""
    print(f"{level}: {message}", file=sys.stderr, flush=True)


def disk_full_error(exc: BaseException) -> OSError | None:
    """The ENOSPC OSError behind `exc` (itself, or its cause/context: exporters wrap errors), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a script's main(); turn expected errors into one line and an exit code.

    Without --debug, a UserError prints `error: ...` and exits 2, a CheckFailed exits 1, Ctrl-C
    exits 130, and a full disk is named as such; anything else is a bug and keeps its traceback.
    """
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        main(argv)
    except (UserError, CheckFailed) as exc:
        if debug:
            raise
        label, code = ("FAILED", EXIT_CHECK_FAILED) if isinstance(exc, CheckFailed) else ("error", EXIT_BAD_INPUT)
        print(f"{label}: {exc}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt:
        print("interrupted: nothing half-written was kept; earlier artefacts are intact", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # only a full disk is expected here; anything else is a bug: re-raised
        full = disk_full_error(exc)
        if full is None or debug:
            raise
        print(f"error: disk full while writing {full.filename or 'output'}; free space and re-run "
              "(the previous complete artefacts are intact)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
