"""The CPU ("torch") rasterizer: gsplat's unpacked ``rasterization`` pipeline in torch.

projection (autograd) -> colors / SH (autograd) -> tile lists (for ``info``) -> pair plan
-> compositing (:class:`Composite`, hand-written backward) -> image layout (autograd).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .composite import CHUNK_ROWS, composite_backward, composite_forward
from .projection import project_gaussians
from .sh import sh_to_color
from .tiles import PairPlan, build_pair_plan, isect_tiles

DEFAULT_SUB_TILE = 4  # pixels per sub-tile side (its gcd with tile_size is used)


class Composite(torch.autograd.Function):
    """Differentiable compositing over a fixed pair plan.

    Returns the composited colors (no background) and the final transmittance in sub-tile
    layout ([S, P, D] and [S, P]). With ``absgrad`` the backward pass stores gsplat's
    absolute 2D-mean gradient in ``means2d.absgrad`` ([C, N, 2]), like gsplat.
    """

    @staticmethod
    def forward(
        ctx,
        means2d: Tensor,  # [C, N, 2]
        conics: Tensor,  # [C, N, 3]
        colors: Tensor,  # [C, N, D]
        opacities: Tensor,  # [C, N]
        plan: PairPlan,
        absgrad: bool,
        chunk_rows: int = CHUNK_ROWS,
    ) -> tuple[Tensor, Tensor]:
        D = colors.shape[-1]
        flat = (
            means2d.reshape(-1, 2),
            conics.reshape(-1, 3),
            colors.reshape(-1, D),
            opacities.reshape(-1),
        )
        out, t_final, chunks = composite_forward(
            *flat, plan, chunk_rows, keep_chunks=any(ctx.needs_input_grad[:4])
        )
        ctx.save_for_backward(means2d, conics, colors, opacities, t_final)
        ctx.plan = plan
        ctx.chunks = chunks
        ctx.absgrad = absgrad
        return out, t_final

    @staticmethod
    def backward(ctx, v_out: Tensor, v_trans: Tensor):
        means2d, conics, colors, opacities, t_final = ctx.saved_tensors
        C, N, D = colors.shape
        flat = (
            means2d.reshape(-1, 2),
            conics.reshape(-1, 3),
            colors.reshape(-1, D),
            opacities.reshape(-1),
        )
        v_means2d, v_conics, v_colors, v_opac, v_abs = composite_backward(
            *flat,
            ctx.plan,
            ctx.chunks,
            t_final,
            v_out.contiguous(),
            v_trans.contiguous(),
            need_abs=ctx.absgrad,
        )
        if ctx.absgrad:
            means2d.absgrad = v_abs.reshape(C, N, 2)
        return (
            v_means2d.reshape(C, N, 2),
            v_conics.reshape(C, N, 3),
            v_colors.reshape(C, N, D),
            v_opac.reshape(C, N),
            None,
            None,
            None,
        )


def _to_image(x: Tensor, plan: PairPlan, C: int, width: int, height: int) -> Tensor:
    """[S, P, D] sub-tile layout -> [C, height, width, D] image layout."""
    k, D = plan.sub, x.shape[-1]
    img = x.reshape(C, plan.sub_h, plan.sub_w, k, k, D).permute(0, 1, 3, 2, 4, 5)
    img = img.reshape(C, plan.sub_h * k, plan.sub_w * k, D)
    return img[:, :height, :width]


def _view_colors(
    means: Tensor, colors: Tensor, viewmats: Tensor, sh_degree: int | None, radii: Tensor
) -> Tensor:
    """Per camera colors [C, N, D]: SH evaluated like gsplat (dirs = means - campos, then
    ``clamp_min(color + 0.5, 0)``), or plain colors broadcast to every camera."""
    C, N = radii.shape
    if sh_degree is None:
        return colors if colors.dim() == 3 else colors.expand(C, -1, -1)
    campos = torch.inverse(viewmats)[:, :3, 3]  # [C, 3]
    dirs = means[None, :, :] - campos[:, None, :]  # [C, N, 3]
    return torch.clamp_min(sh_to_color(sh_degree, dirs, colors) + 0.5, 0.0)


def rasterize_torch(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [(C,) N, D] or [(C,) N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    eps2d: float,
    sh_degree: int | None,
    tile_size: int,
    backgrounds: Tensor | None,  # [C, D]
    render_mode: str,
    absgrad: bool,
    rasterize_mode: str,
    sub_tile: int = DEFAULT_SUB_TILE,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[Tensor, Tensor, dict]:
    """gsplat ``rasterization(packed=False)`` semantics on any device torch runs on.

    ``sub_tile`` (pixels per sub-tile side; its gcd with ``tile_size`` is used) and
    ``chunk_rows`` (rows per sweep step) only change speed, never results.
    """
    C = viewmats.shape[0]
    proj = project_gaussians(
        means,
        quats,
        scales,
        viewmats,
        Ks,
        width,
        height,
        eps2d=eps2d,
        near_plane=near_plane,
        far_plane=far_plane,
        radius_clip=radius_clip,
        calc_compensations=rasterize_mode == "antialiased",
    )
    opac = opacities[None, :].expand(C, -1)
    if proj.compensations is not None:
        opac = opac * proj.compensations
    info: dict = {
        "camera_ids": None,
        "gaussian_ids": None,
        "radii": proj.radii,
        "means2d": proj.means2d,
        "depths": proj.depths,
        "conics": proj.conics,
        "opacities": opac,
    }
    feats = _view_colors(means, colors, viewmats, sh_degree, proj.radii)
    if render_mode in ("RGB+D", "RGB+ED"):
        feats = torch.cat([feats, proj.depths[..., None]], dim=-1)
        if backgrounds is not None:
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    elif render_mode in ("D", "ED"):
        feats = proj.depths[..., None]
        if backgrounds is not None:
            backgrounds = backgrounds.new_zeros(C, 1)

    tiles = isect_tiles(proj.means2d, proj.radii, proj.depths, tile_size, width, height)
    info.update(
        {
            "tile_width": tiles.tile_width,
            "tile_height": tiles.tile_height,
            "tiles_per_gauss": tiles.tiles_per_gauss,
            "isect_ids": tiles.isect_ids,
            "flatten_ids": tiles.flatten_ids,
            "isect_offsets": tiles.isect_offsets,
            "width": width,
            "height": height,
            "tile_size": tile_size,
            "n_cameras": C,
        }
    )
    plan = build_pair_plan(
        proj.means2d,
        proj.radii,
        proj.depths,
        proj.conics,
        opac,
        tile_size,
        width,
        height,
        sub=math.gcd(tile_size, sub_tile),
    )
    out, t_final = Composite.apply(
        proj.means2d,
        proj.conics,
        feats.contiguous(),
        opac.contiguous(),
        plan,
        absgrad,
        chunk_rows,
    )
    render_colors = _to_image(out, plan, C, width, height)
    t_img = _to_image(t_final[..., None], plan, C, width, height)
    render_alphas = 1.0 - t_img
    if backgrounds is not None:
        render_colors = render_colors + t_img * backgrounds[:, None, None, :]
    if render_mode in ("ED", "RGB+ED"):
        render_colors = torch.cat(
            [
                render_colors[..., :-1],
                render_colors[..., -1:] / render_alphas.clamp(min=1e-10),
            ],
            dim=-1,
        )
    return render_colors, render_alphas, info
