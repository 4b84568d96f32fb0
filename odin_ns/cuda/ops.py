"""Dispatcher: each op runs the compiled kernel for its tensors' device, else the reference.

The extension builds lazily, on the first call for a device type (CPU library for CPU
tensors; CPU + CUDA libraries for CUDA tensors), and at most once per process. A failed
build never raises here: it warns once and the torch reference is used (same results).
``ODIN_NS_EXT=0`` forces the references; ``ODIN_NS_EXT=cpu`` compiles only the CPU kernels.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_ns.cuda import reference

OPS = (
    "footprint_cull",
    "pack_rows",
    "unpack_accumulate",
    "ready_mask",
    "selective_adam_apply",
    "validate_reads",
)


@dataclass(frozen=True)
class BackendStatus:
    """Whether compiled kernels serve a device type, and why not when they do not."""

    device_type: str
    compiled: bool
    reason: str  # empty when compiled


@functools.cache
def _load(device_type: str) -> BackendStatus:
    """Build and load the library for ``device_type`` once per process (never raises)."""
    from odin_ns.cuda import build

    if device_type == "cpu":
        loader = build.load_cpu
    elif device_type == "cuda":
        if os.environ.get("ODIN_NS_EXT") == "cpu":
            return BackendStatus(device_type, False, "ODIN_NS_EXT=cpu: CUDA kernels not built")
        loader = build.load_cuda
    else:
        return BackendStatus(device_type, False, f"no compiled kernels for {device_type}")
    try:
        loader()
    except Exception as error:  # noqa: BLE001 - any build failure falls back to references
        reason = build.summarize_error(error)
        warnings.warn(
            f"odin_ns.cuda: {device_type} kernels unavailable, using torch references ({reason})",
            RuntimeWarning,
            stacklevel=3,
        )
        return BackendStatus(device_type, False, reason)
    return BackendStatus(device_type, True, "")


def status(device_type: str = "cpu") -> BackendStatus:
    """Which implementation ops on ``device_type`` tensors use (builds on first call)."""
    if os.environ.get("ODIN_NS_EXT") == "0":
        return BackendStatus(device_type, False, "disabled by ODIN_NS_EXT=0")
    return _load(device_type)


def implementation(name: str, device: torch.device | str) -> Callable:
    """The callable ``name`` runs for tensors on ``device``: compiled op or reference."""
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; ops are {OPS}")
    if status(torch.device(device).type).compiled:
        return getattr(torch.ops.odin, name)
    return getattr(reference, name)


@torch.no_grad()
def footprint_cull(
    means2d: Tensor,  # [V, N, 2]
    radii: Tensor,  # [V, N] 3-sigma radius in pixels, <= 0: culled
    depths: Tensor,  # [V, N]
    opacities: Tensor,  # [N] activated opacity
    width: int,
    height: int,
    margin_px: float,
    near_plane: float,
    opacity_threshold: float,
) -> tuple[Tensor, Tensor]:
    """CSR (indptr [V + 1], indices [nnz]) of the primitives each view can touch."""
    fn = implementation("footprint_cull", means2d.device)
    return fn(
        means2d,
        radii,
        depths,
        opacities,
        int(width),
        int(height),
        float(margin_px),
        float(near_plane),
        float(opacity_threshold),
    )


@torch.no_grad()
def pack_rows(ids: Tensor, tensors: Sequence[Tensor]) -> Tensor:
    """[M, sum(cols)] float32 buffer of rows ``ids`` ([M] int64) of every [N, ...] tensor."""
    return implementation("pack_rows", ids.device)(ids, list(tensors))


@torch.no_grad()
def unpack_accumulate(buffer: Tensor, ids: Tensor, accum: Tensor, arrivals: Tensor) -> None:
    """In place: accum[ids] += buffer ([M, D]), arrivals[ids] += 1; repeats add each time."""
    implementation("unpack_accumulate", accum.device)(buffer, ids, accum, arrivals)


@torch.no_grad()
def ready_mask(arrivals: Tensor, expected: Tensor, blocked: Tensor) -> Tensor:
    """[N] bool: arrivals == expected & expected > 0 & ~blocked."""
    return implementation("ready_mask", arrivals.device)(arrivals, expected, blocked)


@torch.no_grad()
def selective_adam_apply(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    mask: Tensor,  # [N] bool
    versions: Tensor,  # [N] int64
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    new_version: int,
) -> None:
    """In place: Adam step on the masked rows (torch.optim.Adam arithmetic), version bump."""
    implementation("selective_adam_apply", param.device)(
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        mask,
        versions,
        float(lr),
        float(beta1),
        float(beta2),
        float(eps),
        int(step),
        int(new_version),
    )


@torch.no_grad()
def validate_reads(read_ids: Tensor, versions: Tensor, required: Tensor) -> Tensor:
    """[K] int64: the read ids whose applied version is below the required one."""
    return implementation("validate_reads", versions.device)(read_ids, versions, required)
