"""Throughput-first admission (DESIGN 3.5): when a read may go ahead of a pending update.

Rank r at global step t reads ``F(r, t)``. Some of those rows may lack an update: a
*pending source* (``sharded_admission``) is a set O of them, with ``s`` the oldest update
they may lack (owned rows waiting for a writer's gradient rows; in the sharded layout also
the cached rows of an owner's late push). Throughput-first lets the step run without
waiting for a source only when ALL hold:

1. phase: ``s >= phase_start`` (the first global step of the bound plan). The engine
   drains at every phase start, so inside the engine this always holds; it is still
   checked.
2. staleness: ``t - s <= K`` (``SyncConfig.staleness_window``).
3. overlap: ``|O| / |F(r, t)| <= tau``.
4. evidence: ``E < tau`` with ``E = mean_{p in O} g(p) / mean_{p in A} g(p)``, where
   ``g(p)`` is the L2 norm of row p's last known update (all parameter groups, without the
   visible flag; ``GradientEvidence``) and ``A`` is every row whose last known update was
   visible (the active set; footprint-margin rows have zero gradient, strength 0, and would
   only dilute the mean). A row of O with no known update counts as the active-set mean
   (unknown is not low-impact); with nothing known at all, ``E = 1``. If the active-set
   mean is 0, ``E = 0`` when the rows' mean is 0 too, else infinity.

That is the ``overlap`` rule (``SyncConfig.admission``). The ``impact`` rule (the default)
replaces conditions 3 and 4 by one on the delayed rows' share of the read's expected
gradient mass, ``I = |O| / |F(r, t)| * E``, admitted when ``I <= tau**2``: the overlap
rule's worst admitted read carries tau * tau of it, and the impact rule admits any read
that carries no more. Many overlapping rows of far, tiny Gaussians that every view of a
driving sequence sees (overlap 0.8, E 0.02: I = 0.016) are admitted, where the overlap rule
falls back on every such read; a few strong rows are not.

The first condition that fails, in the order phase, staleness, overlap, evidence (impact
rule: phase, staleness, impact), is the fallback's reason. A fallback waits until its
source moves; then every source is decided again with what has arrived (the evidence may
have changed). The step runs once every remaining decision admits: those are the step's
admitted delayed reads, each with staleness ``t - s``. With ``tau = 0`` nothing is
admitted (a source always has ``|O| > 0``), so reads are exactly those of quality-first.

A delayed update is still applied when it arrives, per row in version order, so after a
drain every replica is identical; a result differs from quality-first's only through the
gradients computed from stale rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from odin_ns.cuda.ops import RowOps
from odin_ns.runtime.uploads import upload, upload_together

FALLBACK_REASONS = ("overlap", "evidence", "impact", "staleness", "phase")
ADMISSION_RULES = ("overlap", "impact")


@dataclass(frozen=True, slots=True)
class Decision:
    """One admission decision of a rank about a pending source: rows whose owner is ``peer``
    (the rank itself for its owned rows) and that may lack updates from ``pub_step`` on.

    ``reason`` is None when the delayed read was admitted, else one of ``FALLBACK_REASONS``.
    ``evidence_ratio`` is NaN when the rule stopped before evaluating it.
    """

    step: int  # global step t of the read
    peer: int  # the rows' owner (the deciding rank: its owned rows)
    pub_step: int  # global step s of the oldest update the rows may lack
    overlap_rows: int  # |O|, the source's rows
    read_rows: int  # |F(r, t)|
    evidence_ratio: float
    reason: str | None

    @property
    def admitted(self) -> bool:
        return self.reason is None

    @property
    def staleness(self) -> int:
        return self.step - self.pub_step

    @property
    def overlap_ratio(self) -> float:
        return self.overlap_rows / self.read_rows if self.read_rows else 0.0

    @property
    def impact_share(self) -> float:
        """The delayed rows' share of the read's expected gradient mass (NaN: no E)."""
        return self.overlap_ratio * self.evidence_ratio


def reason_before_evidence(
    step: int,
    pub_step: int,
    phase_start: int,
    overlap_rows: int,
    read_rows: int,
    tau: float,
    window: int,
    rule: str = "overlap",
) -> str | None:
    """The first failing condition of the rule that needs no evidence, or None when the
    evidence ratio decides (arguments as ``fallback_reason``'s)."""
    if pub_step < phase_start:
        return "phase"
    if step - pub_step > window:
        return "staleness"
    if rule == "overlap" and (read_rows <= 0 or overlap_rows > tau * read_rows):
        return "overlap"
    return None


def reason_from_evidence(
    overlap_rows: int, read_rows: int, ratio: float, tau: float, rule: str = "overlap"
) -> str | None:
    """The decision once ``reason_before_evidence`` passed: None (admitted) or the reason."""
    if rule == "impact":
        share = overlap_rows / read_rows * ratio if read_rows > 0 else math.inf
        return None if tau > 0 and share <= tau * tau else "impact"
    return None if ratio < tau else "evidence"


def fallback_reason(
    step: int,
    pub_step: int,
    phase_start: int,
    overlap_rows: int,
    read_rows: int,
    evidence_ratio: Callable[[], float],
    tau: float,
    window: int,
    rule: str = "overlap",
) -> tuple[str | None, float]:
    """The rule of the module docstring for one pending publication.

    Args:
        step, pub_step: global steps t (the read) and s (the pending publication).
        phase_start: first global step of the current phase's plan.
        overlap_rows, read_rows: ``|F(q, s) ∩ F(r, t)|`` and ``|F(r, t)|`` (> 0).
        evidence_ratio: computes E; called only when the earlier conditions hold.
        tau, window: ``SyncConfig.tau`` and ``SyncConfig.staleness_window`` (K).
        rule: ``SyncConfig.admission``: "overlap" or "impact".

    Returns:
        (None if admitted else the first failing reason, E or NaN when not evaluated).
    """
    early = reason_before_evidence(
        step, pub_step, phase_start, overlap_rows, read_rows, tau, window, rule
    )
    if early is not None:
        return early, math.nan
    ratio = float(evidence_ratio())
    return reason_from_evidence(overlap_rows, read_rows, ratio, tau, rule), ratio


def decide_in_one_read(
    candidates: Sequence[tuple[int, int, int, int]],
    evidence: Callable[[list[int]], list[float]],
    tau: float,
    window: int,
    rule: str,
    phase_start: int,
) -> list[tuple[str | None, float]]:
    """``fallback_reason`` for many pending publications, with every evidence ratio that
    the rule needs computed in one batch (on a GPU: one read of the device).

    Args:
        candidates: (step, pub_step, overlap_rows, read_rows) per pending publication.
        evidence: given the indices of the candidates whose E the rule needs, their E.
        tau, window, rule, phase_start: as ``fallback_reason``'s.

    Returns:
        per candidate, what ``fallback_reason`` returns for it.
    """
    early = [
        reason_before_evidence(t, s, phase_start, n, m, tau, window, rule)
        for t, s, n, m in candidates
    ]
    need = [i for i, reason in enumerate(early) if reason is None]
    ratios = dict(zip(need, evidence(need) if need else [], strict=True))
    out: list[tuple[str | None, float]] = []
    for i, (_, _, n, m) in enumerate(candidates):
        if early[i] is not None:
            out.append((early[i], math.nan))
        else:
            out.append((reason_from_evidence(n, m, ratios[i], tau, rule), ratios[i]))
    return out


class GradientEvidence:
    """The last known gradient-row norm of every row of a rank's table: of its last applied
    update (an owner's rows), or as its owner sent it with a push (a cached row).

    Everything lives on ``device`` and is updated without reading it back: on a GPU an
    update costs no synchronization and two writes; ``ratios`` reads many decisions' E in
    one copy.

    Args:
        num_rows: rows of the table.
        device: where the tables live (the parameters' device).
    """

    def __init__(self, num_rows: int, device: torch.device):
        self.strength = torch.full((num_rows,), math.nan, device=device)  # [N] (NaN: unknown)
        self.active = torch.zeros(num_rows, dtype=torch.bool, device=device)  # [N]
        self._record_row_norms = RowOps(device).record_row_norms

    def observe(self, rows: Tensor, buf: Tensor, keep: Tensor | None = None) -> None:
        """Record rows' updates (one ``record_row_norms``: a launch beside a GPU).

        A row that was not visible (footprint margin) has a zero gradient: its strength is
        recorded as 0 but it is not part of the active set, so margins do not dilute the
        active-set mean.

        Args:
            rows: [M] int64 strictly increasing row ids (a step's union).
            buf: [M, D + 1] float32 gradient rows (last column: visible flag or count).
            keep: [M] bool rows to record (None: all); the others stay as they were.
        """
        if rows.numel() == 0:
            return
        device = self.strength.device
        if keep is None:
            keep = torch.ones(rows.shape[0], dtype=torch.bool, device=device)
        self._record_row_norms(self.strength, self.active, upload(rows, device), buf, keep)

    @torch.no_grad()
    def observe_strengths(self, rows: Tensor, strength: Tensor) -> None:
        """Record the strengths an owner sent with a push: ``strength`` [M] float32 of rows
        ``rows`` ([M] int64, distinct), the norms of their last applied updates (0: the
        update was not visible, NaN: none applied yet; neither joins the active set)."""
        if rows.numel() == 0:
            return
        rows = upload(rows, self.strength.device)
        self.strength[rows] = strength
        self.active[rows] = strength > 0  # (NaN is not > 0)

    def _active_mean(self) -> tuple[Tensor, Tensor]:
        """(the active set's mean norm as a 0-d float64 tensor, 0 while it is empty; its
        size, 0-d int64), summed over the table on its device when a decision needs it
        (cheaper on a GPU host than keeping running sums: those cost a dozen operations at
        every recording)."""
        count = torch.count_nonzero(self.active)  # (a bool sum widens to int64 first)
        total = torch.where(self.active, self.strength, 0.0).sum(dtype=torch.float64)
        return total / count.clamp(min=1), count

    def mean(self) -> float | None:
        """Mean known norm over the active set, None before the first visible update
        (reads the device: for reports and tests, not for the step)."""
        mean, count = self._active_mean()
        return float(mean) if int(count) else None

    @torch.no_grad()
    def ratio_tensors(self, rows: Tensor, query: Tensor, sizes: Tensor) -> Tensor:
        """E of Q queries at once (see the module docstring; 1 before the first visible
        update), a [Q] float64 tensor on the tables' device: a fixed number of operations
        however many queries.

        Args:
            rows: [K] int64 every query's rows, query after query.
            query: [K] int64 the query each row belongs to (0 .. Q - 1).
            sizes: [Q] int64 rows per query (each > 0).
        """
        mean, count = self._active_mean()
        vals = self.strength[rows].double()
        vals = torch.where(vals.isnan(), mean, vals)  # an unknown row counts as the mean
        total = torch.zeros(sizes.numel(), dtype=torch.float64, device=rows.device)
        over = total.index_add_(0, query, vals) / sizes
        ratio = torch.where(mean > 0, over / mean, torch.where(over == 0, 0.0, math.inf))
        return torch.where(count == 0, 1.0, ratio)

    def ratios(self, queries: Sequence[Tensor]) -> list[float]:
        """E of each query's rows ([K_i] int64 host tensors, K_i > 0), moved to the device
        in one copy and read back in one."""
        if not queries:
            return []
        sizes = [int(q.numel()) for q in queries]
        query = torch.from_numpy(np.repeat(np.arange(len(sizes), dtype=np.int64), sizes))
        rows, query, sizes_d = upload_together(
            [torch.cat(list(queries)), query, torch.tensor(sizes, dtype=torch.int64)],
            self.strength.device,
        )
        return self.ratio_tensors(rows, query, sizes_d).cpu().tolist()

    def ratio(self, rows: Tensor) -> float:
        """E of one set of rows (one read of the device)."""
        return self.ratios([rows])[0]


# The tau values at which a run summary counts its decisions' impact shares (``impact_within_tau``).
TAU_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclass(slots=True)
class ImpactTally:
    """How many of a run's decisions carried an impact share ``I`` (``Decision.impact_share``)
    within the impact rule's bound ``tau**2``, for each tau of ``TAU_GRID``: what the rule
    would have admitted of these very decisions at another tau, from one run, whichever rule
    decided. A first-order guide: a fallback's read is decided again after its wait (counted
    again), and admitting more changes later decisions. Decisions without E (the overlap rule
    stopped before the evidence) are not counted."""

    decisions: int = 0  # decisions with an impact share
    within: dict[float, int] = field(default_factory=lambda: dict.fromkeys(TAU_GRID, 0))

    def add(self, decision: Decision) -> None:
        share = decision.impact_share
        if math.isnan(share):
            return
        self.decisions += 1
        for tau in TAU_GRID:
            self.within[tau] += share <= tau * tau

    def as_dict(self) -> dict:
        """``impact_decisions`` and ``impact_within_tau`` (tau as text -> count)."""
        return {
            "impact_decisions": self.decisions,
            "impact_within_tau": {f"{tau:g}": n for tau, n in self.within.items()},
        }


def admission_totals(
    admissions: Sequence[Decision],
    fallbacks: dict[str, int],
    staleness_hist: dict[int, int],
    impacts: ImpactTally,
) -> dict:
    """The admission keys of a run summary (JSON-ready): counts, the admitted fraction of
    all decisions, the staleness histogram, the admitted reads' overlap and evidence ratios
    (mean and largest; zeros when nothing was admitted), and ``impacts``' counts."""
    admitted = len(admissions)
    decisions = admitted + sum(fallbacks.values())
    overlap = [d.overlap_ratio for d in admissions]
    evidence = [d.evidence_ratio for d in admissions]
    return {
        "admitted": admitted,
        "fallbacks": dict(fallbacks),
        "decisions": decisions,
        "admitted_fraction": admitted / decisions if decisions else 0.0,
        "max_staleness": max(staleness_hist, default=0),
        "staleness_hist": {str(k): v for k, v in sorted(staleness_hist.items())},
        "overlap_ratio_admitted_mean": float(np.mean(overlap)) if overlap else 0.0,
        "overlap_ratio_admitted_max": float(max(overlap, default=0.0)),
        "evidence_ratio_admitted_mean": float(np.mean(evidence)) if evidence else 0.0,
        "evidence_ratio_admitted_max": float(max(evidence, default=0.0)),
        **impacts.as_dict(),
    }


__all__ = [
    "ADMISSION_RULES",
    "FALLBACK_REASONS",
    "TAU_GRID",
    "Decision",
    "GradientEvidence",
    "ImpactTally",
    "admission_totals",
    "decide_in_one_read",
    "fallback_reason",
    "reason_before_evidence",
    "reason_from_evidence",
]
