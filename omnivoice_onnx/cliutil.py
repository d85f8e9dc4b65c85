"""What every command shares at its edges: arguments, exit codes, one-line errors.

Used by the runtime's `omnivoice-onnx` command and by every toolchain script (omnivoice_export.cli
re-exports it), so there is one copy. Users run these commands by hand for minutes at a time. An
expected problem (a wrong path, a stale capture, a missing provider, a flag out of range, a folder
it may not write, a full disk, `kill`, a closed pipe, memory running out) must end in one line on
stderr that names the problem and the fix, with a documented exit code; files.py makes sure it
never leaves a half-written artefact behind. What can be checked before the work (flags, the
folders it will write) is checked before the work. Standard library and the runtime only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from omnivoice_onnx.errors import DISK_FULL, ENVIRONMENT, UserError, check_unicode  # noqa: F401 (re-exported)
from omnivoice_onnx.rng import SEED_MAX, SEED_MIN  # what torch.manual_seed accepts (re-exported: --seed)
from omnivoice_onnx.sessions import default_threads

EXIT_CHECK_FAILED = 1  # a parity/end-to-end check ran and failed: a finding, not a crash
EXIT_BAD_INPUT = 2  # the user's input is wrong or missing; the message says how to fix it
# Ctrl-C (SIGINT) and `kill` (SIGTERM) end as shells report a process a signal stopped,
# 128 + signal number, after the same clean unwinding: artefacts from before the run are intact.
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
# stdout's reader went away (`parity_check.py | head -1`): quietly, with the code of a process
# that SIGPIPE ended, as `yes | head -1` does; artefacts from before the run are intact.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141


class CheckFailed(Exception):
    """A check ran to completion and failed; exit code 1."""


EXIT_CODES_HELP = (f"exit codes: 0 success, {EXIT_CHECK_FAILED} a check ran and failed, {EXIT_BAD_INPUT} bad or "
                   f"missing input (the message names the fix), {EXIT_INTERRUPTED} interrupted (Ctrl-C), "
                   f"{EXIT_TERMINATED} terminated (SIGTERM), {EXIT_BROKEN_PIPE} output pipe closed; "
                   "errors are one line on stderr, --debug shows the traceback")



def _bounds(low: float | None, high: float | None) -> str:
    if high is None:
        return f">= {low}"
    if low is None:
        return f"<= {high}"
    return f"in [{low}, {high}]"


def int_range(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse `type=` for an integer flag within [low, high] (None: unbounded on that side).

    A value out of range is refused when the arguments are parsed, before any model is loaded:
    `--num-step 0` would otherwise reach onnxruntime as a Gather index error minutes later.
    """
    def parse_int(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: an integer {_bounds(low, high)} is needed")
        return value
    return parse_int


def float_range(low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """argparse `type=` for a finite number within [low, high] (nan and inf are refused: a
    threshold of nan would fail every comparison silently)."""
    def parse_float(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: a finite number {_bounds(low, high)} is needed")
        return value
    return parse_float


SEED = int_range(SEED_MIN, SEED_MAX)
NUM_STEP = int_range(1)  # generate()'s unmasking steps: at least one
THREADS = int_range(1)  # onnxruntime intra-op threads


def prepare(parser: argparse.ArgumentParser, epilog: str = EXIT_CODES_HELP) -> argparse.ArgumentParser:
    """Add --debug and the exit codes (in the --help epilog) to a parser (a script's, or one
    subcommand's). A bad argument becomes a UserError like any other: one line naming the flag and
    the fix, exit 2 (argparse's own error prints the whole usage block first)."""
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of its one-line summary")
    parser.epilog = epilog

    def refuse(message: str) -> NoReturn:
        raise UserError(message, f"see {parser.prog} --help")
    parser.error = refuse
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """prepare(parser), then parse: every pipeline script's parser ends with this."""
    return prepare(parser).parse_args(argv)


def parse_subset(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """A comma-separated subset of `choices` (e.g. --graphs transformer,decoder), each named once,
    or a UserError. A repeated name is refused: `--graphs decoder,decoder` would export the decoder
    twice into one staging file and install it twice."""
    picked = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(picked) - set(choices))
    if unknown or not picked:
        raise UserError(f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}",
                        f"choose from {', '.join(choices)}")
    repeated = sorted({item for item in picked if picked.count(item) > 1})
    if repeated:
        raise UserError(f"{flag}: {', '.join(repeated)} given more than once", f"name each of {', '.join(choices)} "
                        "at most once")
    return picked


def _nearest_existing(path: Path) -> Path:
    """`path` or the closest of its ancestors that exists (what mkdir(parents=True) starts from)."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _can_create_in(directory: Path) -> OSError | None:
    """None when a file can be created in `directory` (tried, then removed), else the OSError.

    Tried rather than judged from the mode bits: os.access says yes to root on a read-only mount,
    and ACLs or a full quota say no where the mode bits say yes.
    """
    try:
        handle, name = tempfile.mkstemp(prefix=".write-test-", dir=directory)
    except OSError as exc:
        return exc
    os.close(handle)
    os.unlink(name)
    return None


def check_output(path: Path, flag: str, kind: str) -> None:
    """Before any work: `path` can be written as the script will write it; else a UserError
    naming `flag`. A run that fails only when it saves its result has thrown minutes away.

    kind  "file": written by files.atomic_path (a sibling renamed into place): `path` must not be
              a directory, and its directory must accept new files.
          "dir":  files are written inside it: `path` must be a directory or absent, and it (or the
              ancestor it will be created in) must accept new files.
          "tree": replaced whole by files.atomic_dir (a sibling directory renamed into place):
              `path` must be a directory or absent, and its parent must accept new files.
    """
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise UserError(f"{flag} {path} is a directory", f"pass the path of a file to write, e.g. {path / 'out.wav'}")
    if kind in ("dir", "tree") and os.path.lexists(path) and not path.is_dir():
        raise UserError(f"{flag} {path} exists and is not a directory", "pass a directory (or a path to create one at)")
    existing = _nearest_existing(path if kind == "dir" else path.parent)
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is not a directory", "pass a path whose parents are directories")
    problem = _can_create_in(existing)
    if problem is not None:
        raise UserError(f"{flag} {path}: cannot create files in {existing} ({problem.strerror})",
                        "choose a writable location, or fix its permissions")


def check_input_dir(path: Path, flag: str) -> None:
    """`path` is a directory (an existing artefact directory: --capture-dir, --onnx-dir to read)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is not a directory", "pass the directory the earlier step wrote")


def note(message: str, level: str = "note") -> None:
    """A one-line diagnostic on stderr that does not stop the run (`note: ...`, `warning: ...`)."""
    print(f"{level}: {message}", file=sys.stderr, flush=True)


def os_error_in_chain(exc: BaseException | None, numbers: set[int]) -> OSError | None:
    """The OSError with an errno in `numbers` behind `exc` (itself, or its cause/context:
    exporters and loaders wrap errors), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in numbers:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None




def environment_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` that a user fixes on the machine (see ENVIRONMENT), if any."""
    return os_error_in_chain(exc, ENVIRONMENT)


def environment_message(error: OSError) -> str:
    """One line for an ENVIRONMENT error: the problem, the file and the fix."""
    where = error.filename or "an output file"
    if error.errno in DISK_FULL:
        return (f"disk full while writing {where}; free space and re-run "
                "(the previous complete artefacts are intact)")
    if error.errno == errno.EROFS:
        return f"{where} is on a read-only file system; write to another location"
    return (f"permission denied: {where}; give this user access to it (chmod/chown), or run as its owner "
            "(the previous complete artefacts are intact)")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that every `finally`
    runs (temporary files and staging directories are removed) and the exit is as clean."""


@dataclass
class Sigterm:
    received: bool = False  # a SIGTERM arrived during the block


@contextlib.contextmanager
def sigterm_raises() -> Iterator[Sigterm]:
    """Turn SIGTERM into Terminated for the block (main thread only; the handler is restored).

    Python's default for SIGTERM ends the process on the spot, leaving the export's staging
    directory (GBs at full size) behind. An exception raised by a signal handler lands wherever
    the main thread is, and a library's bare `except:` there can swallow it (Ctrl-C's
    KeyboardInterrupt alike); the run then goes on to its end, and `received` tells run_main.
    Every later SIGTERM raises again.
    """
    state = Sigterm()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def terminate(signum, frame) -> NoReturn:
        state.received = True
        raise Terminated()
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, which would raise once more."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a replaced sys.stdout has no fd
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None, prog: str | None = None) -> None:
    """Run a command's main(); turn expected errors into one line and an exit code.

    Without --debug, a UserError prints `error: ...` (`<prog>: error: ...` when `prog` is given,
    as argparse and the `omnivoice-onnx` command do) and exits 2, a CheckFailed exits 1, Ctrl-C
    exits 130 and SIGTERM 143 (both after every `finally` ran; a SIGTERM that a library swallowed
    is reported when the run ends), a closed stdout pipe exits 141 quietly, running out of memory
    and a full disk or a permission the machine denies are named in one line (exit 2); anything
    else is a bug and keeps its traceback.
    """
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    lead = f"{prog}: " if prog else ""
    try:
        for position, arg in enumerate(sys.argv[1:] if argv is None else argv, 1):
            check_unicode(arg, f"command-line argument {position}", "pass UTF-8 text (check the terminal's locale)")
        default_threads()  # a bad $OMNIVOICE_ORT_THREADS is named now, not after minutes of work
        with sigterm_raises() as sigterm:
            main(argv)
        if sigterm.received:  # swallowed where it was raised (see sigterm_raises): the run completed
            print(f"{lead}terminated (SIGTERM): too late to stop the run, which completed; its artefacts are "
                  "complete", file=sys.stderr)
            sys.exit(EXIT_TERMINATED)
    except (UserError, CheckFailed) as exc:
        if debug:
            raise
        label, code = ("FAILED", EXIT_CHECK_FAILED) if isinstance(exc, CheckFailed) else ("error", EXIT_BAD_INPUT)
        print(f"{lead}{label}: {exc}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"{lead}{'terminated (SIGTERM)' if terminated else 'interrupted'}: nothing half-written was kept; "
              "earlier artefacts are intact", file=sys.stderr)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    except BrokenPipeError:
        if debug:
            raise
        _silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    except MemoryError:
        # numpy and onnxruntime raise it for one allocation too large (a huge --duration, a
        # transformer batch that does not fit): the process itself is still usable to say so.
        if debug:
            raise
        print(f"{lead}error: out of memory; ask for less at once (shorter text or duration, fewer items), or "
              "free memory", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:  # only the machine's errors are expected here; anything else is a bug: re-raised
        found = environment_error(exc)
        if found is None or debug:
            raise
        print(f"{lead}error: {environment_message(found)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
