"""Rank 0's copy of a sharded model: what evaluation during training and the live viewer see.

In sharded mode no rank holds the whole model. Where someone looks at the whole model while
training runs (an evaluation step; every phase start while the live viewer runs), every
rank sends rank 0 the parameters (not the Adam moments) of the rows it owns, after a drain,
so the copy is the barrier-synchronous model at that step. Rank 0 keeps it as
``OdinSplatfactoModel.eval_copy``; the model renders from it whenever it is not training.

Memory on rank 0 is bounded by ``--pipeline.eval-copy-max-rows K`` (0: the whole model):
above K Gaussians the copy keeps the K most opaque ones. The viewer then shows those; an
evaluation is skipped with a note (its metrics would not be the model's), and ns-eval on
the checkpoint remains the measure.

Traffic: one int64 count per rank (all-gather); above the bound, every rank's owned
opacities to rank 0 and the kept positions back; then the kept rows, ``W`` floats each
(``W`` = 59 for SH degree 3), rank q -> rank 0 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.model import GAUSSIAN_GROUPS


@dataclass
class EvalCopy:
    """Rank 0's copy: ``params`` per group [K, ...], rows in ascending global id (``ids``
    [K] int64); ``num_rows`` = N, the model's Gaussians; ``step``: the step it is of."""

    params: dict[str, Tensor]
    ids: np.ndarray
    num_rows: int
    step: int

    @property
    def complete(self) -> bool:
        """Whether the copy holds every Gaussian (then it is the whole model)."""
        return int(self.ids.size) == self.num_rows


def select_copy_rows(
    opacities: list[np.ndarray], owned: list[np.ndarray], cap: int
) -> list[np.ndarray]:
    """Which owned rows the copy keeps, per rank.

    Args:
        opacities: per rank [O_q] float, the owned rows' opacity logits.
        owned: per rank [O_q] int64, their global ids.
        cap: the most rows the copy holds (0: no bound).

    Returns:
        per rank [k_q] int64 positions into its owned rows, ascending: every row when the
        model fits, else the ``cap`` most opaque rows of the whole model (ties broken by
        lower global id, so the choice depends on the model only, not on the owners).
    """
    total = sum(int(o.size) for o in opacities)
    if cap <= 0 or total <= cap:
        return [np.arange(o.size, dtype=np.int64) for o in opacities]
    values = np.concatenate([np.asarray(o, dtype=np.float64) for o in opacities])
    gids = np.concatenate(owned)
    rank_of = np.concatenate([np.full(o.size, q) for q, o in enumerate(opacities)])
    position = np.concatenate([np.arange(o.size) for o in opacities])
    order = np.lexsort((gids, -values))[:cap]  # most opaque first, then lower id
    return [np.sort(position[order[rank_of[order] == q]]) for q in range(len(opacities))]


def pack_param_rows(params: dict[str, Tensor], rows: np.ndarray) -> Tensor:
    """[k, W] float32 CPU: rows ``rows`` ([k] int64 positions) of every group, flattened,
    in ``GAUSSIAN_GROUPS`` order (one message of parameter rows)."""
    index = torch.from_numpy(rows).to(params["means"].device)
    columns = []
    for name in GAUSSIAN_GROUPS:
        width = int(np.prod(params[name].shape[1:]))
        columns.append(params[name].detach()[index].reshape(rows.size, width).float().cpu())
    return torch.cat(columns, dim=1).contiguous()


def unpack_param_rows(buf: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of ``pack_param_rows`` ([K, W] -> per group [K, ...] on ``like``'s device and dtype)."""
    out, off = {}, 0
    for name in GAUSSIAN_GROUPS:
        shape = like[name].shape[1:]
        d = int(np.prod(shape))
        part = buf[:, off : off + d].reshape(buf.shape[0], *shape)
        out[name] = part.to(device=like[name].device, dtype=like[name].dtype).contiguous()
        off += d
    return out


@torch.no_grad()
def gather_eval_copy(
    params: dict[str, Tensor],
    owned: np.ndarray,
    num_rows: int,
    step: int,
    cap: int,
    rank: int,
    world_size: int,
    group=None,
) -> EvalCopy | None:
    """Rank 0: the copy of the model at ``step``; other ranks: None. Collective (call on
    every rank of ``group``, after a drain).

    Args:
        params: this rank's owned rows per group, [O, ...] (the local table's prefix).
        owned: [O] int64 sorted global ids of those rows.
        num_rows: N, Gaussians of the whole model.
        cap: ``--pipeline.eval-copy-max-rows`` (0: no bound).
    """
    count = torch.tensor([owned.size], dtype=torch.int64)
    counts = [torch.zeros_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c) for c in counts]
    if sum(sizes) != num_rows:
        raise RuntimeError(f"owned rows add up to {sum(sizes)}, the model has {num_rows}")
    if 0 < cap < num_rows:  # every rank decides the same: the sizes are all-gathered
        keep, kept = _exchange_selection(params, owned, sizes, cap, rank, world_size, group)
    else:
        keep, kept = np.arange(owned.size, dtype=np.int64), sizes
    mine = pack_param_rows(params, keep)
    if rank != 0:
        if keep.size:  # gloo: no empty messages; rank 0 knows the count
            dist.send(torch.from_numpy(owned[keep]), dst=0, group=group, tag=11)
            dist.send(mine, dst=0, group=group, tag=12)
        return None
    ids_parts, rows_parts = [torch.from_numpy(owned[keep])], [mine]
    for q in range(1, world_size):
        ids = torch.empty(kept[q], dtype=torch.int64)
        buf = torch.empty(kept[q], mine.shape[1])
        if kept[q]:
            dist.recv(ids, src=q, group=group, tag=11)
            dist.recv(buf, src=q, group=group, tag=12)
        ids_parts.append(ids)
        rows_parts.append(buf)
    ids = torch.cat(ids_parts)
    order = torch.argsort(ids)
    rows = torch.cat(rows_parts)[order]
    return EvalCopy(unpack_param_rows(rows, params), ids[order].numpy(), num_rows, step)


def _exchange_selection(
    params: dict[str, Tensor],
    owned: np.ndarray,
    sizes: list[int],
    cap: int,
    rank: int,
    world_size: int,
    group,
) -> tuple[np.ndarray, list[int]]:
    """Above the bound: every rank sends rank 0 its owned opacities and ids, rank 0 selects
    (``select_copy_rows``) and sends each rank its kept positions. Returns this rank's
    positions and, on rank 0, every rank's kept count (elsewhere: empty)."""
    opacity = params["opacities"].detach().reshape(-1).float().cpu()
    if rank != 0:
        if owned.size:
            dist.send(opacity, dst=0, group=group, tag=13)
            dist.send(torch.from_numpy(owned), dst=0, group=group, tag=14)
        count = torch.zeros(1, dtype=torch.int64)
        dist.recv(count, src=0, group=group, tag=15)
        keep = torch.empty(int(count), dtype=torch.int64)
        if keep.numel():
            dist.recv(keep, src=0, group=group, tag=16)
        return keep.numpy(), []
    opacities, ids = [opacity.numpy()], [owned]
    for q in range(1, world_size):
        o = torch.empty(sizes[q])
        g = torch.empty(sizes[q], dtype=torch.int64)
        if sizes[q]:
            dist.recv(o, src=q, group=group, tag=13)
            dist.recv(g, src=q, group=group, tag=14)
        opacities.append(o.numpy())
        ids.append(g.numpy())
    keeps = select_copy_rows(opacities, ids, cap)
    for q in range(1, world_size):
        dist.send(torch.tensor([keeps[q].size], dtype=torch.int64), dst=q, group=group, tag=15)
        if keeps[q].size:
            dist.send(torch.from_numpy(keeps[q]), dst=q, group=group, tag=16)
    return keeps[0], [int(k.size) for k in keeps]
