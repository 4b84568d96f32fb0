"""Slow is not dead: busy notices (heartbeats) and rendezvous next to the transport.

A rank busy with work of its own (rank 0's checkpoint write, evaluation, a paused viewer)
holds ``Liveness.busy(reason)``: a background thread then beats every ``beat_s`` seconds.
A peer that waits on it (``engine`` deadlines) reads the beat count now and then and resets
its deadline whenever the count moved: it times out only after ``timeout_s`` of silence. A
rank that hangs or is stopped (SIGSTOP stops its beat thread too) stays silent and times out
as before. Only busy sections beat: a main thread stuck anywhere else is not kept alive.

Dead is not slow either: the same thread pulses every ``beat_s`` for the rank's whole life,
busy or not. A peer whose pulses stop for ``PeerSilence.PULSES_MISSED`` periods has ended
(killed, its node gone) or cannot be reached: the wait on it fails at once with
``PeerFailure`` instead of at ``timeout_s``. That is what notices a dead peer where nothing
reads its connection (a rendezvous before a phase start's collectives, a node killed while
its peers wait there); a pulse proves the process runs, not that it progresses, so a stuck
rank still times out by its silence.

``Rendezvous`` lets every rank wait, with the same heartbeat-aware deadline, until every
peer has reached the same point, before a gloo collective that would otherwise wait under
gloo's own timeout (``--distributed-timeout-s``) with no notion of "busy".

The channel is the ``torch.distributed`` key-value store (``StoreLiveness``: TCPStore under
torchrun, FileStore in tests): counters only (``add``), never a blocking ``get``, nothing
posted that would have to be cancelled, independent of the publication sockets. Tests'
ranks in threads use ``tests/harness``'s ``MemoryLiveness``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch.distributed as dist

from odin_ns.runtime.errors import PeerFailure, SyncTimeout


class Liveness(Protocol):
    """What the engine needs to tell slow from dead (per rank)."""

    def busy(self, reason: str):  # -> context manager
        """Beat while the ``with`` block runs (nestable)."""

    def beats(self, peer: int) -> int | None:
        """``peer``'s beat count (None: the channel could not be read)."""

    def pulses(self, peer: int) -> int | None:
        """``peer``'s pulse count: every ``beat_s`` while its process runs (None: unreadable)."""

    def reason(self, peer: int) -> str:
        """What ``peer`` last said it was busy with ("" if unknown)."""

    def arrive(self) -> None:
        """This rank reached its next rendezvous."""

    def arrived(self, peer: int) -> int | None:
        """How many rendezvous ``peer`` has reached (None: unreadable)."""

    def close(self) -> None:
        """Stop beating."""


class PeerSilence:
    """When each peer was last heard from (heartbeats of its busy sections), for deadlines,
    and whether it still runs at all (its pulses).

    A wait that started at ``start`` on ``peer`` times out at ``deadline(peer, start)``:
    ``timeout_s`` after the later of ``start`` and the last beat of ``peer`` seen. It fails
    sooner, with ``PeerFailure``, when ``peer`` has pulsed (its liveness started) but its
    pulses have not moved for ``PULSES_MISSED`` periods since the later of ``start`` and the
    last move seen. The
    counters are read at most every ``beat_s`` per peer and only once a wait has lasted
    ``beat_s``: waits that end quickly never touch the channel.

    Args:
        liveness: the ranks' counters (None: deadlines from ``start`` alone).
        rank, world_size: this rank (for the failure's message) and R.
        beat_s: the beat and pulse period.
        timeout_s: the silence a wait allows.
    """

    PULSES_MISSED = 10  # a process that has not pulsed for this many periods has ended

    def __init__(
        self,
        liveness: Liveness | None,
        rank: int,
        world_size: int,
        beat_s: float,
        timeout_s: float,
    ):
        self.liveness = liveness
        self.rank = rank
        self.beat_s = float(beat_s)
        self.timeout_s = float(timeout_s)
        self.gone_after_s = self.PULSES_MISSED * self.beat_s
        self.count: list[int | None] = [None] * world_size
        self.heard = [-float("inf")] * world_size  # perf_counter of the last beat seen
        self.pulse_count: list[int | None] = [None] * world_size
        self.pulsed = [-float("inf")] * world_size  # perf_counter of the last pulse seen
        self.checked = [-float("inf")] * world_size

    def deadline(self, peer: int, start: float) -> float:
        """When a wait on ``peer`` begun at ``start`` times out; raises ``PeerFailure`` if
        ``peer`` stopped pulsing (step None: ``wait_until`` adds the step it waited for)."""
        now = time.perf_counter()
        beat = self.beat_s
        if self.liveness is not None and now - start >= beat and now - self.checked[peer] >= beat:
            self.checked[peer] = now
            if _moved(self.count, peer, self.liveness.beats(peer)):
                self.heard[peer] = now
            if _moved(self.pulse_count, peer, self.liveness.pulses(peer)):
                self.pulsed[peer] = now
            quiet = now - max(start, self.pulsed[peer])
            started = (self.pulse_count[peer] or 0) > 0  # (a peer still setting up: not yet)
            if started and quiet >= self.gone_after_s:
                raise PeerFailure(
                    self.rank, peer, None,
                    f"its process stopped answering (no pulse for {quiet:.1f} s): it ended or "
                    "was stopped, or its node is gone or unreachable",
                )  # fmt: skip
        return max(start, self.heard[peer]) + self.timeout_s

    def latest_deadline(self, peers: Iterable[int], start: float) -> float:
        """The deadline of a wait on whichever of ``peers`` is slowest: it lasts while any
        of them is heard from (a wait that does not know which peer it waits for)."""
        return max(self.deadline(q, start) for q in peers)

    def heard_since(self, start: float) -> bool:
        return any(h >= start for h in self.heard)

    def describe(self, peer: int) -> str:
        if self.liveness is None or self.heard[peer] == -float("inf"):
            return ""
        silent = time.perf_counter() - self.heard[peer]
        reason = self.liveness.reason(peer) or "busy"
        return f"; its last busy notice ({reason}) came {silent:.1f} s ago"


def _moved(counts: list[int | None], peer: int, n: int | None) -> bool:
    """Whether ``peer``'s counter moved since ``counts[peer]`` (then updated); ``n`` None
    (unreadable) or a first reading: no move seen."""
    if n is None:
        return False
    moved = counts[peer] is not None and n != counts[peer]
    counts[peer] = n
    return moved


Awaited = tuple[int, int | None] | None  # (peer, global step) a wait still needs; None: done


def wait_until(
    awaited: Callable[[], Awaited],
    receive: Callable[[float], object],
    apply: Callable[[], object],
    deadline: Callable[[int, float], float],
    rank: int,
    what: str | Callable[[], str],
    timeout_s: float,
    start: float,
    poll_s: float,
    describe: Callable[[int], str] = lambda peer: "",
) -> None:
    """The one wait loop of both engines: receive and apply until ``awaited()`` is None.

    ``awaited`` names what is still missing, (peer, global step; peer -1: no one peer);
    ``receive(timeout)`` takes in arrivals, waiting up to ``timeout`` seconds for one;
    ``deadline(peer, start)`` is when a wait on ``peer`` begun at ``start`` times out (a
    ``PeerSilence``'s, so busy peers' heartbeats extend it); it raises ``PeerFailure`` for a
    peer that has stopped running. Raises ``SyncTimeout`` naming the peer and step, ``what``
    (called if callable) and ``describe(peer)``; a dead peer's ``PeerFailure`` gets the step
    and ``what`` too.
    """
    while True:
        receive(0.0)
        apply()
        missing = awaited()
        if missing is None:
            return
        peer, step = missing
        try:
            remaining = deadline(peer, start) - time.perf_counter()
        except PeerFailure as gone:
            text = what() if callable(what) else what
            raise PeerFailure(rank, gone.peer, step, f"{gone.what} (waiting in {text})") from None
        if remaining <= 0:
            text = what() if callable(what) else what
            raise SyncTimeout(
                rank, peer, step, f"timed out after {timeout_s} s in {text}" + describe(peer)
            )
        receive(min(remaining, poll_s))


def switch_held_section(held, hold: bool, begin: Callable[[], AbstractContextManager]):
    """A section held open across calls (the viewer's pause as a busy section): enters
    ``begin()`` when ``hold`` and none is held, leaves the held one when not ``hold``.
    Returns the section now held, or None."""
    if hold and held is None:
        held = begin()
        held.__enter__()
    elif not hold and held is not None:
        held.__exit__(None, None, None)
        held = None
    return held


class Rendezvous:
    """The one rendezvous of both layouts: every rank waits at the same points (before a
    collective that follows work only some ranks do) until every peer has reached the
    same one, with ``silence``'s heartbeat-aware deadline (``wait_until``), so a peer busy
    evaluating or writing a checkpoint is waited for and a silent one times out.

    Args:
        liveness: the ranks' counters (None or world_size 1: ``meet`` returns at once).
        silence: the deadlines (the caller's ``PeerSilence``, shared with its other waits).
        rank, world_size: this rank and R.
        timeout_s: the deadline's silence, for the timeout's message.
    """

    def __init__(
        self,
        liveness: Liveness | None,
        silence: PeerSilence,
        rank: int,
        world_size: int,
        timeout_s: float,
    ):
        self.liveness = liveness
        self.silence = silence
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.count = 0  # rendezvous this rank has reached

    def meet(self, what: str, step: int | None = None) -> float:
        """Arrive, then wait until every peer has arrived as often (after a drain: nothing
        is in flight). Returns the seconds spent; a timeout names the missing peer,
        ``step`` and ``what``."""
        live = self.liveness
        if live is None or self.world_size == 1:
            return 0.0
        start = time.perf_counter()
        self.count += 1
        live.arrive()
        n = self.count

        def missing() -> Awaited:
            for q in range(self.world_size):
                if q != self.rank and (live.arrived(q) or 0) < n:
                    return q, step
            return None

        wait_until(
            missing,
            time.sleep,
            lambda: None,
            self.silence.deadline,
            self.rank,
            f"{what} (rendezvous {n})",
            self.timeout_s,
            start,
            0.005,
            self.silence.describe,
        )
        return time.perf_counter() - start


class Beater:
    """A ``Liveness``'s beat thread: calls ``pulse()`` every ``period_s`` until closed, and
    ``beat()`` with it while some busy section is open (``enter`` / ``leave`` nest; entering
    beats at once)."""

    def __init__(
        self,
        beat: Callable[[], object],
        pulse: Callable[[], object],
        period_s: float,
        name: str,
    ):
        self._beat = beat
        self._pulse = pulse
        self._period = period_s
        self._cond = threading.Condition()
        self._depth = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                busy = self._depth > 0
                self._cond.release()
                try:
                    self._pulse()
                    if busy:
                        self._beat()
                except Exception:  # the store is gone: peers will see silence
                    pass
                finally:
                    self._cond.acquire()
                self._cond.wait(self._period)

    def enter(self) -> None:
        with self._cond:
            self._depth += 1
            self._cond.notify_all()

    def leave(self) -> None:
        with self._cond:
            self._depth -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


_instances = itertools.count()  # same order on every rank: one namespace per engine


class StoreLiveness:
    """Busy beats and rendezvous counters in a ``torch.distributed`` store.

    Args:
        rank, world_size: this rank and R (ranks of the runtime's group).
        beat_s: beat period while busy.
        store: the store (default: the default process group's).
        namespace: key prefix (default: a per-process instance counter, which every rank
            advances in the same order).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        beat_s: float,
        store: dist.Store | None = None,
        namespace: str | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.prefix = f"odin/live/{namespace if namespace is not None else next(_instances)}/"
        self._beater = Beater(self._beat, self._pulse, beat_s, name=f"odin-beat-{rank}")
        self._reason = ""

    def _key(self, what: str, rank: int) -> str:
        return f"{self.prefix}{what}/{rank}"

    def _beat(self) -> None:
        self.store.add(self._key("beats", self.rank), 1)

    def _pulse(self) -> None:
        self.store.add(self._key("pulses", self.rank), 1)

    @contextmanager
    def busy(self, reason: str) -> Iterator[None]:
        try:
            self.store.set(self._key("reason", self.rank), reason)
        except Exception:
            pass
        self._beater.enter()
        try:
            yield
        finally:
            self._beater.leave()

    def _count(self, what: str, peer: int) -> int | None:
        try:
            return int(self.store.add(self._key(what, peer), 0))
        except Exception:
            return None

    def beats(self, peer: int) -> int | None:
        return self._count("beats", peer)

    def pulses(self, peer: int) -> int | None:
        return self._count("pulses", peer)

    def reason(self, peer: int) -> str:
        key = self._key("reason", peer)
        try:
            return self.store.get(key).decode() if self.store.check([key]) else ""
        except Exception:
            return ""

    def arrive(self) -> None:
        self.store.add(self._key("arrived", self.rank), 1)

    def arrived(self, peer: int) -> int | None:
        return self._count("arrived", peer)

    def close(self) -> None:
        self._beater.close()


__all__ = [
    "Beater",
    "Liveness",
    "PeerSilence",
    "Rendezvous",
    "StoreLiveness",
    "switch_held_section",
    "wait_until",
]
