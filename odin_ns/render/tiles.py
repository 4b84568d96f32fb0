"""Tile intersection: gsplat's tile lists (for ``info``) and the finer pair plan we composite.

gsplat assigns a Gaussian to every 16x16 tile its 3-sigma square touches and composites a
pixel over its tile's list. We keep exactly that candidate set (so results match gsplat),
but evaluate it on small sub-tiles (4x4 pixels by default) and drop the sub-tiles none of
whose pixel centers lies inside the Gaussian's ``alpha >= 1/255`` ellipse: those pixels
would be skipped by the alpha rule anyway, so the output is unchanged and the work
shrinks several times (about 6x fewer (pixel, Gaussian) pairs than gsplat's tile lists on
a typical scene). Everything is vectorized; there is no Python loop over tiles, pixels or
Gaussians.
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


def _small_int(keys: Tensor, bound: int) -> Tensor:
    """``keys`` (in [0, bound)) in the narrowest integer type: CPU sorts run faster."""
    if bound <= 2**15:
        return keys.to(torch.int16)
    if bound <= 2**31:
        return keys.to(torch.int32)
    return keys


def _expand(counts: Tensor) -> tuple[Tensor, Tensor]:
    """For K items with ``counts``: (owner [M], rank of each entry within its item [M])."""
    owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(owner), device=counts.device) - start.index_select(0, owner)
    return owner, rank


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
    x0, y0 = x0.flatten().index_select(0, flat), y0.flatten().index_select(0, flat)
    x1, y1 = x1.flatten().index_select(0, flat), y1.flatten().index_select(0, flat)
    # One strip per (Gaussian, tile row), then one entry per tile of the strip.
    strip_g, rank = _expand(y1 - y0)
    strip_flat = flat.index_select(0, strip_g)
    strip_tile = (y0.index_select(0, strip_g) + rank) * tile_width + x0.index_select(0, strip_g)
    if C > 1:
        strip_tile = strip_tile + (strip_flat // N) * (tile_width * tile_height)
    entry_strip, col = _expand((x1 - x0).index_select(0, strip_g))
    cam_tile = strip_tile.index_select(0, entry_strip) + col  # camera * tiles + tile id
    flatten_ids = strip_flat.index_select(0, entry_strip)
    tile_n_bits = (tile_width * tile_height).bit_length()
    n_tiles = tile_width * tile_height
    cam = torch.div(cam_tile, n_tiles, rounding_mode="floor") if C > 1 else 0
    tile_id = cam_tile - cam * n_tiles if C > 1 else cam_tile
    depth_bits = depths.detach().float().flatten().view(torch.int32).long()
    isect_ids = (
        (cam << (32 + tile_n_bits) if C > 1 else 0)
        | (tile_id << 32)
        | depth_bits.index_select(0, flatten_ids)
    )
    isect_ids, order = torch.sort(isect_ids, stable=True)
    flatten_ids = flatten_ids.index_select(0, order).to(torch.int32)
    counts = torch.bincount(cam_tile, minlength=C * n_tiles)
    offsets = (torch.cumsum(counts, 0) - counts).reshape(C, tile_height, tile_width)
    return TileIntersections(
        tile_width, tile_height, tiles_per_gauss, isect_ids, flatten_ids, offsets.int()
    )


def _ellipse_terms(a: Tensor, b: Tensor, c: Tensor, level: Tensor) -> dict[str, Tensor]:
    """Per-Gaussian constants of the ellipse ``0.5 d^T [[a, b], [b, c]] d <= level``."""
    det = a * c - b * b
    ex = torch.sqrt(2.0 * level * c / det)  # half extents
    ey = torch.sqrt(2.0 * level * a / det)
    # dy of the ellipse's extreme-x points, 2 a level, and 1 / a for the strip formula.
    return {
        "ey": ey,
        "turn": b * ex / c,
        "b": b,
        "a2l": 2.0 * a * level,
        "det": det,
        "inv_a": 1.0 / a,
    }


def _strip_x_range(
    mu_x: Tensor, mu_y: Tensor, t: dict[str, Tensor], y0: Tensor, y1: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """x-extent of the ellipse (see :func:`_ellipse_terms`) inside the band y0 <= p_y <= y1.

    With ``d = mu - p``: for fixed dy the dx range is
    ``(-b dy +- sqrt(2 a level - det dy^2)) / a``; its upper end is concave in dy and peaks
    at the extreme point ``dy = -turn``, so over a band of dy the extreme is at that dy
    clamped into the band (likewise for the lower end, at ``+turn``).
    Returns (x_min, x_max, empty) in the coordinates of ``mu``.
    """
    lo = torch.maximum(mu_y - y1, -t["ey"])  # dy range of the band inside the ellipse
    hi = torch.minimum(mu_y - y0, t["ey"])
    empty = lo > hi
    b, a2l, det, inv_a = t["b"], t["a2l"], t["det"], t["inv_a"]
    dy = torch.minimum(torch.maximum(-t["turn"], lo), hi)
    dx_max = (torch.sqrt((a2l - det * dy * dy).clamp(min=0.0)) - b * dy) * inv_a
    dy = torch.minimum(torch.maximum(t["turn"], lo), hi)
    dx_min = (-torch.sqrt((a2l - det * dy * dy).clamp(min=0.0)) - b * dy) * inv_a
    return mu_x - dx_max, mu_x - dx_min, empty


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

    A row exists when the sub-tile lies inside the Gaussian's gsplat tile range and its
    pixel centers reach the ellipse ``opacity * exp(-sigma) >= 1/255`` (with a safety
    margin, so float32 rounding in the compositor never meets a dropped row): rows of
    sub-tiles are enumerated per Gaussian ("strips") and each strip gets the exact x-range
    of the ellipse inside it, like a scanline rasterizer.
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
    if C > 1:
        flat = flat.index_select(0, torch.sort(flat // N, stable=True).indices)

    m = means2d.detach().reshape(-1, 2).index_select(0, flat)
    x0, x1, y0, y1 = _tile_rect(
        m, radii.flatten().index_select(0, flat), tile_size, tile_width, tile_height
    )  # gsplat's tile range, in tiles
    tx0, ty0 = x0 * per, y0 * per  # ... in sub-tiles
    tx1 = torch.clamp(x1 * per, max=sub_w)
    ty1 = torch.clamp(y1 * per, max=sub_h)

    # Per Gaussian, in pixel-index coordinates (pixel centers at integers).
    a, b, c = conics.detach().reshape(-1, 3).index_select(0, flat).double().unbind(-1)
    o = opacities.detach().flatten().index_select(0, flat).double()
    pd = (a > 0) & (a * c - b * b > 0)
    one = torch.ones_like(a)
    a, c = torch.where(pd, a, one), torch.where(pd, c, one)
    b = torch.where(pd, b, torch.zeros_like(b))
    level = torch.log((255.0 * o).clamp(min=1.0)) * 1.001 + 1e-4  # alpha test, with margin
    mu_x, mu_y = m[:, 0].double() - 0.5, m[:, 1].double() - 0.5
    ey = torch.sqrt(2.0 * level * a / (a * c - b * b))  # y half extent
    # Sub-tiles holding the pixel centers (integers) inside the extent.
    sy0 = torch.floor(torch.ceil(mu_y - ey) / sub).clamp(-1, sub_h).long()
    sy1 = torch.floor(torch.floor(mu_y + ey) / sub).clamp(-1, sub_h).long() + 1
    # A numerically indefinite conic keeps its whole tile range (sigma < 0 is then tested
    # per pixel); a Gaussian with opacity below 1/255 never passes the alpha test.
    sy0 = torch.where(pd, torch.maximum(sy0, ty0), ty0)
    sy1 = torch.where(pd, torch.minimum(sy1, ty1), ty1)
    sy1 = torch.where(o < ALPHA_MIN, sy0, sy1)

    # Strips: one per (Gaussian, row of sub-tiles); float math in the input dtype (the
    # margin in `level` dwarfs its rounding).
    dtype = means2d.dtype
    terms = _ellipse_terms(a, b, c, level)
    names = list(terms)
    table = torch.stack([mu_x, mu_y, *terms.values()], dim=-1).to(dtype)  # [V, 8]
    strip_g, rank = _expand((sy1 - sy0).clamp(min=0))
    sy = sy0.index_select(0, strip_g) + rank
    cols = table.index_select(0, strip_g).unbind(-1)
    band0 = (sy * sub).to(dtype)
    xa, xb, empty = _strip_x_range(
        cols[0], cols[1], dict(zip(names, cols[2:], strict=True)), band0, band0 + (sub - 1)
    )
    xa, xb = torch.ceil(xa), torch.floor(xb)  # first and last pixel column inside
    empty = empty | (xa > xb)
    sx0 = torch.floor(xa / sub).clamp(-1, sub_w).long()
    sx1 = torch.floor(xb / sub).clamp(-1, sub_w).long() + 1
    g_pd = pd.index_select(0, strip_g)
    gx0, gx1 = tx0.index_select(0, strip_g), tx1.index_select(0, strip_g)
    sx0 = torch.where(g_pd, torch.maximum(sx0, gx0), gx0)
    sx1 = torch.where(g_pd, torch.minimum(sx1, gx1), gx1)
    sx1 = torch.where(empty & g_pd, sx0, sx1)

    # Rows: one per (strip, sub-tile column), then grouped by sub-tile (stable: depth order).
    strip_gid = flat.index_select(0, strip_g)
    strip_seg = sy * sub_w + sx0  # sub-tile id of the strip's first row
    if C > 1:
        strip_seg = strip_seg + (strip_gid // N) * (sub_h * sub_w)
    width_s = (sx1 - sx0).clamp(min=0)
    n_seg = C * sub_h * sub_w
    itype = torch.int32 if n_seg < 2**31 and len(flat) < 2**31 else torch.int64
    # seg of a row = its strip's first seg + (row index - strip's first row index)
    first_row = torch.cumsum(width_s, 0) - width_s
    seg = torch.repeat_interleave((strip_seg - first_row).to(itype), width_s)
    seg += torch.arange(len(seg), dtype=itype, device=device)
    perm = torch.sort(_small_int(seg, n_seg), stable=True).indices
    gid = torch.repeat_interleave(strip_gid.to(itype), width_s).index_select(0, perm).long()
    seg_counts = torch.bincount(seg, minlength=n_seg)
    return PairPlan(sub, sub_w, sub_h, n_seg, gid, seg_counts.to(device))
