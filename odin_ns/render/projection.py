"""EWA projection of 3D Gaussians to the image plane, with gsplat's culling rules.

Differentiable through torch autograd. The arithmetic follows gsplat 1.4.0's CUDA kernel
``fully_fused_projection_fwd`` (pinhole camera): the Jacobian uses the clamped
(1.3x field of view) camera-space position, ``eps2d`` is added to the 2D covariance's
diagonal, the radius is 3 sigma of the blurred covariance's largest eigenvalue (with
gsplat's ``max(0.01, b^2 - det)`` guard), and a Gaussian gets radius 0 when its depth lies
outside ``[near_plane, far_plane]``, its blurred determinant is not positive, its radius is
``<= radius_clip``, or its footprint misses the image.

The 3x3 algebra is written out entry by entry on [C, N] tensors: on CPU that is several
times faster, forward and backward, than batched 3x3 matmuls. The 2D covariance is
``T T^T`` with ``T = J R_cam R S`` (J the 2x3 projection Jacobian), so the 3D covariance
is never formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


def three_sigma_radius(c00: Tensor, c01: Tensor, c11: Tensor) -> Tensor:
    """gsplat's screen radius, in whole pixels, of the blurred 2D covariance
    ``[[c00, c01], [c01, c11]]`` (any matching shapes): ``ceil(3 sqrt(lambda_max))`` with
    gsplat's ``max(0.01, b^2 - det)`` guard on the eigenvalue's square root."""
    det = c00 * c11 - c01 * c01
    b = 0.5 * (c00 + c11)
    v1 = b + torch.sqrt(torch.clamp(b * b - det, min=0.01))
    return torch.ceil(3.0 * torch.sqrt(v1.clamp(min=0.0)))


def quat_scale_to_matrix(quats: Tensor, scales: Tensor) -> list[list[Tensor]]:
    """Entries of ``R(quat) @ diag(scale)`` (3x3 nested list of [N] tensors); quats wxyz,
    normalized here as in gsplat."""
    w, x, y, z = F.normalize(quats, p=2, dim=-1).unbind(-1)
    sx, sy, sz = scales.unbind(-1)
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    R = [
        [1 - 2 * (yy + zz), 2 * (xy - wz), 2 * (xz + wy)],
        [2 * (xy + wz), 1 - 2 * (xx + zz), 2 * (yz - wx)],
        [2 * (xz - wy), 2 * (yz + wx), 1 - 2 * (xx + yy)],
    ]
    return [[R[i][0] * sx, R[i][1] * sy, R[i][2] * sz] for i in range(3)]


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
    M = quat_scale_to_matrix(quats, scales)  # [N] entries
    Rc = viewmats[:, :3, :3, None]  # [C, 3, 3, 1]
    tc = viewmats[:, :3, 3, None]  # [C, 3, 1]
    mean = means.t()  # [3, N]
    # Camera-space centers and R_cam @ M, [C, N] entries.
    cam = [
        Rc[:, i, 0] * mean[0] + Rc[:, i, 1] * mean[1] + Rc[:, i, 2] * mean[2] + tc[:, i]
        for i in range(3)
    ]
    Mc = [
        [Rc[:, i, 0] * M[0][j] + Rc[:, i, 1] * M[1][j] + Rc[:, i, 2] * M[2][j] for j in range(3)]
        for i in range(3)
    ]
    x, y, z = cam
    with torch.no_grad():
        in_depth = (z >= near_plane) & (z <= far_plane)
    # Culled Gaussians may sit at z <= 0; keep their (unused) arithmetic finite so that the
    # zero gradients they receive never meet an inf.
    z = torch.where(in_depth, z, torch.ones_like(z))
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    rz = 1.0 / z
    tx = torch.minimum(lim_x_pos, torch.maximum(-lim_x_neg, x * rz))  # clamped x / z
    ty = torch.minimum(lim_y_pos, torch.maximum(-lim_y_neg, y * rz))
    # J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]] with tx, ty clamped; T = J Mc.
    j0, j1 = fx * rz, fy * rz
    T0 = [j0 * (Mc[0][k] - tx * Mc[2][k]) for k in range(3)]
    T1 = [j1 * (Mc[1][k] - ty * Mc[2][k]) for k in range(3)]
    c00 = T0[0] * T0[0] + T0[1] * T0[1] + T0[2] * T0[2]
    c01 = T0[0] * T1[0] + T0[1] * T1[1] + T0[2] * T1[2]
    c11 = T1[0] * T1[0] + T1[1] * T1[1] + T1[2] * T1[2]
    means2d = torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)  # [C, N, 2]

    det_orig = c00 * c11 - c01 * c01
    c00 = c00 + eps2d
    c11 = c11 + eps2d
    det = c00 * c11 - c01 * c01  # [C, N]
    with torch.no_grad():
        valid = in_depth & (det > 0)
    det_safe = torch.where(valid, det, torch.ones_like(det))
    inv_det = 1.0 / det_safe
    conics = torch.stack([c11 * inv_det, -c01 * inv_det, c00 * inv_det], dim=-1)
    compensations = None
    if calc_compensations:
        compensations = torch.sqrt(torch.clamp(det_orig * inv_det, min=0.0))

    with torch.no_grad():
        radius = three_sigma_radius(c00, c01, c11)
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
    return Projection(radii, means2d, cam[2], conics, compensations)
