"""The program's edge, for every command of the house: how it ends (exit codes, one-line errors,
Ctrl-C and SIGTERM: run_main, --debug) and the argparse types that refuse a value out of range.

Not a front end: the runtime's `omnivoice-onnx` command (cli/), every toolchain script and the
bench stand on it, so there is one copy, and it imports nothing heavy (errors and limits only).

Users run these commands by hand for minutes at a time. An
expected problem (a wrong path, a stale capture, a missing provider, a flag out of range, a folder
it may not write, a full disk, `kill`, a closed pipe, memory running out) must end in one line on
stderr that names the problem and the fix, with a documented exit code; files.py makes sure it
never leaves a half-written artefact behind. What can be checked before the work (flags: the range
types below, the folders it will write) is checked before the work. Standard library and the runtime only.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from omnivoice_onnx.errors import UserError, check_unicode, environment_error, environment_message, say
from omnivoice_onnx.limits import (
    MAX_PAUSE_S,
    MAX_SCORE_FACTOR,
    MAX_SPEED,
    MAX_VOLUME,
    MIN_PAUSE_S,
    MIN_SPEED,
    MIN_VOLUME,
    SEED_MAX,
    SEED_MIN,
    default_threads,
)

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


EXIT_CODES_HELP = (
    f"exit codes: 0 success, {EXIT_CHECK_FAILED} a check ran and failed, {EXIT_BAD_INPUT} bad or "
    f"missing input (the message names the fix), {EXIT_INTERRUPTED} interrupted (Ctrl-C), "
    f"{EXIT_TERMINATED} terminated (SIGTERM), {EXIT_BROKEN_PIPE} output pipe closed; "
    "errors are one line on stderr, --debug shows the traceback"
)


def prepare(parser: argparse.ArgumentParser, epilog: str = EXIT_CODES_HELP) -> argparse.ArgumentParser:
    """Add --debug and the exit codes (in the --help epilog) to a parser (a script's, or one
    subcommand's). A bad argument becomes a UserError like any other: one line naming the flag and
    the fix, exit 2 (argparse's own error prints the whole usage block first)."""
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an error instead of its one-line summary"
    )
    parser.epilog = epilog

    def refuse(message: str) -> NoReturn:
        raise UserError(message, f"see {parser.prog} --help")

    # The instance's own error(): argparse has no hook for it, and each script and subcommand
    # builds its parser itself (a subclass would have to reach every one of them).
    parser.error = refuse  # type: ignore[method-assign]
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """prepare(parser), then parse: every pipeline script's parser ends with this."""
    return prepare(parser).parse_args(argv)


def note(message: str, level: str = "note") -> None:
    """A one-line diagnostic on stderr that does not stop the run (`note: ...`, `warning: ...`)."""
    say(f"{level}: {message}", file=sys.stderr)


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

    def terminate(signum: int, frame: FrameType | None) -> NoReturn:
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
            say(
                f"{lead}terminated (SIGTERM): too late to stop the run, which completed; its artefacts are complete",
                file=sys.stderr,
            )
            sys.exit(EXIT_TERMINATED)
    except (UserError, CheckFailed) as exc:
        if debug:
            raise
        label, code = ("FAILED", EXIT_CHECK_FAILED) if isinstance(exc, CheckFailed) else ("error", EXIT_BAD_INPUT)
        say(f"{lead}{label}: {exc}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt as exc:
        # A command that keeps something on purpose (download's resumable .part) says so in the
        # interrupt it raises again: the line must tell what is left, not a general promise.
        terminated = isinstance(exc, Terminated)
        say(
            f"{lead}{'terminated (SIGTERM)' if terminated else 'interrupted'}: "
            f"{str(exc) or 'nothing half-written was kept'}; earlier artefacts are intact",
            file=sys.stderr,
        )
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
        say(
            f"{lead}error: out of memory; ask for less at once (shorter text or duration, fewer items), or free memory",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:  # only the machine's errors are expected here; anything else is a bug: re-raised
        found = environment_error(exc)
        if found is None or debug:
            raise
        say(f"{lead}error: {environment_message(found)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


# --- the range types: argparse refuses a value out of range when the arguments are parsed ---


def _bounds(low: float | None, high: float | None, low_open: bool = False) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


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


def float_range(low: float | None = None, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """argparse `type=` for a finite number within [low, high] ((low, high] when `low_open`; nan
    and inf are refused: a threshold of nan would fail every comparison silently)."""

    def parse_float(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: a finite number {_bounds(low, high, low_open)} is needed"
            )
        return value

    return parse_float


# The request's flags, for every command (speak, batch, the toolchain's scripts): their ranges are
# omnivoice_onnx.limits', the API's own, so a value argparse takes is one validate() takes. The
# raisable limits (MAX_NUM_STEP, MAX_DURATION_S, MAX_THREADS: $OMNIVOICE_<NAME>) are left to
# validate(), which names the variable that raises them.
SEED = int_range(SEED_MIN, SEED_MAX)
NUM_STEP = int_range(1)  # generate()'s unmasking steps: at least one
THREADS = int_range(1)  # onnxruntime intra-op threads
SPEED = float_range(MIN_SPEED, MAX_SPEED)
DURATION = float_range(0.0, low_open=True)  # seconds of speech asked for (overrides the estimate)
SCORE_FACTOR = float_range(-MAX_SCORE_FACTOR, MAX_SCORE_FACTOR)  # guidance_scale, layer_penalty_factor
T_SHIFT = float_range(0.0, low_open=True)
TEMPERATURE = float_range(0.0)  # 0: greedy; (0, MIN_TEMPERATURE) is refused by validate, with its reason
CHUNK_SECONDS = float_range(0.0, low_open=True)  # audio_chunk_duration, audio_chunk_threshold
PAUSE = float_range(MIN_PAUSE_S, MAX_PAUSE_S)  # seconds of silence between chunks (sentence_silence)
VOLUME = float_range(MIN_VOLUME, MAX_VOLUME)  # the output's linear gain
