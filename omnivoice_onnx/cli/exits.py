"""How every command ends: exit codes, one-line errors, Ctrl-C and SIGTERM (run_main), --debug.

Used by the runtime's `omnivoice-onnx` command and by every toolchain script (omnivoice_export.cli
re-exports it), so there is one copy. Users run these commands by hand for minutes at a time. An
expected problem (a wrong path, a stale capture, a missing provider, a flag out of range, a folder
it may not write, a full disk, `kill`, a closed pipe, memory running out) must end in one line on
stderr that names the problem and the fix, with a documented exit code; files.py makes sure it
never leaves a half-written artefact behind. What can be checked before the work (flags: cli.flags,
the folders it will write) is checked before the work. Standard library and the runtime only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from omnivoice_onnx.errors import UserError, check_unicode, environment_error, environment_message, say
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
