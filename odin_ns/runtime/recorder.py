"""Optional observer of the engine: what every step read, and every admission decision.

Pass a ``ReadRecorder`` as ``PrimitiveSyncEngine(..., observer=...)`` (tests, analyses);
with the default ``observer=None`` the engine records nothing and pays nothing. Memory
grows with the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from odin_ns.runtime.admission import Decision


@dataclass
class ReadRecord:
    """What rank r read at a step: for every row of its read set, the version (last
    applied global step) it had and the version quality-first would have required (the
    last step < t whose footprints contain the row)."""

    step: int
    rows: Tensor  # [M] int64 the read set F(r, t)
    version: Tensor  # [M] int64
    required: Tensor  # [M] int64


class ReadRecorder:
    """Keeps ``read_records`` (one per step) and ``decisions`` (every admission decision,
    admitted or not, in the order made)."""

    def __init__(self) -> None:
        self.read_records: list[ReadRecord] = []
        self.decisions: list[Decision] = []

    def on_read(self, step: int, rows: Tensor, version: Tensor, required: Tensor) -> None:
        """Step ``step`` is about to read ``rows`` ([M]) at ``version`` ([M]); quality-first
        would require ``required`` ([M]). The tensors are the caller's: copied here."""
        self.read_records.append(ReadRecord(step, rows.clone(), version.clone(), required.clone()))

    def on_decision(self, decision: Decision) -> None:
        """One admission decision was made (throughput-first)."""
        self.decisions.append(decision)


__all__ = ["ReadRecord", "ReadRecorder"]
