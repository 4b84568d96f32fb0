"""A phase's step tables (DESIGN 3.11): per local step, what one rank reads, whom it sends
which gradient rows, which owned rows each writer writes (the update log's ``StepRows``) and
which pushes it sends and receives, all cut from the plan's footprints by host kernels
(``step_record``, ``owner_rows``, ``reader_rows``, ``writer_groups``; their twins here and
in ``step_kernels``). ``PhaseSteps`` holds a phase's tables while its steps run: made in the
step, or beside an accelerator ``TABLES_AHEAD`` steps ahead on a thread of their own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.runtime.layout import EVERY_RANK, ShardLayout
from odin_ns.runtime.step_kernels import step_record_reference, writer_groups_reference
from odin_ns.runtime.update_log import StepRows
from odin_ns.runtime.uploads import upload_together

TABLES_AHEAD = 2  # steps whose tables a thread makes ahead beside an accelerator (PhaseSteps)
# The most ranks at which that thread also groups each step's rows by writer set (for a step
# whose peers are behind): at 1M rows, 4.5% per view, the groups cost it 1.7 ms a step at
# R = 8 (tables 2.9 -> 4.6 ms) but 26 ms at R = 64 (15 -> 41 ms), longer than a step there
GROUPS_AHEAD_MAX_RANKS = 16


def groups_ahead(layout: ShardLayout, world_size: int, tables_thread: bool) -> bool:
    """Whether the tables' thread groups each step's rows by writer set (``step_rows``'
    ``group_writers``): the replicated layout, its tables made ahead, up to
    ``GROUPS_AHEAD_MAX_RANKS`` ranks."""
    return tables_thread and layout.replicated and world_size <= GROUPS_AHEAD_MAX_RANKS


@dataclass
class Push:
    """One push of owned rows to a reader, sent once each row's last update before the read
    (``prev``) is applied. A pair's pushes go in the reader's step order (one per step at
    most), so that a step's tables give the pushes of that step: no list of the phase."""

    ready: int  # the latest of ``prev``: the step after which its rows no longer change
    step: int  # local step at which the reader reads them
    peer: int  # reader (push out) or owner (push in)
    rows: np.ndarray  # local ids (owned rows out / cache rows in), global order
    prev: np.ndarray  # [len(rows)] local step of each row's last write before ``step``


@dataclass
class Step:
    """What rank ``me`` does at one local step (host index arrays; local ids)."""

    reads: np.ndarray  # [M] local ids of the read set, in global-id order (render order)
    reads_global: np.ndarray  # [M] global ids (sorted)
    grad_out: dict[int, np.ndarray]  # owner -> local ids (cache rows) whose grads go there
    own_rows: np.ndarray  # local ids (owned) of own reads, global order
    # the owned rows anyone writes at this step, as the update log reads them: [U] sorted
    # local ids, per writer q its [M_q] positions among them, each one's last planned write
    # before t (-1: none)
    writes: StepRows
    own_prev: np.ndarray  # [len(own_rows)] last planned write before t of each own read
    # the own reads that have a planned write before t: (local ids, that write's local step)
    own_waits: tuple[np.ndarray, np.ndarray]
    pushes_out: list[Push]  # what this rank pushes for the step: one per reader, rank order
    pushes_in: list[Push]  # what it is pushed for the step: one per owner, rank order


class PhaseSteps:
    """One rank's step tables of a phase (``Step`` per local step), made in step order as
    the engine first asks for a step, and forgotten once the step has run
    (``forget_through``): host memory of the steps in flight, not of the phase (a 100-step
    replicated phase at 1M Gaussians and R = 64 would hold about 3 GB). Also the plan as
    the owner's ``UpdateLog`` reads it (``step_union``: at local step s, writer q's
    "footprint" is the owned local ids of the rows q reads that this rank owns, [M_q] sorted,
    the order of q's gradient message; nothing is searched or counted again).

    With ``ahead`` > 0 a thread of its own makes the tables of the ``ahead`` steps after
    the newest one handed over, in step order, started at the end of each of the engine's
    steps (``make_ahead``) so that it runs beside what follows: the step path then takes
    them made (the host kernels release the GIL; replicated at R = 8, 1M rows, 2 ms a
    step). Each table is made once, by one thread at a time, in order, so they are
    the same tables either way. That thread also makes what ``derive`` gives of each table
    it makes (the engine's ``StepPath``: the step's id lists on the device and its version
    test), which the engine takes with ``derived``; a table made on the asking thread has
    none (the engine makes it there, when the step needs it).

    Args:
        steps: the tables in step order (``step_rows``'s, or an iterator over a list).
        num_steps: how many there are.
        ahead: how many steps past the newest one handed over ``make_ahead`` starts (0:
            each step's tables are made when first asked for, on the asking thread).
        derive: what to make of each table on the maker's thread (None: nothing).
    """

    def __init__(
        self,
        steps: Iterator[Step],
        num_steps: int,
        ahead: int = 0,
        derive: Callable[[Step], object] | None = None,
    ):
        self._steps = steps
        self._made: dict[int, Step] = {}
        self._derive = derive
        self._derived: dict[int, object] = {}  # what ``derive`` made, until taken
        self._next = 0  # the next step to make (or to take from ``_coming``)
        # (tables, derived) of steps _next, _next + 1, ... being made on the maker's thread
        self._coming: deque[Future[tuple[Step, object]]] = deque()
        self.ahead = max(0, int(ahead))
        self._maker = (
            ThreadPoolExecutor(1, thread_name_prefix="odin-step-tables")
            if self.ahead and num_steps > 1
            else None
        )
        self.num_steps = num_steps

    def __len__(self) -> int:
        return self.num_steps

    @property
    def made(self) -> int:
        """How many steps' tables were handed over so far (steps 0..made - 1), whether
        made on the asking thread or ahead."""
        return self._next

    def __getitem__(self, t: int) -> Step:
        if not 0 <= t < self.num_steps:
            raise IndexError(f"local step {t} outside the phase's {self.num_steps} steps")
        while self._next <= t:  # (the maker's thread is idle when nothing is coming)
            if self._coming:
                step, derived = self._coming.popleft().result()
                if derived is not None:
                    self._derived[self._next] = derived
            else:
                step = next(self._steps)
            self._made[self._next] = step
            self._next += 1
        if self._next == self.num_steps:  # every step handed over
            self._finish()
        step = self._made.get(t)
        if step is None:
            raise RuntimeError(f"local step {t} has run: its tables are forgotten")
        return step

    def make_ahead(self) -> None:
        """Start making, on the maker's thread, the tables of the ``ahead`` steps after the
        newest one handed over (in step order, each once). Called when the caller's own work
        is done (the engine: at the end of a step), so that the maker runs beside what comes
        next (an accelerator's step, the wait for it), not beside the caller's own kernels:
        started as each step was asked for, in the step, the sharded step at R = 8, 1M rows
        took 4.6 ms instead of 1.6 on this 2-core machine, its own memory-bound kernels
        slowed by the maker's (2026-12-07). Nothing without a maker's thread."""
        if self._maker is None:
            return
        last = min(self._next - 1 + self.ahead, self.num_steps - 1)
        while self._next + len(self._coming) <= last:
            self._coming.append(self._maker.submit(self._make_next))
        if self._next + len(self._coming) == self.num_steps:  # every step asked for
            self.close()

    def _make_next(self) -> tuple[Step, object]:
        """The next table and what ``derive`` makes of it (on the maker's thread)."""
        step = next(self._steps)
        return step, None if self._derive is None else self._derive(step)

    def derived(self, t: int) -> object | None:
        """What ``derive`` made of step t's tables on the maker's thread, handed over once
        (None: not made there, or taken already). Ask after ``self[t]``."""
        return self._derived.pop(t, None)

    def close(self) -> None:
        """Let the maker's thread end once it has made the tables already asked of it
        (later ones are then made when asked for); idempotent. Called when the phase's
        last step has been asked for (a phase cut short: its thread ends with the engine)."""
        if self._maker is not None:
            self._maker.shutdown(wait=False)
            self._maker = None

    def _finish(self) -> None:
        """Every step handed over (nothing is being made): end the maker's thread, close the
        tables' iterator (``step_rows`` then ends its cutting thread) and drop ``derive``
        (the engine's bound method: the engine then goes with its last reference, not at
        the next full collection, with its table)."""
        self.close()
        self._derive = None
        closing = getattr(self._steps, "close", None)
        if closing is not None:
            closing()

    def forget_through(self, t: int) -> None:
        """Steps <= t have run: drop their tables."""
        for s in [s for s in self._made if s <= t]:
            del self._made[s]
        for s in [s for s in self._derived if s <= t]:
            del self._derived[s]

    def step_union(self, s: int) -> StepRows:
        """The owned rows written at local step s (local ids), host tensors."""
        return self[s].writes


def step_rows(
    plan,
    layout: ShardLayout,
    num_ranks: int,
    num_steps: int | None = None,
    aside: bool = False,
    device: torch.device | str = "cpu",
    group_writers: bool = False,
) -> Iterator[Step]:
    """Rank ``layout.rank``'s ``Step`` of each local step of the phase's plan, in order,
    with the pushes it makes for the step (one per reader) and receives (one per owner).

    A row read at t by r is pushed iff some rank wrote it in the phase before t (its previous
    write ``prev >= 0``); else the phase start's cache fill holds it. Per step, the update
    log's host kernel ``step_record`` gives the union of every rank's reads, each read's
    positions in it and each row's previous write; the host kernels ``owner_rows`` and
    ``reader_rows`` (twins ``owner_rows_reference``, ``reader_rows_reference``) cut the
    rank's tables from those in one pass over the union and one over its reads (no search
    or sort of ids per step). A list two tables hold alike is one array (the reads and the
    owned reads where the rank owns them all, the gradient rows every peer is sent), so the
    step path uploads it once. The update log's lists (``Step.writes``) are moved to
    ``device``, the parameters', as each table is made, in one copy per step.

    ``aside`` (a layout with owners): a thread of its own cuts step t's tables while the
    caller's thread makes step t + 1's record (the kernels release the GIL; the tables come
    out in step order, the same tables). At R = 64, 1M rows: 10 -> 5.6 ms a step on 2 cores.

    ``group_writers`` (the replicated layout, its tables made ahead beside an accelerator):
    each step's rows grouped by writer set with its record (``StepRows.groups``), off the
    step's path; a step whose first look misses more than two writers (peers behind) needs
    them, and made by the step they cost it 1.5 ms at R = 8 (1M rows).
    """
    me = layout.rank
    record = ops.host_op("step_record") or step_record_reference
    as_owner = ops.host_op("owner_rows") or owner_rows_reference
    as_reader = ops.host_op("reader_rows") or reader_rows_reference
    group = (ops.host_op("writer_groups") or writer_groups_reference) if group_writers else None
    # the maps as the kernels take them: int32, half the bytes a look-up pulls in
    owner = torch.from_numpy(layout.owner.astype(np.int32))
    local_of = torch.from_numpy(layout.local_of.astype(np.int32))
    last = torch.full((layout.owner.size,), -1, dtype=torch.int64)  # last write per row
    # the rows a rank's tables name are those its table holds (it owns or reads them): the
    # union leaves out the rest of the peers' reads (at R = 64 most of them)
    held = None if layout.replicated else torch.from_numpy(layout.local_of >= 0)
    peers = [q for q in range(num_ranks) if q != me]

    def cut(t: int, ids: Tensor, positions: list[Tensor], prev: Tensor):
        """Step t's ``Step`` from its record."""
        made = as_owner(ids, positions, prev, owner, local_of, me)
        writes = step_writes(*made[:3], device)
        out_rows, out_prev = _as_arrays(made[3:])
        made = as_reader(ids, positions[me], prev, owner, local_of, me, num_ranks)
        reads_global, reads_local, own_rows, own_prev, every, grad_rows, in_rows, in_prev = (
            _as_arrays(made)
        )
        if layout.identity:  # local ids are global ids: one list
            reads_local = reads_global
        if own_rows.size == reads_local.size:  # every read is owned: the same list
            own_rows = reads_local
        if every.size == reads_local.size:  # every rank owns every read: one list for all
            grad_out = dict.fromkeys(peers, reads_local) if reads_local.size else {}
        else:  # an owner of none of the reads is still sent the rows every rank owns
            grad_out = {o: grad_rows[o] if grad_rows[o].size else every for o in peers}
            grad_out = {o: rows for o, rows in grad_out.items() if rows.size}
        pushes_in = [Push(int(in_prev[o].max()), t, o, in_rows[o], in_prev[o])
                     for o in peers if in_rows[o].size]  # fmt: skip
        pushes_out = [Push(int(out_prev[q].max()), t, q, out_rows[q], out_prev[q])
                      for q in peers if out_rows[q].size]  # fmt: skip
        step = Step(
            reads=reads_local,
            reads_global=reads_global,
            grad_out=grad_out,
            own_rows=own_rows,
            writes=writes,
            own_prev=own_prev,
            own_waits=_waits(own_rows, own_prev),
            pushes_out=pushes_out,
            pushes_in=pushes_in,
        )
        return step

    cutter = None
    if aside and not layout.replicated:
        cutter = ThreadPoolExecutor(1, thread_name_prefix="odin-step-cut")
    cutting: deque[Future] = deque()  # the steps being cut, in order
    try:
        for t in range(plan.num_steps if num_steps is None else num_steps):
            reads = [torch.from_numpy(plan.step_footprint(t, q)) for q in range(num_ranks)]
            ids, positions, prev = record(reads, last, t, held)  # the union [U], sorted
            if layout.replicated:  # no owner to look up (1.3 ms a step at R = 8, 1M rows)
                writes = step_writes(ids, prev, positions, device, group)
                yield replicated_step(writes, me, peers)
            elif cutter is None:
                yield cut(t, ids, positions, prev)
            else:
                cutting.append(cutter.submit(cut, t, ids, positions, prev))
                if len(cutting) > 1:
                    yield cutting.popleft().result()
        while cutting:
            yield cutting.popleft().result()
    finally:
        if cutter is not None:
            cutter.shutdown(wait=True, cancel_futures=True)


def _as_arrays(outputs: Sequence[Tensor | list[Tensor]]) -> list:
    """A host kernel's outputs (tensors, lists of tensors) as numpy arrays sharing their
    memory."""
    return [x.numpy() if isinstance(x, Tensor) else [y.numpy() for y in x] for x in outputs]


def owner_rows_reference(
    ids: Tensor,
    positions: Sequence[Tensor],
    prev: Tensor,
    owner: Tensor,
    local_of: Tensor,
    rank: int,
) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor], list[Tensor]]:
    """What ``rank`` does as an owner at a step, from the step's record (``ids`` [U] sorted
    global ids of every rank's reads, ``positions`` per rank q of R its [M_q] positions in
    ids, ``prev`` [U] each row's previous write in the phase, -1: none) and the ownership map
    (``owner`` [N] int32: a rank or ``EVERY_RANK``; ``local_of`` [N] int32: the rank's local
    id of each row, -1: none). Returns (rows [U'] local ids of the union rows it owns, their [U']
    previous writes, per writer q its [M'_q] positions among them; per reader q its push:
    [P_q] local ids of the rows of q's reads that ``rank`` alone owns and that were written
    before, in q's order, and their [P_q] previous writes; empty for q = rank). Host int64
    tensors. The torch twin of the host kernel ``torch.ops.odin.owner_rows``."""
    o = owner[ids].long()
    _check_owners(o, ids, len(positions), "owner_rows")
    owns = (o == rank) | (o == EVERY_RANK)
    renumber = torch.cumsum(owns, 0) - 1  # union position -> position among owned rows
    pushed = (o == rank) & (prev >= 0)
    pushed_at = [p[pushed[p]] if q != rank else p[:0] for q, p in enumerate(positions)]
    return (
        local_of[ids[owns]].long(),
        prev[owns],
        [renumber[p[owns[p]]] for p in positions],
        [local_of[ids[p]].long() for p in pushed_at],
        [prev[p] for p in pushed_at],
    )


def reader_rows_reference(
    ids: Tensor,
    reads: Tensor,
    prev: Tensor,
    owner: Tensor,
    local_of: Tensor,
    rank: int,
    num_ranks: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Tensor], list[Tensor]]:
    """What ``rank`` does as a reader at a step: ``reads`` [M] are its reads' positions in
    the step's union ``ids`` (the rest as in ``owner_rows_reference``). Returns (the reads'
    [M] global ids, their [M] local ids, the [K] local ids of the ones ``rank`` owns and
    their [K] previous writes, the [E] local ids of the ones every rank owns; per owner o of
    ``num_ranks`` the gradient rows that go there: the reads o alone owns and those every
    rank owns, in read order, empty where o owns none alone (and for o = rank); per owner o
    its push: the [P_o] local ids of the reads o alone owns that were written before, and
    their [P_o] previous writes). Host int64 tensors; raises ValueError where the local
    table lacks a read. The torch twin of the host kernel ``torch.ops.odin.reader_rows``."""
    g = ids[reads]
    o = owner[g].long()
    _check_owners(o, g, num_ranks, "reader_rows")
    local = local_of[g].long()
    if bool((local < 0).any()):
        row = int(g[local < 0][0])
        raise ValueError(
            f"reader_rows: rank {rank} reads row {row}, which its local table does not hold"
        )
    before = prev[reads]
    own = (o == rank) | (o == EVERY_RANK)
    every = o == EVERY_RANK
    grad_rows, push_rows, push_prev = [], [], []
    for q in range(num_ranks):
        alone = (o == q) & (q != rank)
        grad_rows.append(local[alone | every] if bool(alone.any()) else local[:0])
        sel = alone & (before >= 0)
        push_rows.append(local[sel])
        push_prev.append(before[sel])
    return g, local, local[own], before[own], local[every], grad_rows, push_rows, push_prev


def _check_owners(owners: Tensor, rows: Tensor, num_ranks: int, op: str) -> None:
    """ValueError naming the first of ``rows`` whose owner entry is neither a rank of
    ``num_ranks`` nor ``EVERY_RANK`` (the host kernels' message)."""
    bad = (owners < EVERY_RANK) | (owners >= num_ranks)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(
            f"{op}: row {int(rows[i])} has owner {int(owners[i])}, not a rank in "
            f"[0, {num_ranks}) or -1 (every rank)"
        )


def replicated_step(writes: StepRows, me: int, peers: list[int]) -> Step:
    """``step_rows``' table of a step where every rank owns every row (local ids are global
    ids), from the step's record (``writes``: the union of every rank's reads, each rank's
    positions in it, each row's previous write); every peer is sent the gradients of every
    read row and nothing is pushed."""
    ids, prev = writes.ids.numpy(), writes.prev.numpy()
    mine = writes.positions[me].numpy()
    reads, own_prev = ids[mine], prev[mine]
    return Step(
        reads=reads,
        reads_global=reads,
        grad_out=dict.fromkeys(peers, reads) if reads.size else {},
        own_rows=reads,
        writes=writes,
        own_prev=own_prev,
        own_waits=_waits(reads, own_prev),
        pushes_out=[],
        pushes_in=[],
    )


def step_writes(
    ids: Tensor,
    prev: Tensor,
    positions: list[Tensor],
    device,
    writer_groups: Callable | None = None,
) -> StepRows:
    """The update log's ``StepRows`` of a step's owned writes: [U] local ids, their [U]
    previous writes, per writer its [M_q] positions among them (host int64 tensors, kept),
    the ids and positions also on ``device``, moved there in one copy; with
    ``writer_groups`` (the host kernel), the rows grouped by writer set too."""
    ids_data, *positions_data = upload_together([ids, *positions], device)
    prev_max = int(prev.max()) if prev.numel() else -1
    groups = None if writer_groups is None else writer_groups(positions, ids.numel())
    return StepRows(ids, positions, prev, prev_max, ids_data, positions_data, groups)


def _waits(rows: np.ndarray, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``rows`` that have a planned write before the read (``prev`` >= 0) and that
    write's local step: what the read waits for."""
    has = prev >= 0
    return (rows, prev) if has.all() else (rows[has], prev[has])


def step_tables(
    plan,
    layout: ShardLayout,
    num_ranks: int,
    num_steps: int | None = None,
    aside: bool = False,
    device: torch.device | str = "cpu",
):
    """(steps, pushes_out, pushes_in) of rank ``layout.rank`` for the phase's plan, all made
    now (``step_rows``, ``aside`` and ``device`` as there; tests and benchmarks: the engine
    makes each step's tables as the step nears): ``pushes_out[q]`` / ``pushes_in[o]`` are
    the pair's pushes in the reader's step order, the order the owner sends them in."""
    steps = list(step_rows(plan, layout, num_ranks, num_steps, aside, device))
    peers = [q for q in range(num_ranks) if q != layout.rank]
    out = {q: [p for st in steps for p in st.pushes_out if p.peer == q] for q in peers}
    inn = {o: [p for st in steps for p in st.pushes_in if p.peer == o] for o in peers}
    return steps, out, inn


__all__ = [
    "GROUPS_AHEAD_MAX_RANKS",
    "TABLES_AHEAD",
    "PhaseSteps",
    "Push",
    "Step",
    "groups_ahead",
    "owner_rows_reference",
    "reader_rows_reference",
    "step_rows",
    "step_tables",
]
