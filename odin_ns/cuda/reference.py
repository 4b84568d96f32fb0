"""Pure-torch references of the ``torch.ops.odin`` ops: the specification, and the fallback.

Each function has the signature of its compiled op and the same defined behaviour:

- repeated ids: ``pack_rows`` copies a repeated row once per occurrence; ``unpack_accumulate``
  adds it once per occurrence, in id-list order (``index_add_``);
- empty id lists give empty outputs and leave in-place arguments untouched;
- bad input (shape, dtype, device, out-of-range ids) raises ValueError before anything is
  written.

They run on any device; the compiled CPU kernels match them bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check(cond: bool, op: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {message}")


def _check_ids(ids: Tensor, n: int, op: str, name: str = "ids") -> None:
    _check(ids.dim() == 1, op, f"{name} must be 1-D, got shape {list(ids.shape)}")
    _check(ids.dtype == torch.int64, op, f"{name} must be torch.int64, got {ids.dtype}")
    if ids.numel() == 0:
        return
    lo, hi = (int(x) for x in torch.stack(torch.aminmax(ids)).tolist())
    _check(
        lo >= 0 and hi < n,
        op,
        f"{name} out of range: values span [{lo}, {hi}] but must lie in [0, {n})",
    )


def _check_same_device(op: str, device: torch.device, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        _check(
            t.device == device, op, f"{name} is on {t.device} but the other inputs are on {device}"
        )


def footprint_cull(
    means2d: Tensor,  # [V, N, 2] projected centres, pixels
    radii: Tensor,  # [V, N] 3-sigma radius, pixels; <= 0 means culled by the projection
    depths: Tensor,  # [V, N] camera-space depth
    opacities: Tensor,  # [N] activated opacity
    width: int,
    height: int,
    margin_px: float,
    near_plane: float,
    opacity_threshold: float,
) -> tuple[Tensor, Tensor]:
    """Views x primitives CSR of the primitives each view can touch.

    Kept: radius > 0, depth > near_plane, opacity >= opacity_threshold, a finite centre,
    and the disc of radius ``radius + margin_px`` meets the image ``[0, W] x [0, H]``
    (squared distance from the centre to the rectangle < r^2). Computed in float32.

    Returns:
        indptr: [V + 1] int64; indices: [nnz] int64, ascending within each view.
    """
    op = "footprint_cull"
    _check(
        means2d.dim() == 3 and means2d.shape[2] == 2,
        op,
        f"means2d must have shape [V, N, 2], got {list(means2d.shape)}",
    )
    V, N = means2d.shape[0], means2d.shape[1]
    for name, t, shape in (
        ("radii", radii, [V, N]),
        ("depths", depths, [V, N]),
        ("opacities", opacities, [N]),
    ):
        _check(list(t.shape) == shape, op, f"{name} must have shape {shape}, got {list(t.shape)}")
    _check_same_device(op, means2d.device, radii=radii, depths=depths, opacities=opacities)
    for name, t in (
        ("means2d", means2d),
        ("radii", radii),
        ("depths", depths),
        ("opacities", opacities),
    ):
        _check(
            t.dtype != torch.bool and not t.is_complex(),
            op,
            f"{name} must be real-valued, got {t.dtype}",
        )
    _check(
        width > 0 and height > 0, op, f"width and height must be positive, got {width} x {height}"
    )
    _check(margin_px >= 0, op, f"margin_px must be >= 0, got {margin_px}")

    xy = means2d.float()
    x, y = xy[..., 0], xy[..., 1]
    radii, depths, opacities = radii.float(), depths.float(), opacities.float()
    r = radii + margin_px
    dx = torch.clamp_min(torch.maximum(-x, x - width), 0.0)
    dy = torch.clamp_min(torch.maximum(-y, y - height), 0.0)
    keep = (
        (radii > 0)
        & (depths > near_plane)
        & (opacities >= opacity_threshold)[None, :]
        & torch.isfinite(x)
        & torch.isfinite(y)
        & (dx * dx + dy * dy < r * r)
    )
    counts = keep.sum(dim=1)
    indptr = torch.zeros(V + 1, dtype=torch.int64, device=means2d.device)
    indptr[1:] = torch.cumsum(counts, dim=0)
    indices = keep.nonzero()[:, 1].contiguous()
    return indptr, indices


def pack_rows(
    ids: Tensor,  # [M] int64 row ids
    tensors: list[Tensor],  # K tensors of shape [N, ...], floating point
) -> Tensor:
    """Gather rows ``ids`` of every tensor into one [M, sum(cols)] float32 send buffer."""
    op = "pack_rows"
    _check(len(tensors) > 0, op, "tensors must not be empty")
    _check(
        tensors[0].dim() >= 1,
        op,
        f"tensors[0] must have shape [N, ...], got {list(tensors[0].shape)}",
    )
    N = tensors[0].shape[0]
    for k, t in enumerate(tensors):
        _check(
            t.dim() >= 1 and t.shape[0] == N,
            op,
            f"tensors[{k}] must have shape [N, ...] with N = {N}, got {list(t.shape)}",
        )
        _check(
            t.is_floating_point(),
            op,
            f"tensors[{k}] must be a floating-point tensor, got {t.dtype}",
        )
        _check(
            t.device == ids.device, op, f"tensors[{k}] is on {t.device} but ids is on {ids.device}"
        )
    _check_ids(ids, N, op)
    return torch.cat([t.reshape(N, math.prod(t.shape[1:]))[ids].float() for t in tensors], dim=1)


def unpack_accumulate(
    buffer: Tensor,  # [M, D] float32 received rows
    ids: Tensor,  # [M] int64 destination rows
    accum: Tensor,  # [N, D] float32, updated in place
    arrivals: Tensor,  # [N] int32, updated in place
) -> None:
    """``accum[ids] += buffer`` and ``arrivals[ids] += 1``; repeated ids add once each."""
    op = "unpack_accumulate"
    _check(accum.dim() == 2, op, f"accum must have shape [N, D], got {list(accum.shape)}")
    N, D = accum.shape
    _check(ids.dim() == 1, op, f"ids must be 1-D, got shape {list(ids.shape)}")
    M = ids.shape[0]
    _check(
        list(buffer.shape) == [M, D],
        op,
        f"buffer must have shape [{M}, {D}], got {list(buffer.shape)}",
    )
    _check(
        list(arrivals.shape) == [N],
        op,
        f"arrivals must have shape [{N}], got {list(arrivals.shape)}",
    )
    for name, t, dtype in (
        ("buffer", buffer, torch.float32),
        ("accum", accum, torch.float32),
        ("arrivals", arrivals, torch.int32),
    ):
        _check(t.dtype == dtype, op, f"{name} must be {dtype}, got {t.dtype}")
    _check_same_device(op, accum.device, buffer=buffer, ids=ids, arrivals=arrivals)
    _check(accum.is_contiguous(), op, "accum must be contiguous (it is updated in place)")
    _check(arrivals.is_contiguous(), op, "arrivals must be contiguous (it is updated in place)")
    _check_ids(ids, N, op)
    if M == 0:
        return
    accum.index_add_(0, ids, buffer)
    arrivals.index_add_(0, ids, torch.ones(M, dtype=torch.int32, device=ids.device))


def ready_mask(
    arrivals: Tensor,  # [N] int32 contributions received for the pending step
    expected: Tensor,  # [N] int32 contributions that step needs (0: none pending)
    blocked: Tensor,  # [N] bool an earlier update of the primitive is still pending
) -> Tensor:
    """[N] bool: rows whose update is complete and may be applied now (in version order)."""
    op = "ready_mask"
    _check(arrivals.dim() == 1, op, f"arrivals must have shape [N], got {list(arrivals.shape)}")
    N = arrivals.shape[0]
    for name, t, dtype in (
        ("arrivals", arrivals, torch.int32),
        ("expected", expected, torch.int32),
        ("blocked", blocked, torch.bool),
    ):
        _check(list(t.shape) == [N], op, f"{name} must have shape [{N}], got {list(t.shape)}")
        _check(t.dtype == dtype, op, f"{name} must be {dtype}, got {t.dtype}")
    _check_same_device(op, arrivals.device, expected=expected, blocked=blocked)
    return (arrivals == expected) & (expected > 0) & ~blocked


@torch.no_grad()
def selective_adam_apply(
    param: Tensor,  # [N, ...] updated in place
    grad: Tensor,  # [N, ...]
    exp_avg: Tensor,  # [N, ...] updated in place
    exp_avg_sq: Tensor,  # [N, ...] updated in place
    mask: Tensor,  # [N] bool rows to update
    versions: Tensor,  # [N] int64, masked rows set to new_version
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    new_version: int,
) -> None:
    """Fused selective Adam on the masked rows plus version bump; other rows untouched.

    The arithmetic is ``odin_ns.optim.selective_adam_update_`` (torch.optim.Adam's
    single-tensor step), so every path of the project computes the same bits.
    """
    from odin_ns.optim import selective_adam_update_

    op = "selective_adam_apply"
    _check(param.dim() >= 1, op, f"param must have shape [N, ...], got {list(param.shape)}")
    _check(
        param.dtype in (torch.float32, torch.float64),
        op,
        f"param must be float32 or float64, got {param.dtype}",
    )
    N = param.shape[0]
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        _check(
            t.shape == param.shape,
            op,
            f"{name} must have shape {list(param.shape)} like param, got {list(t.shape)}",
        )
        _check(t.dtype == param.dtype, op, f"{name} must be {param.dtype}, got {t.dtype}")
    for name, t, dtype in (("mask", mask, torch.bool), ("versions", versions, torch.int64)):
        _check(list(t.shape) == [N], op, f"{name} must have shape [{N}], got {list(t.shape)}")
        _check(t.dtype == dtype, op, f"{name} must be {dtype}, got {t.dtype}")
    _check_same_device(
        op,
        param.device,
        grad=grad,
        exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq,
        mask=mask,
        versions=versions,
    )
    for name, t in (
        ("param", param),
        ("exp_avg", exp_avg),
        ("exp_avg_sq", exp_avg_sq),
        ("versions", versions),
    ):
        _check(t.is_contiguous(), op, f"{name} must be contiguous (it is updated in place)")
    _check(step >= 1, op, f"step is the 1-based bias-correction count, got {step}")
    _check(
        0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0,
        op,
        f"betas must lie in [0, 1), got ({beta1}, {beta2})",
    )
    rows = mask.nonzero().squeeze(-1)
    if rows.numel() > 0 and param.numel() > 0:
        selective_adam_update_(param, grad, exp_avg, exp_avg_sq, rows, lr, beta1, beta2, eps, step)
    versions.masked_fill_(mask, new_version)


def validate_reads(
    read_ids: Tensor,  # [M] int64 primitives a step is about to read
    versions: Tensor,  # [N] int64 last applied version per primitive
    required: Tensor,  # [M] int64 version each read needs
) -> Tensor:
    """[K] int64: the read ids whose version is below the required one, in read order."""
    op = "validate_reads"
    _check(versions.dim() == 1, op, f"versions must have shape [N], got {list(versions.shape)}")
    _check(read_ids.dim() == 1, op, f"read_ids must be 1-D, got shape {list(read_ids.shape)}")
    M = read_ids.shape[0]
    _check(
        list(required.shape) == [M],
        op,
        f"required must have shape [{M}], got {list(required.shape)}",
    )
    _check(versions.dtype == torch.int64, op, f"versions must be torch.int64, got {versions.dtype}")
    _check(required.dtype == torch.int64, op, f"required must be torch.int64, got {required.dtype}")
    _check_same_device(op, versions.device, read_ids=read_ids, required=required)
    _check_ids(read_ids, versions.shape[0], op, "read_ids")
    return read_ids[versions[read_ids] < required]
