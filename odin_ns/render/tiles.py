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
    seg: Tensor  # [R] int64 sub-tile id
    x0: Tensor  # [R] pixel column of the sub-tile's first pixel (float)
    y0: Tensor  # [R] pixel row of the sub-tile's first pixel (float)
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


def _enumerate_rects(
    x0: Tensor, x1: Tensor, y0: Tensor, y1: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Expand K rectangles into their cells, rectangle by rectangle, row-major inside.

    Returns (owner [M], x [M], y [M]) with owner the rectangle index of each cell.
    """
    w = (x1 - x0).clamp(min=0)
    h = (y1 - y0).clamp(min=0)
    counts = w * h
    owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    start = torch.cumsum(counts, 0) - counts
    local = torch.arange(len(owner), device=counts.device) - start[owner]
    wo = w[owner]
    return owner, x0[owner] + local % wo, y0[owner] + local // wo


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

    A row exists when the sub-tile lies inside the Gaussian's gsplat tile range and
    overlaps the bounding box of the pixel centers where ``opacity * exp(-sigma) >= 1/255``.
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
    d = depths.detach().flatten()[flat]
    order = torch.sort(d, stable=True).indices
    flat = flat[order]
    flat = flat[torch.sort(flat // N, stable=True).indices]

    m = means2d.detach().reshape(-1, 2)[flat]
    x0, x1, y0, y1 = _tile_rect(
        m, radii.flatten()[flat], tile_size, tile_width, tile_height
    )  # tile units
    sx0, sy0 = x0 * per, y0 * per
    sx1 = torch.clamp(x1 * per, max=sub_w)
    sy1 = torch.clamp(y1 * per, max=sub_h)

    # Bounding box of {pixel centers p : sigma(p) <= log(255 * opacity)}.
    a, b, c = conics.detach().reshape(-1, 3)[flat].double().unbind(-1)
    o = opacities.detach().flatten()[flat].double()
    det = a * c - b * b
    pd = (a > 0) & (det > 0)
    det_pd = torch.where(pd, det, torch.ones_like(det))
    level = torch.log((255.0 * o).clamp(min=1.0))  # sigma bound of the alpha test
    ex = torch.sqrt(2.0 * level * c.clamp(min=0.0) / det_pd) * 1.0001 + 1e-3
    ey = torch.sqrt(2.0 * level * a.clamp(min=0.0) / det_pd) * 1.0001 + 1e-3
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
    gid = flat[owner]
    cam = gid // N
    seg = (cam * sub_h + sy) * sub_w + sx
    seg, perm = torch.sort(seg, stable=True)
    gid = gid[perm]
    n_seg = C * sub_h * sub_w
    seg_counts = torch.bincount(seg, minlength=n_seg)
    rem = seg % (sub_h * sub_w)
    dtype = means2d.dtype
    x0p = ((rem % sub_w) * sub).to(dtype)
    y0p = ((rem // sub_w) * sub).to(dtype)
    return PairPlan(sub, sub_w, sub_h, n_seg, gid, seg, x0p, y0p, seg_counts.to(device))
