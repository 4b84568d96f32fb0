"""The NCCL backend of the device transport: the one module that needs GPUs and NCCL.

``NcclLink`` is the ``device_transport.DeviceLink`` of ranks that each own a CUDA device:
one two-rank NCCL group per direction of every pair (``channels_in_order``) and one of
every rank for ddp's dense all-reduce. What it does is four backend calls and a set-up;
the protocol around them (channels, notices, credits, completion polling) is
``device_transport``.

On GPUs it is not run by the test suite: this project's machines have no GPU. The suite
runs this very class over gloo between CPU processes (``backend="gloo"``,
``tests/test_nccl_transport.py``), which checks its group creation, its set-up order and
its calls' ranks, not NCCL's semantics; the protocol runs under those semantics over a
double (``tests/harness/nccl_double.py``). ``python -m odin_ns.cuda.gpu_check`` runs it
where a GPU is lent (one GPU cannot hold two NCCL ranks, so only its set-up and a one-rank
all-reduce run there).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.runtime.device_transport import Channel, channels_in_order

# CUDA streams torch's NCCL groups draw from, per device: each communicator takes the next
# stream of a pool of 32 (c10's kStreamsPerPool), so past 32 communicators two channels share
# a stream, and a receive queued there behind another channel's send waits until the send's
# peer receives: two ranks whose send and receive share a stream the other way round wait
# for each other for good (transport_choice refuses NCCL there)
STREAMS_PER_DEVICE = 32


def communicators_per_rank(world_size: int, transports: int) -> int:
    """NCCL communicators one rank holds: per device transport its 2 (R - 1) channels and
    the all-reduce group, and the default process group's (nerfstudio's barriers)."""
    return transports * (2 * (world_size - 1) + 1) + 1


class NcclLink:
    """Device buffers over NCCL between ranks that each own a GPU.

    Every rank creates every channel's group, in one order (``new_group`` is collective).
    ``open`` then makes each of this rank's channels carry one number, src sending and dst
    receiving, in that order. That first exchange is what sets a channel up: torch gives an
    unbatched send or receive a two-rank communicator of its own, made at the channel's
    first one (not the group's collective communicator: a warm-up all-reduce would leave it
    unmade), and NCCL connects a pair at its first exchange, each blocking both ranks until
    both have started. In one global order that cannot deadlock (the earliest channel any
    rank waits on has both its ranks there), and no set-up is left for a step: the
    protocol's first send would otherwise block its host until the peer received, and the
    peer receives only on the send's notice, which the blocked host never sends.

    Args:
        world_size: R.
        device: this rank's CUDA device (the CPU with ``backend="gloo"``: the tests).
        timeout_s: how long NCCL's watchdog lets an operation run before it ends the
            process: a send stays open until its receiver's host takes the notice, so this
            is the idle timeout the host transport allows a peer, not torch's 10 minutes.
        backend: "nccl"; "gloo" runs this same code between CPU processes.
    """

    def __init__(
        self, world_size: int, device: torch.device, timeout_s: float, backend: str = "nccl"
    ):
        self.device = device
        self.rank = dist.get_rank()
        timeout = timedelta(seconds=timeout_s)
        self.channels = {
            ch: dist.new_group(sorted(ch), backend=backend, timeout=timeout)
            for ch in channels_in_order(world_size)
        }
        self.everyone = dist.new_group(backend=backend, timeout=timeout)

    def open(self, channels: list[Channel]) -> None:
        one = torch.zeros(1, device=self.device)
        for ch in channels:  # this rank's, in the global order
            if ch.src == self.rank:
                dist.send(one, dst=ch.dst, group=self.channels[ch])
            else:
                dist.recv(one, src=ch.src, group=self.channels[ch])
            self._synchronize()  # (the exchange done before the next channel's)
        dist.all_reduce(one, group=self.everyone)
        self._synchronize()

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def isend(self, ch: Channel, buf: Tensor) -> dist.Work:
        return dist.isend(buf, dst=ch.dst, group=self.channels[ch])

    def irecv(self, ch: Channel, buf: Tensor) -> dist.Work:
        return dist.irecv(buf, src=ch.src, group=self.channels[ch])

    def all_reduce(self, buf: Tensor) -> dist.Work:
        return dist.all_reduce(buf, group=self.everyone, async_op=True)


__all__ = ["STREAMS_PER_DEVICE", "NcclLink", "communicators_per_rank"]
