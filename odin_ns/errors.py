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


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def rank_reason(rank: int, err: BaseException, with_type: bool = False) -> str:
    """``err`` as one line that starts with ``rank R:`` (added unless the message has it)."""
    text = err.message if isinstance(err, OdinInputError) else first_line(err)
    if with_type:
        text = f"{type(err).__name__}: {text}"
    prefix = f"rank {rank}:"
    return text if text.startswith(prefix) else f"{prefix} {text}"


def non_finite_loss(rank: int, step: int) -> FloatingPointError:
    """The refusal of a step whose loss is not finite (its gradients are not published)."""
    return FloatingPointError(
        f"rank {rank}: non-finite loss at step {step}; nothing from this step was published, "
        "so every replica still holds the last finite state"
    )


def non_finite_gradient(rank: int, step: int, group: str) -> FloatingPointError:
    """The refusal to publish a step's gradient of ``group`` that is not finite."""
    return FloatingPointError(
        f"rank {rank}: non-finite gradient of '{group}' at step {step}; refusing to publish it"
    )
