"""Publications that stay on the device: notices on the host, row data over device links.

The protocol of ranks that each own a GPU (DESIGN 3.13). The host decides *when* (the
plan's sizes, arrival notices, credits); the row data goes from the sender's device buffer
to a device buffer of the receiver over a ``DeviceLink`` (``odin_ns.runtime.nccl`` on GPUs,
a double that enforces NCCL's semantics in the tests) and is never staged in host memory.

NCCL's rules shape it:

- **a communicator runs its operations in order, ignores tags, and a posted receive blocks
  what follows it**: so every ordered pair of ranks gets its own two-rank channel
  (``channel(src, dst)``) on which ``src`` only sends and ``dst`` only receives, both in
  step order; the i-th send matches the i-th receive, with the plan's exact sizes. No
  operation of one direction can wait behind one of another, so no cycle of waits exists.
- **a posted receive occupies the GPU until its send arrives**: the sender posts the send,
  then sends a notice (the row count, exact to 2^48) over the host transport; the receiver posts
  the device receive only when that notice has arrived, so a receive never waits for a send
  that has not been posted.
- **NCCL must not be called from two threads**: every link call is made on the thread that
  made the first (the training loop's); another thread gets a ``RuntimeError``.
- **completion without blocking the host**: handles are polled (``is_completed()``); a
  completed receive's ``wait()`` only orders the compute stream after the copy.

Zero-row publications (a step that wrote nothing) travel as the notice alone. Credits count
the bytes of device sends not yet completed (NCCL completes a send once the peer's receive
has taken it), as the gloo transport counts its unsent host bytes.

The ddp baseline's dense all-reduce goes over the link's all-reduce (one communicator of
every rank, in step order, as DDP does); its sum arrives as ``Arrival(ALL_PEERS, ...)``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from odin_ns.runtime.errors import PeerFailure, SyncError
from odin_ns.runtime.transport import ALL_PEERS, Arrival, Transport


class Channel(NamedTuple):
    """One direction of a pair: ``src`` sends, ``dst`` receives (global ranks)."""

    src: int
    dst: int


def channel(src: int, dst: int) -> Channel:
    """The channel of publications from ``src`` to ``dst``."""
    return Channel(src, dst)


def channels_in_order(world_size: int) -> list[Channel]:
    """Every directed channel, in the one order all ranks open them. A two-rank NCCL
    communicator's set-up blocks both ranks until both have started it; opened in one
    global order, the smallest channel not yet open always has both its ranks waiting on
    it, so opening never deadlocks."""
    return [channel(a, b) for a in range(world_size) for b in range(world_size) if a != b]


# A notice is a row count as two float32 numbers (the host transports carry float32 rows):
# the count's high and low 24 bits, each exact in a float32, so counts up to 2^48 travel
# exactly (one number would round counts past 2^24 = 16.7M rows)
NOTICE_COLUMNS = 2


def notice_of(rows: int) -> Tensor:
    """The [1, 2] float32 notice of a ``rows``-row publication."""
    return torch.tensor([[float(rows >> 24), float(rows & 0xFFFFFF)]])


def rows_of(notice: Tensor) -> int:
    """The row count a notice carries (``notice_of``'s inverse)."""
    high, low = notice.reshape(-1).tolist()
    return (int(high) << 24) + int(low)


class Handle(Protocol):
    """A started device operation (``torch.distributed.Work`` on NCCL)."""

    def is_completed(self) -> bool:
        """True once the operation has finished on the device (never blocks)."""

    def wait(self) -> bool:
        """Order the current stream after the operation (after ``is_completed()``: free)."""


class DeviceLink(Protocol):
    """The backend calls of the protocol: device buffers between two ranks of a channel and
    a dense all-reduce. One instance per rank; called from one thread only."""

    def open(self, channels: list[Channel]) -> None:
        """Set up the communicators of ``channels`` (this rank's, in global order)."""

    def isend(self, ch: Channel, buf: Tensor) -> Handle:
        """Start sending ``buf`` ([M, W] float32 on the device) to ``ch.dst``."""

    def irecv(self, ch: Channel, buf: Tensor) -> Handle:
        """Start receiving ``ch.src``'s next send on ``ch`` into ``buf`` (same size)."""

    def all_reduce(self, buf: Tensor) -> Handle:
        """Start summing ``buf`` over every rank in place."""


class DeviceTransport:
    """``Transport`` over a ``DeviceLink`` for the data and a host ``Transport`` for notices.

    Args:
        rank, world_size: this rank and R.
        link: the device backend (``nccl.NcclLink`` or the tests' double).
        notices: a host transport between the same ranks (a ``P2PTransport`` on a gloo
            group) that carries the [1, 2] notices (``notice_of``).
        device: where received publications are allocated (the parameters' device).
        poll_s: how long ``take`` sleeps between polls while device operations are pending.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        link: DeviceLink,
        notices: Transport,
        device: torch.device | str,
        poll_s: float = 50e-6,
    ):
        self.rank = rank
        self.world_size = world_size
        self.link = link
        self.notices = notices
        self.device = torch.device(device)
        self.poll_s = poll_s
        self._thread = threading.get_ident()
        peers = [q for q in range(world_size) if q != rank]
        self._expected: dict[int, deque[tuple[int, int, int]]] = {q: deque() for q in peers}
        self._receiving: dict[int, deque[tuple[int, Tensor, Handle | None]]] = {
            q: deque() for q in peers
        }
        self._unsent: dict[int, deque[tuple[int, int, Handle]]] = {q: deque() for q in peers}
        self._inflight = dict.fromkeys(peers, 0)
        self._reduces: deque[tuple[int, Tensor, Handle]] = deque()
        self._failure: SyncError | None = None
        self._call(link.open, [ch for ch in channels_in_order(world_size) if rank in ch])

    # ------------------------------------------------------------ link calls
    def _call(self, fn, *args):
        """One link call, from the owning thread; a backend error becomes a PeerFailure."""
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"rank {self.rank}: device link called from a second thread; NCCL calls "
                "must all come from the training loop's thread"
            )
        try:
            return fn(*args)
        except SyncError:
            raise
        except Exception as exc:
            err = PeerFailure(self.rank, ALL_PEERS, None, f"device link failed: {exc}")
            self._failure = self._failure or err
            raise err from exc

    def _done(self, handle: Handle | None) -> bool:
        if handle is None:
            return True
        if not self._call(handle.is_completed):
            return False
        self._call(handle.wait)
        return True

    # -------------------------------------------------------------- sending
    def send(self, peer: int, step: int, tag: int, buf: Tensor) -> None:
        """Post the device send of ``buf`` ([M, W]; not modified afterwards), then notify
        ``peer`` with M on the host."""
        rows = int(buf.shape[0])
        if rows:
            handle = self._call(self.link.isend, channel(self.rank, peer), buf)
            nbytes = buf.numel() * buf.element_size()
            self._unsent[peer].append((step, nbytes, handle))
            self._inflight[peer] += nbytes
        self.notices.send(peer, step, tag, notice_of(rows))

    def all_reduce(self, step: int, buf: Tensor) -> None:
        self._reduces.append((step, buf, self._call(self.link.all_reduce, buf)))

    def _poll_sends(self) -> None:
        for peer, fifo in self._unsent.items():
            while fifo and self._done(fifo[0][2]):
                _, nbytes, _ = fifo.popleft()
                self._inflight[peer] -= nbytes

    def oldest_unsent(self) -> tuple[int, int] | None:
        self._poll_sends()
        heads = [(fifo[0][0], peer) for peer, fifo in self._unsent.items() if fifo]
        notice = self.notices.oldest_unsent()
        if notice is not None:
            heads.append((notice[1], notice[0]))
        if not heads:
            return None
        step, peer = min(heads)
        return peer, step

    def inflight_bytes(self, peer: int) -> tuple[int, int | None]:
        self._poll_sends()
        fifo = self._unsent[peer]
        return self._inflight[peer], (fifo[0][0] if fifo else None)

    # ------------------------------------------------------------ receiving
    def post_recv(self, peer: int, step: int, tag: int, rows: int, cols: int) -> None:
        """Expect ``peer``'s [rows, cols] publication of ``step``; the device receive is
        posted when its notice arrives."""
        self._expected[peer].append((step, rows, cols))
        self.notices.post_recv(peer, step, tag, 1, NOTICE_COLUMNS)

    def _on_notice(self, notice: Arrival) -> None:
        peer = notice.peer
        if not self._expected[peer]:
            raise PeerFailure(self.rank, peer, notice.step, "notice of an unexpected step")
        step, rows, cols = self._expected[peer].popleft()
        sent = rows_of(notice.buf)
        if (step, rows) != (notice.step, sent):
            err = PeerFailure(
                self.rank, peer, notice.step,
                f"publication mismatch: expected step {step} with {rows} rows, peer "
                f"announced step {notice.step} with {sent} rows",
            )  # fmt: skip
            self._failure = self._failure or err
            raise err
        buf = torch.empty(rows, cols, dtype=torch.float32, device=self.device)
        handle = self._call(self.link.irecv, channel(peer, self.rank), buf) if rows else None
        self._receiving[peer].append((step, buf, handle))

    def _pending_on_device(self) -> bool:
        return bool(self._reduces) or any(self._receiving.values())

    def _collect(self, notices: list[Arrival], out: list[Arrival]) -> None:
        for notice in notices:
            self._on_notice(notice)
        for peer, fifo in self._receiving.items():  # per peer in step order
            while fifo and self._done(fifo[0][2]):
                step, buf, _ = fifo.popleft()
                out.append(Arrival(peer, step, buf))
        while self._reduces and self._done(self._reduces[0][2]):
            step, buf, _ = self._reduces.popleft()
            out.append(Arrival(ALL_PEERS, step, buf))

    def take(self, timeout: float) -> list[Arrival]:
        """Arrivals so far (device buffers); if none, poll up to ``timeout`` s."""
        out: list[Arrival] = []
        deadline = time.monotonic() + timeout
        wait = 0.0
        while True:
            self._collect(self.notices.take(wait), out)
            remaining = deadline - time.monotonic()
            if out or self.failure() is not None or remaining <= 0:
                return out
            wait = min(remaining, self.poll_s) if self._pending_on_device() else remaining

    def failure(self) -> SyncError | None:
        return self._failure or self.notices.failure()

    def close(self) -> None:
        self.notices.close()


__all__ = [
    "Channel",
    "DeviceLink",
    "DeviceTransport",
    "Handle",
    "channel",
    "channels_in_order",
]
