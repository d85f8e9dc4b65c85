"""What every script shares at its edges: exit codes, one-line errors, atomic writes.

Users run these scripts by hand for minutes at a time on multi-GB files. An expected problem (a
wrong path, a stale capture, a missing provider) must end in one line on stderr that names the
problem and the fix, with a documented exit code, and never leave a half-written artefact behind.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

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


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """--debug, and the exit codes in the --help epilog (every script's parser calls this)."""
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of its one-line summary")
    parser.epilog = EXIT_CODES_HELP


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
    except UserError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except CheckFailed as exc:
        if debug:
            raise
        print(f"FAILED: {exc}", file=sys.stderr)
        sys.exit(EXIT_CHECK_FAILED)
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


def umask_mode(*paths: Path) -> None:
    """Give each file the mode a plain open() gives (0666 minus the umask).

    onnx's external-data writer and safetensors create their files 0600, so an exported graph's
    sidecar or a built checkpoint would be unreadable to other users of a shared machine or
    container while its `.onnx` is readable.
    """
    mask = os.umask(0)
    os.umask(mask)
    for path in paths:
        os.chmod(path, 0o666 & ~mask)


def temp_path_for(path: Path) -> Path:
    """The hidden sibling a file is written to before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    Rename within one directory is atomic on POSIX, so readers see the old file or the new one,
    never a partial write. On any exception (Ctrl-C included) the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, what: str, fix: str) -> Any:
    """Load JSON or raise a UserError naming the file and how to regenerate it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}", fix)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} is not valid JSON ({path}: {exc})", fix) from exc
