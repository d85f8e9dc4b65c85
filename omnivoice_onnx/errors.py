"""The one error type users see: an expected problem, printed as one line naming the fix.

Defined in the runtime so that the runtime raises it without importing the toolchain; the
toolchain's scripts (omnivoice_export.cli.run_main) catch the same class and exit 2.
"""

from __future__ import annotations

import errno

DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# OSErrors that describe the machine, not a bug: a full disk, a file or folder this user may not
# read or write, a read-only mount. Each ends in one line naming the file (exit 2).
ENVIRONMENT = DISK_FULL | {errno.EACCES, errno.EPERM, errno.EROFS}


class UserError(Exception):
    """An expected problem with the user's input; printed as one line, exit code 2."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem, self.fix = problem, fix


def check_unicode(text: str, where: str, fix: str) -> str:
    """`text` if UTF-8 can carry it; else one line naming `where`. A str holds a lone surrogate
    when it came from bytes that are not UTF-8 (argv, decoded with surrogateescape) or from a JSON
    `\\udc80` escape; the tokenizer and every UTF-8 writer would fail on it with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"{where} is not valid text: it holds {text[exc.start]!r} at character {exc.start} (a byte "
                        "that is not UTF-8, or a lone surrogate \\u escape)", fix) from None
    return text
