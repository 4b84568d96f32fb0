"""EWA projection of 3D Gaussians to the image plane, with gsplat's culling rules.

Differentiable through torch autograd. The arithmetic follows gsplat 1.4.0's CUDA kernel
``fully_fused_projection_fwd`` (pinhole camera): the Jacobian uses the clamped
(1.3x field of view) camera-space position, ``eps2d`` is added to the 2D covariance's
diagonal, the radius is 3 sigma of the blurred covariance's largest eigenvalue (with
gsplat's ``max(0.01, b^2 - det)`` guard), and a Gaussian gets radius 0 when its depth lies
outside ``[near_plane, far_plane]``, its blurred determinant is not positive, its radius is
``<= radius_clip``, or its footprint misses the image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gsplat.cuda._torch_impl import _quat_scale_to_covar_preci
from torch import Tensor


@dataclass
class Projection:
    """Per camera and Gaussian projection results (the [C, N] layout of gsplat's
    ``packed=False``). Entries with ``radii == 0`` are not rendered."""

    radii: Tensor  # [C, N] int32
    means2d: Tensor  # [C, N, 2]
    depths: Tensor  # [C, N]
    conics: Tensor  # [C, N, 3] upper triangle of the inverse blurred 2D covariance
    compensations: Tensor | None  # [C, N] antialiasing opacity factor, or None


def project_gaussians(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] (wxyz, not necessarily normalized)
    scales: Tensor,  # [N, 3]
    viewmats: Tensor,  # [C, 4, 4] world-to-camera
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    calc_compensations: bool = False,
) -> Projection:
    """Project Gaussians into every camera (pinhole), like gsplat's fully fused projection."""
    covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_preci=False)  # [N, 3, 3]
    R = viewmats[:, :3, :3]  # [C, 3, 3]
    t = viewmats[:, :3, 3]  # [C, 3]
    means_c = torch.einsum("cij,nj->cni", R, means) + t[:, None, :]  # [C, N, 3]
    covars_c = torch.einsum("cij,njk,clk->cnil", R, covars, R)  # [C, N, 3, 3]

    x, y, z = means_c.unbind(-1)  # [C, N]
    with torch.no_grad():
        in_depth = (z >= near_plane) & (z <= far_plane)
    # Culled Gaussians may sit at z <= 0; keep their (unused) arithmetic finite so that the
    # zero gradients they receive never meet an inf.
    z_safe = torch.where(in_depth, z, torch.ones_like(z))
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    rz = 1.0 / z_safe
    tx = z_safe * torch.minimum(lim_x_pos, torch.maximum(-lim_x_neg, x * rz))
    ty = z_safe * torch.minimum(lim_y_pos, torch.maximum(-lim_y_neg, y * rz))
    zeros = torch.zeros_like(x)
    J = torch.stack(
        [fx * rz, zeros, -fx * tx * rz * rz, zeros, fy * rz, -fy * ty * rz * rz], dim=-1
    ).reshape(*x.shape, 2, 3)  # [C, N, 2, 3]
    cov2d = J @ covars_c @ J.transpose(-1, -2)  # [C, N, 2, 2]
    means2d = torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)  # [C, N, 2]

    c00 = cov2d[..., 0, 0]
    c01 = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    c11 = cov2d[..., 1, 1]
    det_orig = c00 * c11 - c01 * c01
    c00 = c00 + eps2d
    c11 = c11 + eps2d
    det = c00 * c11 - c01 * c01  # [C, N]
    with torch.no_grad():
        valid = in_depth & (det > 0)
    det_safe = torch.where(valid, det, torch.ones_like(det))
    conics = torch.stack([c11 / det_safe, -c01 / det_safe, c00 / det_safe], dim=-1)
    compensations = None
    if calc_compensations:
        compensations = torch.sqrt(torch.clamp(det_orig / det_safe, min=0.0))

    with torch.no_grad():
        b = 0.5 * (c00 + c11)
        v1 = b + torch.sqrt(torch.clamp(b * b - det, min=0.01))
        radius = torch.ceil(3.0 * torch.sqrt(v1.clamp(min=0.0)))
        mx, my = means2d[..., 0], means2d[..., 1]
        keep = (
            valid
            & (radius > radius_clip)
            & (mx + radius > 0)
            & (mx - radius < width)
            & (my + radius > 0)
            & (my - radius < height)
        )
        radii = torch.where(keep, radius, torch.zeros_like(radius)).to(torch.int32)
    return Projection(radii, means2d, z, conics, compensations)
