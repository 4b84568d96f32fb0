"""Inner loops of the primitive-sync runtime, as small plain-torch functions.

Each function is one step of the per-step data path (pack, accumulate, ready mask, apply,
read-set check). They take and return plain tensors so they can later be swapped for the
compiled ops in ``odin_ns.cuda.ops`` without touching the engine.

Publication layout: one float32 buffer ``[M, D + 1]`` per (rank, step); row ``i`` is
primitive ``footprint[i]``; columns ``[off_g, off_g + d_g)`` hold parameter group ``g``'s
gradient row flattened (groups concatenated in order); the last column is the visible flag
(1.0 visible, 0.0 not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from odin_ns.cuda import ops as ext_ops
from odin_ns.optim import selective_adam_update_


@torch.no_grad()
def pack_rows(
    grads: Sequence[Tensor | None],
    row_dims: Sequence[int],
    rows: Tensor,
    visible: Tensor,
    out: Tensor | None = None,
) -> Tensor:
    """Gather the footprint's gradient rows of every group plus the visible flag.

    Args:
        grads: per group a [N, ...] gradient (any float dtype), or None for zero.
        row_dims: per group the flattened row size d_g (``prod(param.shape[1:])``).
        rows: [M] int64 primitive ids (the step footprint).
        visible: [N] bool visibility mask of this rank's step.
        out: optional [M, D + 1] float32 buffer to fill.

    Returns:
        [M, D + 1] float32 publication buffer.
    """
    width = sum(row_dims) + 1
    m = rows.shape[0]
    if out is None and all(g is not None for g in grads):
        # One fused gather (torch.ops.odin.pack_rows when the extension is built).
        n = visible.shape[0]
        columns = [g.detach().reshape(n, d) for g, d in zip(grads, row_dims, strict=True)]
        columns.append(visible.to(torch.float32).unsqueeze(1))
        return ext_ops.pack_rows(rows, columns)
    if out is None:
        out = torch.empty(m, width, dtype=torch.float32, device=rows.device)
    off = 0
    for grad, d in zip(grads, row_dims, strict=True):
        if grad is None:
            out[:, off : off + d] = 0.0
        else:
            out[:, off : off + d] = grad.detach()[rows].reshape(m, d)
        off += d
    out[:, off] = visible[rows].to(torch.float32)
    return out


def scatter_slots(num: int, positions: Tensor) -> Tensor:
    """Map each of ``num`` union rows to its row in a contribution buffer, or -1.

    Args:
        num: U, size of the step's union of footprints.
        positions: [M] int64 positions of the contribution's rows in the union.

    Returns:
        [U] int64 slot table.
    """
    slots = torch.full((num,), -1, dtype=torch.int64, device=positions.device)
    slots[positions] = torch.arange(positions.shape[0], device=positions.device)
    return slots


@torch.no_grad()
def accumulate_rows_(acc: Tensor, slots: Tensor, contrib: Tensor) -> None:
    """Add one rank's contribution to the rows it wrote, in place.

    Called once per rank in fixed rank order 0..R-1, so every replica sums the same
    floats in the same order (bitwise identical results). The visible column is summed
    too: a row is visible iff the sum of its writers' flags is > 0 (logical OR).

    Args:
        acc: [K, D + 1] float32 accumulator (starts at zero).
        slots: [K] int64 row of ``contrib`` for each accumulator row, -1 if this rank did
            not write it.
        contrib: [M, D + 1] float32 publication buffer of one rank.
    """
    sel = (slots >= 0).nonzero().squeeze(1)
    if sel.numel() == 0:
        return
    acc[sel] += contrib[slots[sel]]


def ready_mask(arrived: Tensor, expected: Tensor, applied: Tensor, blocked: Tensor) -> Tensor:
    """Rows of one pending step whose update can be applied now.

    Args:
        arrived: [U] int32 number of writers whose publication has arrived.
        expected: [U] int32 number of writers (from the plan).
        applied: [U] bool already applied.
        blocked: [U] bool the primitive has an unapplied update at an earlier step.

    Returns:
        [U] bool ready = complete & not applied & not blocked.
    """
    return (arrived == expected) & ~applied & ~blocked


@torch.no_grad()
def apply_rows_(
    params: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    ids: Tensor,
    packed: Tensor,
    lrs: Sequence[float],
    betas: Sequence[tuple[float, float]],
    eps: Sequence[float],
    step: int,
    versions: Tensor,
) -> int:
    """Apply the summed update of global step ``step`` to rows ``ids`` of every group.

    Only visible rows move (selective Adam, bias correction ``step + 1``); every row in
    ``ids`` gets version ``step`` (an invisible row's update is a no-op, but it is applied).

    Args:
        params, exp_avgs, exp_avg_sqs: per group [N, ...] tensors, updated in place.
        ids: [K] int64 sorted unique primitive ids.
        packed: [K, D + 1] float32 summed gradient rows plus summed visible flags.
        lrs, betas, eps: per group Adam hyper-parameters for this step.
        step: 0-based global step of the update.
        versions: [N] int64 per-primitive version vector, updated in place.

    Returns:
        number of visible rows moved.
    """
    vis = packed[:, -1] > 0
    rows = ids[vis]
    if rows.numel() > 0:
        grad_rows = packed[vis]
        off = 0
        for param, m, v, lr, (b1, b2), e in zip(
            params, exp_avgs, exp_avg_sqs, lrs, betas, eps, strict=True
        ):
            d = math.prod(param.shape[1:])
            grad = grad_rows[:, off : off + d].reshape(rows.shape[0], *param.shape[1:])
            off += d
            selective_adam_update_(
                param, grad.to(param.dtype), m, v, rows, lr, b1, b2, e, step=step + 1
            )
    versions[ids] = step
    return int(rows.numel())


def any_marked(ids: Tensor, marked_ids: Tensor, scratch: Tensor) -> Tensor:
    """Whether any of ``ids`` is in ``marked_ids`` (the read-set validation check).

    Args:
        ids: [M] int64 primitive ids (a read set).
        marked_ids: [K] int64 primitive ids (rows with an unapplied update).
        scratch: [N] bool all-False work mask; left all-False on return.

    Returns:
        [] bool tensor.
    """
    scratch[marked_ids] = True
    hit = scratch[ids].any()
    scratch[marked_ids] = False
    return hit
