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
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeAlias

from omnivoice_onnx.bundle import DEFAULT_MODEL_DIR
from omnivoice_onnx.errors import (  # noqa: F401  (re-exported: every command's edge)
    DISK_FULL,
    ENVIRONMENT,
    UserError,
    check_unicode,
    environment_error,
    environment_message,
    os_error_in_chain,
    printable,
    say,
)
from omnivoice_onnx.files import check_input_dir, check_output  # noqa: F401  (re-exported, as above)
from omnivoice_onnx.limits import MAX_SCORE_FACTOR, MAX_SPEED, MIN_SPEED, SEED_MAX, SEED_MIN
from omnivoice_onnx.sessions import default_threads
from omnivoice_onnx.voices import VOICES_ENV

# What each subcommand's add_parser(subparsers) receives (argparse's class is generic in its stubs only).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_CHECK_FAILED = 1  # a parity/end-to-end check ran and failed: a finding, not a crash
EXIT_BAD_INPUT = 2  # the user's input is wrong or missing; the message says how to fix it
# Ctrl-C (SIGINT) and `kill` (SIGTERM) end as shells report a process a signal stopped,
# 128 + signal number, after the same clean unwinding: artefacts from before the run are intact.
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
# stdout's reader went away (`parity_check.py | head -1`): quietly, with the code of a process
# that SIGPIPE ended, as `yes | head -1` does; artefacts from before the run are intact.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141


def add_bundle_flags(parser: Any, model_dir: bool = True, variant: bool = True, voices: bool = True,
                     model_dest: str = "model_dir", model_default: Path | None = DEFAULT_MODEL_DIR,
                     model_aliases: tuple[str, ...] = (), hub: bool = True) -> None:
    """--model-dir (and upstream's --model_dir), --variant and --voices, declared here once for
    every command: each adds those it uses (to a parser or an argument group). `model_dest` and
    `model_default`: for `info`, whose positional DIR the flag overrides; `model_aliases`: a
    script's older spelling of --model-dir; `hub`: hf:ORG/NAME is read (__main__.resolve_hub_model_dirs)."""
    if model_dir:
        hub_help = ", or hf:ORG/NAME for a Hugging Face repo's" if hub else ""
        parser.add_argument("--model-dir", "--model_dir", *model_aliases, dest=model_dest, type=Path,
                            default=model_default, metavar="DIR",
                            help=f"the bundle (export folder){hub_help} (default: {model_default or 'DIR'})")
    if variant:
        parser.add_argument("--variant", default=None,
                            help="transformer variant (fp32, fp32-fused, int8, ...; default: fp32-fused when the "
                                 "bundle has it, else fp32; `omnivoice-onnx info` lists them)")
    if voices:
        parser.add_argument("--voices", type=Path, default=None, metavar="DIR",
                            help=f"the saved voices folder (default: ${VOICES_ENV}, else <model-dir>/voices)")


class CheckFailed(Exception):
    """A check ran to completion and failed; exit code 1."""


EXIT_CODES_HELP = (f"exit codes: 0 success, {EXIT_CHECK_FAILED} a check ran and failed, {EXIT_BAD_INPUT} bad or "
                   f"missing input (the message names the fix), {EXIT_INTERRUPTED} interrupted (Ctrl-C), "
                   f"{EXIT_TERMINATED} terminated (SIGTERM), {EXIT_BROKEN_PIPE} output pipe closed; "
                   "errors are one line on stderr, --debug shows the traceback")



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
            raise argparse.ArgumentTypeError(f"{text} is out of range: a finite number "
                                             f"{_bounds(low, high, low_open)} is needed")
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


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after a flag's help, only where there is a default to show: a
    flag that is off or unset (False, None) says nothing rather than "(default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def prepare(parser: argparse.ArgumentParser, epilog: str = EXIT_CODES_HELP) -> argparse.ArgumentParser:
    """Add --debug and the exit codes (in the --help epilog) to a parser (a script's, or one
    subcommand's). A bad argument becomes a UserError like any other: one line naming the flag and
    the fix, exit 2 (argparse's own error prints the whole usage block first)."""
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of its one-line summary")
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
            say(f"{lead}terminated (SIGTERM): too late to stop the run, which completed; its artefacts are "
                "complete", file=sys.stderr)
            sys.exit(EXIT_TERMINATED)
    except (UserError, CheckFailed) as exc:
        if debug:
            raise
        label, code = ("FAILED", EXIT_CHECK_FAILED) if isinstance(exc, CheckFailed) else ("error", EXIT_BAD_INPUT)
        say(f"{lead}{label}: {exc}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        say(f"{lead}{'terminated (SIGTERM)' if terminated else 'interrupted'}: nothing half-written was kept; "
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
        say(f"{lead}error: out of memory; ask for less at once (shorter text or duration, fewer items), or "
            "free memory", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:  # only the machine's errors are expected here; anything else is a bug: re-raised
        found = environment_error(exc)
        if found is None or debug:
            raise
        say(f"{lead}error: {environment_message(found)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
