"""Point-to-point transport of publications over ``torch.distributed``.

Why threads: gloo's ``isend``/``irecv`` works never report ``is_completed()`` before
``wait()`` is called, and a ``wait(timeout)`` that times out closes the connection to the
peer. So non-blocking progress cannot poll. Instead one thread per peer posts the receives
the engine allows (FIFO, exact sizes) and blocks in ``wait()`` (which releases the GIL), and
one thread per peer waits for the sends to that peer to complete so their buffers can be
freed. A gloo send completes only once the peer has posted the matching receive, so the
bytes of incomplete sends to a peer (``inflight_bytes``) are what a rank running ahead of
that peer holds; the engine caps them (credits, ``SyncConfig.max_inflight_bytes``). The
threads only move buffers; all tensor math stays on the caller's thread. The engine's own deadlines
(``SyncConfig.timeout_s``) are Python-level waits on a condition, so a slow peer raises
``SyncTimeout`` without touching gloo, and a crashed peer (closed socket) surfaces at once
as ``PeerFailure``.

A ``Transport`` is anything with the methods of ``P2PTransport``; tests use an in-process
loopback (``tests/harness``). The ddp mode uses the transport's ``all_reduce`` instead of
point-to-point messages; its result arrives as one ``Arrival`` with ``peer == ALL_PEERS``.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.runtime.errors import PeerFailure, SyncError

ALL_PEERS = -1  # Arrival.peer of an all-reduced (summed over every rank) buffer


def has_credits(inflight: int, nbytes: int, cap: int) -> bool:
    """The credit rule: ``nbytes`` more may go to a peer with ``inflight`` bytes not yet
    taken if they fit under ``cap``, or if nothing is in flight (one message always goes,
    however large)."""
    return inflight == 0 or inflight + nbytes <= cap


@dataclass
class Arrival:
    """A received publication: ``buf`` is peer ``peer``'s [M, D + 1] buffer for ``step``
    (``peer == ALL_PEERS``: the all-reduce of every rank's [N, D + 1] buffer)."""

    peer: int
    step: int
    buf: Tensor


class Transport(Protocol):
    """What the engine needs from a transport (steps are global steps)."""

    def post_recv(self, peer: int, step: int, tag: int, rows: int, cols: int) -> None:
        """Allow receiving ``peer``'s [rows, cols] publication of ``step`` (FIFO per peer)."""

    def send(self, peer: int, step: int, tag: int, buf: Tensor) -> None:
        """Start sending ``buf`` to ``peer``; ``buf`` must not be modified afterwards."""

    def all_reduce(self, step: int, buf: Tensor) -> None:
        """Start summing ``buf`` over every rank in place (all ranks, in step order); the
        sum arrives as ``Arrival(ALL_PEERS, step, buf)``."""

    def take(self, timeout: float) -> list[Arrival]:
        """Arrivals so far; if none, block up to ``timeout`` s for any event first."""

    def oldest_unsent(self) -> tuple[int, int] | None:
        """(peer, step) of the oldest send not yet completed, or None."""

    def inflight_bytes(self, peer: int) -> tuple[int, int | None]:
        """(bytes of the sends to ``peer`` not yet completed, step of the oldest one)."""

    def failure(self) -> SyncError | None:
        """The first transport failure, if any."""

    def close(self) -> None:
        """Stop background work (after a drain)."""


class P2PTransport:
    """``torch.distributed`` isend/irecv transport over gloo.

    Buffers travel on the CPU (gloo's point-to-point is CPU-only): a CUDA publication is
    copied to the host before sending, and arrivals are CPU tensors the engine moves to the
    parameters' device. On GPU machines pass a gloo group (``dist.new_group(backend=
    "gloo")``). A NCCL group is refused: a communicator runs its operations in order, so a
    receive posted for a slow peer would block every later send; NCCL has a transport of
    its own: ``device_transport`` over ``nccl.NcclLink``).

    Args:
        rank, world_size: this process's rank and the world size in ``group``.
        group: process group (None: the default group). A dedicated group keeps the
            publication tags apart from other point-to-point traffic.
        idle_timeout_s: how long a background wait may last; a gloo wait that times out
            closes the connection, so this is a last resort (the engine's deadlines are
            shorter and fire first).
        pin_receives: receive into pinned host memory (parameters on CUDA: the arrival
            then goes to the device without the host waiting for the stream).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None = None,
        idle_timeout_s: float = 1800.0,
        pin_receives: bool = False,
    ):
        backend = str(dist.get_backend(group))
        if "gloo" not in backend:
            raise NotImplementedError(
                f"P2PTransport needs a gloo process group, got backend {backend!r}; create one "
                "with torch.distributed.new_group(backend='gloo')"
            )
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self._pin = pin_receives
        self._idle = timedelta(seconds=idle_timeout_s)
        self._last_copy: tuple[Tensor, Tensor] | None = None  # (device buffer, host copy)
        self._cond = threading.Condition()
        self._inbox: list[Arrival] = []
        self._events = 0
        self._failure: SyncError | None = None
        self._unsent: dict[int, deque[tuple[int, int]]] = {}  # peer -> (step, bytes) FIFO
        self._inflight: dict[int, int] = {}  # peer -> bytes of incomplete sends
        self._specs: dict[int, queue.SimpleQueue] = {}
        self._sends: dict[int, queue.SimpleQueue] = {}
        self._reduces: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        for peer in range(world_size):
            if peer == rank:
                continue
            self._specs[peer] = queue.SimpleQueue()
            self._sends[peer] = queue.SimpleQueue()
            self._unsent[peer] = deque()
            self._inflight[peer] = 0
            self._threads.append(
                threading.Thread(
                    target=self._recv_loop, args=(peer,), name=f"odin-recv-{peer}", daemon=True
                )
            )
            self._threads.append(
                threading.Thread(
                    target=self._send_loop, args=(peer,), name=f"odin-send-{peer}", daemon=True
                )
            )
        self._threads.append(
            threading.Thread(target=self._reduce_loop, name="odin-reduce", daemon=True)
        )
        for th in self._threads:
            th.start()

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def _notify(self, arrival: Arrival | None = None) -> None:
        with self._cond:
            if arrival is not None:
                self._inbox.append(arrival)
            self._events += 1
            self._cond.notify_all()

    def _fail(self, err: SyncError) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = err
            self._events += 1
            self._cond.notify_all()

    def _recv_loop(self, peer: int) -> None:
        specs = self._specs[peer]
        src = self._global(peer)
        posted: deque[tuple[int, Tensor, dist.Work]] = deque()
        step = None
        try:
            while True:
                block = not posted
                while True:
                    try:
                        spec = specs.get(block=block)
                    except queue.Empty:
                        break
                    if spec is None:
                        return
                    step, tag, rows, cols = spec
                    buf = torch.empty(rows, cols, dtype=torch.float32, pin_memory=self._pin)
                    posted.append((step, buf, dist.irecv(buf, src=src, group=self.group, tag=tag)))
                    block = False
                step, buf, work = posted.popleft()
                work.wait(self._idle)
                self._notify(Arrival(peer, step, buf))
        except Exception as exc:  # the peer died or the connection broke
            self._fail(PeerFailure(self.rank, peer, step, f"receive failed: {exc}"))

    def _send_loop(self, peer: int) -> None:
        sends = self._sends[peer]
        while True:
            item = sends.get()
            if item is None:
                return
            step, nbytes, work = item
            try:
                work.wait(self._idle)
            except Exception as exc:
                self._fail(PeerFailure(self.rank, peer, step, f"send failed: {exc}"))
                return
            with self._cond:
                self._unsent[peer].popleft()
                self._inflight[peer] -= nbytes
                self._events += 1
                self._cond.notify_all()

    def _reduce_loop(self) -> None:
        while True:
            item = self._reduces.get()
            if item is None:
                return
            step, buf, work = item
            try:
                work.wait(self._idle)
            except Exception as exc:
                self._fail(PeerFailure(self.rank, ALL_PEERS, step, f"all-reduce failed: {exc}"))
                return
            self._notify(Arrival(ALL_PEERS, step, buf))

    def post_recv(self, peer: int, step: int, tag: int, rows: int, cols: int) -> None:
        self._specs[peer].put((step, tag, rows, cols))

    def all_reduce(self, step: int, buf: Tensor) -> None:
        buf = buf.cpu()
        try:
            work = dist.all_reduce(buf, group=self.group, async_op=True)
        except Exception as exc:
            err = PeerFailure(self.rank, ALL_PEERS, step, f"all-reduce failed: {exc}")
            self._fail(err)
            raise err from exc
        self._reduces.put((step, buf, work))

    def send(self, peer: int, step: int, tag: int, buf: Tensor) -> None:
        buf = self._host(buf)
        try:
            work = dist.isend(buf, dst=self._global(peer), group=self.group, tag=tag)
        except Exception as exc:
            err = PeerFailure(self.rank, peer, step, f"send failed: {exc}")
            self._fail(err)
            raise err from exc
        nbytes = buf.numel() * buf.element_size()
        with self._cond:
            self._unsent[peer].append((step, nbytes))
            self._inflight[peer] += nbytes
        self._sends[peer].put((step, nbytes, work))

    def _host(self, buf: Tensor) -> Tensor:
        """``buf`` in host memory: a device buffer copied once however many peers it is
        sent to (the engine sends one publication to each of its owners in turn, and a sent
        buffer is never modified); a host buffer as it is."""
        if buf.device.type == "cpu":
            return buf
        if self._last_copy is None or self._last_copy[0] is not buf:
            self._last_copy = (buf, buf.cpu())
        return self._last_copy[1]

    def take(self, timeout: float) -> list[Arrival]:
        with self._cond:
            if not self._inbox and self._failure is None and timeout > 0:
                events = self._events
                self._cond.wait_for(lambda: self._events != events, timeout)
            items, self._inbox = self._inbox, []
        return items

    def oldest_unsent(self) -> tuple[int, int] | None:
        with self._cond:
            heads = [(fifo[0][0], peer) for peer, fifo in self._unsent.items() if fifo]
        if not heads:
            return None
        step, peer = min(heads)
        return peer, step

    def inflight_bytes(self, peer: int) -> tuple[int, int | None]:
        with self._cond:
            fifo = self._unsent[peer]
            return self._inflight[peer], (fifo[0][0] if fifo else None)

    def failure(self) -> SyncError | None:
        with self._cond:
            return self._failure

    def close(self) -> None:
        """Stop the threads. Threads still blocked in a wait (undrained) are left, as daemons."""
        for specs in self._specs.values():
            specs.put(None)
        for sends in self._sends.values():
            sends.put(None)
        self._reduces.put(None)
        for th in self._threads:
            th.join(timeout=1.0)
