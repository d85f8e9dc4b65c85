"""The one error type users see: an expected problem, printed as one line naming the fix; and
the machine's errors (a full disk, a denied permission) that are told as one line too.

Defined in the runtime so that the runtime raises it without importing the toolchain; the
toolchain's scripts (omnivoice_export.common.edge.run_main) catch the same class and exit 2. Here too
the two checks every raw value a front end takes passes before anything else touches it
(check_unicode for text, check_path for a path), so each refusal reads the same everywhere.
Ground floor: imports nothing of the package.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from typing import Any, TextIO

# What must never reach a terminal or a log raw: C0 controls (ESC starts the sequences that retitle,
# recolour or clear a terminal; CR and NL fake or split lines; NUL), DEL and C1 (8-bit CSI), the
# bidi embeddings, overrides and isolates that reorder what is shown, the Unicode line and
# paragraph separators, and lone surrogates (from bytes that are not UTF-8: printing one raises).
UNSAFE_CHARACTERS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` as one safe line: every UNSAFE_CHARACTERS character written as its Python escape
    (`\\x1b`, `\\u202e`), the rest kept, non-ASCII letters included. The one escape every line
    the runtime prints or logs goes through (UserError's message, say, OneLineFormatter):
    names, paths and texts come from files and requests, and a voice file named with an escape
    sequence would otherwise retitle or clear the user's terminal."""
    return UNSAFE_CHARACTERS.sub(_escape, str(text))


def say(text: object = "", file: TextIO | None = None) -> None:
    """Print `text` as one printable() line (stdout by default), flushed: how every command line of
    the runtime reaches the terminal."""
    print(printable(text), file=file or sys.stdout, flush=True)


class OneLineFormatter(logging.Formatter):
    """A log formatter whose every record's message is printable(): a request's text, a voice name
    or a path in a log line cannot split it or drive the terminal that tails the log."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return printable(super().formatMessage(record))


def log_lines(level: int = logging.INFO) -> None:
    """The root logger on stderr, one OneLineFormatter line per record: the servers' log."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(levelname)s:     %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


class UserError(Exception):
    """An expected problem with the user's input; printed as one line, exit code 2. The problem and
    the fix are made printable() here, once, so every surface that shows one (a CLI line, an HTTP
    error, a Wyoming error, a log line, a batch record) shows the same safe text."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        problem, fix = printable(problem), None if fix is None else printable(fix)
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem, self.fix = problem, fix


class Cancelled(Exception):
    """Raised by generate()/stream() when the caller's cancel event is set; checked between
    unmasking steps (one transformer call is the longest wait). Not an error: the caller asked."""


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


DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# OSErrors that describe the machine, not a bug: a full disk, a file or folder this user may not
# read or write, a read-only mount. Each ends in one line naming the file (exit 2).
ENVIRONMENT = DISK_FULL | {errno.EACCES, errno.EPERM, errno.EROFS}


def environment_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` that a user fixes on the machine (see ENVIRONMENT), if any."""
    return os_error_in_chain(exc, ENVIRONMENT)


def environment_message(error: OSError) -> str:
    """One line for an ENVIRONMENT error: the problem, the file and the fix."""
    where = error.filename or "an output file"
    if error.errno in DISK_FULL:
        return f"disk full while writing {where}; free space and re-run (the previous complete artefacts are intact)"
    if error.errno == errno.EROFS:
        return f"{where} is on a read-only file system; write to another location"
    return (
        f"permission denied: {where}; give this user access to it (chmod/chown), or run as its owner "
        "(the previous complete artefacts are intact)"
    )


def check_unicode(text: str, where: str, fix: str) -> str:
    """`text` if UTF-8 can carry it; else one line naming `where`. A str holds a lone surrogate
    when it came from bytes that are not UTF-8 (argv, decoded with surrogateescape) or from a JSON
    `\\udc80` escape; the tokenizer and every UTF-8 writer would fail on it with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(
            f"{where} is not valid text: it holds {text[exc.start]!r} at character {exc.start} (a byte "
            "that is not UTF-8, or a lone surrogate \\u escape)",
            fix,
        ) from None
    return text


def check_path(value: Any, label: str) -> str:
    """`value` (a str or os.PathLike) as a path string, or a UserError: the one check of every
    path-valued field a front end takes (CLI flags, batch lines, HTTP fields, a voice's file). A
    NUL cannot be in a path (the OS APIs take C strings: Python raises ValueError, a traceback, at
    the first stat or open); argv cannot hold one, a JSON string can (`\\u0000`)."""
    if not isinstance(value, (str, os.PathLike)):
        raise UserError(
            f"{label} must be a file path (a string), got {type(value).__name__}", f"pass {label} as a path"
        )
    path = os.fspath(value)
    if not isinstance(path, str):  # a bytes path-like
        raise UserError(f"{label} must be a path string, got {type(path).__name__}", f"pass {label} as a str path")
    if "\0" in path:
        raise UserError(
            f"{label} {path[:200]!r} holds a NUL character at position {path.index(chr(0))}: not a path",
            f"pass {label} as the file's path",
        )
    return path
