"""Primitive ownership from the AOT plan (DESIGN 3.11): one owner rank per primitive.

Sharded training keeps each primitive's parameters and Adam moments on one owner. A rank
should own mostly what its own view stream reads, so that few rows cross the network, and
about N/R rows, so that memory is balanced. Everything here is a plain function of the
plan's CSR footprints, deterministic and identical on every rank:

- ``stream_read_counts``: [R, N] how many views of rank r's stream read primitive p (the
  plan's locality groups when rank r trains only its group, else its planned steps);
- ``locality_ownership``: capacitated greedy assignment on those counts (each primitive to
  the rank that reads it most, ranks capped at ``floor(N/R (1 + eps))`` rows with ``eps``
  small enough that every rank also gets at least ``0.9 N/R``);
- ``random_ownership``: the Grendel-GS baseline (a seeded random balanced deal);
- ``rebalance_ownership``: at a later phase start, keep the carried owners or move to a
  fresh (sticky) locality assignment: when the carried ones leave N/R +- 10%, or when
  their remote-read bytes over the phase exceed the fresh ones' by more than the bytes of
  migrating the moved rows (parameters and both Adam moments);
- ``ownership_report``: owned rows, largest over N/R, remote-read fraction and cache rows
  of the plan under an ownership, with the random baseline's remote-read fraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp


def _counts_of_views(F: sp.csr_matrix, views: np.ndarray) -> np.ndarray:
    """[N] int64: how many of ``views`` (repeats count) read each primitive."""
    views = np.asarray(views, dtype=np.int64).reshape(-1)
    if views.size == 0:
        return np.zeros(F.shape[1], dtype=np.int64)
    return np.bincount(F[views].indices, minlength=F.shape[1]).astype(np.int64)


def step_read_counts(plan: Any) -> np.ndarray:
    """[R, N] int64: per rank, how many of its planned (step, view) slots read each row."""
    F = plan.footprints
    return np.stack([_counts_of_views(F, plan.views[:, r, :]) for r in range(plan.num_ranks)])


def stream_read_counts(plan: Any) -> np.ndarray:
    """[R, N] int64: per rank, how many views of its stream read each primitive.

    The stream is the plan's locality group of rank r when the plan trains rank r only on
    its group (``assignment == "locality"``: the whole epoch, not just this phase's steps),
    else the views the plan gives rank r.
    """
    if plan.groups is not None and plan.assignment == "locality":
        F = plan.footprints
        return np.stack([_counts_of_views(F, g) for g in plan.groups])
    return step_read_counts(plan)


def capacity(num_rows: int, num_ranks: int, slack: float = 0.05) -> int:
    """Most rows one rank may own: ``floor(N/R (1 + eps))``, ``eps = min(slack, 0.1/(R-1))``.

    With that cap the other R - 1 ranks hold at most ``(R-1) N/R (1 + eps)`` rows, so every
    rank owns at least ``N/R (1 - (R-1) eps) >= 0.9 N/R``: balanced to N/R +- 10%.
    """
    if num_ranks <= 1:
        return num_rows
    eps = min(float(slack), 0.1 / (num_ranks - 1))
    return max(-(-num_rows // num_ranks), int(np.floor(num_rows / num_ranks * (1.0 + eps))))


def locality_ownership(
    counts: np.ndarray,
    slack: float = 0.05,
    current: np.ndarray | None = None,
    bonus: float = 0.5,
) -> np.ndarray:
    """[N] int64 owner of each primitive from read counts [R, N] (deterministic).

    Rounds of a capacitated greedy: each unassigned primitive picks, among ranks with room,
    the one that reads it most (lowest rank on ties); a rank takes its pickers in order of
    decreasing count (lowest id on ties) up to its remaining capacity; the others pick
    again next round. Primitives nobody reads fill the remaining room, least-loaded first.

    Sticky (``current``: [N] int64 owners now, for a rebalance): the current owner's score
    gets ``bonus`` (0.5: it wins ties, and rows nobody reads stay where they are while
    their owner has room); the capacity, hence the N/R +- 10% balance, is unchanged.
    """
    counts = np.asarray(counts)
    num_ranks, n = counts.shape
    owner = np.full(n, -1, dtype=np.int64)
    room = np.full(num_ranks, capacity(n, num_ranks, slack), dtype=np.int64)
    score = counts.astype(np.float64)
    if current is not None:
        score[np.asarray(current, dtype=np.int64), np.arange(n)] += float(bonus)
    todo = np.flatnonzero(score.max(axis=0) > 0)
    for _ in range(num_ranks):
        if todo.size == 0:
            break
        masked = np.where(room[:, None] > 0, score[:, todo], -1.0)  # [R, K]
        choice = masked.argmax(axis=0)
        best = masked[choice, np.arange(todo.size)]
        left = []
        for r in range(num_ranks):
            pick = todo[choice == r]
            if pick.size == 0:
                continue
            order = np.lexsort((pick, -best[choice == r]))
            pick = pick[order]
            take = int(min(room[r], pick.size))
            owner[pick[:take]] = r
            room[r] -= take
            left.append(pick[take:])
        todo = np.sort(np.concatenate(left)) if left else todo[:0]
    rest = np.flatnonzero(owner < 0)  # unread: fill the least-loaded ranks first
    if rest.size:
        slots = np.concatenate([np.full(int(room[r]), r) for r in range(num_ranks)])
        within = np.concatenate([np.arange(int(room[r])) for r in range(num_ranks)])
        load_after = (room.max() - room[slots]) + within  # rows owned after taking the slot
        slots = slots[np.lexsort((slots, load_after))]
        owner[rest] = slots[: rest.size]
    return owner


def random_ownership(num_rows: int, num_ranks: int, seed: int = 0) -> np.ndarray:
    """[N] int64 owners of a seeded random balanced deal (Grendel-GS's redistribution)."""
    perm = np.random.default_rng([int(seed), 0x5A4D]).permutation(num_rows)
    owner = np.empty(num_rows, dtype=np.int64)
    owner[perm] = np.arange(num_rows) % num_ranks
    return owner


def assign_ownership(plan: Any, strategy: str = "locality", seed: int = 0) -> np.ndarray:
    """[N] int64 owners for ``plan``: ``locality`` (from read counts) or ``random``."""
    if strategy == "locality":
        return locality_ownership(stream_read_counts(plan))
    if strategy == "random":
        return random_ownership(plan.footprints.shape[1], plan.num_ranks, seed)
    raise ValueError(f"ownership strategy must be 'locality' or 'random', got {strategy!r}")


def remote_read_fraction(counts: np.ndarray, owner: np.ndarray) -> float:
    """Share of row reads (counts [R, N]) that fall on rows the reader does not own."""
    total = float(counts.sum())
    if total == 0:
        return 0.0
    local = float(counts[owner, np.arange(owner.size)].sum())
    return 1.0 - local / total


ROW_FLOATS = 3 + 3 + 4 + 1 + 3 + 45  # float32 per Gaussian: means .. features_rest (SH 3)
REBALANCE_MODES = ("auto", "always", "never")


def is_balanced(owner: np.ndarray, num_ranks: int, tolerance: float = 0.1) -> bool:
    """Whether every rank owns N/R +- ``tolerance`` rows under ``owner`` [N]."""
    if owner.size == 0:
        return True
    owned = np.bincount(owner, minlength=num_ranks)
    fair = owner.size / num_ranks
    return bool(owned.max() <= (1 + tolerance) * fair and owned.min() >= (1 - tolerance) * fair)


def remote_reads(counts: np.ndarray, owner: np.ndarray) -> int:
    """Row reads (counts [R, N]) that fall on rows the reader does not own."""
    return int(counts.sum() - counts[owner, np.arange(owner.size)].sum())


@dataclass(frozen=True)
class Rebalance:
    """A phase start's ownership decision (``rebalance_ownership``).

    Bytes are estimates over the coming phase from the plan: a remote read costs a
    gradient row to the owner and a parameter row back (``2 x read_row_bytes``); a moved
    row costs its parameters, both Adam moments and its version once (``migrate_row_bytes``).
    """

    owner: np.ndarray  # [N] int64 owners for the phase (the carried ones when kept)
    mode: str  # auto / always / never
    rebalanced: bool
    reason: str  # balance / bytes / always / kept / never
    moved_rows: int  # rows whose owner changes (0 when kept)
    migrated_bytes: int  # moved_rows x migrate_row_bytes
    carried_bytes: int  # remote-read bytes of the carried owners over the phase
    fresh_bytes: int  # remote-read bytes of the fresh (sticky locality) owners
    fresh_moved_rows: int  # rows the fresh owners would move
    fresh_migration_bytes: int  # fresh_moved_rows x migrate_row_bytes
    remote_read_fraction_before: float  # carried owners, this phase's planned reads
    remote_read_fraction_after: float  # the owners chosen

    def report(self) -> dict:
        """JSON-ready figures (everything but the owner vector)."""
        out = {k: v for k, v in vars(self).items() if k != "owner"}
        out["saved_bytes"] = self.carried_bytes - self.fresh_bytes if self.rebalanced else 0
        return out


def rebalance_ownership(
    plan: Any,
    owner: np.ndarray,
    mode: str = "auto",
    read_row_bytes: int = 4 * ROW_FLOATS,
    migrate_row_bytes: int = 3 * 4 * ROW_FLOATS + 8,
    slack: float = 0.05,
    tolerance: float = 0.1,
    strategy: str = "locality",
    seed: int = 0,
) -> Rebalance:
    """Keep the carried owners [N] for ``plan``'s phase, or move to a fresh assignment.

    The fresh assignment (``strategy``) is ``locality_ownership`` on the plan's stream
    counts, sticky to the carried owners (bonus 0.5: the current owner wins ties, unread
    rows stay), so it is balanced to N/R +- 10%; or, for the random baseline, a fresh
    random deal (``random_ownership``: a random owner stays random). ``auto`` takes it when the carried owners leave N/R +-
    ``tolerance`` (reason ``balance``), or when the carried owners' remote-read bytes over
    the phase exceed the fresh ones' by more than the migration bytes (``bytes``);
    ``always`` takes it every time, ``never`` never. Deterministic: the same on every rank.
    """
    if mode not in REBALANCE_MODES:
        raise ValueError(f"rebalance mode must be one of {REBALANCE_MODES}, got {mode!r}")
    owner = np.asarray(owner, dtype=np.int64)
    steps = step_read_counts(plan)  # [R, N] this phase's planned reads
    if strategy == "locality":
        fresh = locality_ownership(stream_read_counts(plan), slack, current=owner)
    elif strategy == "random":
        fresh = random_ownership(owner.size, plan.num_ranks, seed)
    else:
        raise ValueError(f"ownership strategy must be 'locality' or 'random', got {strategy!r}")
    moved = int((fresh != owner).sum())
    carried_bytes = 2 * read_row_bytes * remote_reads(steps, owner)
    fresh_bytes = 2 * read_row_bytes * remote_reads(steps, fresh)
    migration_bytes = migrate_row_bytes * moved
    if mode != "auto":
        take, reason = mode == "always", mode
    elif not is_balanced(owner, plan.num_ranks, tolerance):
        take, reason = True, "balance"
    elif carried_bytes - fresh_bytes > migration_bytes:
        take, reason = True, "bytes"
    else:
        take, reason = False, "kept"
    chosen = fresh if take else owner
    return Rebalance(
        owner=chosen,
        mode=mode,
        rebalanced=take,
        reason=reason,
        moved_rows=moved if take else 0,
        migrated_bytes=migration_bytes if take else 0,
        carried_bytes=carried_bytes,
        fresh_bytes=fresh_bytes,
        fresh_moved_rows=moved,
        fresh_migration_bytes=migration_bytes,
        remote_read_fraction_before=remote_read_fraction(steps, owner),
        remote_read_fraction_after=remote_read_fraction(steps, chosen),
    )


def ownership_report(plan: Any, owner: np.ndarray, seed: int = 0) -> dict:
    """JSON-ready figures of ``owner`` [N] for ``plan`` (and the random baseline's)."""
    num_ranks, n = plan.num_ranks, plan.footprints.shape[1]
    owned = np.bincount(owner, minlength=num_ranks)
    steps = step_read_counts(plan)
    stream = stream_read_counts(plan)
    cache = [int(((steps[r] > 0) & (owner != r)).sum()) for r in range(num_ranks)]
    rand = random_ownership(n, num_ranks, seed)
    fair = n / num_ranks if num_ranks else 0.0
    return {
        "num_rows": int(n),
        "num_ranks": int(num_ranks),
        "owned_rows": owned.tolist(),
        "owned_rows_max_over_fair": float(owned.max() / fair) if n else 0.0,
        "owned_rows_min_over_fair": float(owned.min() / fair) if n else 0.0,
        "cache_rows": cache,
        "remote_read_fraction": remote_read_fraction(steps, owner),
        "remote_read_fraction_stream": remote_read_fraction(stream, owner),
        "random_remote_read_fraction": remote_read_fraction(steps, rand),
        "random_remote_read_fraction_stream": remote_read_fraction(stream, rand),
    }


__all__ = [
    "REBALANCE_MODES",
    "ROW_FLOATS",
    "Rebalance",
    "assign_ownership",
    "capacity",
    "is_balanced",
    "locality_ownership",
    "ownership_report",
    "random_ownership",
    "rebalance_ownership",
    "remote_read_fraction",
    "remote_reads",
    "step_read_counts",
    "stream_read_counts",
]
