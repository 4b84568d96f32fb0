"""The update log: every step's pending update, per-primitive version order, and apply.

The update of global step s is, per primitive p of the union of the step's footprints,
selective Adam with gradient = sum of p's writers' rows in rank order and visible = OR of
their flags. A replica applies row p of step s once all of p's writers for s have arrived
and p's previous planned write is applied (``versions[p] == prev``): per-primitive version
order. Summing stored per-rank contributions in fixed rank order at apply time makes the
result bitwise identical in every mode and on every rank.

Two planes:
- control plane (host CPU tensors, decided only by the plan and by which publications have
  arrived): union ids, per-rank positions, expected / arrived writer counts, applied flags,
  the planned previous write of every row, the version vector ``versions``;
- data plane (the parameters' device): contributions, accumulators, parameters, moments,
  and a device mirror of ``versions`` that the apply op keeps.

So deciding what is ready never reads the device; apply runs by mask.

An optional ``ApplyHook`` sees every applied row set around its Adam update (the MCMC
strategy's lazy position noise, ``odin_ns.distributed.mcmc_noise``); with the default
``hook=None`` the apply path is unchanged. The engine (``runtime.sharded``) keeps its owned
rows' updates here: per step, per writer, the owned rows the writer read (its step tables'
``step_union``); a writer with none of them sends nothing for the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.runtime.config import ParamGroupState
from odin_ns.runtime.uploads import upload

HOST = torch.device("cpu")


class ApplyHook(Protocol):
    """Called around the update of every applied row set, in apply order."""

    def before_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` ([K] int64 host, sorted unique) are about to get step ``step``'s update."""

    def after_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` ([K] int64 host) just got step ``step``'s update."""


def advance_last_write(last_write: Tensor, ids: Tensor, step: int) -> Tensor:
    """[U] int64 ``last_write[ids]``, then ``last_write[ids] = step`` in place."""
    prev = last_write.index_select(0, ids)
    last_write.index_fill_(0, ids, step)
    return prev


def step_record_reference(
    footprints: Sequence[Tensor], last_write: Tensor, step: int
) -> tuple[Tensor, Tensor, list[Tensor], Tensor]:
    """A step's rows from its footprints (each [M_q] int64 host, sorted unique, ids <
    N = ``last_write``'s length): (ids [U] int64 sorted unique, writers per id [U] int32, per
    footprint its [M_q] int64 positions in ids, prev [U] int64 = ``last_write[ids]`` before
    the call); then ``last_write[ids] = step`` in place. The torch twin of the host kernel
    ``torch.ops.odin.step_record``."""
    if footprints:
        ids, counts = torch.unique(torch.cat(list(footprints)), sorted=True, return_counts=True)
    else:
        ids = counts = torch.zeros(0, dtype=torch.int64)
    prev = advance_last_write(last_write, ids, step)
    positions = [torch.searchsorted(ids, fp) for fp in footprints]
    return ids, counts.to(torch.int32), positions, prev


def add_arrivals_reference(arrived: Tensor, positions: Tensor) -> None:
    """``arrived[positions] += 1`` in place: [U] int32, [M] int64 distinct positions (one
    publication's rows), host. The torch twin of the host kernel
    ``torch.ops.odin.add_arrivals``."""
    arrived.index_add_(0, positions, torch.ones(1, dtype=torch.int32).expand(len(positions)))


def ready_rows_reference(
    arrived: Tensor,
    expected: Tensor,
    applied: Tensor,
    ids: Tensor,
    prev: Tensor,
    versions: Tensor,
    in_order: bool,
) -> tuple[Tensor, int]:
    """(ready [U] bool, its count): a pending step's rows whose writers have all arrived,
    not yet applied, whose previous planned write is applied (``versions[ids] >= prev``;
    taken as true when ``in_order``: every earlier step is applied). [U] int32 arrived and
    expected, [U] bool applied, [U] int64 ids and prev, [N] int64 versions, all host. The
    torch twin of the host kernel ``torch.ops.odin.ready_rows``."""
    if in_order:
        blocked = torch.zeros_like(applied)
    else:
        blocked = versions.index_select(0, ids) < prev
    ready = ops.ready_mask(arrived, expected, applied, blocked)
    return ready, int(ready.sum())


def commit_rows_reference(
    applied: Tensor, versions: Tensor, ids: Tensor, ready: Tensor, step: int
) -> bool:
    """Rows ``ready`` ([U] bool) of a step now applied: ``applied |= ready`` and
    ``versions[ids[ready]] = step`` in place; whether every row of the step is applied. The
    torch twin of the host kernel ``torch.ops.odin.commit_rows``."""
    applied |= ready
    versions.index_fill_(0, ids[ready], step)
    return bool(applied.all())


class StepWrites(Protocol):
    """Who writes which rows at each local step (the engine's step tables)."""

    def step_union(self, s: int) -> tuple[Tensor, list[Tensor], Tensor]:
        """(ids [U] int64 sorted unique rows written at local step s, per writer its [M_q]
        int64 positions in ids, [U] int32 writers per row), host tensors."""


@dataclass(frozen=True)
class StepKernels:
    """The update log's per-step host kernels: the compiled ``torch.ops.odin`` ones where the
    CPU library is built, else their torch twins (same results). Resolved once per log."""

    add_arrivals: Callable = add_arrivals_reference
    ready_rows: Callable = ready_rows_reference
    commit_rows: Callable = commit_rows_reference

    @classmethod
    def resolve(cls) -> StepKernels:
        return cls(
            ops.host_op("add_arrivals") or add_arrivals_reference,
            ops.host_op("ready_rows") or ready_rows_reference,
            ops.host_op("commit_rows") or commit_rows_reference,
        )


class PendingStep:
    """One step's update (rows = sorted union U of what the step's writers wrote).

    Args:
        step: global step.
        union: (ids [U] sorted unique, per writer q the [M_q] positions of its rows in ids,
            [U] int32 writers per id), host tensors (``StepWrites.step_union``).
        last_write: [N] int64 host, per row the last planned write before ``step`` (or its
            version at bind time); read for ``prev``, then set to ``step`` on the step's rows.
        device: the parameters' device.
        kernels: the per-step host kernels (``StepKernels.resolve()``).
    """

    def __init__(
        self,
        step: int,
        union: tuple[Tensor, list[Tensor], Tensor],
        last_write: Tensor,
        device,
        kernels: StepKernels,
    ):
        self.step = step
        self.kernels = kernels
        ids, positions, counts = union
        self.ids = ids  # [U] int64 (host)
        self.prev = advance_last_write(last_write, ids, step)  # [U] planned previous write
        self.expected = counts  # [U] int32 writers per row
        self.arrived = torch.zeros_like(self.expected)  # [U] int32
        self.applied = torch.zeros(ids.shape, dtype=torch.bool)  # [U]
        self.positions = positions  # per rank [M_q] int64 positions into U
        self.device = device
        self.ids_data = upload(ids, device)  # [U] on the parameters' device
        # per rank (positions on device [M_q], rows [M_q, W] on device), in rank order
        self.parts: list[tuple[Tensor, Tensor] | None] = [None] * len(positions)
        # a writer with no row of the step sends nothing: its part counts as received
        self.received = [pos.numel() == 0 for pos in positions]
        self.done = ids.numel() == 0  # every row applied

    def add(self, q: int, rows: Tensor) -> None:
        """Rank q's contribution: [M_q, W] float32 on the parameters' device."""
        self.parts[q] = (upload(self.positions[q], self.device), rows)
        self.received[q] = True
        self.kernels.add_arrivals(self.arrived, self.positions[q])

    def add_sum(self, dense: Tensor) -> None:
        """Every writer's contribution already summed: [N, W] float32 (device), row p = p."""
        u = self.ids.shape[0]
        self.parts = [(torch.arange(u, device=self.device), dense.index_select(0, self.ids_data))]
        self.parts += [None] * (len(self.received) - 1)
        self.received = [True] * len(self.received)
        self.arrived.copy_(self.expected)


class UpdateLog:
    """Pending steps of one bound plan, keyed by local step, created in step order.

    Args:
        groups: the parameter groups (updated in place by ``apply_ready``).
        writes: who writes which rows at each local step (``StepWrites``).
        world_size: R.
        step_offset: global step of the plan's local step 0.
        versions: [N] int64 host version vector to continue from (updated in place).
        hook: optional ``ApplyHook`` called around every apply (None: no call).
        observe_sum: optional ``f(ids, acc, applied)`` called after every apply with the
            step's rows ([U] int64), their summed rows ([U, W] float32, visible count last)
            and which were applied ([U] bool), all on the parameters' device (no read of
            it): throughput-first's evidence. None: no call.
    """

    def __init__(
        self,
        groups: Sequence[ParamGroupState],
        writes: StepWrites,
        world_size: int,
        step_offset: int,
        versions: Tensor,
        hook: ApplyHook | None = None,
        observe_sum: Callable[[Tensor, Tensor, Tensor], None] | None = None,
    ):
        self.groups = list(groups)
        self.hook = hook
        self.observe_sum = observe_sum
        self.writes = writes
        self.world_size = world_size
        self.step_offset = step_offset
        self.device = self.groups[0].param.device
        self.width = sum(g.row_dim for g in self.groups) + 1  # W: columns, then visible
        self.versions = versions  # [N] int64 host: last applied global step per primitive
        self.versions_data = versions if self.device == HOST else versions.to(self.device)
        self._last_write = versions.clone()  # [N] last planned write of the created steps
        self.kernels = StepKernels.resolve()
        self.pending: dict[int, PendingStep] = {}
        self.created = -1  # records exist (or existed) for local steps <= this
        self.dirty = False  # something arrived since the last apply_ready

    def record(self, t: int) -> PendingStep:
        """Record of local step t, creating the records of all steps <= t first.

        Records come from the plan, before any update arrives, so an update of a later step
        can never overtake an earlier update of the same row that this rank has not heard
        of yet.
        """
        while self.created < t:
            s = self.created + 1
            self.pending[s] = PendingStep(
                self.step_offset + s,
                self.writes.step_union(s),
                self._last_write,
                self.device,
                self.kernels,
            )
            self.created = s
        rec = self.pending.get(t)
        if rec is None:
            raise RuntimeError(f"step {self.step_offset + t} already retired")
        return rec

    def add(self, t: int, q: int, rows: Tensor) -> None:
        """Store rank q's [M_q, W] publication of local step t (device tensor)."""
        self.record(t).add(q, rows)
        self.dirty = True

    def add_sum(self, t: int, dense: Tensor) -> None:
        """Store local step t's update summed over every rank: [N, W] (device tensor)."""
        self.record(t).add_sum(dense)
        self.dirty = True

    def oldest_unapplied(self, before: int, ids: Tensor | None = None) -> int | None:
        """Oldest local step < ``before`` with a row not yet applied (of ``ids``, [K] int64
        host sorted, if given), or None."""
        for s, rec in self.pending.items():
            if s >= before:
                break
            if rec.done:
                continue
            if ids is None:
                return s
            pos = torch.searchsorted(rec.ids, ids).clamp_(max=max(rec.ids.numel() - 1, 0))
            if bool(((rec.ids[pos] == ids) & ~rec.applied[pos]).any()):
                return s
        return None

    def first_missing(self, before: int) -> tuple[int, int]:
        """(peer, global step) of the oldest missing publication before local ``before``."""
        for s, rec in self.pending.items():
            if s >= before:
                break
            if not rec.done:
                missing = [q for q, got in enumerate(rec.received) if not got]
                return (missing[0] if missing else -1), rec.step
        return -1, self.step_offset + before

    def apply_ready(self) -> int:
        """Apply every ready row of every pending step in step order (so per primitive in
        version order); retire steps fully applied and received. Returns rows applied."""
        if not self.dirty:
            return 0
        self.dirty = False
        ready_rows, commit_rows = self.kernels.ready_rows, self.kernels.commit_rows
        total = 0
        earlier_done = True  # every step before s fully applied (retired steps are)
        for s in list(self.pending):
            rec = self.pending[s]
            if not rec.done:
                ready, n = ready_rows(  # host, no device read
                    rec.arrived, rec.expected, rec.applied, rec.ids, rec.prev, self.versions,
                    earlier_done,  # then every row's previous planned write is applied
                )  # fmt: skip
                if n:  # else nothing changes, and the step is still not done
                    self._apply(rec, ready)
                    total += n
                    if commit_rows(rec.applied, self.versions, rec.ids, ready, rec.step):
                        rec.done = True
                        rec.parts = [None] * self.world_size
            earlier_done = earlier_done and rec.done
            if rec.done and all(rec.received):
                del self.pending[s]
        return total

    def _apply(self, rec: PendingStep, ready: Tensor) -> None:
        ready_data = upload(ready, self.device)
        acc = torch.zeros(rec.ids.shape[0], self.width, dtype=torch.float32, device=self.device)
        for part in rec.parts:  # fixed rank order: bitwise identical sums
            if part is not None:
                ops.accumulate_ready_rows(acc, ready_data, part[0], part[1])
        hook = self.hook
        if hook is not None:
            ids = rec.ids[ready]
            hook.before_apply(rec.step, ids)
        ops.apply_ready_rows(
            [g.param for g in self.groups],
            [g.exp_avg for g in self.groups],
            [g.exp_avg_sq for g in self.groups],
            rec.ids_data,
            acc,
            ready_data,
            [g.lr_at(rec.step) for g in self.groups],
            [g.betas for g in self.groups],
            [g.eps for g in self.groups],
            rec.step,
            self.versions_data,
        )
        if hook is not None:
            hook.after_apply(rec.step, ids)
        if self.observe_sum is not None:
            self.observe_sum(rec.ids_data, acc, ready_data)


__all__ = ["ApplyHook", "PendingStep", "StepKernels", "UpdateLog"]
