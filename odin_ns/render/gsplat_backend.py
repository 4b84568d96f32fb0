"""The CUDA ("gsplat") rasterizer: gsplat's own ``rasterization``."""

from __future__ import annotations

from torch import Tensor

from odin_ns.errors import first_line


def gsplat_kernels_missing() -> str | None:
    """Why gsplat's CUDA kernels cannot run here, or None once they are loaded.

    Loading them builds them the first time: gsplat compiles its kernels with the CUDA
    toolkit (minutes, then cached), or finds nothing to compile with, says so on the console
    and goes on, so that the first render would fail with an ``AttributeError``. The
    checks call this before training (``preflight.check_rasterizer``, in ``odin-ns-train``'s
    launcher before the ranks start: one build, not one per rank racing in one folder that
    gsplat clears when it finds no library there). gsplat 1.4.0 says whether its kernels
    are there only through its private ``gsplat.cuda._backend._C`` (None: nothing to build
    them with); this is the one place that reads it (pinned by ``tests/test_gpu_paths.py``).
    """
    try:
        from gsplat.cuda._backend import _C
    except Exception as err:  # the build failed
        return f"building them failed ({first_line(err)})"
    if _C is None:
        return "gsplat found neither a built copy nor a CUDA toolkit (nvcc) to build them with"
    return None


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
