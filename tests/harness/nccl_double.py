"""A double of NCCL for the device transport's protocol, on CPU tensors in one process.

Imported as ``harness.nccl_double``. ``NcclDouble`` stands in for the communicators of R
ranks (threads); ``DoubleLink`` is one rank's ``device_transport.DeviceLink`` over it, so
the tests run the very protocol code (``DeviceTransport``) that ``runtime.nccl.NcclLink``
serves on GPUs; only the four backend calls differ. What it enforces:

- **one in-order stream per communicator and rank**: an operation starts only once the
  rank's earlier operations on that communicator have completed, so a posted receive
  blocks everything after it there;
- **no tags**: on a communicator the i-th send from a to b matches b's i-th receive from a,
  whatever either side meant by it; a send and its receive complete together, once both
  are at the head of their streams, after a random latency (seeded);
- **sizes must match**: a send and the receive it meets with another shape or dtype fail
  both ranks (``DoubleError``), as a hang or garbage would on GPUs;
- **all-reduce**: completes once every rank's head on the all-reduce communicator is an
  all-reduce; the sum is taken in rank order;
- **one thread per rank** calls the link and polls its handles;
- **set-up**: ``open`` blocks a communicator's ranks until all have opened it, so the ranks'
  opening orders must not form a cycle; a communicator not opened cannot be used;
- **the notice rule** (the protocol's promise, ``strict_notices``): a receive is posted
  only once the send it will meet has been posted, so no receive spins on a GPU waiting
  for a peer that has not published.

A protocol that breaks a rule gets a ``DoubleError`` (or, for a wait that NCCL would never
end, handles that never complete); tests in ``test_nccl_transport.py`` show each.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.toy import LoopbackHub
from odin_ns.runtime.device_transport import DeviceTransport

EVERYONE = "all-reduce"  # the all-reduce communicator's key


class DoubleError(RuntimeError):
    """The protocol broke a rule of NCCL (or of its own notice promise)."""


@dataclass
class _Op:
    kind: str  # "send", "recv" or "reduce"
    rank: int
    peer: int  # the other rank (-1 for an all-reduce)
    buf: Tensor
    done: bool = False
    ready_at: float | None = None  # set when the operation met its partner(s)


class _Handle:
    def __init__(self, double: NcclDouble, rank: int, op: _Op):
        self.double, self.rank, self.op = double, rank, op

    def is_completed(self) -> bool:
        with self.double.lock:
            self.double._check(self.rank)
            self.double._progress()
            self.double._check(self.rank)
            return self.op.done

    def wait(self) -> bool:
        with self.double.lock:
            self.double._check(self.rank)
            if not self.op.done:
                raise DoubleError(f"rank {self.rank}: wait() before the operation completed")
            return True


class NcclDouble:
    """The communicators of ``world_size`` ranks (see the module docstring).

    Args:
        world_size: R.
        seed: of the random completion latencies.
        max_latency_s: a matched operation completes after up to this long.
        strict_notices: enforce the notice rule.
    """

    def __init__(
        self,
        world_size: int,
        seed: int = 0,
        max_latency_s: float = 1e-3,
        strict_notices: bool = True,
    ):
        self.world_size = world_size
        self.lock = threading.RLock()
        self.rng = random.Random(seed)
        self.max_latency_s = max_latency_s
        self.strict_notices = strict_notices
        self.streams: dict[tuple[Hashable, int], deque[_Op]] = defaultdict(deque)
        self.posted: dict[tuple[Hashable, str, int, int], int] = defaultdict(int)
        self.opened: dict[int, list[Hashable]] = {}
        self.threads: dict[int, int] = {}
        self.error: str | None = None

    def link(self, rank: int) -> DoubleLink:
        return DoubleLink(self, rank)

    # ------------------------------------------------------------ rules
    def _fail(self, message: str) -> None:
        self.error = self.error or message
        raise DoubleError(message)

    def _check(self, rank: int) -> None:
        me = threading.get_ident()
        if self.threads.setdefault(rank, me) != me:
            self._fail(f"rank {rank}: NCCL called from a second thread")
        if self.error is not None:
            raise DoubleError(self.error)

    def _open(self, rank: int, comms: Sequence[Hashable]) -> None:
        with self.lock:
            self._check(rank)
            self.opened[rank] = [*comms, EVERYONE]
            self._check_open_order()

    def _check_open_order(self) -> None:
        """Set-up blocks a communicator's ranks until all have opened it: the ranks'
        opening orders must have no cycle (checked over the ranks opened so far)."""
        after: dict[Hashable, set[Hashable]] = defaultdict(set)
        for comms in self.opened.values():
            for a, b in zip(comms, comms[1:], strict=False):
                after[a].add(b)
        state: dict[Hashable, int] = {}

        def visit(c: Hashable) -> None:
            state[c] = 1
            for d in after[c]:
                if state.get(d) == 1:
                    self._fail(f"communicator set-up order has a cycle through {d!r}")
                if d not in state:
                    visit(d)
            state[c] = 2

        for c in list(after):
            if c not in state:
                visit(c)

    def _post(self, rank: int, kind: str, comm: Hashable, peer: int, buf: Tensor) -> _Handle:
        with self.lock:
            self._check(rank)
            if comm not in self.opened.get(rank, ()):
                self._fail(f"rank {rank}: communicator {comm!r} used before it was opened")
            if kind == "recv" and self.strict_notices:
                sends = self.posted[(comm, "send", peer, rank)]
                if sends <= self.posted[(comm, "recv", peer, rank)]:
                    self._fail(
                        f"rank {rank}: receive from {peer} on {comm!r} posted before the "
                        "peer posted its send (it would spin on the GPU)"
                    )
            if kind != "reduce":
                src, dst = (rank, peer) if kind == "send" else (peer, rank)
                self.posted[(comm, kind, src, dst)] += 1
            op = _Op(kind, rank, peer, buf)
            self.streams[(comm, rank)].append(op)
            self._progress()
            return _Handle(self, rank, op)

    # ---------------------------------------------------------- progress
    def _progress(self) -> None:
        now = time.monotonic()
        moved = True
        while moved:
            moved = False
            for comm in {c for c, _ in self.streams}:
                moved |= self._step_comm(comm, now)

    def _heads(self, comm: Hashable) -> dict[int, _Op]:
        return {r: q[0] for (c, r), q in self.streams.items() if c == comm and q}

    def _meet(self, comm: Hashable, ops: list[_Op], now: float) -> bool:
        """Matched ``ops`` complete after their latency; True if they completed now."""
        if ops[0].ready_at is None:
            ready = now + self.rng.uniform(0.0, self.max_latency_s)
            for op in ops:
                op.ready_at = ready
        if now < ops[0].ready_at:
            return False
        for op in ops:
            op.done = True
            self.streams[(comm, op.rank)].popleft()
        return True

    def _step_comm(self, comm: Hashable, now: float) -> bool:
        heads = self._heads(comm)
        if comm == EVERYONE:
            if len(heads) < self.world_size:
                return False
            ops = [heads[r] for r in range(self.world_size)]
            if ops[0].ready_at is None:
                shapes = {(tuple(op.buf.shape), op.buf.dtype) for op in ops}
                if len(shapes) > 1:
                    self._fail(f"all-reduce sizes differ across ranks: {sorted(map(str, shapes))}")
            if not self._meet(comm, ops, now):
                return False
            total = ops[0].buf.clone()
            for op in ops[1:]:
                total += op.buf
            for op in ops:
                op.buf.copy_(total)
            return True
        for send in heads.values():
            recv = heads.get(send.peer)
            if send.kind != "send" or recv is None or recv.kind != "recv" or recv.peer != send.rank:
                continue
            if (send.buf.shape, send.buf.dtype) != (recv.buf.shape, recv.buf.dtype):
                self._fail(
                    f"size mismatch on {comm!r}: rank {send.rank} sends "
                    f"{tuple(send.buf.shape)} {send.buf.dtype}, rank {recv.rank} receives "
                    f"{tuple(recv.buf.shape)} {recv.buf.dtype}"
                )
            if self._meet(comm, [send, recv], now):
                recv.buf.copy_(send.buf)
                return True
        return False


class DoubleLink:
    """One rank's ``DeviceLink`` over an ``NcclDouble``: a channel is its communicator."""

    def __init__(self, double: NcclDouble, rank: int):
        self.double, self.rank = double, rank

    def open(self, channels) -> None:
        self.double._open(self.rank, list(channels))

    def isend(self, ch, buf: Tensor) -> _Handle:
        return self.double._post(self.rank, "send", ch, ch.dst, buf)

    def irecv(self, ch, buf: Tensor) -> _Handle:
        return self.double._post(self.rank, "recv", ch, ch.src, buf)

    def all_reduce(self, buf: Tensor) -> _Handle:
        return self.double._post(self.rank, "reduce", EVERYONE, -1, buf)


class DeviceHub:
    """Per rank a ``DeviceTransport`` over one ``NcclDouble`` (data) and one loopback hub
    (notices): the ``hub.transport(rank)`` that the threaded harnesses take. Build each
    rank's transport on that rank's thread (it is the one allowed to call the link)."""

    def __init__(self, world_size: int, seed: int = 0, max_latency_s: float = 1e-3):
        self.world_size = world_size
        self.double = NcclDouble(world_size, seed, max_latency_s)
        self.notices = LoopbackHub(world_size)

    def transport(self, rank: int) -> DeviceTransport:
        link = self.double.link(rank)
        notices = self.notices.transport(rank)
        return DeviceTransport(rank, self.world_size, link, notices, torch.device("cpu"))


__all__ = ["EVERYONE", "DeviceHub", "DoubleError", "DoubleLink", "NcclDouble"]
