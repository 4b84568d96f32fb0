"""View-dependent colors from spherical harmonics, gsplat's convention.

Same real SH basis and constants as gsplat (``_eval_sh_bases_fast``, Sloan 2013), written
as a list of per-basis tensors instead of in-place slice writes, which keeps autograd's
backward cheap on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sh_bases(degree: int, dirs: Tensor) -> list[Tensor]:
    """The (degree + 1)^2 SH bases at unit directions ``dirs`` [..., 3], each [...]."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, 0.2820947917738781)]
    if degree < 1:
        return out
    a = -0.48860251190292
    out += [a * y, -a * z, a * x]
    if degree < 2:
        return out
    z2 = z * z
    fb = -1.092548430592079 * z
    fa = 0.5462742152960395
    c1 = x * x - y * y
    s1 = 2 * x * y
    p6 = 0.9461746957575601 * z2 - 0.3153915652525201
    out += [fa * s1, fb * y, p6, fb * x, fa * c1]
    if degree < 3:
        return out
    fc = -2.285228997322329 * z2 + 0.4570457994644658
    fb = 1.445305721320277 * z
    fa = -0.5900435899266435
    c2 = x * c1 - y * s1
    s2 = x * s1 + y * c1
    out += [
        fa * s2,
        fb * s1,
        fc * y,
        z * (1.865881662950577 * z2 - 1.119528997770346),
        fc * x,
        fb * c1,
        fa * c2,
    ]
    if degree < 4:
        return out
    fd = z * (-4.683325804901025 * z2 + 2.007139630671868)
    fc = 3.31161143515146 * z2 - 0.47308734787878
    fb = -1.770130769779931 * z
    fa = 0.6258357354491763
    c3 = x * c2 - y * s2
    s3 = x * s2 + y * c2
    p20 = (
        1.984313483298443 * z2 * (1.865881662950577 * z2 - 1.119528997770346)
        + -1.006230589874905 * p6
    )
    out += [fa * s3, fb * s2, fc * s1, fd * y, p20, fd * x, fc * c1, fb * c2, fa * c3]
    return out


def sh_to_color(
    degree: int,
    dirs: Tensor,  # [C, N, 3] (any length; normalized here)
    coeffs: Tensor,  # [N, K, 3] or [C, N, K, 3]
) -> Tensor:
    """Evaluate the first (degree + 1)^2 bands. Returns [C, N, 3] (no +0.5 offset)."""
    dirs = F.normalize(dirs, p=2, dim=-1)
    bases = torch.stack(sh_bases(degree, dirs), dim=-1)  # [C, N, B]
    used = coeffs[..., : bases.shape[-1], :]
    if used.dim() == 3:
        used = used[None]
    return (bases[..., None] * used).sum(-2)
