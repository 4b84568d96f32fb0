"""Publications: pack this rank's rows, move them over the transport, file arrivals.

Two exchanges, picked once from the gate:
- ``SparseExchange`` (barrier, quality-first, throughput-first): rank r's publication of
  step t is its footprint's rows ``[M, W]``, sent to every peer; receives are posted per
  peer in step order with the plan's exact sizes (``message_rows``). Every rank publishes
  every step, also with an empty footprint (a zero-row message still says "rank q is past
  step t"), so receives per peer are FIFO.
- ``DenseExchange`` (ddp): every step one all-reduce of the dense ``[N, W]`` buffer (every
  gradient row plus the visible flags); the sum arrives once for all peers.

Layout of a buffer: groups' flattened gradient columns in order, then the visible flag.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.runtime.transport import ALL_PEERS, Arrival, Transport
from odin_ns.runtime.update_log import UpdateLog
from odin_ns.runtime.uploads import upload

TAG_MODULUS = 1 << 30


class WireBuffers:
    """Host buffers for the wire copy of this rank's publications.

    A CPU replica packs straight into host memory and sends that buffer (no copy), and so
    does a transport that sends device buffers (``Transport.device_resident``). On an
    accelerator with a host transport (or with ``force``), ``depth`` buffers of
    ``[max_rows, W]`` are allocated at bind time (pinned on CUDA) and used round robin; slot
    ``t % depth`` is reused only when the caller says its previous send completed, else a
    fresh (pinned) buffer is taken.

    Args:
        max_rows: most rows of one publication in the bound plan.
        width: W.
        device: the parameters' device.
        host_transport: the transport sends from host memory.
        depth: ring size.
        force: use the ring on a CPU replica too (tests).
    """

    def __init__(
        self,
        max_rows: int,
        width: int,
        device,
        host_transport: bool = True,
        depth: int = 4,
        force: bool = False,
    ):
        self.enabled = (torch.device(device).type != "cpu" and host_transport) or force
        self.pin = torch.device(device).type == "cuda"
        self.depth = depth
        self.max_rows = max_rows
        self.slots = (
            [torch.empty(max_rows, width, pin_memory=self.pin) for _ in range(depth)]
            if self.enabled
            else []
        )

    def host_copy(self, t: int, buf: Tensor, slot_free: bool) -> Tensor:
        """``buf`` ([M, W] float32) on the host, for local step t."""
        if not self.enabled:
            return buf
        if slot_free and buf.shape[0] <= self.max_rows:
            out = self.slots[t % self.depth][: buf.shape[0]]
        else:
            out = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=self.pin)
        out.copy_(buf)  # blocking: gloo reads it from another thread
        return out


class SparseExchange:
    """Point-to-point publications of footprint rows (see the module docstring).

    Args:
        transport: None for a single rank.
        rank, world_size: this rank and R.
        width: W.
        message_rows: [T, R] int64 the plan's publication sizes.
        step_offset: global step of local step 0.
        recv_ahead: ``SyncConfig.recv_ahead``.
        device: the parameters' device.
    """

    def __init__(
        self,
        transport: Transport | None,
        rank: int,
        world_size: int,
        width: int,
        message_rows: np.ndarray,
        step_offset: int,
        recv_ahead: int,
        device,
    ):
        self.transport = transport
        self.rank = rank
        self.world_size = world_size
        self.width = width
        self.message_rows = message_rows
        self.num_steps = message_rows.shape[0]
        self.step_offset = step_offset
        self.recv_ahead = recv_ahead
        self.device = device
        self.recv_done = [-1] * world_size  # per peer: received local steps <= this
        self.posted = [-1] * world_size  # per peer: receives posted up to
        mine = message_rows[:, rank] if self.num_steps else np.zeros(1, dtype=np.int64)
        self.host_transport = transport is not None and not transport.device_resident
        self.wire = WireBuffers(int(mine.max(initial=0)), width, device, self.host_transport)

    def _tag(self, t: int) -> int:
        return (self.step_offset + t) % TAG_MODULUS

    def post_receives(self, t: int) -> None:
        """Allow receiving every peer's publications up to local t + recv_ahead."""
        if self.transport is None:
            return
        limit = min(t + self.recv_ahead, self.num_steps - 1)
        for q in range(self.world_size):
            if q == self.rank:
                continue
            for s in range(self.posted[q] + 1, limit + 1):
                rows = int(self.message_rows[s, q])
                self.transport.post_recv(q, self.step_offset + s, self._tag(s), rows, self.width)
            self.posted[q] = max(self.posted[q], limit)

    def pack(self, t: int, reads: Tensor, columns: list[Tensor]) -> tuple[Tensor, Tensor]:
        """(buffer on the device, its host wire copy) of local step t's publication.

        Args:
            reads: [M] int64 footprint of this rank at t, on the parameters' device.
            columns: per group [N, d_g] gradient, then the [N, 1] visible flag.
        """
        buf = ops.pack_rows(reads, columns)
        if self.transport is None:
            return buf, buf
        slot_free = True
        if self.wire.enabled:
            unsent = self.transport.oldest_unsent()
            slot_free = unsent is None or unsent[1] > self.step_offset + t - self.wire.depth
        return buf, self.wire.host_copy(t, buf, slot_free)

    def send(self, t: int, buf: Tensor, wire: Tensor, log: UpdateLog) -> int:
        """Send the wire copy to every peer, file the own contribution; returns bytes sent."""
        sent = 0
        if self.transport is not None:
            for q in range(self.world_size):
                if q != self.rank:
                    self.transport.send(q, self.step_offset + t, self._tag(t), wire)
                    sent += wire.numel() * wire.element_size()
        log.add(t, self.rank, buf)
        return sent

    def absorb(self, arrival: Arrival, log: UpdateLog, gate) -> int:
        """File one arrived publication; returns its bytes."""
        s = arrival.step - self.step_offset
        if s != self.recv_done[arrival.peer] + 1:
            raise RuntimeError(
                f"rank {self.rank}: publication of step {arrival.step} from peer "
                f"{arrival.peer} out of order"
            )
        rec = log.record(s)
        buf = upload(arrival.buf, self.device)  # a host transport's arrivals are host buffers
        gate.observe(arrival.peer, rec.footprints[arrival.peer], buf)
        log.add(s, arrival.peer, buf)
        self.recv_done[arrival.peer] = s
        return arrival.buf.numel() * arrival.buf.element_size()


class DenseExchange(SparseExchange):
    """Dense all-reduce publications (ddp): one ``[N, W]`` sum per step for all peers."""

    def __init__(self, transport, rank, world_size, width, num_rows: int, step_offset, device):
        super().__init__(
            transport,
            rank,
            world_size,
            width,
            np.zeros((0, world_size), dtype=np.int64),
            step_offset,
            0,
            device,
        )
        self.all_rows = torch.arange(num_rows, device=device)  # [N]
        self.wire = WireBuffers(num_rows, width, device, self.host_transport, depth=1)

    def post_receives(self, t: int) -> None:
        """Nothing to post: the all-reduce of each step is started by ``send``."""

    def pack(self, t, reads, columns):
        # Every row, but only this rank's footprint rows carry its contribution: a gradient
        # on a row the rank did not draw (MCMC's opacity / scale regularisers reach every
        # row) is no rank's publication in any mode, so the sum is barrier's exactly.
        buf = torch.zeros(self.all_rows.numel(), self.width, device=reads.device)  # [N, W]
        buf[reads] = ops.pack_rows(reads, columns)
        if self.transport is None:
            return buf, buf
        # The gate waited for step t - 1's sum, so the one slot is free.
        return buf, self.wire.host_copy(0, buf, True)

    def send(self, t, buf, wire, log):
        if self.transport is None:
            log.add_sum(t, buf)
            return 0
        self.transport.all_reduce(self.step_offset + t, wire)
        return wire.numel() * wire.element_size()

    def absorb(self, arrival, log, gate):
        s = arrival.step - self.step_offset
        peers = [q for q in range(self.world_size) if q != self.rank]
        if arrival.peer != ALL_PEERS or any(self.recv_done[q] + 1 != s for q in peers):
            raise RuntimeError(f"rank {self.rank}: all-reduce of step {arrival.step} out of order")
        log.add_sum(s, upload(arrival.buf, self.device))
        for q in peers:
            self.recv_done[q] = s
        return arrival.buf.numel() * arrival.buf.element_size()


__all__ = ["TAG_MODULUS", "DenseExchange", "SparseExchange", "WireBuffers"]
