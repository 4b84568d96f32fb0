"""``Liveness`` of ranks that are threads of one process (the runtime's is
``StoreLiveness``, over torch.distributed's key-value store).

Imported as ``harness.memory_liveness``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from odin_ns.runtime.liveness import Beater


class MemoryBoard:
    """Counters shared by ``MemoryLiveness`` ends."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self.reasons: dict[int, str] = {}

    def add(self, what: str, rank: int) -> None:
        with self._lock:
            self._counts[(what, rank)] = self._counts.get((what, rank), 0) + 1

    def get(self, what: str, rank: int) -> int:
        with self._lock:
            return self._counts.get((what, rank), 0)


class MemoryLiveness:
    """One rank's ``Liveness`` on a shared ``MemoryBoard``."""

    def __init__(self, board: MemoryBoard, rank: int, beat_s: float):
        self.board = board
        self.rank = rank
        self._beater = Beater(
            lambda: board.add("beats", rank),
            lambda: board.add("pulses", rank),
            beat_s,
            f"odin-beat-{rank}",
        )

    @contextmanager
    def busy(self, reason: str) -> Iterator[None]:
        self.board.reasons[self.rank] = reason
        self._beater.enter()
        try:
            yield
        finally:
            self._beater.leave()

    def beats(self, peer: int) -> int | None:
        return self.board.get("beats", peer)

    def pulses(self, peer: int) -> int | None:
        return self.board.get("pulses", peer)

    def reason(self, peer: int) -> str:
        return self.board.reasons.get(peer, "")

    def arrive(self) -> None:
        self.board.add("arrived", self.rank)

    def arrived(self, peer: int) -> int | None:
        return self.board.get("arrived", peer)

    def close(self) -> None:
        self._beater.close()
