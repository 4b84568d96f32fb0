"""Inner loops of the primitive-sync runtime in the engine's layout (plain torch).

Interim: these are the signatures ``odin_ns.cuda.ops`` is getting (compiled op, else the
torch reference). Once the dispatcher exposes them, the engine calls ``odin_ns.cuda.ops``
and this module goes away.

Layout: a publication is one float32 buffer ``[M, W]`` (``W = sum_g d_g + 1``); row ``i`` is
primitive ``ids[i]``; group ``g``'s gradient row flattened sits in columns
``[off_g, off_g + d_g)``; the last column is the visible flag (1.0 visible, 0.0 not). A step's
accumulator is ``[U, W]`` over the sorted union of the step's footprints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from odin_ns.cuda import ops as ext_ops
from odin_ns.optim import selective_adam_update_


@torch.no_grad()
def pack_rows(ids: Tensor, columns: Sequence[Tensor]) -> Tensor:
    """[M, W] float32: rows ``ids`` ([M] int64) of every [N, d_g] column block, concatenated."""
    return ext_ops.pack_rows(ids, list(columns))


@torch.no_grad()
def accumulate_ready_rows(acc: Tensor, ready: Tensor, positions: Tensor, contrib: Tensor) -> None:
    """In place, for each i: if ready[positions[i]]: acc[positions[i]] += contrib[i].

    Args:
        acc: [U, W] float32 accumulator (the engine zeroes it, then calls this once per
            rank in rank order 0..R-1: bitwise identical sums on every replica).
        ready: [U] bool rows applied now.
        positions: [M] int64 union position of each contribution row (unique).
        contrib: [M, W] float32 one rank's publication.
    """
    if positions.numel() == 0:
        return
    keep = ready.index_select(0, positions)
    acc.index_add_(0, positions[keep], contrib[keep])


def ready_mask(arrived: Tensor, expected: Tensor, applied: Tensor, blocked: Tensor) -> Tensor:
    """[U] bool = (arrived == expected) & ~applied & ~blocked (all [U]; counts int32)."""
    return (arrived == expected) & ~applied & ~blocked


@torch.no_grad()
def apply_ready_rows(
    params: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    ids: Tensor,
    acc: Tensor,
    ready: Tensor,
    lrs: Sequence[float],
    betas: Sequence[tuple[float, float]],
    eps: Sequence[float],
    step: int,
    versions: Tensor,
) -> None:
    """Apply global step ``step``'s summed update to the ready rows, in place.

    For every i with ready[i]: versions[ids[i]] = step, and if acc[i, -1] > 0 (visible) the
    selective Adam update of each group's row ids[i] with gradient acc[i, cols_g] and
    bias-correction count step + 1 (``odin_ns.optim.selective_adam_update_``).

    Args:
        params, exp_avgs, exp_avg_sqs: per group [N, ...] tensors.
        ids: [U] int64 sorted unique primitive ids (the step's union).
        acc: [U, W] float32 summed rows.
        ready: [U] bool rows to apply.
        lrs, betas, eps: per group Adam hyper-parameters of this step.
        step: 0-based global step.
        versions: [N] int64 per-primitive version (last applied step).
    """
    move = ready & (acc[:, -1] > 0)
    rows = ids[move]
    if rows.numel() > 0:
        grad_rows = acc[move]
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
    versions[ids[ready]] = step


@torch.no_grad()
def validate_reads(read_ids: Tensor, versions: Tensor, required: Tensor) -> Tensor:
    """[K] int64: the ids of ``read_ids`` ([M]) whose ``versions`` ([N]) entry is below
    ``required`` ([M]), in read order."""
    return ext_ops.validate_reads(read_ids, versions, required)
