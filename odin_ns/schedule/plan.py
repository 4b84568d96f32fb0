"""Ahead-of-time plan for one phase: who trains which view when, and who waits for whom.

``build_plan`` turns footprints into a ``Plan`` (contract in docs/architecture.md):

- ``strategy="odin"``: views are split once into R spatially coherent groups of equal size
  (``locality.partition_views`` on the Jaccard locality graph). Then one of two
  assignments (``PlanOptions.assignment``; ``auto`` picks with ``locality_ratio``):

  * ``locality`` (street / city scenes, where groups cut overlap): rank r trains only its
    group, so ranks running side by side work on different parts of the scene. Inside an
    epoch each rank's group is shuffled with a per-(seed, epoch) generator; to balance each
    step's cost, every rank sorts its epoch's views by cost (random ties), cuts the list
    into B strata, and stratum position j of every rank goes to the same step (one shared
    random permutation per stratum): a step's R ranks get views of the same cost quantile.
  * ``balance`` (object-centric scenes, where every view overlaps most others and no
    grouping avoids conflict): each step is a band of R * B views of similar cost (views
    sorted by cost, random ties), handed to ranks in group order; steps are shuffled.
    Per-step cost is balanced whatever the cost spread.

  Then, with locality, each epoch's steps are ordered (``PlanOptions.step_order``,
  ``low_conflict_order``) so that a rank's view overlaps few views its peers trained in the
  steps just before: a quality-first rank waits on a peer's step only when their views
  share a primitive.
- ``strategy="random"``: the baseline. Each epoch is a global shuffle dealt round-robin.

Epochs: an epoch covers every training view once in ``ceil(V / (R * B))`` steps. When
``R * B`` does not divide V the missing slots are padded with *repeats*: extra views drawn
(per epoch, seeded) from the same rank's group (odin) or from the whole epoch (random);
they are trained twice in that epoch. Steps run through epochs ``epoch, epoch + 1, ...``
and the plan is cut after ``num_steps`` steps. To continue an unfinished epoch in the next
phase (new footprints after densification), pass ``**plan.resume(t)``: the views not yet
trained in that epoch are planned first as a short epoch, then full epochs follow.

Dependency table: one pass over the steps with a per-(rank, primitive) last-write array
[R, N]; at step t each rank's read set gathers its rows, the max per peer is the latest
step that peer wrote any of them, and the count of rows equal to that max is the
intersection size. Writes of step t are recorded after all reads of step t. The same pass
counts each read set's rows a peer wrote in the last ``CONFLICT_WINDOW`` steps
(``Plan.conflict``, what ``stats.plan_conflict`` reports). The pass and the locality
graph's view overlaps run as compiled host kernels when the CPU library is built
(``odin_ns/cuda/csrc/plan_cpu.cpp``), else as their numpy / scipy twins: the same plan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linear_sum_assignment

from odin_ns.cuda import ops
from odin_ns.schedule.locality import exact_overlaps, locality_graph, partition_views

Strategy = Literal["odin", "random"]
CONFLICT_WINDOW = 4  # steps back a plan's ``conflict`` looks (``stats.plan_conflict``)
HISTORY_STEPS = 4  # steps of the previous epoch a low-conflict order looks back on
# The dependency pass renumbers rows by first touch only when its last-write array [R, N]
# is larger than this (bytes): the renumbering (an argsort of N) pays for itself once the
# array leaves the cache (R = 16, N = 1M: 0.18 s vs 0.27 s for 100 steps) and costs twice
# the pass below it (street, R = 2, N = 117k: 0.014 s vs 0.007 s for 25 steps).
RELABEL_ABOVE_BYTES = 8 << 20


@dataclass
class PlanOptions:
    """Knobs of the odin strategy (defaults suit 1k-50k views)."""

    knn: int = 16
    """Neighbours per view in the locality graph."""
    max_work: float = 3e7
    """Budget of the sparse product F @ F.T (primitive sampling above it)."""
    assignment: Literal["auto", "locality", "balance"] = "auto"
    """``locality``: rank r trains only its group r. ``balance``: every step is a band of
    views of similar cost (steps balanced whatever the costs), handed to ranks in group
    order. ``auto``: locality, unless the groups do not cut overlap (``locality_gain``)."""
    locality_gain: float = 0.5
    """auto picks locality when a view overlaps a view of another group by at most this
    fraction of what it overlaps a random view (exact, from per-group primitive counts)."""
    step_order: Literal["low-conflict", "shuffled"] = "low-conflict"
    """Order of an epoch's steps. ``shuffled``: random. ``low-conflict`` (DESIGN 1: "views
    running close together on different ranks share few primitives"): greedy, so that a
    rank's view overlaps few views its peers trained in the steps just before
    (``low_conflict_order``); a step's views and their cost balance are the same. Locality
    assignment with exact view overlaps (``max_work``) only; otherwise the steps stay
    shuffled."""
    lag_weight: float = 0.2
    """low-conflict: weight of an overlap with the step d steps back, ``lag_weight ** (d -
    1)`` (an overlap with the previous step is a wait whenever a peer runs late; one
    further back only when it runs later than that)."""


@dataclass
class Plan:
    """One phase's schedule (see docs/architecture.md for the contract)."""

    views: np.ndarray  # int64 [T, R, B]
    dependency: np.ndarray  # int64 [T, R, R]; -1 where no dependency (and on q == r)
    dependency_rows: np.ndarray  # int64 [T, R, R]; 0 where no dependency
    message_rows: np.ndarray  # int64 [T, R]
    plan_hash: str
    footprints: sp.csr_matrix  # [V, N] bool
    step_epoch: np.ndarray  # int64 [T] epoch each step belongs to
    groups: list[np.ndarray] | None  # odin: view ids of each rank's group (full epochs)
    strategy: str
    assignment: str  # "locality" / "balance" (odin) or "random"
    seed: int
    epoch: int  # epoch of the first step
    pending: np.ndarray | None = field(default=None)  # views still due in `epoch`
    conflict: np.ndarray | None = field(default=None)  # int64 [T, R] (dependency_pass)
    conflict_window: int = CONFLICT_WINDOW

    @property
    def num_steps(self) -> int:
        return self.views.shape[0]

    @property
    def num_ranks(self) -> int:
        return self.views.shape[1]

    @property
    def views_per_rank(self) -> int:
        return self.views.shape[2]

    def step_footprint(self, t: int, r: int) -> np.ndarray:
        """Sorted unique primitive ids of the union of footprints of views[t, r], in the
        footprints' integer type (scipy's CSR: int32 below 2^31 ids); one view's ids are
        the matrix's own, not a copy, so not to be written (a sharded phase start reads
        every rank's at every step: at R = 64 and 1M rows, copies to int64 cost 6 ms a plan
        step)."""
        F = self.footprints
        rows = [F.indices[F.indptr[v] : F.indptr[v + 1]] for v in self.views[t, r]]
        return rows[0] if len(rows) == 1 else np.unique(np.concatenate(rows))

    def resume(self, t: int) -> dict:
        """Arguments (``epoch``, ``pending``) for a plan that continues at local step t."""
        if not 0 <= t <= self.num_steps:
            raise ValueError(f"step {t} outside the plan's 0..{self.num_steps}")
        if t == 0:
            return {"epoch": self.epoch, "pending": self.pending}
        e = int(self.step_epoch[t - 1])
        if e == self.epoch and self.pending is not None:
            due = self.pending
        else:
            due = np.arange(self.footprints.shape[0])
        first = int(np.searchsorted(self.step_epoch, e))
        done = np.unique(self.views[first:t])
        rest = np.setdiff1d(due, done)
        if rest.size == 0:
            return {"epoch": e + 1, "pending": None}
        return {"epoch": e, "pending": rest}


def _check_inputs(
    footprints, num_ranks, num_steps, views_per_rank, costs, strategy, pending, seed, epoch
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray | None]:
    if not sp.issparse(footprints):
        raise ValueError("footprints must be a scipy.sparse matrix [V, N]")
    F = footprints
    if not (isinstance(F, sp.csr_matrix) and F.dtype == bool and F.has_canonical_format):
        F = sp.csr_matrix(footprints, dtype=bool)
        F.sum_duplicates()
        F.sort_indices()
    num_views = F.shape[0]
    if strategy not in ("odin", "random"):
        raise ValueError(f"strategy must be 'odin' or 'random', got {strategy!r}")
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got {seed}, {epoch}")
    if num_ranks < 1 or views_per_rank < 1 or num_steps < 0:
        raise ValueError(
            f"need num_ranks >= 1, views_per_rank >= 1, num_steps >= 0; got "
            f"{num_ranks}, {views_per_rank}, {num_steps}"
        )
    if num_ranks > num_views:
        raise ValueError(f"more ranks ({num_ranks}) than views ({num_views})")
    if costs is None:
        cost = np.diff(F.indptr).astype(np.float64)
    else:
        cost = np.asarray(costs, dtype=np.float64).reshape(-1)
        if cost.shape[0] != num_views:
            raise ValueError(f"costs has {cost.shape[0]} entries but there are {num_views} views")
        if not np.isfinite(cost).all() or (cost < 0).any():
            raise ValueError("costs must be finite and non-negative")
    if pending is not None:
        pending = np.unique(np.asarray(pending, dtype=np.int64).reshape(-1))
        if pending.size == 0:
            pending = None
        elif pending[0] < 0 or pending[-1] >= num_views:
            raise ValueError(f"pending views must be in [0, {num_views})")
    return F, cost, pending


def _fix_step_duplicates(slots: np.ndarray) -> None:
    """Swap entries of one epoch's ``slots`` [T, R, B] (in place) so that no (t, r) row
    repeats a view. Repeats come from padding; a swap partner is looked for in the same
    rank's other steps first (keeps its group), then in other ranks. Impossible only when
    R * B > V and a group is smaller than B."""
    T, R, B = slots.shape
    if B == 1:
        return
    srt = np.sort(slots, axis=2)
    bad = np.argwhere((srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2))
    for t, r in bad:
        row = slots[t, r]
        for b in range(1, B):
            x = row[b]
            if x not in row[:b]:
                continue
            order = [(s, r) for s in range(T) if s != t]
            order += [(s, q) for s in range(T) for q in range(R) if q != r]
            for s, q in order:
                other = slots[s, q]
                hit = next((c for c in range(B) if other[c] not in row and x not in other), None)
                if hit is not None:
                    row[b], other[hit] = other[hit], x
                    break


def _odin_epoch(
    groups: list[np.ndarray],
    cost: np.ndarray,
    steps: int,
    views_per_rank: int,
    rng: np.random.Generator,
    fallback: np.ndarray,
) -> np.ndarray:
    """[steps, R, B] slots for one epoch: each rank its group, cost-quantile matched."""
    B = views_per_rank
    S = steps * B
    perms = [rng.permutation(steps) for _ in range(B)]
    out = np.empty((steps, len(groups), B), dtype=np.int64)
    for r, g in enumerate(groups):
        src = g if g.size else fallback
        extra = S - g.size
        pad = rng.choice(src, size=extra, replace=extra > src.size) if extra > 0 else src[:0]
        lst = np.concatenate([g, pad])
        lst = lst[np.lexsort((rng.random(S), cost[lst]))]
        for b in range(B):
            out[perms[b], r, b] = lst[b * steps : (b + 1) * steps]
    _fix_step_duplicates(out)
    return out


def view_conflicts(
    overlaps: sp.csr_matrix, group_of: np.ndarray
) -> tuple[sp.csr_matrix, np.ndarray]:
    """What ``low_conflict_order`` reads of a plan's views, made once per plan: ([V, V] bool
    CSR, true where two views share a primitive; [V] float64, how many views of other groups
    each view shares one with), from ``overlaps`` ([V, V], nonzero where they share one) and
    ``group_of`` ([V] each view's locality group)."""
    hit = overlaps.tocsr().astype(bool)
    coo = hit.tocoo()
    cross = group_of[coo.row] != group_of[coo.col]
    return hit, np.bincount(coo.row[cross], minlength=hit.shape[0]).astype(np.float64)


def low_conflict_order(
    slots: np.ndarray,  # int64 [S, R, B]: one epoch's steps, in random order
    hit: sp.csr_matrix,  # [V, V] bool: two views share a primitive (``view_conflicts``)
    view_degree: np.ndarray,  # [V]: views of other groups each shares one with (same)
    history: np.ndarray,  # int64 [H, R, B]: the steps planned just before (oldest first)
    steps: int,  # how many leading steps to order (the plan's remaining length)
    rng: np.random.Generator,
    lag_weight: float = 0.2,
) -> np.ndarray:
    """``slots`` with its first ``steps`` steps chosen greedily, the rest as they were.

    Quality-first waits at step t for a peer's step s < t when their views share a
    primitive; the wait is hidden unless that peer runs t - s steps late. Each step the
    greedy takes the one with the lowest score: the ranks whose view would share a
    primitive with a peer's view d steps back, weighted ``lag_weight ** (d - 1)``, minus a
    hardness in [0, 1): the step's views' overlaps with other groups' views, relative to the
    epoch's hardest step, times a uniform draw from ``rng``. So a step that conflicts with
    many goes early (not last, where the leftovers would run back to back), and epochs do
    not repeat one order (without the draw, 85-100% of a street epoch's steps sat where
    they sat in the epoch before; with it 23-26%, a shuffle 6-12%). On the built-in street
    scene's footprints after 100 steps (simulated, exponential delays of half a step's
    compute, 6 plan seeds), the share of barrier's wait that quality-first hides: 2 ranks
    39% -> 53%, 3 ranks 24% -> 28%; on fox and drive it stays at 1-6% (every pair of
    views overlaps). Measured on that street (docs/benchmarks.md): 2 ranks 52% -> 68%,
    3 ranks 18% both.
    """
    num, R, B = slots.shape
    if num == 0 or R == 1:
        return slots
    degree = view_degree[slots].sum(axis=(1, 2))
    hardness = degree * rng.random(num) / (degree.max() + 1.0)
    reads = np.zeros((hit.shape[0], R), dtype=bool)  # [V, R]: view overlaps rank q's view

    def waits(step: np.ndarray) -> np.ndarray:
        """[S] ranks of each step that would read a primitive a peer wrote at ``step``."""
        reads[:] = False
        for q in range(R):
            nbrs = hit[step[q]]
            reads[nbrs.indices, q] = True
        peers = reads.sum(axis=1)
        out = np.zeros(num)
        for r in range(R):
            own = slots[:, r, :]
            out += ((peers[own] - reads[own, r]) > 0).any(axis=1)
        return out

    score = np.zeros(num)
    for step in history:
        score = lag_weight * score + waits(step)
    left = np.ones(num, dtype=bool)
    order = []
    for _ in range(min(steps, num)):
        j = int(np.argmin(np.where(left, score - hardness, np.inf)))
        order.append(j)
        left[j] = False
        score = lag_weight * score + waits(slots[j])
    return slots[np.concatenate([np.asarray(order, dtype=np.int64), np.flatnonzero(left)])]


def _keep_sides(parts: list[np.ndarray], group_of: np.ndarray) -> list[np.ndarray]:
    """``parts`` (a partition of an epoch's pending views into R groups) reordered so that
    part r shares the most views with rank r's full group (``group_of`` [V]): a phase that
    continues an epoch keeps each rank on its side of the scene. Without it, a street's two
    halves could swap ranks at a phase boundary, and in the sharded layout every row a rank
    read would then be another rank's (a 40x jump in bytes per step, measured on the test
    street)."""
    shared = np.stack([np.bincount(group_of[p], minlength=len(parts)) for p in parts], axis=1)
    _, part_of_rank = linear_sum_assignment(shared, maximize=True)  # shared: [rank, part]
    return [parts[i] for i in part_of_rank]


def locality_ratio(
    F: sp.csr_matrix, groups: list[np.ndarray], overlaps: sp.csr_matrix | None = None
) -> float:
    """Mean overlap (rows) of a view with a view of another group, over the mean overlap
    with any other view: ~1 when grouping cannot separate views (object-centric scenes),
    << 1 when it does (street scenes). NaN when nothing overlaps or there is one group.

    ``overlaps``: ``locality.exact_overlaps(F)`` if known ([V, V] ``|F_a & F_b|``); the
    pair sums then come from it instead of per-group primitive counts (the same integers).
    """
    num_views, n = F.shape
    if overlaps is not None:
        P = overlaps.tocsr()
        diag = P.diagonal().astype(np.float64)
        s_all = float(P.sum(dtype=np.float64)) - float(diag.sum())
        s_in = 0.0
        for g in groups:
            s_in += float(P[g][:, g].sum(dtype=np.float64)) - float(diag[g].sum())
    else:
        deg = np.bincount(F.indices, minlength=n).astype(np.float64)
        s_all = float(np.dot(deg, deg - 1.0))
        s_in = 0.0
        for g in groups:
            c = np.bincount(F[g].indices, minlength=n).astype(np.float64)
            s_in += float(np.dot(c, c - 1.0))
    sizes = np.array([g.size for g in groups], dtype=np.float64)
    p_cross = num_views**2 - float(np.dot(sizes, sizes))
    if s_all <= 0 or p_cross <= 0:
        return float("nan")
    return ((s_all - s_in) / p_cross) / (s_all / (num_views * (num_views - 1.0)))


def _balance_epoch(
    due: np.ndarray,
    group_of: np.ndarray,
    cost: np.ndarray,
    num_ranks: int,
    views_per_rank: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """[steps, R, B] slots for one epoch: cost-sorted bands of R * B views, one per step,
    handed to ranks in group order (rank r tends to get group r's views); steps shuffled."""
    slots = num_ranks * views_per_rank
    steps = -(-due.size // slots)
    extra = steps * slots - due.size
    lst = due
    if extra:
        lst = np.concatenate([due, rng.choice(due, size=extra, replace=extra > due.size)])
    lst = lst[np.lexsort((rng.random(lst.size), cost[lst]))].reshape(steps, slots)
    key = group_of[lst] + rng.random(lst.shape)  # group order, random inside a group
    lst = np.take_along_axis(lst, np.argsort(key, axis=1), axis=1)
    out = lst[rng.permutation(steps)].reshape(steps, num_ranks, views_per_rank).copy()
    _fix_step_duplicates(out)
    return out


def _random_epoch(
    due: np.ndarray, num_ranks: int, views_per_rank: int, rng: np.random.Generator
) -> np.ndarray:
    """[steps, R, B] slots for one epoch: global shuffle dealt round-robin."""
    slots = num_ranks * views_per_rank
    steps = -(-due.size // slots)
    perm = rng.permutation(due)
    extra = steps * slots - due.size
    if extra:
        perm = np.concatenate([perm, rng.choice(due, size=extra, replace=extra > due.size)])
    out = perm.reshape(steps, views_per_rank, num_ranks).transpose(0, 2, 1).copy()
    _fix_step_duplicates(out)
    return out


def _gather_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray):
    """Concatenated CSR rows and their offsets [len(rows) + 1]."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    offs = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    idx = np.repeat(starts - offs[:-1], lens) + np.arange(offs[-1])
    return indices[idx], offs


def step_rows(F: sp.csr_matrix, views_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Read sets of one step: (ids, offsets [R + 1]); rank r's sorted unique ids are
    ``ids[offsets[r]:offsets[r + 1]]``. ``views_t`` is [R, B]."""
    R, B = views_t.shape
    if B == 1:
        return _gather_rows(F.indptr, F.indices, views_t[:, 0])
    ids, offs = _gather_rows(F.indptr, F.indices, views_t.reshape(-1))
    rank = np.repeat(np.arange(R * B) // B, np.diff(offs))
    key = np.unique(rank * np.int64(F.shape[1]) + ids)
    rank = key // F.shape[1]
    out_offs = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(np.bincount(rank, minlength=R), out=out_offs[1:])
    return (key % F.shape[1]).astype(F.indices.dtype), out_offs


def _all_step_rows(F: sp.csr_matrix, views: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Read sets of every (t, r), concatenated in (t, r) order, and offsets [T * R + 1]."""
    T, R, B = views.shape
    if B == 1:
        return _gather_rows(F.indptr, F.indices, views.reshape(-1))
    parts, lens = [], np.zeros(T * R, dtype=np.int64)
    for t in range(T):
        ids, offs = step_rows(F, views[t])
        parts.append(ids)
        lens[t * R : (t + 1) * R] = np.diff(offs)
    offs = np.zeros(T * R + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    return (np.concatenate(parts) if parts else F.indices[:0]), offs


def _step_dtype(num_steps: int) -> type:
    """Smallest signed integer type that holds -1 .. num_steps - 1 (less memory traffic)."""
    for dt in (np.int16, np.int32):
        if num_steps < np.iinfo(dt).max:
            return dt
    return np.int64


def _relabel_by_first_touch(ids: np.ndarray, n: int) -> np.ndarray:
    """Renumber primitives in order of first use so that the rows a step touches sit close
    together in memory (2x faster gathers on large scenes). Any bijection gives the same
    table; this one only changes speed."""
    first = np.full(n, ids.size, dtype=np.int64)
    first[ids[::-1]] = np.arange(ids.size - 1, -1, -1)  # repeated ids: a smallest position wins
    label = np.empty(n, dtype=ids.dtype)
    label[np.argsort(first, kind="stable")] = np.arange(n, dtype=ids.dtype)
    return label[ids]


def dependency_pass(
    F: sp.csr_matrix, views: np.ndarray, window: int = CONFLICT_WINDOW
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dependency [T, R, R], dependency_rows [T, R, R], message_rows [T, R], conflict
    [T, R]) of ``views`` ([T, R, B] view ids into ``F``'s rows), in one pass over the steps.

    ``conflict[t, r]``: rows of rank r's read set at t that a peer wrote in steps
    ``t - window .. t - 1`` (what ``stats.conflict_rows`` reports). Runs the compiled
    kernel (``torch.ops.odin.plan_dependencies``: two loops over each read set, no
    temporaries; 25 steps x 2 ranks x 20k rows of 117k: 10-14 ms -> 5-6 ms) when the CPU
    library is built, else its twin ``dependency_pass_reference``; both give the same
    arrays.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    kernel = ops.host_op("plan_dependencies")
    if kernel is None:
        return dependency_pass_reference(F, views, window)
    out = kernel(
        *ops.csr_tensors(F),
        torch.from_numpy(np.ascontiguousarray(views, dtype=np.int64)),
        int(F.shape[1]),
        int(window),
    )
    return tuple(x.numpy() for x in out)


def dependency_pass_reference(
    F: sp.csr_matrix, views: np.ndarray, window: int = CONFLICT_WINDOW
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``dependency_pass`` in numpy (the compiled kernel's specification). The pass keeps
    ``last[q, p]``, the latest step < t at which rank q wrote primitive p, and reads it per
    rank with contiguous takes (a read set's rows are one slice of the concatenated sets).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    T, R, _ = views.shape
    dep = np.full((T, R, R), -1, dtype=np.int64)
    rows = np.zeros((T, R, R), dtype=np.int64)
    conflict = np.zeros((T, R), dtype=np.int64)
    ids, offs = _all_step_rows(F, views)
    msg = np.diff(offs).reshape(T, R)
    step_dtype = _step_dtype(T)
    if R * F.shape[1] * np.dtype(step_dtype).itemsize > RELABEL_ABOVE_BYTES:
        ids = _relabel_by_first_touch(ids, F.shape[1])
    ids = ids.astype(np.intp)
    last = np.full((R, F.shape[1]), -1, dtype=step_dtype)  # -1: never written
    for t in range(T):
        reads = [ids[offs[t * R + r] : offs[t * R + r + 1]] for r in range(R)]
        for r, read in enumerate(reads):
            if read.size == 0:
                continue
            seen = last.take(read, axis=1)  # [R, M]: each rank's latest write of each row
            latest = seen.max(axis=1)  # [R]
            dep[t, r] = latest
            count = [np.count_nonzero(seen[q] == latest[q]) for q in range(R)]
            rows[t, r] = np.where(latest >= 0, count, 0)
            seen[r] = -1  # a rank does not conflict with itself
            conflict[t, r] = np.count_nonzero(seen.max(axis=0) >= max(t - window, 0))
        for r, read in enumerate(reads):  # step t's writes, after all of its reads
            last[r][read] = t
    rank_ids = np.arange(R)
    dep[:, rank_ids, rank_ids] = -1
    rows[:, rank_ids, rank_ids] = 0
    return dep, rows, msg, conflict


def dependency_table(
    F: sp.csr_matrix, views: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dependency [T, R, R], dependency_rows [T, R, R], message_rows [T, R]) of ``views``."""
    return dependency_pass(F, views)[:3]


def _plan_hash(F: sp.csr_matrix, views: np.ndarray, meta: list, cost: np.ndarray, pending) -> str:
    h = hashlib.sha256()
    h.update(repr(["odin-plan-v1", *meta, F.shape, views.shape]).encode())
    h.update(np.ascontiguousarray(views, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(F.indptr, dtype="<i8").tobytes())
    idx_dtype = "<i4" if F.shape[1] < 2**31 else "<i8"
    h.update(np.ascontiguousarray(F.indices, dtype=idx_dtype).tobytes())
    h.update(np.ascontiguousarray(cost, dtype="<f8").tobytes())
    if pending is not None:
        h.update(np.ascontiguousarray(pending, dtype="<i8").tobytes())
    return h.hexdigest()


def build_plan(
    footprints: sp.spmatrix,  # [V, N] bool
    num_ranks: int,
    num_steps: int,
    views_per_rank: int = 1,
    costs: np.ndarray | None = None,  # [V] cost per view (default: footprint size)
    seed: int = 0,
    epoch: int = 0,
    strategy: Strategy = "odin",
    pending: np.ndarray | None = None,  # views still due in `epoch` (from Plan.resume)
    options: PlanOptions | None = None,
) -> Plan:
    """Plan ``num_steps`` steps of ``num_ranks`` ranks training ``views_per_rank`` views each.

    Deterministic: identical inputs give identical ``views`` and ``plan_hash`` on every rank.
    """
    F, cost, pending = _check_inputs(
        footprints, num_ranks, num_steps, views_per_rank, costs, strategy, pending, seed, epoch
    )
    opts = options or PlanOptions()
    num_views = F.shape[0]
    R, B = num_ranks, views_per_rank
    groups = overlaps = None
    assignment = "random"
    full_groups: list[np.ndarray] | None = None
    pending_groups: list[np.ndarray] | None = None
    if strategy == "odin" and num_steps > 0:
        overlaps = exact_overlaps(F, opts.max_work)  # None: the graph samples primitives
        graph = locality_graph(F, opts.knn, opts.max_work, seed, overlaps=overlaps)
        full_groups = partition_views(graph, R)
        groups = full_groups
        assignment = opts.assignment
        if assignment == "auto":
            ratio = locality_ratio(F, full_groups, overlaps)
            assignment = "locality" if ratio <= opts.locality_gain else "balance"
        group_of = np.empty(num_views, dtype=np.int64)
        for r, g in enumerate(full_groups):
            group_of[g] = r
        if pending is not None and assignment == "locality":
            pending_groups = _keep_sides(partition_views(graph, R, nodes=pending), group_of)

    # Locality streams with exact overlaps only. Balanced bands (object captures): every
    # step waits on every peer whatever the order, and ordered by hardness alone the plan's
    # rows read from a peer's previous step rose (fox, 8 ranks: 73% -> 82%). A sampled
    # graph misses overlaps, and ordered on it the greedy did worse than a shuffle on a
    # 5,000-view city (simulated, 8 ranks: 95% vs 97% of barrier's wait hidden).
    order_steps = strategy == "odin" and assignment == "locality" and num_steps > 0
    order_steps = order_steps and opts.step_order == "low-conflict" and overlaps is not None
    if order_steps:
        hit, view_degree = view_conflicts(overlaps, group_of)
    chunks: list[np.ndarray] = []
    chunk_epoch: list[np.ndarray] = []
    total, e = 0, epoch
    all_views = np.arange(num_views)
    while total < num_steps:
        due = pending if (e == epoch and pending is not None) else all_views
        rng = np.random.default_rng([seed, e, int(due.size)])
        if strategy == "odin" and assignment == "balance":
            slots = _balance_epoch(due, group_of, cost, R, B, rng)
        elif strategy == "odin":
            grp = pending_groups if due is pending else full_groups
            steps = -(-max(g.size for g in grp) // B)
            steps = max(steps, -(-due.size // (R * B)))
            slots = _odin_epoch(grp, cost, steps, B, rng, due)
        else:
            slots = _random_epoch(due, R, B, rng)
        if order_steps:
            history = chunks[-1][-HISTORY_STEPS:] if chunks else slots[:0]
            slots = low_conflict_order(
                slots, hit, view_degree, history, num_steps - total, rng, opts.lag_weight
            )
        chunks.append(slots)
        chunk_epoch.append(np.full(slots.shape[0], e, dtype=np.int64))
        total += slots.shape[0]
        e += 1
    if chunks:
        views = np.concatenate(chunks)[:num_steps]
        step_epoch = np.concatenate(chunk_epoch)[:num_steps]
    else:
        views = np.zeros((0, R, B), dtype=np.int64)
        step_epoch = np.zeros(0, dtype=np.int64)
    dep, dep_rows, msg, conflict = dependency_pass(F, views)
    meta = [strategy, assignment, R, B, int(num_steps), int(seed), int(epoch)]
    meta += [opts.knn, opts.max_work, opts.locality_gain, opts.step_order, opts.lag_weight]
    return Plan(
        views=views,
        dependency=dep,
        dependency_rows=dep_rows,
        message_rows=msg,
        plan_hash=_plan_hash(F, views, meta, cost, pending),
        footprints=F,
        step_epoch=step_epoch,
        groups=groups,
        strategy=strategy,
        assignment=assignment,
        seed=int(seed),
        epoch=int(epoch),
        pending=pending,
        conflict=conflict,
    )
