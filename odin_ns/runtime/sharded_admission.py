"""Throughput-first in sharded mode: which lagging rows a step may read (DESIGN 3.5, 3.11).

Before local step t, rank r's read set can lag in two ways, each a *pending source*:

- **owned rows** whose last planned update before t is not applied here yet (it waits for a
  writer's gradient rows): the rows with ``prev > applied``; the oldest update they may lack
  is step ``applied + 1``;
- **cached rows** of owner o whose push for t has not arrived: the push's rows. A row
  refreshed by the push for its read at step t1 holds the row after its last update before
  t1, and no update falls between that one and t1, so the oldest update it may lack is at
  t1 or later (``fresh_since``: t1, or 0 for the phase start's fill).

Each source is decided by replicated throughput-first's rule (``admission.fallback_reason``:
phase, staleness ``t - s <= K``, overlap ``|O| / |F(r, t)| <= tau``, evidence ``E < tau``),
with ``s`` the oldest update the rows may lack, so the staleness is an upper bound of every
row's. The evidence is what a rank in sharded mode knows of each row's updates: the L2 norm
of the summed gradient row of its last applied update (owned rows: the owner's apply;
cached rows: the owner sends it with every push, one float per row). ``E`` is the mean over
the source's rows over the mean over every row with a known visible update (unknown rows
count as the mean, so with nothing known ``E = 1``), as ``admission.GradientEvidence``
computes per peer in replicated mode, here over the rank's local table.

A fallback waits until its source moves (one more owned step applied, or the push arrived),
then every source is decided again; the step runs once every remaining source is admitted.
A late push still lands (pushes per pair arrive in order and only ever carry newer values),
and a late gradient is applied in step order as always, so after a drain every owner's rows
are what they would be with those stale gradients, and caches are refilled at the next
phase start. With ``tau = 0`` nothing is admitted: the step reads exactly what
quality-first reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from odin_ns.runtime.admission import (
    Decision,
    GradientEvidence,
    decide_in_one_read,
)
from odin_ns.runtime.config import SyncConfig


@dataclass(frozen=True, slots=True)
class TakenPush:
    """A push a reader took in: owner ``owner``'s push for the read at local step ``step``
    refreshes cached local rows ``rows`` ([M], host; ``rows_data``: the same on the
    parameters' device) with ``values`` ([M, W] as the owner packed them; throughput-first
    appends the owner's evidence of each row, ``evidence.strength``, as a last column)."""

    owner: int
    step: int
    rows: np.ndarray
    rows_data: Tensor
    values: Tensor


def _joined(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class PendingSource:
    """Rows of one step's read set that may lag, and how to know they caught up."""

    peer: int  # the rows' owner (this rank: owned rows waiting for writers' gradients)
    rows: np.ndarray  # [K] local ids
    pub_step: int  # local step of the oldest update the rows may lack
    caught_up: Callable[[], bool]  # the source moved (re-decide)


class ShardedAdmission:
    """Admission state of one rank for one phase (see the module docstring).

    Args:
        config: read at every decision (``tau``, ``staleness_window``).
        num_local, num_owned: L and O of the phase's ``ShardLayout``.
        step_offset: global step of local step 0.
        device: the parameters' device.
    """

    def __init__(
        self,
        config: SyncConfig,
        num_local: int,
        num_owned: int,
        step_offset: int,
        device: torch.device,
    ):
        self.config = config
        self.num_owned = int(num_owned)
        self.offset = int(step_offset)
        self.device = device
        self.evidence = GradientEvidence(num_local, device)  # the local table's rows
        # [C] per cached row, the read step whose push last refreshed it (0: the fill)
        self.fresh_since = np.zeros(num_local - self.num_owned, dtype=np.int64)

    # ------------------------------------------------------------ evidence
    @torch.no_grad()
    def observe_apply(self, rows: Tensor, acc: Tensor, applied: Tensor) -> None:
        """An owner applied ``acc`` ([U, W] summed gradient rows, visible count last) to the
        rows ``applied`` ([U] bool) of owned local rows ``rows`` ([U] int64)."""
        self.evidence.observe(rows, acc, keep=applied)

    @torch.no_grad()
    def observe_pushes(self, pushes: Sequence[TakenPush]) -> None:
        """The pushes one look took in, in arrival order, refreshed their cached rows; the
        owners' evidence of them is recorded in as few operations as the rows allow: one
        for every owner's first push, one more for every owner's second, and so on (a
        later push of a row overwrites an earlier one's evidence, as if recorded one by
        one; rows of different owners are distinct)."""
        layers: list[list[TakenPush]] = []
        seen: dict[int, int] = {}  # owner -> its pushes so far in this look
        for push in pushes:
            self.fresh_since[push.rows - self.num_owned] = push.step
            layer = seen.get(push.owner, 0)
            seen[push.owner] = layer + 1
            if layer == len(layers):
                layers.append([])
            layers[layer].append(push)
        for layer in layers:
            self.evidence.observe_strengths(
                _joined([p.rows_data for p in layer]), _joined([p.values[:, -1] for p in layer])
            )

    def oldest_missing(self, cached_rows: np.ndarray) -> int:
        """Earliest local step of an update cached local rows ``cached_rows`` may lack."""
        return int(self.fresh_since[cached_rows - self.num_owned].min())

    # ------------------------------------------------------------ decisions
    def decide(self, t: int, read_rows: int, sources: list[PendingSource]) -> list[Decision]:
        """One decision per pending source of local step t (``read_rows`` = |F(r, t)|); the
        evidence the rule needs is read from the device once."""
        now = self.offset + t
        reasons = decide_in_one_read(
            [(now, self.offset + src.pub_step, int(src.rows.size), read_rows) for src in sources],
            lambda idx: self.evidence.ratios([torch.from_numpy(sources[i].rows) for i in idx]),
            float(self.config.tau),
            int(self.config.staleness_window),
            self.config.admission,
            self.offset,
        )
        return [
            Decision(now, src.peer, self.offset + src.pub_step, int(src.rows.size), read_rows,
                     ratio, reason)
            for src, (reason, ratio) in zip(sources, reasons, strict=True)
        ]  # fmt: skip


__all__ = ["PendingSource", "ShardedAdmission", "TakenPush"]
