"""Host-to-device uploads that never make the host wait for the device's queued work.

A plain ``tensor.to(cuda)`` from host memory synchronizes the current stream (torch copies
and then waits), so every id list the step uploads would stall the host until the GPU
caught up. ``upload`` stages the host tensor in pinned memory from torch's caching host
allocator and copies without blocking; the allocator keeps that staging block until the
copy has completed, so the caller may reuse or free its host tensor at once. On the CPU it
is the tensor itself; on other devices a non-blocking copy. ``upload_together`` moves
several lists in one copy (one staging block, one copy launched) and hands back a view of
each.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def upload(host: Tensor, device: torch.device) -> Tensor:
    """``host`` (a CPU tensor) on ``device``, without waiting for the device (a tensor
    already on ``device`` is returned as it is)."""
    device = torch.device(device)
    if host.device.type == device.type:
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def upload_together(parts: Sequence[Tensor], device: torch.device) -> list[Tensor]:
    """Each of ``parts`` (1-D CPU tensors of one dtype) on ``device``, moved in one copy
    without waiting for the device: views of one device buffer, in order. On the CPU the
    parts themselves."""
    device = torch.device(device)
    if device.type == "cpu" or not parts:
        return list(parts)
    sizes = [p.numel() for p in parts]
    if device.type == "cuda":  # staged straight into pinned memory: one host copy
        staged = torch.empty(sum(sizes), dtype=parts[0].dtype, pin_memory=True)
        torch.cat(parts, out=staged)
    else:
        staged = torch.cat(parts)
    return list(staged.to(device, non_blocking=True).split(sizes))


__all__ = ["upload", "upload_together"]
