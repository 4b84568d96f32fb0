"""Tile intersection: gsplat's tile lists (for ``info``) and the finer pair plan we composite.

gsplat assigns a Gaussian to every 16x16 tile its 3-sigma square touches and composites a
pixel over its tile's list. We keep exactly that candidate set (so results match gsplat),
but evaluate it on small sub-tiles (4x4 pixels by default) and drop the sub-tiles that lie
outside the Gaussian's ``alpha >= 1/255`` ellipse's bounding box: those pixels would be
skipped by the alpha rule anyway, so the output is unchanged and the work shrinks several
times. Everything is vectorized; there is no Python loop over tiles, pixels or Gaussians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ALPHA_MIN = 1.0 / 255.0


@dataclass
class TileIntersections:
    """gsplat's ``isect_tiles`` / ``isect_offset_encode`` outputs (unpacked layout)."""

    tile_width: int
    tile_height: int
    tiles_per_gauss: Tensor  # [C, N] int32
    isect_ids: Tensor  # [n_isects] int64: camera | tile | depth bits, sorted
    flatten_ids: Tensor  # [n_isects] int32 flat index into C * N
    isect_offsets: Tensor  # [C, tile_height, tile_width] int32


@dataclass
class PairPlan:
    """Rows of (sub-tile, Gaussian) pairs sorted by sub-tile, then depth (front to back).

    Sub-tile ``s`` of camera ``c`` at sub-tile column ``sx`` and row ``sy`` has id
    ``s = (c * sub_h + sy) * sub_w + sx``; its rows form one contiguous segment.
    """

    sub: int  # sub-tile side in pixels
    sub_w: int  # sub-tiles per image row
    sub_h: int  # sub-tiles per image column
    n_seg: int  # C * sub_h * sub_w
    gid: Tensor  # [R] int64 flat Gaussian index into C * N
    seg_counts: Tensor  # [n_seg] int64 rows per sub-tile

    @property
    def n_rows(self) -> int:
        return int(self.gid.shape[0])


def _tile_rect(
    means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int, tile_height: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """gsplat's tile range of each Gaussian: [x0, x1) x [y0, y1) in tile units."""
    r = radii.to(means2d.dtype) / tile_size
    tx = means2d[..., 0] / tile_size
    ty = means2d[..., 1] / tile_size
    x0 = torch.floor(tx - r).clamp(0, tile_width).long()
    x1 = torch.ceil(tx + r).clamp(0, tile_width).long()
    y0 = torch.floor(ty - r).clamp(0, tile_height).long()
    y1 = torch.ceil(ty + r).clamp(0, tile_height).long()
    return x0, x1, y0, y1


def _expand(counts: Tensor) -> tuple[Tensor, Tensor]:
    """For K items with ``counts``: (owner [M], rank of each entry within its item [M])."""
    owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(owner), device=counts.device) - start.index_select(0, owner)
    return owner, rank


def _enumerate_rects(
    x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Expand K rectangles into their cells, rectangle by rectangle, row-major inside.

    Returns (owner [M], x [M], y [M]) with owner the rectangle index of each cell.
    Two expansions (rows, then cells of a row) instead of integer division, which is slow
    on CPU.
    """
    w = (x1 - x0).clamp(min=0)
    h = (y1 - y0).clamp(min=0)
    row_owner, row_rank = _expand(h)  # one entry per (rectangle, row)
    cell_row, col_rank = _expand(w.index_select(0, row_owner))
    owner = row_owner.index_select(0, cell_row)
    x = x0.index_select(0, owner) + col_rank
    y = (y0.index_select(0, row_owner) + row_rank).index_select(0, cell_row)
    return owner, x, y


@torch.no_grad()
def isect_tiles(
    means2d: Tensor,  # [C, N, 2]
    radii: Tensor,  # [C, N]
    depths: Tensor,  # [C, N]
    tile_size: int,
    width: int,
    height: int,
) -> TileIntersections:
    """Vectorized equivalent of gsplat's ``isect_tiles`` + ``isect_offset_encode``."""
    C, N = radii.shape
    tile_width = math.ceil(width / tile_size)
    tile_height = math.ceil(height / tile_size)
    x0, x1, y0, y1 = _tile_rect(means2d, radii, tile_size, tile_width, tile_height)
    visible = radii > 0
    tiles_per_gauss = ((x1 - x0) * (y1 - y0) * visible).to(torch.int32)
    flat = torch.nonzero(visible.flatten()).squeeze(1)  # [V], ascending like gsplat
    owner, tx, ty = _enumerate_rects(
        x0.flatten()[flat], x1.flatten()[flat], y0.flatten()[flat], y1.flatten()[flat]
    )
    flatten_ids = flat[owner]
    cam = flatten_ids // N
    tile_id = ty * tile_width + tx
    tile_n_bits = (tile_width * tile_height).bit_length()
    depth_bits = depths.detach().float().flatten().view(torch.int32).long()[flatten_ids]
    isect_ids = (cam << (32 + tile_n_bits)) | (tile_id << 32) | depth_bits
    isect_ids, order = torch.sort(isect_ids, stable=True)
    flatten_ids = flatten_ids[order].to(torch.int32)
    counts = torch.bincount(
        (isect_ids >> 32).clamp(max=C * (1 << tile_n_bits)),
        minlength=C << tile_n_bits,
    )[: C << tile_n_bits].reshape(C, 1 << tile_n_bits)[:, : tile_width * tile_height]
    offsets = (torch.cumsum(counts.flatten(), 0) - counts.flatten()).reshape(
        C, tile_height, tile_width
    )
    return TileIntersections(
        tile_width, tile_height, tiles_per_gauss, isect_ids, flatten_ids, offsets.int()
    )


def _min_sigma_on_square(
    mx: Tensor, my: Tensor, a: Tensor, b: Tensor, c: Tensor, x0: Tensor, y0: Tensor, side: float
) -> Tensor:
    """Minimum of ``sigma(p) = 0.5 d^T [[a, b], [b, c]] d`` (``d = mean - p``, positive
    definite conic) over the square ``[x0, x0 + side] x [y0, y0 + side]``. [K]

    sigma grows along every ray from the mean, so the minimum lies on an edge that faces
    the mean (the segment from any point of the square to the mean leaves through one).
    On the facing vertical edge ``x = clamp(mx)`` sigma is a quadratic in y minimized at
    ``dy = -b dx / c`` (clamped to the edge); likewise on the facing horizontal edge. When
    the mean is inside, both give 0.
    """
    dx = mx - mx.clamp(min=x0, max=x0 + side)
    dy = my - (my + b * dx / c).clamp(min=y0, max=y0 + side)
    best = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    dy = my - my.clamp(min=y0, max=y0 + side)
    dx = mx - (mx + b * dy / a).clamp(min=x0, max=x0 + side)
    return torch.minimum(best, 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy)


@torch.no_grad()
def build_pair_plan(
    means2d: Tensor,  # [C, N, 2]
    radii: Tensor,  # [C, N]
    depths: Tensor,  # [C, N]
    conics: Tensor,  # [C, N, 3]
    opacities: Tensor,  # [C, N]
    tile_size: int,
    width: int,
    height: int,
    sub: int = 4,
) -> PairPlan:
    """Enumerate the (sub-tile, Gaussian) rows to composite, front to back per sub-tile.

    A row exists when the sub-tile lies inside the Gaussian's gsplat tile range and some
    pixel center of the sub-tile may pass the alpha test ``opacity * exp(-sigma) >= 1/255``
    (bounding box of that ellipse first, then the exact ellipse-square test, both with a
    safety margin so that float32 rounding in the compositor never meets a dropped row).
    """
    if tile_size % sub != 0:
        raise ValueError(f"sub-tile size {sub} must divide tile_size {tile_size}")
    C, N = radii.shape
    device = means2d.device
    tile_width = math.ceil(width / tile_size)
    tile_height = math.ceil(height / tile_size)
    sub_w = math.ceil(width / sub)
    sub_h = math.ceil(height / sub)
    per = tile_size // sub

    # Visible Gaussians, ordered by camera, then depth, then index (gsplat's sort order).
    flat = torch.nonzero((radii > 0).flatten()).squeeze(1)
    order = torch.sort(depths.detach().flatten().index_select(0, flat), stable=True).indices
    flat = flat.index_select(0, order)
    flat = flat.index_select(0, torch.sort(flat // N, stable=True).indices)

    m = means2d.detach().reshape(-1, 2).index_select(0, flat)
    x0, x1, y0, y1 = _tile_rect(
        m, radii.flatten().index_select(0, flat), tile_size, tile_width, tile_height
    )  # tile units
    sx0, sy0 = x0 * per, y0 * per
    sx1 = torch.clamp(x1 * per, max=sub_w)
    sy1 = torch.clamp(y1 * per, max=sub_h)

    # Bounding box of {pixel centers p : sigma(p) <= log(255 * opacity)}.
    con = conics.detach().reshape(-1, 3).index_select(0, flat).double()
    a, b, c = con.unbind(-1)
    o = opacities.detach().flatten().index_select(0, flat).double()
    det = a * c - b * b
    pd = (a > 0) & (det > 0)
    det_pd = torch.where(pd, det, torch.ones_like(det))
    level = torch.log((255.0 * o).clamp(min=1.0))  # sigma bound of the alpha test
    level = level * 1.001 + 1e-4  # margin for float32 rounding in the compositor
    ex = torch.sqrt(2.0 * level * c.clamp(min=0.0) / det_pd)
    ey = torch.sqrt(2.0 * level * a.clamp(min=0.0) / det_pd)
    mx, my = m[:, 0].double() - 0.5, m[:, 1].double() - 0.5  # pixel index of the center
    bx0 = torch.floor((mx - ex) / sub).clamp(-1, sub_w).long()
    bx1 = torch.floor((mx + ex) / sub).clamp(-1, sub_w).long() + 1
    by0 = torch.floor((my - ey) / sub).clamp(-1, sub_h).long()
    by1 = torch.floor((my + ey) / sub).clamp(-1, sub_h).long() + 1
    # A numerically indefinite conic keeps its whole tile range (sigma < 0 is skipped
    # per pixel); a Gaussian with opacity below 1/255 never passes the alpha test.
    sx0 = torch.where(pd, torch.maximum(sx0, bx0), sx0)
    sx1 = torch.where(pd, torch.minimum(sx1, bx1), sx1)
    sy0 = torch.where(pd, torch.maximum(sy0, by0), sy0)
    sy1 = torch.where(pd, torch.minimum(sy1, by1), sy1)
    sx1 = torch.where(o < ALPHA_MIN, sx0, sx1)

    owner, sx, sy = _enumerate_rects(sx0, sx1, sy0, sy1)
    # Exact test: does the ellipse reach a pixel center of the sub-tile?
    dtype = means2d.dtype
    per_row = torch.stack([mx, my, a, b, c, level], dim=-1).to(dtype).index_select(0, owner)
    mins = _min_sigma_on_square(
        *per_row[:, :5].unbind(-1), (sx * sub).to(dtype), (sy * sub).to(dtype), float(sub - 1)
    )
    hit = (mins <= per_row[:, 5]) | ~pd.index_select(0, owner)
    keep = torch.nonzero(hit).squeeze(1)
    owner, sx, sy = owner[keep], sx[keep], sy[keep]

    gid = flat.index_select(0, owner)
    cam = gid // N if C > 1 else torch.zeros_like(gid)
    seg = (cam * sub_h + sy) * sub_w + sx
    n_seg = C * sub_h * sub_w
    key = seg.int() if n_seg < 2**31 else seg
    perm = torch.sort(key, stable=True).indices
    gid = gid.index_select(0, perm)
    seg_counts = torch.bincount(seg, minlength=n_seg)
    return PairPlan(sub, sub_w, sub_h, n_seg, gid, seg_counts.to(device))
