"""Front-to-back alpha compositing of projected Gaussians, with a hand-written backward.

The per-pixel rules are gsplat's (``rasterize_to_pixels_fwd.cu``):
``alpha = min(0.999, opacity * exp(-sigma))``; a Gaussian is skipped where ``sigma < 0`` or
``alpha < 1/255``; a pixel stops *before* the Gaussian that would bring its transmittance
to ``<= 1e-4``. Pixel centers sit at ``+0.5``.

Layout: the sweep goes front to back in chunks of ``CHUNK_ROWS`` rows. A chunk is a dense
``[S_a, P, L]`` block (live sub-tiles x pixels of a sub-tile x rows, padded with a
transparent Gaussian), so transmittance is a plain ``cumsum`` of ``log(1 - alpha)`` along
the last dimension plus a carried offset, color sums are batched matmuls, and no
per-pixel gather or scatter is needed. A sub-tile leaves the sweep when all its pixels
have stopped, which skips most rows of a dense scene (as gsplat's early exit does).

The backward pass is the closed form gsplat's CUDA kernel uses (suffix sums of
``weight * color`` replace its back-to-front loop), so nothing per pair enters the autograd
graph; it also accumulates gsplat's ``absgrad`` (sum over pixels of
``|d loss / d means2d|``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .tiles import ALPHA_MIN, PairPlan

ALPHA_MAX = 0.999
LOG_T_MIN = math.log(1e-4)  # a pixel keeps a Gaussian only while T stays above 1e-4
CHUNK_ROWS = 64  # rows of every live sub-tile processed per step


def _pixel_offsets(sub: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Column and row offsets ([1, P, 1] each) of the pixels inside a sub-tile."""
    p = torch.arange(sub * sub, device=like.device)
    ox = (p % sub).to(like.dtype)[None, :, None]
    oy = (p // sub).to(like.dtype)[None, :, None]
    return ox, oy


def _row_table(means2d: Tensor, conics: Tensor, opacities: Tensor) -> Tensor:
    """[M + 1, 6] (x, y, a, b, c, opacity) per Gaussian; the last row is transparent."""
    table = torch.cat([means2d, conics, opacities[:, None]], dim=1)
    return torch.cat([table, table.new_zeros(1, 6)], dim=0)


def _chunk_rows(
    table: Tensor, segs: Tensor, idx: Tensor, plan: PairPlan
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Row data of a chunk, each [S_a, 1, L]: center relative to the sub-tile's first pixel
    center (x, y), conic (a, b, c), opacity."""
    S_a, L = idx.shape
    rows = table.index_select(0, idx.reshape(-1)).reshape(S_a, L, 6)
    rem = segs % (plan.sub_w * plan.sub_h)
    x0 = ((rem % plan.sub_w) * plan.sub).to(table.dtype)[:, None] + 0.5
    y0 = ((rem // plan.sub_w) * plan.sub).to(table.dtype)[:, None] + 0.5
    mx = (rows[..., 0] - x0)[:, None, :]
    my = (rows[..., 1] - y0)[:, None, :]
    a, b, c, o = (rows[..., k][:, None, :] for k in range(2, 6))
    return mx, my, a, b, c, o


def _deltas(mx: Tensor, my: Tensor, sub: int) -> tuple[Tensor, Tensor]:
    """dx, dy = mean - pixel center, [S_a, P, L] each."""
    ox, oy = _pixel_offsets(sub, mx)
    return mx - ox, my - oy


@dataclass
class Chunk:
    """One step of the front-to-back sweep, kept for the backward pass."""

    segs: Tensor  # [S_a] live sub-tiles
    idx: Tensor  # [S_a, L] flat Gaussian index per row; M (transparent dummy) pads
    alpha: Tensor  # [S_a, P, L] alpha of kept pairs, 0 elsewhere
    trans: Tensor  # [S_a, P, L] transmittance before each pair
    alpha_grad: Tensor  # [S_a, P, L] alpha where it carries gradient (not clamped)


def composite_forward(
    means2d: Tensor,  # [M, 2] flat over cameras x Gaussians
    conics: Tensor,  # [M, 3]
    colors: Tensor,  # [M, D]
    opacities: Tensor,  # [M]
    plan: PairPlan,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[Tensor, Tensor, list[Chunk]]:
    """Composite every sub-tile front to back, ``chunk_rows`` rows at a time; a sub-tile
    leaves the sweep once its rows run out or all its pixels have stopped.

    Returns (colors [S, P, D] without background, final transmittance [S, P], chunks).
    """
    M, D = colors.shape
    P = plan.sub * plan.sub
    device = colors.device
    table = _row_table(means2d, conics, opacities)
    col_table = torch.cat([colors, colors.new_zeros(1, D)], dim=0)
    gid_pad = torch.cat([plan.gid, plan.gid.new_full((1,), M)])  # [R + 1]
    counts = plan.seg_counts
    starts = torch.cumsum(counts, 0) - counts
    out = colors.new_zeros(plan.n_seg, P, D)
    cum_last = colors.new_zeros(plan.n_seg, P)  # log T so far, including a stopping pair
    log_final = colors.new_zeros(plan.n_seg, P)  # log T over kept pairs
    ar = torch.arange(chunk_rows, device=device)
    segs = torch.nonzero(counts > 0).squeeze(1)
    chunks = []
    l0 = 0
    while len(segs) > 0:
        lens = counts[segs]
        inside = (l0 + ar)[None, :] < lens[:, None]  # [S_a, L]
        pos = torch.where(inside, starts[segs][:, None] + l0 + ar[None, :], plan.n_rows)
        idx = gid_pad[pos]
        mx, my, a, b, c, o = _chunk_rows(table, segs, idx, plan)
        dx, dy = _deltas(mx, my, plan.sub)
        # sigma = 0.5 * (a dx^2 + c dy^2) + b dx dy, built in place.
        sigma = dx * (0.5 * a)
        sigma.addcmul_(dy, b).mul_(dx)
        sigma.addcmul_(dy * dy, 0.5 * c)
        del dx, dy
        raw = torch.exp(-sigma).mul_(o)  # opacity * exp(-sigma)
        alpha = raw.clamp(max=ALPHA_MAX)
        alpha.masked_fill_((sigma < 0) | (alpha < ALPHA_MIN), 0.0)
        del sigma
        log_t = torch.log1p(-alpha)  # 0 where skipped
        cum = torch.cumsum(log_t, dim=-1).add_(cum_last.index_select(0, segs)[..., None])
        keep = cum > LOG_T_MIN
        alpha.mul_(keep)
        log_t.mul_(keep)
        trans = torch.exp(cum - log_t)  # T before each pair
        weight = alpha * trans
        cols = col_table.index_select(0, idx.reshape(-1)).reshape(*idx.shape, D)
        out.index_add_(0, segs, torch.bmm(weight, cols))
        last = cum[..., -1]
        cum_last.index_copy_(0, segs, last)
        log_final.index_add_(0, segs, log_t.sum(-1))
        alpha_grad = alpha.masked_fill(raw > ALPHA_MAX, 0.0)
        chunks.append(Chunk(segs, idx, alpha, trans, alpha_grad))
        l0 += chunk_rows
        segs = segs[(lens > l0) & (last > LOG_T_MIN).any(-1)]
    return out, torch.exp(log_final), chunks


def composite_backward(
    means2d: Tensor,  # [M, 2]
    conics: Tensor,  # [M, 3]
    colors: Tensor,  # [M, D]
    opacities: Tensor,  # [M]
    plan: PairPlan,
    chunks: list[Chunk],
    t_final: Tensor,  # [S, P]
    v_out: Tensor,  # [S, P, D] d loss / d composited colors (before background)
    v_trans: Tensor,  # [S, P] d loss / d final transmittance
    need_abs: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients w.r.t. (means2d, conics, colors, opacities), plus absgrad [M, 2] or None.

    Sweeps the chunks back to front, carrying per pixel the sum over later pairs of
    ``weight * (color . v_out)``.
    """
    M, D = colors.shape
    table = _row_table(means2d, conics, opacities)
    col_table = torch.cat([colors, colors.new_zeros(1, D)], dim=0)
    # per row: v_mean (2), v_conic (3), v_opacity (1), absgrad (2)
    v_geo = means2d.new_zeros(M + 1, 8)
    v_col = colors.new_zeros(M + 1, D)
    later_sum = t_final * v_trans  # [S, P] later pairs' colors + the final T's term
    for ch in reversed(chunks):
        S_a, L = ch.idx.shape
        flat_idx = ch.idx.reshape(-1)
        cols = col_table.index_select(0, flat_idx).reshape(S_a, L, D)
        g = v_out.index_select(0, ch.segs)  # [S_a, P, D]
        weight = ch.alpha * ch.trans
        gc = torch.bmm(g, cols.transpose(1, 2))  # [S_a, P, L] sum_k v_out[k] color[k]
        v_col.index_add_(0, flat_idx, torch.bmm(weight.transpose(1, 2), g).reshape(-1, D))
        s = weight.mul_(gc)
        total = s.sum(-1)  # [S_a, P]
        carry = later_sum.index_select(0, ch.segs)
        later = torch.cumsum(s, dim=-1).neg_().add_((total + carry)[..., None])
        later_sum.index_copy_(0, ch.segs, carry + total)
        v_alpha = gc.mul_(ch.trans).sub_(later.div_(1.0 - ch.alpha))
        del later, s
        v_sigma = v_alpha.mul_(ch.alpha_grad).neg_()  # d loss / d sigma

        mx, my, a, b, c, o = _chunk_rows(table, ch.segs, ch.idx, plan)
        dx, dy = _deltas(mx, my, plan.sub)
        vdx = v_sigma * dx
        vdy = v_sigma * dy
        s0 = v_sigma.sum(1)  # [S_a, L]
        sx = vdx.sum(1)
        sy = vdy.sum(1)
        sxx = (vdx * dx).sum(1)
        sxy = (vdx * dy).sum(1)
        syy = (vdy * dy).sum(1)
        a, b, c, o = a[:, 0], b[:, 0], c[:, 0], o[:, 0]
        parts = [
            a * sx + b * sy,
            b * sx + c * sy,
            0.5 * sxx,
            sxy,
            0.5 * syy,
            -s0 / o.clamp(min=ALPHA_MIN),
        ]
        if need_abs:
            parts.append((vdx * a[:, None]).addcmul_(vdy, b[:, None]).abs_().sum(1))
            parts.append((vdx * b[:, None]).addcmul_(vdy, c[:, None]).abs_().sum(1))
        else:
            parts += [torch.zeros_like(s0), torch.zeros_like(s0)]
        v_geo.index_add_(0, flat_idx, torch.stack(parts, dim=-1).reshape(-1, 8))
    v_abs = v_geo[:M, 6:8] if need_abs else None
    return v_geo[:M, 0:2], v_geo[:M, 2:5], v_col[:M], v_geo[:M, 5], v_abs
