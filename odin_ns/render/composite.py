"""Front-to-back alpha compositing of projected Gaussians, with a hand-written backward.

The per-pixel rules are gsplat's (``rasterize_to_pixels_fwd.cu``):
``alpha = min(0.999, opacity * exp(-sigma))``; a Gaussian is skipped where ``sigma < 0`` or
``alpha < 1/255``; a pixel stops *before* the Gaussian that would bring its transmittance
to ``<= 1e-4``. Pixel centers sit at ``+0.5``.

Layout: the sweep goes front to back in chunks of ``CHUNK_ROWS`` rows. A chunk is a dense
``[S_a, P, L]`` block (live sub-tiles x pixels of a sub-tile x rows, padded with a
transparent Gaussian), so transmittance is a ``cumprod`` of ``1 - alpha`` along the last
dimension times the carried transmittance (float products, as in gsplat), color sums are
batched matmuls, and no per-pixel gather or scatter is needed. A sub-tile leaves the sweep
when all its pixels have stopped, which skips the back rows of a dense scene (as gsplat's
early exit does).

The backward pass is the closed form gsplat's CUDA kernel uses (suffix sums of
``weight * color`` replace its back-to-front loop), so nothing per pair enters the autograd
graph; it also accumulates gsplat's ``absgrad`` (sum over pixels of
``|d loss / d means2d|``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .tiles import ALPHA_MIN, PairPlan

ALPHA_MAX = 0.999
T_MIN = 1e-4  # a pixel keeps a Gaussian only while its transmittance stays above this
CHUNK_ROWS = 32  # rows of every live sub-tile processed per sweep step
MAX_BLOCK_PAIRS = 1 << 22  # (pixel, row) pairs evaluated at once, to bound memory


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
    """Row data of a chunk, each a contiguous [S_a, 1, L]: center relative to the sub-tile's
    first pixel center (x, y), conic (a, b, c), opacity."""
    S_a, L = idx.shape
    rows = table.index_select(0, idx.reshape(-1)).t().reshape(6, S_a, 1, L).contiguous()
    rem = segs % (plan.sub_w * plan.sub_h)
    x0 = ((rem % plan.sub_w) * plan.sub).to(table.dtype)[:, None, None] + 0.5
    y0 = ((rem // plan.sub_w) * plan.sub).to(table.dtype)[:, None, None] + 0.5
    mx, my, a, b, c, o = rows.unbind(0)
    return mx - x0, my - y0, a, b, c, o


def _has_indefinite_conic(conics: Tensor, gid: Tensor) -> bool:
    """Whether any planned row has a conic that is not positive definite. Only then can
    sigma be negative (beyond rounding at sigma = 0) and the per-pixel ``sigma < 0`` test
    matter; it is skipped otherwise."""
    con = conics.index_select(0, gid)
    a, b, c = con.unbind(-1)
    return bool(((a <= 0) | (a * c - b * b <= 0)).any())


@dataclass
class Chunk:
    """One step of the front-to-back sweep, kept for the backward pass."""

    segs: Tensor  # [S_a] live sub-tiles
    idx: Tensor  # [S_a, L] flat Gaussian index per row; M (transparent dummy) pads
    alpha: Tensor  # [S_a, P, L] alpha of composited pairs, 0 elsewhere
    trans: Tensor  # [S_a, P, L] transmittance before each pair (where alpha > 0)
    alpha_grad: Tensor  # [S_a, P, L] alpha where it carries gradient (not clamped)


def composite_forward(
    means2d: Tensor,  # [M, 2] flat over cameras x Gaussians
    conics: Tensor,  # [M, 3]
    colors: Tensor,  # [M, D]
    opacities: Tensor,  # [M]
    plan: PairPlan,
    chunk_rows: int = CHUNK_ROWS,
    keep_chunks: bool = True,
) -> tuple[Tensor, Tensor, list[Chunk]]:
    """Composite every sub-tile front to back, ``chunk_rows`` rows at a time; a sub-tile
    leaves the sweep once its rows run out or all its pixels have stopped. A step touches
    at most ``MAX_BLOCK_PAIRS`` pairs at once (more live sub-tiles are split into blocks),
    which bounds memory on large images. ``keep_chunks=False`` (no backward) keeps none.

    Masks are kept as 0/1 floats (comparisons written into float buffers): on CPU that is
    several times faster than boolean masks with ``where`` / ``masked_fill``.

    Returns (colors [S, P, D] without background, final transmittance [S, P], chunks).
    """
    M, D = colors.shape
    P = plan.sub * plan.sub
    device = colors.device
    table = _row_table(means2d, conics, opacities)
    col_table = torch.cat([colors, colors.new_zeros(1, D)], dim=0)
    gid_pad = torch.cat([plan.gid, plan.gid.new_full((1,), M)])  # [R + 1]
    check_sign = _has_indefinite_conic(conics, plan.gid)
    counts = plan.seg_counts
    starts = torch.cumsum(counts, 0) - counts
    out = colors.new_zeros(plan.n_seg, P, D)
    t_run = colors.new_ones(plan.n_seg, P)  # running T, including a stopping pair
    t_final = colors.new_ones(plan.n_seg, P)  # T over composited pairs
    ox, oy = _pixel_offsets(plan.sub, colors)
    chunks: list[Chunk] = []

    def block(segs: Tensor, l0: int, rows: int) -> Tensor:
        """Rows l0 .. l0 + rows of sub-tiles ``segs``; returns T after them [S_a, P]."""
        lens = counts.index_select(0, segs)
        ar = torch.arange(rows, device=device)
        pos = (starts.index_select(0, segs) + l0)[:, None] + ar[None, :]
        pos = torch.where((l0 + ar)[None, :] < lens[:, None], pos, plan.n_rows)  # pad -> R
        idx = gid_pad.index_select(0, pos.reshape(-1)).reshape(pos.shape)
        mx, my, a, b, c, o = _chunk_rows(table, segs, idx, plan)
        dx = mx - ox  # [S_a, P, L]
        dy = my - oy
        # -sigma = dx * (-0.5 a dx - b dy) - 0.5 c dy^2, built in place.
        nsig = dx * (-0.5 * a)
        nsig.addcmul_(dy, -b).mul_(dx)
        nsig.addcmul_(dy.mul_(dy), -0.5 * c)
        del dx, dy
        mask = torch.empty_like(nsig)
        if check_sign:
            sign_ok = torch.le(nsig, 0.0, out=torch.empty_like(nsig))
        raw = nsig.exp_().mul_(o)  # opacity * exp(-sigma)
        alpha = raw.clamp(max=ALPHA_MAX)
        alpha.mul_(torch.ge(alpha, ALPHA_MIN, out=mask))
        if check_sign:
            alpha.mul_(sign_ok)
        one_minus = torch.rsub(alpha, 1.0)
        t_incl = torch.cumprod(one_minus, dim=-1)
        t_incl.mul_(t_run.index_select(0, segs)[..., None])  # T after each pair
        alpha.mul_(torch.gt(t_incl, T_MIN, out=mask))  # stop before T would reach 1e-4
        last = t_incl[..., -1].clone()
        trans = t_incl.div_(one_minus)  # T before each pair
        weight = alpha * trans
        cols = col_table.index_select(0, idx.reshape(-1)).reshape(*idx.shape, D)
        out.index_add_(0, segs, torch.bmm(weight, cols))
        t_run.index_copy_(0, segs, last)
        kept = torch.rsub(alpha, 1.0).prod(-1)
        t_final.index_copy_(0, segs, t_final.index_select(0, segs).mul_(kept))
        if keep_chunks:
            alpha_grad = alpha
            if bool(raw.max() > ALPHA_MAX):  # clamped alphas pass no gradient to sigma
                alpha_grad = alpha * torch.le(raw, ALPHA_MAX, out=mask)
            chunks.append(Chunk(segs, idx, alpha, trans, alpha_grad))
        return last

    segs = torch.nonzero(counts > 0).squeeze(1)
    l0 = 0
    while len(segs) > 0:
        left = counts.index_select(0, segs) - l0
        full = left >= chunk_rows
        tails, segs = segs[~full], segs[full]
        if len(tails):
            # Sub-tiles with fewer rows left finish now, grouped by the power of two above
            # their row count so that padding stays below 2x.
            k_tail = torch.ceil(torch.log2(left[~full].double())).long()
            for k in torch.unique(k_tail).tolist():
                group = tails[k_tail == k]
                for part in torch.split(group, max(1, MAX_BLOCK_PAIRS // (P << k))):
                    block(part, l0, 1 << k)
        if len(segs):
            per_block = max(1, MAX_BLOCK_PAIRS // (P * chunk_rows))
            last = torch.cat([block(part, l0, chunk_rows) for part in torch.split(segs, per_block)])
            l0 += chunk_rows
            segs = segs[(counts.index_select(0, segs) > l0) & (last.amax(-1) > T_MIN)]
    return out, t_final, chunks


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
    ``weight * (color . v_out)``. For each pair (gsplat's formulas):
    ``v_alpha = T (color . v_out) - (later + T_final v_trans) / (1 - alpha)`` and
    ``d loss / d sigma = -alpha v_alpha`` (0 where alpha was clamped).
    """
    M, D = colors.shape
    table = _row_table(means2d, conics, opacities)
    col_table = torch.cat([colors, colors.new_zeros(1, D)], dim=0)
    ox, oy = _pixel_offsets(plan.sub, colors)
    # per row, then per Gaussian: v_mean (2), v_conic (3), v_opacity (1), absgrad (2),
    # v_color (D); one scatter per chunk
    v_all = means2d.new_zeros(M + 1, 8 + D)
    later_sum = t_final * v_trans  # [S, P] later pairs' colors + the final T's term
    for ch in reversed(chunks):
        S_a, L = ch.idx.shape
        flat_idx = ch.idx.reshape(-1)
        cols = col_table.index_select(0, flat_idx).reshape(S_a, L, D)
        g = v_out.index_select(0, ch.segs)  # [S_a, P, D]
        weight = ch.alpha * ch.trans
        gc = torch.bmm(g, cols.transpose(1, 2))  # [S_a, P, L] color . v_out
        v_col = torch.bmm(weight.transpose(1, 2), g)  # [S_a, L, D]
        s = weight.mul_(gc)
        total = s.sum(-1)  # [S_a, P]
        carry = later_sum.index_select(0, ch.segs)
        later = torch.cumsum(s, dim=-1).neg_().add_((total + carry)[..., None])
        later_sum.index_copy_(0, ch.segs, carry.add_(total))
        v_alpha = gc.mul_(ch.trans).sub_(later.div_(torch.rsub(ch.alpha, 1.0)))
        del later, s
        nv = v_alpha.mul_(ch.alpha_grad)  # = -d loss / d sigma

        mx, my, a, b, c, o = _chunk_rows(table, ch.segs, ch.idx, plan)
        dx = mx - ox
        dy = my - oy
        ndx = nv * dx
        ndy = nv * dy
        s0 = nv.sum(1)  # [S_a, L]
        sx = ndx.sum(1)
        sy = ndy.sum(1)
        sxx = (ndx * dx).sum(1)
        sxy = (ndx * dy).sum(1)
        syy = (ndy * dy).sum(1)
        a, b, c, o = a[:, 0], b[:, 0], c[:, 0], o[:, 0]
        parts = [
            -(a * sx + b * sy),
            -(b * sx + c * sy),
            -0.5 * sxx,
            -sxy,
            -0.5 * syy,
            s0 / o.clamp(min=ALPHA_MIN),
        ]
        if need_abs:
            parts.append(ndx.mul(a[:, None]).addcmul_(ndy, b[:, None]).abs_().sum(1))
            parts.append(ndx.mul_(b[:, None]).addcmul_(ndy, c[:, None]).abs_().sum(1))
        else:
            parts += [torch.zeros_like(s0), torch.zeros_like(s0)]
        rows = torch.cat([torch.stack(parts, dim=-1), v_col], dim=-1).reshape(-1, 8 + D)
        v_all.index_put_((flat_idx,), rows, accumulate=True)
    v_abs = v_all[:M, 6:8] if need_abs else None
    return v_all[:M, 0:2], v_all[:M, 2:5], v_all[:M, 8:], v_all[:M, 5], v_abs
