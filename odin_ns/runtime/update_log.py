"""The update log: every step's pending update, per-primitive version order, and apply.

The update of global step s is, per primitive p of the union of the step's footprints,
selective Adam with gradient = sum of p's writers' rows in rank order and visible = OR of
their flags. A replica applies row p of step s once all of p's writers for s have arrived
and p's previous planned write is applied (``versions[p] == prev``): per-primitive version
order. Summing stored per-rank contributions in fixed rank order at apply time makes the
result bitwise identical in every mode and on every rank.

Two planes:
- control plane (host CPU tensors, decided only by the plan and by which publications have
  arrived): union ids, per-rank positions, which writers arrived, applied flags, the
  planned previous write of every row (from the step's tables), the version vector
  ``versions``;
- data plane (the parameters' device): contributions, accumulators, parameters, moments,
  and a device mirror of ``versions`` that the apply op keeps.

So deciding what is ready never reads the device; apply runs by mask. A row is complete
once its writers have all arrived. When a step's first look misses at most two writers,
the complete rows are those none of them writes: a byte pass over the step's rows with the
missing writers' rows blocked, at each look (``mark_ready``; a step is looked at after an
arrival of its own, so that is at most two more passes); while the peers keep up, a step's
first look misses at most this rank's own rows, and the last writer completes every row. A
step whose first look misses more (its writers trickle in, R large) groups its rows by
their set of writers (``writer_groups``); an arrival then counts down its groups and hands
on the rows of those it completed (``add_arrivals``), and an apply looks only at those rows
(``take_ready``): the control plane's work follows what arrives, not the step's size,
however many times the engine asks. Rows held back for a previous write not applied yet
are kept as a list for the next look either way. Once every previous write of the step is
applied, its complete rows are ready at once (marked, not looked at one by one). The host
kernels named here, each beside its torch twin, are ``step_kernels``'s.

Which steps a row has applied: every step through ``applied_through`` (the log's prefix of
fully applied steps), and beyond it what the host's ``versions`` says. The apply op keeps
the exact vector on the parameters' device; the host vector is written only for rows of
steps past ``applied_through``, and only when something asks (``settle_versions``), so a
step that completes first, as every step does while the peers keep up, writes nothing on
the host (at 1M rows and R = 8 replicated those writes were a third of ``take_ready``'s
time: a cache miss a row into an 8 MB vector); a drain copies the exact vector back. An
owner that pushes rows writes them as it takes them (``versions_on_take``): its pushes ask
at once.

An optional ``ApplyHook`` sees every applied row set around its Adam update (the MCMC
strategy's lazy position noise, ``odin_ns.distributed.mcmc_noise``); with the default
``hook=None`` the apply path is unchanged. The engine (``runtime.engine``) keeps its owned
rows' updates here: per step, per writer, the owned rows the writer read (its step tables'
``step_union``); a writer with none of them sends nothing for the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.runtime.config import ParamGroupState
from odin_ns.runtime.step_kernels import StepKernels, rows_not_applied
from odin_ns.runtime.uploads import upload


class ApplyHook(Protocol):
    """Called around the update of every applied row set, in apply order."""

    def before_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` ([K] int64 host, sorted unique) are about to get step ``step``'s update."""

    def after_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` ([K] int64 host) just got step ``step``'s update."""


class VersionTest:
    """Whether owned local ``rows`` have applied the global steps they ``need`` ([K] int64
    each), asked again and again while a step or a push waits. A row that has its step keeps
    it (versions only grow), so a test reads on from the first row not yet seen current:
    that row alone first (most tests are of rows still waiting), then the rows after it, up
    to the first that lacks its step (``first_lacking``: the host kernel, or its twin).
    Each question gives the versions as the update log has them: ``versions`` ([O] int64
    host) and ``through`` (every step through it is applied; ``UpdateLog.settle_versions``).
    Where every step the rows need is at or before ``through`` (the steady state, asked after
    the apply that completed the last of them) the answer is yes without a row read (nor
    the rows' range check, which the kernel makes as it reads)."""

    def __init__(self, rows: np.ndarray, need: np.ndarray, kernels: StepKernels = StepKernels()):
        self.rows = np.ascontiguousarray(rows, dtype=np.int64)
        self.need = np.ascontiguousarray(need, dtype=np.int64)
        self._rows, self._need = torch.from_numpy(self.rows), torch.from_numpy(self.need)
        self._kernels = kernels  # first_lacking and lacking_rows: the host kernels or twins
        self._first = 0  # rows before it were seen current
        # every row's step applied once every step through the latest is (no row read)
        self._need_max = int(self.need.max()) if self.need.size else 0  # (unread when empty)

    def lacking(self, versions: np.ndarray, through: int) -> np.ndarray:
        """[L] int64 the positions of the rows that lack their step, in order (read from the
        first row not yet seen current: the host kernel ``lacking_rows``, or its twin)."""
        found = self._kernels.lacking_rows(
            torch.from_numpy(versions), self._rows, self._need, self._first, through
        )
        return found.numpy()

    def waiting_on(self) -> tuple[int, int]:
        """(row, step): the first row not yet seen current and the step it needs; the test
        cannot pass before that row has it. (0, the least int64) once seen current."""
        if self._first >= self.rows.size:
            return 0, np.iinfo(np.int64).min
        return int(self.rows[self._first]), int(self.need[self._first])

    def current(self, versions: np.ndarray, through: int) -> bool:
        """Whether no row lacks its step (read from the first row not yet seen current)."""
        i, n = self._first, self.rows.size
        if i < n and self._need_max <= through:
            i = n  # (the steady state: every step the rows need applied before the question)
        elif i < n:
            if self.need[i] > through and versions[self.rows[i]] < self.need[i]:
                return False
            if i + 1 < n:  # row i has its step: read on from the next
                i = self._kernels.first_lacking(
                    torch.from_numpy(versions), self._rows, self._need, i + 1, through
                )
            else:
                i = n
        self._first = i
        return i == n


@dataclass(frozen=True)
class StepRows:
    """One step's rows as the update log reads them (``StepWrites.step_union``).

    ids: [U] int64 sorted unique rows written at the step (host).
    positions: per writer q, [M_q] int64 the positions of its rows in ids (host).
    prev: [U] int64 each row's last planned write before the step, as a local step (-1:
        none in the phase; host).
    prev_max: the latest of prev (-1: none, or no rows).
    ids_data, positions_data: ids and positions on the parameters' device, moved there
        together when the tables were made (``uploads.upload_together``; on the CPU the
        host tensors themselves), so that the step moves no id list of its own.
    groups: the rows grouped by their set of writers (``writer_groups``' five outputs),
        made with the tables where those are made off the step's path (beside an
        accelerator), for a step whose first look misses many writers; None: that step
        makes them (``WriterCounts``).
    """

    ids: Tensor
    positions: list[Tensor]
    prev: Tensor
    prev_max: int
    ids_data: Tensor
    positions_data: list[Tensor]
    groups: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None


class StepWrites(Protocol):
    """Who writes which rows at each local step (the engine's step tables)."""

    def step_union(self, s: int) -> StepRows:
        """The rows written at local step s."""


class SumBuffers:
    """Reused [U, W] float32 buffers for the steps' summed rows, on the parameters' device.

    A step takes one at its first apply and gives it back once all its rows are applied, so
    the next step sums into the same memory. A fresh buffer costs a CPU its pages' faults
    and, when freed, unmapping them again (a [U, W] sum is ~50 MB at R = 8 replicated, 1M
    rows); a CUDA caching allocator reuses memory the same way, so there this changes
    nothing. At most ``keep`` buffers are kept; a taken buffer is zeroed.

    Args:
        width: W, columns per row.
        device: the parameters' device.
        keep: buffers kept for reuse (more are made when more steps sum at once).
    """

    def __init__(self, width: int, device, keep: int = 2):
        self.width = width
        self.device = device
        self.keep = keep
        self.free: list[Tensor] = []  # [capacity, W] float32, smallest first
        self.lent: dict[int, Tensor] = {}  # data pointer -> the buffer a view was cut from

    def take(self, rows: int) -> Tensor:
        """A zeroed [rows, W] float32 view of a free buffer, or of a new one."""
        fits = next((i for i, b in enumerate(self.free) if b.shape[0] >= rows), None)
        if fits is None:  # an eighth more, so that the next, slightly larger step fits
            base = torch.empty(
                max(1, rows + rows // 8), self.width, dtype=torch.float32, device=self.device
            )
        else:
            base = self.free.pop(fits)
        self.lent[base.data_ptr()] = base
        return base[:rows].zero_()

    def give(self, buf: Tensor) -> None:
        """Return a view ``take`` handed out; its memory may be handed out again."""
        base = self.lent.pop(buf.data_ptr())
        self.free.append(base)
        self.free.sort(key=lambda b: b.shape[0])
        del self.free[: max(0, len(self.free) - self.keep)]  # drop the smallest


class WriterCounts:
    """A pending step's rows grouped by their set of writers (``writer_groups``), each group
    counting down the writers it still waits for, so that an arrival hands on the rows it
    completes (``add_arrivals``) at the cost of its groups and those rows.

    Args:
        positions: per writer q, [M_q] int64 its rows' positions in the step's [U] rows.
        num_rows: U.
        kernels: the per-step host kernels.
        made: the groups as ``writer_groups`` gives them, made with the step's tables
            (``StepRows.groups``; not written here); None: made now.
    """

    def __init__(
        self,
        positions: Sequence[Tensor],
        num_rows: int,
        kernels: StepKernels,
        made: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None,
    ):
        self.kernels = kernels
        if made is None:
            groups = kernels.writer_groups(positions, num_rows)
        else:  # the countdown is this step's to write
            ptr, group_rows, need, writer_ptr, writer_groups = made
            groups = ptr, group_rows, need.clone(), writer_ptr, writer_groups
        # (need: [G] int32 the writers each group still waits for, counted down here)
        self.group_ptr, self.group_rows, self.need, writer_ptr, self.writer_groups = groups
        self.writer_bounds = writer_ptr.tolist()  # writer q's groups: [q] to [q + 1]

    def arrive(self, q: int) -> Tensor:
        """Writer q arrived: [K] int64 the positions of the rows it completed."""
        mine = self.writer_groups[self.writer_bounds[q] : self.writer_bounds[q + 1]]
        return self.kernels.add_arrivals(self.need, mine, self.group_ptr, self.group_rows)


class PendingStep:
    """One step's update (rows = sorted union U of what the step's writers wrote).

    Which rows are complete (every writer of the row arrived): when a step's first look
    misses at most ``MASK_WRITERS`` writers, those no missing writer writes, found at each
    look (``mark_ready`` with the missing writers' rows blocked, or a mask): a step is
    looked at after an arrival of its own (rows held back for a previous write are looked
    at again from a list), so it takes at most that many more byte passes over its rows. A
    step whose first look misses more groups its rows by their writers then
    (``WriterCounts``; or takes the groups its tables brought, made off the step's path:
    ``StepRows.groups``) and each arrival counts down its groups: a step whose writers
    trickle in costs what arrives, not a pass over its rows at each arrival. While the
    peers keep up, a step's first look misses at most this rank's own rows and no group is
    made (``writer_groups`` cost 1.5-2.6 ms a step at R = 8, 1M rows).

    Args:
        step: global step.
        rows: the step's rows (``StepWrites.step_union``).
        device: the parameters' device.
        kernels: the per-step host kernels (``StepKernels.resolve()``).
    """

    MASK_WRITERS = 2  # writers missing at the first look up to which a mask finds them

    def __init__(self, step: int, rows: StepRows, device, kernels: StepKernels):
        self.step = step
        self.kernels = kernels
        self.ids = rows.ids  # [U] int64 (host)
        self.prev = rows.prev  # [U] int64 planned previous write (local step, -1: none)
        self.positions = rows.positions  # per rank [M_q] int64 positions into U
        self.groups = rows.groups  # the rows by writer set, if the tables made them
        # [U] (numpy's zeros: fresh zero pages, not a pass over them, and no wait for the
        # GIL that a torch call gives up and takes back)
        self.applied = torch.from_numpy(np.zeros(self.ids.numel(), dtype=bool))
        self.unapplied = self.ids.numel()  # rows not applied yet
        # the latest previous planned write of any row (local step; -1: none)
        self.prev_max = rows.prev_max
        self.counts: WriterCounts | None = None  # made if the first look misses many
        self.looked = False  # take_ready has run
        # complete positions not applied: counted, or held back at the last look
        self.complete: list[Tensor] = []
        self.arrived_since_look = False  # (without counts) since the last take_ready
        self.device = device
        if rows.ids_data.device.type != torch.device(device).type:
            raise ValueError(
                f"step {step}: its rows were moved to {rows.ids_data.device}, "
                f"the parameters are on {device}"
            )
        self.ids_data = rows.ids_data  # [U] on the parameters' device
        self.positions_data = rows.positions_data  # per rank [M_q] on the parameters' device
        # per rank (positions on device [M_q], rows [M_q, W] on device), in rank order
        self.parts: list[tuple[Tensor, Tensor] | None] = [None] * len(self.positions)
        # [U, W] float32 summed rows (device), taken from the log's SumBuffers at the step's
        # first apply and kept for its later ones: a row is summed once, when it is applied,
        # so rows not applied yet are still zero
        self.acc: Tensor | None = None
        # a writer with no row of the step sends nothing: its part counts as received
        self.received = [pos.numel() == 0 for pos in self.positions]
        self.done = self.ids.numel() == 0  # every row applied
        # [U] bool masks of applied rows whose host versions the log has not written yet
        self.unversioned: list[Tensor] = []

    @property
    def all_arrived(self) -> bool:
        """Every writer arrived: every row not applied is complete."""
        return all(self.received)

    @property
    def has_complete(self) -> bool:
        """Whether some row's writers may all have arrived with the row not applied yet
        (without counts: something arrived, or rows were held, since the last look)."""
        if self.all_arrived:
            return not self.done
        return bool(self.complete) or self.arrived_since_look

    def add(self, q: int, rows: Tensor) -> None:
        """Rank q's contribution: [M_q, W] float32 on the parameters' device."""
        if self.received[q]:
            raise RuntimeError(f"step {self.step}: rank {q}'s rows arrived twice")
        self.parts[q] = (self.positions_data[q], rows)
        self.received[q] = True
        if self.all_arrived:  # the last writer completes every row: nothing to count
            self.complete = []
        elif self.counts is not None:
            complete = self.counts.arrive(q)
            if complete.numel():
                self.complete.append(complete)
        else:
            self.arrived_since_look = True

    def add_sum(self, dense: Tensor) -> None:
        """Every writer's contribution already summed: [N, W] float32 (device), row p = p."""
        u = self.ids.shape[0]
        self.parts = [(torch.arange(u, device=self.device), dense.index_select(0, self.ids_data))]
        self.parts += [None] * (len(self.received) - 1)
        self.received = [True] * len(self.received)
        self.complete = []

    def take_ready(
        self, versions: Tensor, offset: int, applied_through: int, write: bool
    ) -> tuple[Tensor, int]:
        """(ready [U] bool, count): of the complete rows, those whose previous planned write
        is applied (every step through global step ``applied_through`` is; a later one where
        ``versions``, [N] int64 host, says so; ``offset``: the global step of local step 0),
        now marked applied, their host versions written (``write``) or noted in
        ``unversioned``; the others stay complete for a later look.

        Once every previous write is applied (the steady state: the peers keep up), every
        complete row is ready, with no look at its previous write (``mark_ready``: 0.2-0.4 ms
        for 250K rows of a 290K-row step, where the look costs 0.6-0.95), and without counts
        the complete rows are no list: every row not applied, less the missing writers'."""
        write_step = self.step if write else -1
        missing = self.missing()
        if not self.looked and len(missing) > self.MASK_WRITERS:
            self._count_arrivals()
        self.looked = True
        # every row not applied, less the missing writers' (after an arrival, uncounted),
        # or the list of complete rows (counted, or held back at the last look)
        by_mask = self.all_arrived or (self.counts is None and self.arrived_since_look)
        blocked = [self.positions[q] for q in missing] if by_mask else []
        self.arrived_since_look = False
        if self.prev_max + offset <= applied_through:
            ready, n = self.kernels.mark_ready(
                None if by_mask else self._complete_rows(), blocked, self.applied, self.ids,
                versions, write_step,
            )  # fmt: skip
            self.complete = []
            return self._took(ready, n, write)
        candidates = rows_not_applied(self.applied, blocked) if by_mask else self._complete_rows()
        ready, taken, held = self.kernels.take_ready(
            candidates, self.applied, self.ids, self.prev, offset, versions, applied_through,
            write_step,
        )  # fmt: skip
        self.complete = [held] if held.numel() and not self.all_arrived else []
        return self._took(ready, taken.numel(), write)

    def missing(self) -> list[int]:
        """The writers whose rows have not arrived, in rank order."""
        return [q for q, got in enumerate(self.received) if not got]

    def _count_arrivals(self) -> None:
        """Make the writer counts and count every writer arrived so far (at the step's first
        look: no row is applied yet)."""
        self.counts = WriterCounts(self.positions, self.ids.numel(), self.kernels, self.groups)
        arrived = [self.counts.arrive(q) for q, got in enumerate(self.received) if got]
        self.complete = [c for c in arrived if c.numel()]

    def _complete_rows(self) -> Tensor:
        """[K] int64 the positions whose writers all arrived, not applied yet (counted, or
        held back at the last look)."""
        if not self.complete:
            return torch.zeros(0, dtype=torch.int64)
        return self.complete[0] if len(self.complete) == 1 else torch.cat(self.complete)

    def _took(self, ready: Tensor, n: int, write: bool) -> tuple[Tensor, int]:
        """Count the n rows of ``ready`` ([U] bool) just marked applied; note their host
        versions for later unless written (``write``)."""
        if n and not write:
            self.unversioned.append(ready)
        self.unapplied -= n
        self.done = self.unapplied == 0
        return ready, n


class UpdateLog:
    """Pending steps of one bound plan, keyed by local step, created in step order.

    Args:
        groups: the parameter groups (updated in place by ``apply_ready``).
        writes: who writes which rows at each local step (``StepWrites``).
        world_size: R.
        step_offset: global step of the plan's local step 0.
        versions: [N] int64 host version vector to continue from (updated in place, see
            ``settle_versions``); every step before ``step_offset`` is applied.
        hook: optional ``ApplyHook`` called around every apply (None: no call).
        versions_on_take: write the host versions of rows as they are taken (an owner that
            pushes rows: its pushes ask for them as soon as the rows are applied); else only
            when asked (``settle_versions``).
        observe_sum: optional ``f(ids, acc, applied)`` called after every apply with the
            step's rows ([U] int64), their summed rows ([U, W] float32, visible count last)
            and which were applied ([U] bool), all on the parameters' device (no read of
            it): throughput-first's evidence. None: no call.
        kernels: the per-step host kernels (None: ``StepKernels.resolve()``).
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
        versions_on_take: bool = False,
        kernels: StepKernels | None = None,
    ):
        self.groups = list(groups)
        self.versions_on_take = versions_on_take
        self.hook = hook
        self.observe_sum = observe_sum
        self.writes = writes
        self.world_size = world_size
        self.step_offset = step_offset
        self.device = self.groups[0].param.device
        self.width = sum(g.row_dim for g in self.groups) + 1  # W: columns, then visible
        self.versions = versions  # [N] int64 host: see ``settle_versions``
        # [N] int64 on the parameters' device, kept exact by the apply op (a copy of its own
        # on the host too, so that CPU ranks take the path a device's ranks take)
        self.versions_data = versions.to(self.device, copy=True)
        self.applied_through = step_offset - 1  # every step through this one is applied
        self.kernels = kernels if kernels is not None else StepKernels.resolve()
        self.row_ops = ops.RowOps(self.device)
        self.sums = SumBuffers(self.width, self.device)
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
                self.step_offset + s, self.writes.step_union(s), self.device, self.kernels
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
            if self.kernels.any_unapplied(rec.ids, rec.applied, ids):
                return s
        return None

    def first_missing(self, before: int) -> tuple[int, int]:
        """(peer, global step) of the oldest missing publication before local ``before``."""
        for s, rec in self.pending.items():
            if s >= before:
                break
            if not rec.done:
                missing = rec.missing()
                return (missing[0] if missing else -1), rec.step
        return -1, self.step_offset + before

    def apply_ready(self) -> int:
        """Apply every ready row of every pending step in step order (so per primitive in
        version order); retire steps fully applied and received; advance
        ``applied_through``. Returns rows applied."""
        if not self.dirty:
            return 0
        self.dirty = False
        total = 0
        through = self.applied_through
        in_order = True  # every step before s fully applied (retired steps are)
        for s in list(self.pending):
            rec = self.pending[s]
            if rec.has_complete:  # rows whose writers all arrived, not applied yet
                if not in_order:  # its look reads the versions of steps after ``through``
                    self._write_versions(through, before=rec.step)
                ready, n = rec.take_ready(
                    self.versions, self.step_offset, through, self.versions_on_take
                )
                if n:
                    self._apply(rec, ready)
                    total += n
                    if rec.done:
                        self.sums.give(rec.acc)
                        rec.parts, rec.acc = [None] * self.world_size, None
            in_order = in_order and rec.done
            if in_order:
                through = rec.step
            if rec.done and all(rec.received):
                if rec.step > through:  # retired out of order: its versions are due now
                    self._write_versions(through, before=rec.step + 1)
                del self.pending[s]
        self.applied_through = through
        return total

    def settle_versions(self, before: int) -> int:
        """Write the host versions of the applied rows of every step after
        ``applied_through`` and before global step ``before`` (what a read at ``before``
        can need), and return ``applied_through``: a row then has global step n < ``before``
        applied iff ``n <= applied_through`` or ``versions[row] >= n``. (A step's rows are
        applied without writing the host vector; when the step completes before a read of a
        later step asks, as every step does while the peers keep up, ``applied_through``
        covers them and nothing is written.)"""
        if before > self.applied_through + 1:  # (else no step lies between)
            self._write_versions(self.applied_through, before)
        return self.applied_through

    def settle_after_drain(self) -> None:
        """Every step is applied (a drain): the host vector from the device's, which the
        apply op keeps exact (one copy per drain)."""
        self.versions.copy_(self.versions_data)
        for rec in self.pending.values():
            rec.unversioned.clear()

    def _write_versions(self, through: int, before: int) -> None:
        """Write the deferred versions of the pending steps after global step ``through``
        and before global step ``before``; drop those at or before ``through``."""
        for rec in self.pending.values():
            if rec.step >= before:
                break
            if rec.unversioned and rec.step > through:
                for ready in rec.unversioned:
                    self.kernels.write_versions(self.versions, rec.ids, ready, rec.step)
            rec.unversioned.clear()

    def _apply(self, rec: PendingStep, ready: Tensor) -> None:
        ready_data = upload(ready, self.device)
        if rec.acc is None:
            rec.acc = self.sums.take(rec.ids.shape[0])
        acc = rec.acc
        row_ops = self.row_ops
        parts = [part for part in rec.parts if part is not None]  # in rank order: bitwise
        row_ops.accumulate_ready_rows(  # identical sums
            acc, ready_data, [part[0] for part in parts], [part[1] for part in parts]
        )
        hook = self.hook
        if hook is not None:
            ids = rec.ids[ready]
            hook.before_apply(rec.step, ids)
        row_ops.apply_ready_rows(
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


__all__ = [
    "ApplyHook",
    "PendingStep",
    "StepRows",
    "SumBuffers",
    "UpdateLog",
    "VersionTest",
]
