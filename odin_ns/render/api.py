"""``rasterize``: the subset of ``gsplat.rasterization`` that splatfacto uses, on two backends.

Same arguments, outputs and ``info`` dict as gsplat 1.4.0 (``packed=False``), so nerfstudio's
splatfacto and gsplat's ``DefaultStrategy`` work unchanged on either backend.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gsplat_backend import rasterize_gsplat
from .torch_backend import rasterize_torch

BACKENDS = ("auto", "gsplat", "torch")
RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
RASTERIZE_MODES = ("classic", "antialiased")
MAX_SH_DEGREE = 4  # gsplat's SH evaluation supports degrees 0..4

GSPLAT_NEEDS_CUDA = (
    "rasterizer 'gsplat' needs CUDA, which is not available on this machine; "
    "use rasterizer='torch' or 'auto'"
)


def resolve_backend(name: str, device: torch.device | str) -> str:
    """Map a backend name to "gsplat" or "torch" for tensors on ``device``.

    "auto" picks gsplat when CUDA is available and the tensors live on a CUDA device,
    else the torch backend.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown rasterizer {name!r}; expected one of {', '.join(BACKENDS)}")
    device = torch.device(device)
    if name == "torch":
        return "torch"
    cuda = torch.cuda.is_available()
    if name == "gsplat":
        if not cuda:
            raise ValueError(GSPLAT_NEEDS_CUDA)
        if device.type != "cuda":
            raise ValueError(
                f"rasterizer 'gsplat' needs CUDA tensors, got tensors on {device}; "
                "move them to CUDA or use rasterizer='torch' or 'auto'"
            )
        return "gsplat"
    return "gsplat" if cuda and device.type == "cuda" else "torch"


def _check_shape(name: str, t: Tensor, shape: tuple) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def _validate(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    sh_degree: int | None,
    tile_size: int,
    backgrounds: Tensor | None,
    render_mode: str,
    rasterize_mode: str,
) -> None:
    """One clear ValueError per kind of bad input."""
    if means.dim() != 2 or means.shape[-1] != 3:
        raise ValueError(f"means must have shape [N, 3], got {list(means.shape)}")
    N = means.shape[0]
    if viewmats.dim() != 3 or viewmats.shape[1:] != (4, 4):
        raise ValueError(f"viewmats must have shape [C, 4, 4], got {list(viewmats.shape)}")
    C = viewmats.shape[0]
    _check_shape("quats", quats, (N, 4))
    _check_shape("scales", scales, (N, 3))
    _check_shape("opacities", opacities, (N,))
    _check_shape("Ks", Ks, (C, 3, 3))
    if int(width) <= 0 or int(height) <= 0:
        raise ValueError(f"width and height must be positive, got {width}x{height}")
    if int(tile_size) <= 0:
        raise ValueError(f"tile_size must be positive, got {tile_size}")
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    if rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    if sh_degree is None:
        if not (
            (colors.dim() == 2 and colors.shape[0] == N)
            or (colors.dim() == 3 and colors.shape[:2] == (C, N))
        ):
            raise ValueError(
                f"colors must have shape [N, D] or [C, N, D] when sh_degree is None, "
                f"got {list(colors.shape)} (N={N}, C={C})"
            )
        D = colors.shape[-1]
    else:
        if not 0 <= sh_degree <= MAX_SH_DEGREE:
            raise ValueError(f"sh_degree must be in 0..{MAX_SH_DEGREE}, got {sh_degree}")
        if not (
            (colors.dim() == 3 and colors.shape[0] == N and colors.shape[2] == 3)
            or (colors.dim() == 4 and colors.shape[:2] == (C, N) and colors.shape[3] == 3)
        ):
            raise ValueError(
                f"colors must be SH coefficients [N, K, 3] or [C, N, K, 3] when sh_degree "
                f"is set, got {list(colors.shape)} (N={N}, C={C})"
            )
        if (sh_degree + 1) ** 2 > colors.shape[-2]:
            raise ValueError(
                f"sh_degree {sh_degree} needs {(sh_degree + 1) ** 2} SH coefficients, "
                f"colors has {colors.shape[-2]}"
            )
        D = 3
    if backgrounds is not None:
        _check_shape("backgrounds", backgrounds, (C, D))


def rasterize(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [(C,) N, D] or [(C,) N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    *,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    packed: bool = False,
    tile_size: int = 16,
    backgrounds: Tensor | None = None,  # [C, D]
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    backend: str = "auto",
) -> tuple[Tensor, Tensor, dict]:
    """Rasterize N Gaussians into C images, like ``gsplat.rasterization``.

    Returns ``(render_colors [C, H, W, X], render_alphas [C, H, W, 1], info)``; X is D
    (or 3 with SH), 1 for "D"/"ED", D + 1 for "RGB+D"/"RGB+ED". ``info`` holds gsplat's
    keys: "means2d" [C, N, 2] (non-leaf; with ``absgrad`` its ``.absgrad`` is set by the
    backward pass), "radii" [C, N] int32 (0 = not rendered), "depths", "conics",
    "opacities", "width", "height", "n_cameras", "tile_size", "tile_width",
    "tile_height", "tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets",
    "camera_ids" and "gaussian_ids" (None: unpacked).

    ``backend``: "auto" (gsplat for CUDA tensors when CUDA is available, else torch),
    "gsplat" (CUDA only) or "torch" (any device; ``packed=False`` only).
    """
    _validate(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmats,
        Ks,
        width,
        height,
        sh_degree,
        tile_size,
        backgrounds,
        render_mode,
        rasterize_mode,
    )
    chosen = resolve_backend(backend, means.device)
    if chosen == "gsplat":
        return rasterize_gsplat(
            means,
            quats,
            scales,
            opacities,
            colors,
            viewmats,
            Ks,
            int(width),
            int(height),
            near_plane=near_plane,
            far_plane=far_plane,
            radius_clip=radius_clip,
            eps2d=eps2d,
            sh_degree=sh_degree,
            packed=packed,
            tile_size=tile_size,
            backgrounds=backgrounds,
            render_mode=render_mode,
            sparse_grad=sparse_grad,
            absgrad=absgrad,
            rasterize_mode=rasterize_mode,
        )
    if packed:
        raise ValueError("the torch rasterizer supports packed=False only; pass packed=False")
    # sparse_grad only acts with packed=True in gsplat, so it is a no-op here too.
    return rasterize_torch(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmats,
        Ks,
        int(width),
        int(height),
        near_plane=near_plane,
        far_plane=far_plane,
        radius_clip=radius_clip,
        eps2d=eps2d,
        sh_degree=sh_degree,
        tile_size=int(tile_size),
        backgrounds=backgrounds,
        render_mode=render_mode,
        absgrad=absgrad,
        rasterize_mode=rasterize_mode,
    )
