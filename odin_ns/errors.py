"""Errors a user can act on.

``OdinInputError`` derives from ``SystemExit`` on purpose: raised anywhere under
``ns-train`` / ``ns-eval`` / ``odin-ns-train`` it ends the program with its one-line
message and exit status 1, not a traceback from deep inside nerfstudio. Library callers
and tests can still catch it like any exception.
"""

from __future__ import annotations


class OdinInputError(SystemExit):
    """Bad input (data path, configuration, world size): the message says what to fix."""

    def __init__(self, message: str):
        super().__init__(f"odin-ns: error: {message}")
        self.message = message

    def __str__(self) -> str:
        return str(self.code)
