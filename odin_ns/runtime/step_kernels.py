"""The update log's per-step host kernels (``csrc/step_cpu.cpp``, ``torch.ops.odin.*``), each
beside its pure-torch twin, and ``StepKernels``: the compiled kernel where the CPU library
is built, else the twin (the same results; ``tests/test_runtime.py`` and
``tests/test_sharded.py`` compare them). They work on the control plane's host tensors: a
step's rows from its footprints (``step_record``), its rows grouped by writer set
(``writer_groups``) and counted down as writers arrive (``add_arrivals``), the complete rows
that are ready (``take_ready``, ``mark_ready``), the version tests (``first_lacking``,
``lacking_rows``) and the host versions written late (``write_versions``,
``any_unapplied``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from odin_ns.cuda import ops


def advance_last_write(last_write: Tensor, ids: Tensor, step: int) -> Tensor:
    """[U] int64 ``last_write[ids]``, then ``last_write[ids] = step`` in place."""
    prev = last_write.index_select(0, ids)
    last_write.index_fill_(0, ids, step)
    return prev


def step_record_reference(
    footprints: Sequence[Tensor], last_write: Tensor, step: int, held: Tensor | None = None
) -> tuple[Tensor, list[Tensor], Tensor]:
    """A step's rows from its footprints (each [M_q] int64 or int32 host, sorted unique,
    ids < N = ``last_write``'s length): (ids [U] int64 sorted unique, per footprint its [M_q]
    int64 positions in ids, prev [U] int64 = ``last_write[ids]`` before the call); then
    ``last_write[ids] = step`` in place. With ``held`` ([N] bool), each footprint's rows
    that ``held`` lacks are left out first (so [M_q] counts its held rows). The torch twin
    of the host kernel ``torch.ops.odin.step_record``. (How many write each row:
    ``writer_groups_reference``.)"""
    footprints = [fp.long() for fp in footprints]
    if held is not None:
        footprints = [fp[held[fp]] for fp in footprints]
    if footprints:
        ids = torch.unique(torch.cat(list(footprints)), sorted=True)
    else:
        ids = torch.zeros(0, dtype=torch.int64)
    prev = advance_last_write(last_write, ids, step)
    positions = [torch.searchsorted(ids, fp) for fp in footprints]
    return ids, positions, prev


def writer_groups_reference(
    positions: Sequence[Tensor], num_rows: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A step's U = ``num_rows`` rows grouped by their set of writers (``positions``: per
    writer q its [M_q] int64 sorted distinct rows; every row has a writer). Returns
    (group_ptr [G + 1] int64, group_rows [U] int64: group g's rows, increasing, at
    ``group_ptr[g]:group_ptr[g + 1]``, groups in the order of their first row;
    group_need [G] int32 writers per group; writer_ptr [R + 1] int64 and writer_groups
    [S] int64: writer q's groups, increasing, at ``writer_ptr[q]:writer_ptr[q + 1]``). Host
    tensors. The torch twin of the host kernel ``torch.ops.odin.writer_groups``."""
    if num_rows == 0:  # (also with no writers, where torch.unique has no rows to compare)
        empty = torch.zeros(0, dtype=torch.int64)
        ptr = torch.zeros(1, dtype=torch.int64)
        writer_ptr = torch.zeros(len(positions) + 1, dtype=torch.int64)
        return ptr, empty, torch.zeros(0, dtype=torch.int32), writer_ptr, empty
    member = torch.zeros(num_rows, len(positions), dtype=torch.bool)
    for q, pos in enumerate(positions):
        member[pos, q] = True
    if not bool(member.any(dim=1).all()):
        raise ValueError("writer_groups: a row has no writer")
    sets, row_set = torch.unique(member, dim=0, return_inverse=True)
    first = torch.full((sets.shape[0],), num_rows, dtype=torch.int64)
    first.scatter_reduce_(0, row_set, torch.arange(num_rows), "amin")
    order = torch.argsort(first)  # groups in the order of their first row
    group_of_set = torch.empty_like(order)
    group_of_set[order] = torch.arange(order.numel())
    group = group_of_set[row_set]  # [U]
    group_rows = torch.argsort(group, stable=True)
    group_ptr = torch.zeros(order.numel() + 1, dtype=torch.int64)
    group_ptr[1:] = torch.bincount(group, minlength=order.numel()).cumsum(0)
    in_group = sets[order]  # [G, R]
    need = in_group.sum(dim=1, dtype=torch.int32)
    writer_groups = [in_group[:, q].nonzero().squeeze(1) for q in range(len(positions))]
    writer_ptr = torch.zeros(len(positions) + 1, dtype=torch.int64)
    writer_ptr[1:] = torch.tensor([g.numel() for g in writer_groups], dtype=torch.int64).cumsum(0)
    flat = torch.cat(writer_groups) if writer_groups else torch.zeros(0, dtype=torch.int64)
    return group_ptr, group_rows, need, writer_ptr, flat


def add_arrivals_reference(
    need: Tensor, groups: Tensor, group_ptr: Tensor, group_rows: Tensor
) -> Tensor:
    """One writer arrived: ``need[groups] -= 1`` in place ([G] int32 writers each group still
    waits for; ``groups``: [K] int64 distinct, the writer's groups, each waiting), then the
    rows of the groups that now wait for none ([K'] int64, group by group in ``groups``'
    order; ``group_ptr`` / ``group_rows`` as ``writer_groups_reference``'s). Host tensors.
    The torch twin of the host kernel ``torch.ops.odin.add_arrivals``."""
    if bool((need[groups] <= 0).any()):
        raise ValueError("add_arrivals: a group has no writer left to arrive")
    need[groups] -= 1
    done = groups[need[groups] == 0].tolist()
    parts = [group_rows[group_ptr[g] : group_ptr[g + 1]] for g in done]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def take_ready_reference(
    candidates: Tensor,
    applied: Tensor,
    ids: Tensor,
    prev: Tensor,
    offset: int,
    versions: Tensor,
    applied_through: int,
    write_step: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Of a pending step's rows whose writers have all arrived (``candidates``: [K] int64
    distinct positions, none applied), those whose previous planned write is applied:
    ``prev`` [U] int64 local step of it (-1: none in the phase), applied when
    ``prev + offset <= applied_through`` (every step through that global step is applied)
    or else ``versions[ids] >= prev + offset`` ([N] int64, read only there). Those rows are
    marked in ``applied`` ([U] bool) and, where ``write_step >= 0``, get ``versions[ids] =
    write_step``, in place (-1: their versions are the caller's to write).
    Returns (ready [U] bool, the rows taken, [n] int64, and the candidates held back, [K']
    int64, both in increasing order). Host tensors. The torch twin of the host kernel
    ``torch.ops.odin.take_ready``."""
    if candidates.numel() and bool(applied[candidates].any()):
        raise RuntimeError("take_ready: a candidate is already applied")
    need = prev[candidates]
    ok = need + offset <= applied_through  # (-1: no write in the phase, so always)
    later = (~ok).nonzero().squeeze(1)
    if later.numel():
        ok[later] = versions[ids[candidates[later]]] >= need[later] + offset
    take = candidates[ok].sort().values
    ready = torch.zeros(ids.shape, dtype=torch.bool)
    ready[take] = True
    applied[take] = True
    if write_step >= 0:
        versions[ids[take]] = write_step
    return ready, take, candidates[~ok].sort().values


def _outside(ids: Tensor, n: int) -> bool:
    """Whether any of ``ids`` ([K] int64 host) lies outside [0, n) (a twin's range check)."""
    return bool(ids.numel()) and bool((ids < 0).any() | (ids >= n).any())


def rows_not_applied(applied: Tensor, blocked: Sequence[Tensor] = ()) -> Tensor:
    """[K] int64 the positions of ``applied`` ([U] bool, host) not applied and in none of
    the ``blocked`` lists ([M_q] int64 positions each: the writers still missing)."""
    free = torch.logical_not(applied)
    for rows in blocked:
        free.index_fill_(0, rows, False)
    return free.nonzero().squeeze(1)


def mark_ready_reference(
    candidates: Tensor | None,
    blocked: Sequence[Tensor],
    applied: Tensor,
    ids: Tensor,
    versions: Tensor,
    write_step: int,
) -> tuple[Tensor, int]:
    """Every candidate ready (``candidates``: [K] int64 distinct positions, none applied;
    None: every row not applied and in none of the ``blocked`` lists, the missing writers'
    [M_q] int64 positions; the caller knows every previous planned write of the step is
    applied): marked in ``applied`` ([U] bool) and, where ``write_step >= 0``, their
    ``versions[ids]`` set to it ([U] int64 ids into [N] int64 versions), in place. Returns
    (ready [U] bool, how many). Host tensors. The torch twin of the host kernel
    ``torch.ops.odin.mark_ready``."""
    if candidates is not None and len(blocked):
        raise ValueError("mark_ready: blocked rows go with no candidates")
    for rows in blocked:
        if _outside(rows, applied.numel()):
            raise ValueError("mark_ready: blocked rows out of range")
    if candidates is None:
        candidates = rows_not_applied(applied, blocked)
    elif candidates.numel():
        if _outside(candidates, applied.numel()):
            raise ValueError("mark_ready: candidates out of range")
        if bool(applied[candidates].any()):
            raise RuntimeError("mark_ready: a candidate is already applied")
        if torch.unique(candidates).numel() != candidates.numel():
            raise RuntimeError("mark_ready: a candidate twice")
    ready = torch.zeros(applied.shape, dtype=torch.bool)
    ready[candidates] = True
    chosen = ids[ready]  # (the ready rows' ids, checked before anything is written)
    if write_step >= 0 and _outside(chosen, versions.numel()):
        raise ValueError("mark_ready: ids out of range")
    applied |= ready
    if write_step >= 0:
        versions[chosen] = write_step
    return ready, candidates.numel()


def first_lacking_reference(
    versions: Tensor, rows: Tensor, need: Tensor, start: int, applied_through: int
) -> int:
    """The first i >= ``start`` with ``need[i] > applied_through`` and ``versions[rows[i]] <
    need[i]``, else K: where a version test stops (the twin of the host kernel
    ``first_lacking``).

    Args:
        versions: [O] int64, the owned rows' last applied global step, for steps after
            ``applied_through`` (``UpdateLog.settle_versions``).
        rows: [K] int64 owned local ids.
        need: [K] int64 the global step each row must have applied.
        start: where to read from, in [0, K].
        applied_through: every step through this global step is applied.
    """
    later = need[start:] > applied_through
    lacking = (later & (versions[rows[start:]] < need[start:])).nonzero()
    return start + int(lacking[0]) if lacking.numel() else rows.numel()


def lacking_rows_reference(
    versions: Tensor, rows: Tensor, need: Tensor, start: int, applied_through: int
) -> Tensor:
    """[L] int64 every i >= ``start`` with ``need[i] > applied_through`` and
    ``versions[rows[i]] < need[i]``, in order (``first_lacking_reference``'s test, read to the
    end; the twin of the host kernel ``lacking_rows``). Arguments as there."""
    later = need[start:] > applied_through
    return start + (later & (versions[rows[start:]] < need[start:])).nonzero().flatten()


def write_versions_reference(versions: Tensor, ids: Tensor, ready: Tensor, step: int) -> None:
    """``versions[ids[ready]] = step`` in place ([N] int64 versions, a step's [U] int64 ids
    and [U] bool ready mask; host tensors): the versions a look left unwritten, written when
    a read asks (the twin of the host kernel ``write_versions``). The ready rows' ids are
    checked, before any is written."""
    chosen = ids[ready]
    if _outside(chosen, versions.numel()):
        raise ValueError("write_versions: ids out of range")
    versions.index_fill_(0, chosen, step)


def any_unapplied_reference(step_ids: Tensor, applied: Tensor, ids: Tensor) -> bool:
    """Whether any of ``ids`` ([K] int64 sorted) is a row of a pending step (``step_ids``:
    its [U] int64 sorted unique rows) not applied yet (``applied``: [U] bool); host tensors
    (the twin of the host kernel ``any_unapplied``)."""
    if step_ids.numel() == 0 or ids.numel() == 0:
        return False
    pos = torch.searchsorted(step_ids, ids).clamp_(max=step_ids.numel() - 1)
    return bool(((step_ids[pos] == ids) & ~applied[pos]).any())


@dataclass(frozen=True)
class StepKernels:
    """The update log's per-step host kernels: the compiled ``torch.ops.odin`` ones where the
    CPU library is built, else their torch twins (same results). Resolved once per log (and
    ``first_lacking`` and ``lacking_rows`` for the engine's version tests)."""

    writer_groups: Callable = writer_groups_reference
    add_arrivals: Callable = add_arrivals_reference
    take_ready: Callable = take_ready_reference
    mark_ready: Callable = mark_ready_reference
    first_lacking: Callable = first_lacking_reference
    lacking_rows: Callable = lacking_rows_reference
    write_versions: Callable = write_versions_reference
    any_unapplied: Callable = any_unapplied_reference

    @classmethod
    def resolve(cls) -> StepKernels:
        """Each field's compiled kernel of the same name, else its twin (the default)."""
        return cls(**{f.name: ops.host_op(f.name) or f.default for f in fields(cls)})


__all__ = [
    "StepKernels",
    "add_arrivals_reference",
    "advance_last_write",
    "any_unapplied_reference",
    "first_lacking_reference",
    "lacking_rows_reference",
    "mark_ready_reference",
    "rows_not_applied",
    "step_record_reference",
    "take_ready_reference",
    "write_versions_reference",
    "writer_groups_reference",
]
