"""Host-to-device uploads that never make the host wait for the device's queued work.

A plain ``tensor.to(cuda)`` from host memory synchronizes the current stream (torch copies
and then waits), so every id list the step uploads would stall the host until the GPU
caught up. ``upload`` stages the host tensor in pinned memory from torch's caching host
allocator and copies without blocking; the allocator keeps that staging block until the
copy has completed, so the caller may reuse or free its host tensor at once. On the CPU it
is the tensor itself; on other devices a non-blocking copy.
"""

from __future__ import annotations

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


__all__ = ["upload"]
