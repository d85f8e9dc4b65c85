"""The one error type users see: an expected problem, printed as one line naming the fix.

Defined in the runtime so that the runtime raises it without importing the toolchain; the
toolchain's scripts (omnivoice_export.cli.run_main) catch the same class and exit 2.
"""

from __future__ import annotations


class UserError(Exception):
    """An expected problem with the user's input; printed as one line, exit code 2."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem, self.fix = problem, fix
