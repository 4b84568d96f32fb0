"""The CUDA ("gsplat") rasterizer: gsplat's own ``rasterization``."""

from __future__ import annotations

from torch import Tensor


def rasterize_gsplat(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [(C,) N, D] or [(C,) N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    **kwargs,
) -> tuple[Tensor, Tensor, dict]:
    """Call ``gsplat.rasterization`` (imported lazily: it JIT-loads CUDA code)."""
    from gsplat.rendering import rasterization

    return rasterization(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height, **kwargs
    )
