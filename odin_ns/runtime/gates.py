"""Read gates: what a step waits for before it may read, one gate per mode (DESIGN 3.4-3.6).

A gate answers, for rank r at local step t: "wait for peer q's publications up to local
step ``need[q]``" (-1: nothing), or None when the step may read. The engine waits (receiving
and applying) until every peer has arrived up to ``need`` and asks again, so a gate may
re-decide with what has arrived. After the gate opens, ``required`` gives the version each
row of the read set must have; the engine's one conflict scan waits for rows below it
(a row the plan's dependency table missed) and counts them as visibility violations.

- ``BarrierGate``: every peer's publications of every earlier step (synchronous baseline).
- ``DependencyGate``: quality-first, peer q up to ``plan.dependency[t, r, q]``, the last
  step at which q wrote a row r reads at t (reads are always current).
- ``BoundedStalenessGate``: throughput-first, like quality-first except that pending
  publications admitted by ``odin_ns.runtime.admission`` are read around (delayed reads).
- ``DdpGate``: barrier's wait, with ``dense`` publications: every step is one dense
  all-reduce of every gradient row [N, W] (what DDP does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from odin_ns.runtime.admission import Decision, GradientEvidence, decide_in_one_read
from odin_ns.runtime.config import SyncConfig
from odin_ns.runtime.update_log import UpdateLog

Need = list[int] | None


def _unmet(need: list[int], recv_done: Sequence[int], rank: int) -> Need:
    """``need`` if some peer has not arrived up to it, else None."""
    for q, s in enumerate(need):
        if q != rank and recv_done[q] < s:
            return need
    return None


class BarrierGate:
    """Wait for every peer's publication of step t - 1 (hence of every earlier step)."""

    dense = False  # publications are sparse: footprint rows, point to point

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def need(
        self, t: int, reads: Tensor, recv_done: Sequence[int], log: UpdateLog
    ) -> tuple[Need, Sequence[Decision]]:
        """(per-peer local steps to wait for, or None; decisions made) at local step t.

        Args:
            t: local step.
            reads: [M] int64 host read set ``plan.step_footprint(t, rank)``.
            recv_done: per peer, the last local step whose publication has arrived.
            log: the update log (pending steps' footprints and planned writes).
        """
        return _unmet([t - 1] * self.world_size, recv_done, self.rank), ()

    def required(self, t: int, reads: Tensor, base: Tensor, log: UpdateLog) -> Tensor:
        """[M] int64 versions the read set must have (``base``: quality-first's)."""
        return base

    def observe(self, peer: int, rows: Tensor, buf: Tensor) -> None:
        """An arrived publication of ``peer`` ([M] rows, [M, W] host buffer)."""


class DdpGate(BarrierGate):
    """Barrier's wait over dense all-reduced publications (the DDP baseline)."""

    dense = True


class DependencyGate(BarrierGate):
    """Quality-first: peer q up to ``dependency[t, rank, q]``.

    Args:
        dependency: [T, R, R] int64 the plan's dependency table.
    """

    def __init__(self, rank: int, world_size: int, dependency: np.ndarray):
        super().__init__(rank, world_size)
        self.dependency = dependency

    def need(self, t, reads, recv_done, log):
        need = [int(d) for d in self.dependency[t, self.rank]]
        return _unmet(need, recv_done, self.rank), ()


class BoundedStalenessGate(DependencyGate):
    """Throughput-first (``odin_ns.runtime.admission``): decide on every pending peer
    publication up to the dependency that overlaps the read set, newest first per peer; a
    fallback waits for that peer up to its step, then everything is decided again; the gate
    opens when every remaining decision admits.

    Args:
        config: read at every decision (``tau``, ``staleness_window`` may change).
        num_rows: N (gradient evidence is per phase: after a structural change row ids mean
            other Gaussians).
        step_offset: global step of local step 0 (the phase start).
        device: the parameters' device (arrivals are there; so is the evidence).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        dependency: np.ndarray,
        config: SyncConfig,
        num_rows: int,
        step_offset: int,
        device: torch.device,
    ):
        super().__init__(rank, world_size, dependency)
        self.config = config
        self.step_offset = step_offset
        self.evidence = GradientEvidence(num_rows, world_size, device)
        self._mask = torch.zeros(num_rows, dtype=torch.bool)  # [N] scratch, all False
        self._admitted: list[tuple[Tensor, int]] = []  # (overlap ids, local s) admitted

    def observe(self, peer, rows, buf):
        self.evidence.observe(peer, rows, buf)

    def need(self, t, reads, recv_done, log):
        decided, need = self._decide(t, reads, recv_done, log)
        fallbacks = [d for d, _, _ in decided if not d.admitted]
        if fallbacks:
            self._admitted = []
            return need, fallbacks
        self._admitted = [(ids, s) for _, ids, s in decided]
        return None, [d for d, _, _ in decided]

    def required(self, t, reads, base, log):
        """An admitted (q, s) lets its overlap rows lag: they need only the planned write
        before s (the earliest admitted s per row)."""
        if not self._admitted:
            return base
        req = base.clone()
        for ids, s in self._admitted:
            pos = torch.searchsorted(reads, ids)
            req[pos] = torch.minimum(req[pos], log.prev_write(s, ids))
        return req

    def _decide(
        self, t: int, reads: Tensor, recv_done: Sequence[int], log: UpdateLog
    ) -> tuple[list[tuple[Decision, Tensor, int]], list[int]]:
        """Decisions on peers' pending publications that overlap ``reads`` (newest first per
        peer, up to the first fallback); returns ([(decision, overlap ids, local s)], need)
        with need[q] the local step to wait for from q (-1: none). Every pending overlap is
        looked at, and the evidence the rule needs is read from the device once."""
        need = [-1] * self.world_size
        decided: list[tuple[Decision, Tensor, int]] = []
        m = reads.numel()
        if m == 0:
            return decided, need
        now, first = self.step_offset + t, self.step_offset
        pending: list[tuple[int, int, Tensor]] = []  # (q, local s, overlap ids), decision order
        self._mask[reads] = True
        try:
            for q in range(self.world_size):
                if q == self.rank:
                    continue
                for s in range(int(self.dependency[t, self.rank, q]), recv_done[q], -1):
                    fq = log.pending[s].footprints[q]
                    ids = fq[self._mask[fq]]
                    if ids.numel() > 0:
                        pending.append((q, s, ids))
        finally:
            self._mask[reads] = False
        reasons = decide_in_one_read(
            [(now, first + s, ids.numel(), m) for _, s, ids in pending],
            lambda idx: self.evidence.ratios([(pending[i][0], pending[i][2]) for i in idx]),
            float(self.config.tau),
            int(self.config.staleness_window),
            self.config.admission,
            first,
        )
        for (q, s, ids), (reason, ratio) in zip(pending, reasons, strict=True):
            if need[q] >= 0:
                continue  # q's older publications arrive before its fallback: no decision
            decided.append((Decision(now, q, first + s, ids.numel(), m, ratio, reason), ids, s))
            if reason is not None:
                need[q] = s
        return decided, need


def make_gate(
    config: SyncConfig,
    rank: int,
    world_size: int,
    dependency: np.ndarray,
    num_rows: int,
    step_offset: int,
    device: torch.device,
) -> BarrierGate:
    """The read gate of ``config.mode`` for one bound plan (``device``: the parameters')."""
    mode = config.mode
    if mode == "barrier":
        return BarrierGate(rank, world_size)
    if mode == "ddp":
        return DdpGate(rank, world_size)
    if mode == "quality-first":
        return DependencyGate(rank, world_size, dependency)
    if mode == "throughput-first":
        return BoundedStalenessGate(
            rank, world_size, dependency, config, num_rows, step_offset, device
        )
    raise ValueError(f"unknown mode {mode!r}")


__all__ = [
    "BarrierGate",
    "BoundedStalenessGate",
    "DdpGate",
    "DependencyGate",
    "make_gate",
]
