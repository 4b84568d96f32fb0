"""gsplat's DefaultStrategy grow / prune / reset on sharded rows (owners), exactly.

Statistics: every rank keeps the [N] running statistics of the rows it rendered (3 floats
per Gaussian, global ids) and, at a structural step, all-reduces them as
``ReplicatedDensifier.apply`` does (same collectives, same inputs): the sums are bitwise
the replicated ones. Then the structural change runs on owners:

1. each owner flags its rows (duplicate / split, gsplat's ``_grow_gs`` tests); one
   all-reduce of the [N] int32 flags gives every rank the whole change;
2. every rank derives the post-grow order gsplat produces (``duplicate`` appends copies,
   ``split`` keeps the rest in order and appends the children: all first children, then all
   second children), so new global ids are renumbered identically everywhere;
3. the split noise is gsplat's one ``randn(2, n_split, 3)`` drawn from the structural
   step's seeded generator on every rank; an owner slices the columns of its own split
   rows, so each Gaussian gets the numbers replicated training gives it;
4. owners flag pruned rows among their post-grow rows (``_prune_gs`` tests, radii of the
   parent); one all-reduce of the [M] flags gives the final renumbering;
5. opacity reset clamps the owned opacities and zeroes their moments (``reset_opa``).

New rows start at their parent's owner; ``balance_new_rows`` then moves new rows off ranks
above the N/R cap (the session migrates them like any row, with their zero moments). Phase
starts may rebalance every row (``ownership.rebalance_ownership``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gsplat.strategy import DefaultStrategy
from gsplat.utils import normalized_quat_to_rotmat
from torch import Tensor

from odin_ns.distributed.densify import reset_opacities_in_place, seeded_global_rng
from odin_ns.schedule.ownership import capacity


@dataclass
class OwnedRows:
    """An owner's rows: parameters and Adam moments per group, [O, ...] each."""

    params: dict[str, Tensor]
    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]


def _sum_flags(flags: Tensor, group=None) -> np.ndarray:
    flags = flags.to(torch.int32).cpu()
    if dist.is_initialized():
        dist.all_reduce(flags, group=group)
    return flags.numpy()


@torch.no_grad()
def grow_and_prune(
    strategy: DefaultStrategy,
    state: dict,
    rows: OwnedRows,
    owned: np.ndarray,
    owner: np.ndarray,
    rank: int,
    step: int,
    seed: int,
    group=None,
) -> tuple[OwnedRows, np.ndarray, dict]:
    """gsplat's ``_grow_gs`` then ``_prune_gs`` on the owners' rows.

    Args:
        state: the all-reduced [N] statistics (``grad2d``, ``count``, ``radii``,
            ``scene_scale``).
        rows: this rank's owned rows (global ids ``owned``, [O] sorted).
        owner: [N] int64 owner of every row.

    Returns:
        (new owned rows sorted by new id, new [N'] owner vector, {"parent": [N'] old id of
        each row's parent, "is_new": [N'] bool}).
    """
    device = rows.params["means"].device
    n = owner.size
    own = torch.from_numpy(owned).to(device)
    scene_scale = state["scene_scale"]
    grads = state["grad2d"][own] / state["count"][own].clamp_min(1)
    is_grad_high = grads > strategy.grow_grad2d
    is_small = (
        torch.exp(rows.params["scales"]).max(dim=-1).values <= strategy.grow_scale3d * scene_scale
    )
    dup = is_grad_high & is_small
    spl = is_grad_high & ~is_small
    if step < strategy.refine_scale2d_stop_iter:
        spl |= state["radii"][own] > strategy.grow_scale2d
    code = torch.zeros(n, dtype=torch.int32)
    code[owned] = (dup.to(torch.int32) + 2 * spl.to(torch.int32)).cpu()
    code = _sum_flags(code, group)

    # post-grow order (gsplat): [old rows, duplicate copies] -> rest (not split), then the
    # split rows' first children, then their second children.
    dup_sel = np.flatnonzero(code & 1)
    spl_mask = (code & 2) > 0
    a_parent = np.concatenate([np.arange(n), dup_sel])
    a_kind = np.concatenate([np.zeros(n, np.int64), np.ones(dup_sel.size, np.int64)])
    a_split = np.concatenate([spl_mask, np.zeros(dup_sel.size, bool)])
    sel = np.flatnonzero(a_split)  # = split old ids, in order
    rest = np.flatnonzero(~a_split)
    n_split = sel.size
    parent = np.concatenate([a_parent[rest], sel, sel])
    kind = np.concatenate([a_kind[rest], np.full(n_split, 2), np.full(n_split, 3)])

    noise = None
    if n_split > 0:
        with seeded_global_rng(seed * 1_000_003 + step):
            noise = torch.randn(2, n_split, 3, device=device)

    mine = np.flatnonzero(owner[parent] == rank)  # my post-grow rows, in post-grow order
    par_local = torch.from_numpy(np.searchsorted(owned, parent[mine])).to(device)
    kind_m = torch.from_numpy(kind[mine]).to(device)
    child = kind_m >= 2
    new_params = {name: p[par_local].clone() for name, p in rows.params.items()}
    zero = kind_m > 0
    new_m = {}
    new_v = {}
    for name in rows.params:
        m = rows.exp_avg[name][par_local].clone()
        v = rows.exp_avg_sq[name][par_local].clone()
        m[zero] = 0.0
        v[zero] = 0.0
        new_m[name], new_v[name] = m, v
    if bool(child.any()):
        # samples of my split parents, in their global split order (j), as gsplat computes
        par_split = np.flatnonzero(np.isin(sel, owned))  # j of my split rows
        jj = torch.from_numpy(par_split).to(device)
        lp = torch.from_numpy(np.searchsorted(owned, sel[par_split])).to(device)
        scales = torch.exp(rows.params["scales"][lp])
        quats = F.normalize(rows.params["quats"][lp], dim=-1)
        rotmats = normalized_quat_to_rotmat(quats)
        samples = torch.einsum("nij,nj,bnj->bni", rotmats, scales, noise[:, jj])  # [2, S, 3]
        means_split = (rows.params["means"][lp] + samples).reshape(-1, 3)  # [2S, 3]
        scales_split = torch.log(scales / 1.6).repeat(2, 1)
        # my children in post order: first children (kind 2) in j order, then kind 3
        where = torch.from_numpy(np.flatnonzero(kind[mine] >= 2)).to(device)
        new_params["means"][where] = means_split
        new_params["scales"][where] = scales_split

    # prune (gsplat's _prune_gs on the post-grow rows; radii are the parent's)
    is_prune = torch.sigmoid(new_params["opacities"].flatten()) < strategy.prune_opa
    if step > strategy.reset_every:
        too_big = (
            torch.exp(new_params["scales"]).max(dim=-1).values
            > strategy.prune_scale3d * scene_scale
        )
        if step < strategy.refine_scale2d_stop_iter:
            radii = state["radii"][torch.from_numpy(parent[mine]).to(device)]
            too_big |= radii > strategy.prune_scale2d
        is_prune = is_prune | too_big
    pcode = torch.zeros(parent.size, dtype=torch.int32)
    pcode[mine] = is_prune.to(torch.int32).cpu()
    pcode = _sum_flags(pcode, group)
    keep = pcode == 0
    new_owner = owner[parent[keep]]
    keep_mine = torch.from_numpy(keep[mine]).to(device)
    out = OwnedRows(
        params={k: v[keep_mine].contiguous() for k, v in new_params.items()},
        exp_avg={k: v[keep_mine].contiguous() for k, v in new_m.items()},
        exp_avg_sq={k: v[keep_mine].contiguous() for k, v in new_v.items()},
    )
    info = {"parent": parent[keep], "is_new": kind[keep] > 0}
    return out, new_owner, info


def balance_new_rows(
    owner: np.ndarray, is_new: np.ndarray, prefer: np.ndarray | None, slack: float = 0.05
) -> np.ndarray:
    """[N] owners after moving new rows (zero moments, no history) off ranks above
    ``ownership.capacity``; deterministic.

    Args:
        owner: [N] int64 owners (new rows at their parent's owner).
        is_new: [N] bool rows made by this structural step (duplicates, split children).
        prefer: [R, N] read counts of each rank for each row (the parent's), or None.
    """
    num_ranks = int(owner.max()) + 1 if owner.size else 1
    num_ranks = max(num_ranks, prefer.shape[0] if prefer is not None else 1)
    cap = capacity(owner.size, num_ranks, slack)
    out = owner.copy()
    load = np.bincount(out, minlength=num_ranks)
    for q in range(num_ranks):
        excess = int(load[q] - cap)
        if excess <= 0:
            continue
        cand = np.flatnonzero((out == q) & is_new)
        if prefer is not None:
            room = load < cap
            score = np.where(room[:, None], prefer[:, cand], -1).max(axis=0)
            cand = cand[np.lexsort((cand, -score))]
        for row in cand[:excess]:
            room = load < cap
            if not room.any():
                break
            scores = np.where(room, prefer[:, row] if prefer is not None else 0, -1)
            target = int(np.argmax(np.where(room, scores - 1e-9 * load, -np.inf)))
            out[row] = target
            load[q] -= 1
            load[target] += 1
    return out


def reset_opacities(rows: OwnedRows, prune_opa: float) -> None:
    """gsplat's ``reset_opa`` on owned rows (``reset_opacities_in_place``, the replicated
    densifier's: one definition of the ceiling): clamp their logit opacities, zero their
    opacity moments. ``rows``' tensors are changed in place."""
    moments = [rows.exp_avg["opacities"], rows.exp_avg_sq["opacities"]]
    reset_opacities_in_place(rows.params["opacities"], moments, prune_opa)


__all__ = [
    "OwnedRows",
    "balance_new_rows",
    "grow_and_prune",
    "reset_opacities",
]
