"""Throughput-first admission (DESIGN 3.5): when a read may skip a peer's pending update.

Rank r at global step t reads ``F(r, t)``. For a peer q, quality-first waits until q's
publications up to ``dependency[t, r, q]`` have arrived. Throughput-first looks at each of
q's publications ``s <= dependency[t, r, q]`` that has not arrived and whose footprint
overlaps the read set (``O = F(q, s) ∩ F(r, t)``, computed exactly from the plan's
footprints), newest first, and lets the step run without it only when ALL hold:

1. phase: ``s >= phase_start`` (the first global step of the bound plan). The engine
   drains at every rebind, so inside the engine this always holds; it is still checked.
2. staleness: ``t - s <= K`` (``SyncConfig.staleness_window``).
3. overlap: ``|O| / |F(r, t)| <= tau``.
4. evidence: ``E < tau`` with ``E = mean_{p in O} g_q(p) / mean_{p in A_q} g_q(p)``, where
   ``g_q(p)`` is the L2 norm of the gradient row (all parameter groups, without the visible
   flag) of primitive p in q's latest *arrived* publication that contained p, and ``A_q`` is
   every primitive q has published *as visible* since the plan was bound (its active set;
   footprint-margin rows that q did not draw have zero gradient, strength 0, and would only
   dilute the mean). A primitive
   of O that q has not published yet counts as ``mean_{A_q} g_q`` (unknown is not
   low-impact); with no arrived publication of q at all, ``E = 1``. If the active-set mean
   is 0, ``E = 0`` when the overlap mean is 0 too, else infinity.

That is the ``overlap`` rule (``SyncConfig.admission``, the default). The ``impact`` rule
replaces conditions 3 and 4 by one on the delayed rows' share of the read's expected
gradient mass, ``I = |O| / |F(r, t)| * E`` (the overlap's known strength over the read
set's rows at the peer's active-set mean), admitted when ``I <= tau**2``: the overlap rule's
worst admitted read carries tau * tau of it, and the impact rule admits any read that
carries no more. Many overlapping rows of far, tiny Gaussians that every view of a driving
sequence sees (overlap 0.8, E 0.02: I = 0.016) are admitted, where the overlap rule falls
back on every such read; a few strong rows are not.

The first condition that fails, in the order phase, staleness, overlap, evidence (impact
rule: phase, staleness, impact), is the fallback's reason. A fallback on (q, s) waits for q's publications up to s (they arrive in
order, so q's older pending publications need no decision of their own); then every
decision is made again with what has arrived (the evidence may have changed). The step
runs once every remaining decision admits: those are the step's admitted delayed reads,
each with staleness ``t - s``. With ``tau = 0`` nothing is admitted (a decision always has
``|O| > 0``), so reads are exactly those of quality-first.

A delayed update is still applied when it arrives, per primitive in version order, so
after a drain every replica is identical; a replica's result differs from quality-first's
only through the gradients computed from stale rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

FALLBACK_REASONS = ("overlap", "evidence", "impact", "staleness", "phase")
ADMISSION_RULES = ("overlap", "impact")


@dataclass(frozen=True, slots=True)
class Decision:
    """One admission decision of rank ``rank`` about peer ``peer``'s publication ``pub_step``.

    ``reason`` is None when the delayed read was admitted, else one of ``FALLBACK_REASONS``.
    ``evidence_ratio`` is NaN when the rule stopped before evaluating it.
    """

    step: int  # global step t of the read
    peer: int  # q
    pub_step: int  # global step s of q's pending publication
    overlap_rows: int  # |F(q, s) ∩ F(r, t)|
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
    if pub_step < phase_start:
        return "phase", math.nan
    if step - pub_step > window:
        return "staleness", math.nan
    if rule == "impact":
        ratio = float(evidence_ratio())
        share = overlap_rows / read_rows * ratio if read_rows > 0 else math.inf
        return (None if tau > 0 and share <= tau * tau else "impact"), ratio
    if read_rows <= 0 or overlap_rows > tau * read_rows:
        return "overlap", math.nan
    ratio = float(evidence_ratio())
    if not ratio < tau:
        return "evidence", ratio
    return None, ratio


class GradientEvidence:
    """Per peer, the last known gradient-row norm of every primitive it published.

    Args:
        num_rows: N primitives.
        peers: number of ranks R (row q holds peer q's norms; this rank's row stays unused).
        device: where the [R, N] table lives (the parameters' device).
    """

    def __init__(self, num_rows: int, peers: int, device: torch.device):
        self.strength = torch.full((peers, num_rows), math.nan, device=device)  # [R, N]
        self.active = torch.zeros((peers, num_rows), dtype=torch.bool, device=device)  # [R, N]
        self._sum = [0.0] * peers  # sum of the active rows' norms per peer (float64)
        self._count = [0] * peers  # active primitives per peer (|A_q|)

    @torch.no_grad()
    def observe(self, peer: int, rows: Tensor, buf: Tensor) -> None:
        """Record an arrived publication.

        A published row that was not visible (footprint margin) has a zero gradient: its
        strength is recorded as 0 but it is not part of the active set, so margins do not
        dilute the active-set mean.

        Args:
            peer: the publishing rank q.
            rows: [M] int64 primitive ids of the publication (q's footprint).
            buf: [M, D + 1] float32 publication buffer (last column: visible flag).
        """
        if rows.numel() == 0:
            return
        norms = buf[:, :-1].float().norm(dim=1)  # [M]
        visible = buf[:, -1] > 0
        table, active = self.strength[peer], self.active[peer]
        was_active = active[rows]
        self._sum[peer] += float(norms[visible].double().sum()) - float(
            table[rows][was_active].double().sum()
        )
        self._count[peer] += int(visible.sum()) - int(was_active.sum())
        table[rows] = norms
        active[rows] = visible

    def mean(self, peer: int) -> float | None:
        """Mean known norm over peer's active set, None before its first publication."""
        if self._count[peer] == 0:
            return None
        return max(self._sum[peer], 0.0) / self._count[peer]

    @torch.no_grad()
    def ratio(self, peer: int, rows: Tensor) -> float:
        """E for the overlap ``rows`` ([K] int64, K > 0): see the module docstring."""
        mean = self.mean(peer)
        if mean is None:
            return 1.0
        vals = self.strength[peer][rows]
        known = ~torch.isnan(vals)
        n_known = int(known.sum())
        total = float(vals[known].double().sum()) + (rows.numel() - n_known) * mean
        over = total / rows.numel()
        if mean > 0:
            return over / mean
        return 0.0 if over == 0 else math.inf


def admission_totals(
    admissions: Sequence[Decision], fallbacks: dict[str, int], staleness_hist: dict[int, int]
) -> dict:
    """The admission keys of a run summary (JSON-ready): counts, the admitted fraction of
    all decisions, the staleness histogram, and the admitted reads' overlap and evidence
    ratios (mean and largest; zeros when nothing was admitted)."""
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
    }


__all__ = [
    "ADMISSION_RULES",
    "FALLBACK_REASONS",
    "Decision",
    "GradientEvidence",
    "admission_totals",
    "fallback_reason",
]
