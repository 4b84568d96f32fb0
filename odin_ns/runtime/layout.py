"""The ownership map of a phase (DESIGN 3.11): who owns each Gaussian row, and one rank's
local table of the rows it owns followed by the rows it caches.

An ownership map gives every row an owner rank, or ``EVERY_RANK``: a row every rank owns.
The sharded layout (``--pipeline.parallel sharded``) gives each row one owner; the
replicated layout gives every row ``EVERY_RANK``, so a rank holds the whole model, caches
nothing, sends its gradient rows to every peer and applies every update: one step path,
two maps. Rank ``me`` holds a local table of ``L = O + C`` rows: the ``O`` rows it owns
(sorted by global id, so ``[0, O)`` is a contiguous prefix the apply op updates with the
``[O]`` Adam moments) followed by a cache of the ``C`` non-owned rows its planned steps read
in the phase. ``ShardLayout`` maps global ids to local ids. Renders read local ids in global-id
order, so a rank draws exactly the tensors replicated training draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EVERY_RANK = -1  # an ``owner`` entry: the row is replicated, every rank owns it


def owned_by(owner: np.ndarray, rank: int) -> np.ndarray:
    """[K] bool: whether ``rank`` owns each row of ``owner`` ([K] int64 owner entries: a
    rank, or ``EVERY_RANK``)."""
    return (owner == rank) | (owner == EVERY_RANK)


def cache_of(owner: np.ndarray, rank: int, reads: np.ndarray) -> np.ndarray:
    """The rows ``rank`` caches in a phase: those of its ``reads`` ([K] int64 global ids,
    sorted) that it does not own (``owner``: [N] int64, as in ``ShardLayout``)."""
    return reads[~owned_by(owner[reads], rank)]


@dataclass
class ShardLayout:
    """One rank's local table: owned rows, then cached rows (both sorted by global id).

    Args:
        owner: [N] int64 owner of every global row (identical on every rank): a rank, or
            ``EVERY_RANK`` for a row every rank owns (all of them: replicated training).
        rank: this rank.
        cache: [C] int64 sorted global ids of the non-owned rows this rank caches.
    """

    owner: np.ndarray
    rank: int
    cache: np.ndarray
    owned: np.ndarray = field(init=False)  # [O] int64 sorted global ids
    gids: np.ndarray = field(init=False)  # [L] int64 global id of each local row
    local_of: np.ndarray = field(init=False)  # [N] int64 local id of each global row, -1: none
    identity: bool = field(init=False)  # local ids are global ids (every row owned)
    replicated: bool = field(init=False)  # every rank owns every row (``EVERY_RANK``)

    def __post_init__(self):
        self.owned = np.flatnonzero(owned_by(self.owner, self.rank)).astype(np.int64)
        self.cache = np.asarray(self.cache, dtype=np.int64)
        if owned_by(self.owner[self.cache], self.rank).any():
            raise ValueError(f"rank {self.rank}: the cache holds rows the rank owns")
        self.gids = np.concatenate([self.owned, self.cache])
        self.local_of = np.full(self.owner.size, -1, dtype=np.int64)
        self.local_of[self.gids] = np.arange(self.gids.size)
        self.identity = self.gids.size == self.owner.size and self.cache.size == 0
        self.replicated = bool((self.owner == EVERY_RANK).all())

    @property
    def num_owned(self) -> int:
        return int(self.owned.size)

    @property
    def num_local(self) -> int:
        return int(self.gids.size)

    def local(self, gids: np.ndarray) -> np.ndarray:
        """[K] int64 local ids of global ids ``gids`` (each must be in the table)."""
        local = self.local_of[gids]
        if local.size and local.min() < 0:
            raise KeyError(f"rank {self.rank}: global rows not in the local table")
        return local


def replicated_layout(num_rows: int, rank: int) -> ShardLayout:
    """The ownership map of replicated training: every rank owns each of ``num_rows`` rows
    (``EVERY_RANK``) and caches none."""
    return ShardLayout(np.full(num_rows, EVERY_RANK), rank, np.empty(0, dtype=np.int64))


def phase_read_sets(plan, num_ranks: int) -> list[np.ndarray]:
    """Per rank, [K_r] sorted global ids its planned steps of the phase read."""
    F = plan.footprints
    return [np.unique(F[plan.views[:, r, :].reshape(-1)].indices) for r in range(num_ranks)]


__all__ = [
    "EVERY_RANK",
    "ShardLayout",
    "cache_of",
    "owned_by",
    "phase_read_sets",
    "replicated_layout",
]
