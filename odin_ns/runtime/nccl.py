"""The NCCL backend of the device transport: the one module that needs GPUs and NCCL.

``NcclLink`` is the ``device_transport.DeviceLink`` of ranks that each own a CUDA device:
one two-rank NCCL communicator per direction of every pair (``channels_in_order``) and one
of every rank for ddp's dense all-reduce. What it does is four backend calls; the protocol
around them (channels, notices, credits, completion polling) is ``device_transport``.

Not run by the test suite: this project's machines have no GPU. The protocol runs in the
tests over a double that enforces NCCL's semantics (``tests/harness/nccl_double.py``), and
``python -m odin_ns.cuda.gpu_check`` runs this module where a GPU is lent (one GPU cannot
hold two NCCL ranks, so only its set-up and a one-rank all-reduce run there).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.runtime.device_transport import Channel, channels_in_order


class NcclLink:
    """Device buffers over NCCL between ranks that each own a GPU.

    Every rank creates every channel's group, in one order (``new_group`` is collective);
    ``open`` then sets up this rank's communicators in that order with a one-number
    all-reduce each (a communicator's set-up blocks both its ranks until both have started
    it; in one global order that cannot deadlock), so no set-up happens inside a step.

    Args:
        world_size: R.
        device: this rank's CUDA device.
    """

    def __init__(self, world_size: int, device: torch.device):
        self.device = device
        self.channels = {
            ch: dist.new_group(sorted(ch), backend="nccl") for ch in channels_in_order(world_size)
        }
        self.everyone = dist.new_group(backend="nccl")

    def open(self, channels: list[Channel]) -> None:
        one = torch.zeros(1, device=self.device)
        for ch in channels:
            dist.all_reduce(one, group=self.channels[ch])
        dist.all_reduce(one, group=self.everyone)
        torch.cuda.synchronize(self.device)

    def isend(self, ch: Channel, buf: Tensor) -> dist.Work:
        return dist.isend(buf, dst=ch.dst, group=self.channels[ch])

    def irecv(self, ch: Channel, buf: Tensor) -> dist.Work:
        return dist.irecv(buf, src=ch.src, group=self.channels[ch])

    def all_reduce(self, buf: Tensor) -> dist.Work:
        return dist.all_reduce(buf, group=self.everyone, async_op=True)


__all__ = ["NcclLink"]
