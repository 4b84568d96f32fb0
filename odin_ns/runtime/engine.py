"""Primitive-sync engine: replicated data parallel without a global barrier (DESIGN 3.4-3.6).

Every rank holds a full replica. At step t rank r reads and writes exactly the rows
``plan.step_footprint(t, r)``. The engine orchestrates four parts, one concept each:

- ``update_log``: pending steps, per-primitive version order, apply (selective Adam);
- ``gates``: what a step waits for before it reads, one gate per ``SyncConfig.mode``;
- ``exchange``: packing publications and moving them over the ``transport``;
- ``liveness``: busy notices (heartbeats) and rendezvous, so slow is not dead;
- an optional observer (``recorder.ReadRecorder``) of reads and admission decisions.

Every blocking wait ends with ``SyncTimeout`` once the peer it waits for has been silent for
``SyncConfig.timeout_s``: no publication, no send completed and, while that peer is
``busy`` (rank 0's checkpoint write, evaluation, a paused viewer), no heartbeat. A rank
whose publications to a peer reach ``SyncConfig.max_inflight_bytes`` unreceived waits for
credits in ``publish`` (``StepMetrics.credit_wait_s``) under the same deadline.

Loop per rank::

    for step in steps:
        engine.apply_until_readable(step)  # wait per gate, applying what arrives
        ...forward/backward on rows plan.step_footprint(t, r)...
        engine.publish(step, grads, visible)
        engine.apply_arrived()             # non-blocking: receive and apply what is ready
    engine.drain_and_apply_all()           # phase boundary / checkpoint / evaluation

Modes differ only in the gate (and ddp in its dense exchange); every mode applies the same
update per primitive in the same order, so results are bitwise identical (ddp over gloo
with more than 2 ranks: up to the all-reduce's summation order).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.runtime.admission import Decision
from odin_ns.runtime.config import MODES, ParamGroupState, SyncConfig
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.exchange import DenseExchange, SparseExchange
from odin_ns.runtime.gates import make_gate
from odin_ns.runtime.ledger import RunLedger, StepMetrics
from odin_ns.runtime.liveness import Liveness, PeerSilence, Rendezvous, StoreLiveness, wait_until
from odin_ns.runtime.recorder import ReadRecord, ReadRecorder
from odin_ns.runtime.transport import P2PTransport, Transport, has_credits
from odin_ns.runtime.update_log import ApplyHook, UpdateLog
from odin_ns.runtime.uploads import upload

# A record made ahead pays a thread handoff (about 0.25 ms a step on this project's CPU
# host); the record of a step whose footprints hold fewer ids than this (about 0.5 ms of
# ``step_record``) is made on the step thread, where it costs less.
AHEAD_MIN_IDS = 1 << 17


def _check_plan(plan: Any, world_size: int) -> int:
    views = np.asarray(plan.views)
    if views.ndim < 2 or views.shape[1] != world_size:
        raise ValueError(
            f"plan.views must be [T, R, ...] with R = world_size = {world_size}, "
            f"got shape {views.shape}"
        )
    num_steps = views.shape[0]
    dep = np.asarray(plan.dependency)
    if dep.shape != (num_steps, world_size, world_size):
        raise ValueError(
            f"plan.dependency must be [T, R, R] = {(num_steps, world_size, world_size)}, "
            f"got {dep.shape}"
        )
    rows = np.asarray(plan.message_rows)
    if rows.shape != (num_steps, world_size):
        raise ValueError(
            f"plan.message_rows must be [T, R] = {(num_steps, world_size)}, got {rows.shape}"
        )
    return num_steps


def _check_groups(groups: Sequence[ParamGroupState]) -> int:
    if len(groups) == 0:
        raise ValueError("need at least one parameter group")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"parameter group names must be unique, got {names}")
    n = groups[0].param.shape[0]
    device = groups[0].param.device
    for g in groups:
        if g.param.shape[0] != n:
            raise ValueError(f"group {g.name!r} has {g.param.shape[0]} rows, expected {n}")
        if g.exp_avg.shape != g.param.shape or g.exp_avg_sq.shape != g.param.shape:
            raise ValueError(f"group {g.name!r}: Adam moments must have the param's shape")
        if g.param.device != device:
            raise ValueError(f"group {g.name!r} is on {g.param.device}, expected {device}")
    return n


class PrimitiveSyncEngine:
    """Per-rank sync engine for one replica. See the module docstring for the loop.

    Args:
        groups: the replica's parameter groups (all with N rows, on one device).
        plan: the phase's plan (``views``, ``step_footprint``, ``dependency``,
            ``message_rows``, ``plan_hash``; docs/architecture.md).
        rank, world_size: this rank and R (= plan's ranks).
        config: options (default ``SyncConfig()``).
        process_group: gloo group for the transport (None: the default group, which
            must then handle CPU tensors with gloo). Ignored when ``transport`` is given
            or world_size == 1.
        step_offset: global step of the plan's local step 0.
        transport: a custom ``Transport`` (tests); default ``P2PTransport``.
        observer: optional ``ReadRecorder`` (reads and decisions); None records nothing.
        liveness: busy notices and rendezvous (``odin_ns.runtime.liveness``); default with
            the ``P2PTransport``: ``StoreLiveness`` on the default store; with a custom
            transport None (plain deadlines, ``rendezvous`` does nothing).
        ledger: where steps, waits and admission decisions are recorded (the session's,
            kept across rebinds); default a new ``RunLedger``.

    Steps passed to the methods are global steps (``step_offset + t``).
    """

    def __init__(
        self,
        groups: Sequence[ParamGroupState],
        plan: Any,
        rank: int,
        world_size: int,
        config: SyncConfig | None = None,
        process_group: dist.ProcessGroup | None = None,
        step_offset: int = 0,
        transport: Transport | None = None,
        observer: ReadRecorder | None = None,
        liveness: Liveness | None = None,
        ledger: RunLedger | None = None,
    ):
        self.config = config if config is not None else SyncConfig()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, R={world_size}")
        self._rank = rank
        self._world = world_size
        self._group = process_group
        self._observer = observer
        self.visibility_violations = 0
        self.ledger = ledger if ledger is not None else RunLedger()
        _check_groups(groups)
        _check_plan(plan, world_size)
        if world_size > 1 and transport is None:
            if not dist.is_initialized():
                raise ValueError(
                    "world_size > 1 needs torch.distributed initialized or a transport"
                )
            transport = P2PTransport(
                rank, world_size, process_group, self.config.idle_timeout_s,
                groups[0].param.device.type == "cuda",
            )  # fmt: skip
            if liveness is None:
                liveness = StoreLiveness(rank, world_size, self.config.beat_s)
        self._transport = transport
        self._liveness = liveness
        self._silence = PeerSilence(liveness, world_size, self.config.beat_s, self.config.timeout_s)
        self._meeting = Rendezvous(liveness, self._silence, rank, world_size, self.config.timeout_s)
        # Beside an accelerator, the next step's record (its footprints' union) is made on
        # this helper thread while the device runs the step; on CPU ranks the cores train.
        self._ahead = (
            None
            if groups[0].param.device.type == "cpu"
            else ThreadPoolExecutor(1, thread_name_prefix=f"odin-record-{rank}")
        )
        self._bind(groups, plan, step_offset, None)

    # ----------------------------------------------------------------- binding
    def _bind(self, groups, plan, step_offset: int, versions: Tensor | None) -> None:
        n = _check_groups(groups)
        self._num_steps = _check_plan(plan, self._world)
        if step_offset < 0:
            raise ValueError(f"step_offset must be >= 0, got {step_offset}")
        self._groups = list(groups)
        self._plan = plan
        self._offset = int(step_offset)
        self.ledger.phases += 1
        self.num_rows = n
        self._device = self._groups[0].param.device
        self._width = sum(g.row_dim for g in self._groups) + 1
        if versions is None:
            versions = torch.full((n,), -1, dtype=torch.int64)
        elif versions.shape != (n,) or versions.dtype != torch.int64:
            raise ValueError(f"versions must be [{n}] int64, got {tuple(versions.shape)}")
        self.versions = versions.to("cpu")  # [N] int64: last global step applied (host)
        ids_per_step = np.asarray(plan.message_rows).sum(axis=1)  # [T] footprint ids a step
        big = ids_per_step.size > 0 and ids_per_step.mean() >= AHEAD_MIN_IDS
        self._log = UpdateLog(
            self._groups,
            plan,
            self._world,
            self._offset,
            self.versions,
            hook=self._apply_hook,
            ahead=self._ahead if big else None,
        )
        dependency = np.asarray(plan.dependency)
        self._gate = make_gate(
            self.config, self._rank, self._world, dependency, n, self._offset, self._device
        )
        if self._gate.dense:
            self._exchange = DenseExchange(
                self._transport, self._rank, self._world, self._width, n, self._offset,
                self._device,
            )  # fmt: skip
        else:
            self._exchange = SparseExchange(
                self._transport,
                self._rank,
                self._world,
                self._width,
                np.asarray(plan.message_rows),
                self._offset,
                self.config.recv_ahead,
                self._device,
            )
        self._zeros: dict[int, Tensor] = {}  # row size -> [N, d] zero gradient (None grads)
        # first step that published visible rows outside its footprint (-1: none), kept on
        # the device when reading it would synchronize the step (see publish)
        self._first_outside = torch.full((), -1, dtype=torch.int64, device=self._device)
        self._validated = -1
        self._published = -1
        if self._world > 1 and self.config.verify_plan:
            self._verify_plan()

    def _verify_plan(self) -> None:
        if not isinstance(self._transport, P2PTransport):
            return
        digest = hashlib.sha256(str(self._plan.plan_hash).encode()).digest()
        mine = [int.from_bytes(digest[:7], "little"), self.num_rows, self._width]
        local = torch.tensor(mine, dtype=torch.int64)  # gloo group: CPU tensors
        gathered = [torch.zeros_like(local) for _ in range(self._world)]
        try:
            work = dist.all_gather(gathered, local, group=self._group, async_op=True)
            work.wait(timedelta(seconds=self.config.timeout_s))
        except Exception as exc:
            raise PeerFailure(self._rank, -1, None, f"plan check failed: {exc}") from exc
        for q, other in enumerate(gathered):
            if other.tolist() != mine:
                raise ValueError(
                    f"rank {self._rank} and rank {q} disagree on (plan hash, N, D+1): "
                    f"{mine} vs {other.tolist()}; all ranks must bind the same plan and model"
                )

    def rebind(
        self,
        groups: Sequence[ParamGroupState],
        plan: Any,
        step_offset: int,
        versions: Tensor | None = None,
    ) -> None:
        """Bind new tensors and a new plan after a drain (phase boundary, N may change).

        ``versions``: the [N] version vector to keep (default: kept if N is unchanged,
        else a fresh all -1 vector).
        """
        if any(p > self._published for p in self._exchange.posted):
            raise RuntimeError(
                f"rank {self._rank}: receives are posted past the last published step "
                f"{self._offset + self._published} (recv_ahead > 0); run the plan to its "
                "end before rebind, or use recv_ahead=0"
            )
        if self._validated != self._published or self._log.pending:
            raise RuntimeError(
                f"rank {self._rank}: rebind() needs a drained engine; call "
                "drain_and_apply_all() first"
            )
        last = self._offset + self._published
        if step_offset <= last:
            raise ValueError(f"step_offset must be > the last published step {last}")
        if versions is None and groups and groups[0].param.shape[0] == self.num_rows:
            versions = self.versions
        self._bind(groups, plan, step_offset, versions)

    # ------------------------------------------------------- apply hook (MCMC)
    _apply_hook: ApplyHook | None = None

    @property
    def apply_hook(self) -> ApplyHook | None:
        """Optional ``update_log.ApplyHook`` called around every applied row set (the MCMC
        strategy's lazy noise); kept across rebinds. None (default): nothing is called."""
        return self._apply_hook

    @apply_hook.setter
    def apply_hook(self, hook: ApplyHook | None) -> None:
        self._apply_hook = hook
        self._log.hook = hook

    def current_reads(self, step: int) -> Tensor:
        """[K] int64 host ids: the rows of this rank's read set at ``step`` (after
        ``apply_until_readable``) that are at the version quality-first requires (all of
        them, except where throughput-first reads around a pending update)."""
        t = self._local(step, "current_reads")
        reads = self._log.record(t).footprints[self._rank]
        return reads[self.versions[reads] >= self._log.required(t, self._rank)]

    # ---------------------------------------------------------------- waiting
    def _local(self, step: int, what: str) -> int:
        t = int(step) - self._offset
        if not 0 <= t < self._num_steps:
            raise ValueError(
                f"{what}({step}): step outside the bound plan's steps "
                f"[{self._offset}, {self._offset + self._num_steps})"
            )
        return t

    def _poll(self, timeout: float = 0.0) -> None:
        if self._transport is None:
            return
        for arrival in self._transport.take(timeout):
            self.ledger.current.bytes_recv += self._exchange.absorb(arrival, self._log, self._gate)
        err = self._transport.failure()
        if err is not None:
            raise err

    def _apply(self) -> int:
        start = time.perf_counter()
        n = self._log.apply_ready()
        if n:
            self.ledger.current.apply_s += time.perf_counter() - start
            self.ledger.current.rows_applied += n
        return n

    def _wait(
        self,
        awaited: Callable[[], tuple[int, int | None] | None],
        start: float,
        what: str | Callable[[], str],
        poll_s: float | None = None,
    ) -> float:
        """Receive and apply until ``awaited()`` (the (peer, step) still missing) is None
        (``liveness.wait_until``), timing out when that peer has been silent for
        ``timeout_s`` since ``start``; returns the seconds waited while a peer said it was
        busy."""
        begun = time.perf_counter()
        wait_until(
            awaited,
            self._poll,
            self._apply,
            self._silence.deadline,
            self._rank,
            what,
            self.config.timeout_s,
            start,
            self.config.beat_s if poll_s is None else poll_s,
            self._silence.describe,
        )
        busy = self._silence.heard_since(begun)
        return time.perf_counter() - begun if busy else 0.0

    def _arrived_up_to(self, need: Sequence[int]) -> Callable[[], tuple[int, int] | None]:
        done = self._exchange.recv_done

        def blocker():
            for q in range(self._world):
                if q != self._rank and done[q] < need[q]:
                    return q, self._offset + done[q] + 1
            return None

        return blocker

    # ------------------------------------------------------------- step path
    def apply_until_readable(self, step: int) -> float:
        """Block until ``step``'s read set is readable per the mode's gate, receiving and
        applying updates while it waits; returns the seconds spent waiting."""
        t = self._local(step, "apply_until_readable")
        if t != self._published + 1 or self._validated != self._published:
            raise ValueError(
                f"apply_until_readable({step}): expected step "
                f"{self._offset + self._published + 1} (steps run in order; publish() each "
                "step made readable)"
            )
        self._validated = t
        cur = self.ledger.begin_step(step)
        start = time.perf_counter()
        what = f"apply_until_readable({step}) waiting for its publication"
        self._exchange.post_receives(t)
        reads = self._log.record(t).footprints[self._rank]
        while True:
            self._poll()
            self._apply()
            need, decisions = self._gate.need(t, reads, self._exchange.recv_done, self._log)
            if decisions:
                self._count(decisions)
            if need is None:
                break
            cur.busy_wait_s += self._wait(self._arrived_up_to(need), start, what)
        # The one conflict scan: read rows whose version is below what they must have.
        base = self._log.required(t, self._rank)  # [M] last planned write before t
        allowed = self._gate.required(t, reads, base, self._log)
        if ops.validate_reads(reads, self.versions, allowed).numel() > 0:
            # The plan's dependency table missed a writer: a bug upstream. Stay exact.
            self.visibility_violations += 1

            def blocker():
                if ops.validate_reads(reads, self.versions, allowed).numel() == 0:
                    return None
                return self._log.first_missing(t)

            self._wait(blocker, start, f"apply_until_readable({step}) waiting for a read row")
        if allowed is not base:
            self.ledger.read_delayed(int(ops.validate_reads(reads, self.versions, base).numel()))
        if t + 1 < self._num_steps:
            self._log.prepare(t + 1)  # made while the step's forward and backward run
        oldest = self._log.oldest_unapplied(t)
        cur.max_version_lag = 0 if oldest is None else t - oldest
        cur.wait_s = time.perf_counter() - start - cur.apply_s
        if self._observer is not None:
            self._observer.on_read(int(step), reads, self.versions[reads], base)
        return cur.wait_s

    def _count(self, decisions: Sequence[Decision]) -> None:
        self.ledger.count(decisions)
        if self._observer is not None:
            for d in decisions:
                self._observer.on_decision(d)

    @torch.no_grad()
    def publish(self, step: int, grads: Mapping[str, Tensor | None], visible: Tensor) -> None:
        """Publish this rank's update of ``step``: gradient rows of its footprint + visibility.

        Args:
            step: the step last passed to ``apply_until_readable``.
            grads: per group name a full [N, ...] gradient, or None for zero.
            visible: [N] bool rows visible in this rank's views (all inside the footprint).
        """
        t = self._local(step, "publish")
        if t != self._validated or t == self._published:
            raise ValueError(
                f"publish({step}): apply_until_readable({step}) must come first, once per "
                f"step (last readable step {self._offset + self._validated})"
            )
        names = [g.name for g in self._groups]
        if set(grads) != set(names):
            raise ValueError(f"grads must have exactly the keys {names}, got {sorted(grads)}")
        for g in self._groups:
            grad = grads[g.name]
            if grad is not None and grad.shape != g.param.shape:
                raise ValueError(
                    f"grad of {g.name!r} has shape {tuple(grad.shape)}, "
                    f"expected {tuple(g.param.shape)}"
                )
        if visible.shape != (self.num_rows,) or visible.dtype != torch.bool:
            raise ValueError(f"visible must be a [{self.num_rows}] bool mask")
        reads = self._log.record(t).footprints[self._rank]
        planned = int(self._plan.message_rows[t][self._rank])
        if planned != reads.numel():
            raise ValueError(
                f"plan.message_rows[{t}, {self._rank}] = {planned} "
                f"but the footprint has {reads.numel()} rows"
            )
        columns = [self._column(g, grads[g.name]) for g in self._groups]
        columns.append(visible.to(torch.float32).unsqueeze(1))
        reads = upload(reads, self._device)
        buf, wire = self._exchange.pack(t, reads, columns)
        if not self._gate.dense:
            self._wait_for_credits(step, wire.numel() * wire.element_size())
        # [] visible rows off the footprint (counts: 0.4 ms at 1M rows, sums of bools 1.4 ms)
        outside = torch.count_nonzero(visible) - torch.count_nonzero(visible.index_select(0, reads))
        if self._exchange.host_transport:
            # The wire copy already waited for the step's kernels: this read costs nothing.
            if int(outside) != 0:
                self._raise_outside(int(step))
        else:  # a device-resident transport (or none): kept on the device, read at the drain
            first = self._first_outside
            self._first_outside = torch.where((outside != 0) & (first < 0), int(step), first)
        self.ledger.current.bytes_sent += self._exchange.send(t, buf, wire, self._log)
        self._published = t
        self.ledger.in_flight(
            max((self._inflight(q)[0] for q in range(self._world) if q != self._rank), default=0)
        )

    def _raise_outside(self, step: int) -> None:
        raise ValueError(
            f"publish({step}): visible rows outside the planned footprint; a rank may only "
            "read and write plan.step_footprint(t, rank)"
        )

    def _inflight(self, peer: int) -> tuple[int, int | None]:
        return (0, None) if self._transport is None else self._transport.inflight_bytes(peer)

    def _wait_for_credits(self, step: int, nbytes: int) -> None:
        """Credits: wait until every peer has room for ``nbytes`` more in flight (a peer
        with nothing in flight always has: one publication is allowed, however large)."""
        if self._transport is None:
            return
        cap = int(self.config.max_inflight_bytes)
        held: dict[int, int] = {}

        def blocker():
            for q in range(self._world):
                if q == self._rank:
                    continue
                inflight, oldest = self._inflight(q)
                if not has_credits(inflight, nbytes, cap):
                    held[q] = inflight
                    return q, oldest
            return None

        if blocker() is None:
            return
        start = time.perf_counter()

        def what() -> str:
            q, inflight = next(reversed(held.items()))
            return (
                f"publish({step}) waiting for credits ({inflight} bytes of publications in "
                f"flight to peer {q}, max_inflight_bytes {cap})"
            )

        try:
            self.ledger.current.busy_wait_s += self._wait(blocker, start, what)
        finally:  # counted also when it times out
            self.ledger.credit_waited(time.perf_counter() - start)

    def _column(self, group: ParamGroupState, grad: Tensor | None) -> Tensor:
        """[N, d_g] gradient block of one group (a cached zero block for None)."""
        d = group.row_dim
        if grad is not None:
            return grad.detach().reshape(self.num_rows, d)
        if d not in self._zeros:
            self._zeros[d] = torch.zeros(self.num_rows, d, device=self._device)
        return self._zeros[d]

    def apply_arrived(self) -> int:
        """Non-blocking: take what has arrived and apply what is ready; returns rows applied."""
        self._poll()
        return self._apply()

    def drain_and_apply_all(self) -> float:
        """Receive and apply every publication up to the last published step; wait for sends.

        All ranks must call it after the same step. Afterwards every replica is bitwise
        identical and ``versions`` is equal on all ranks. Returns seconds spent.
        """
        if self._validated != self._published:
            raise ValueError(
                "drain_and_apply_all() between apply_until_readable() and publish() of a step"
            )
        first_outside = int(self._first_outside)  # publish's deferred check
        if first_outside >= 0:
            self._raise_outside(first_outside)
        start = time.perf_counter()
        last = self._published
        self.ledger.busy_s += self._wait(
            self._arrived_up_to([last] * self._world),
            start,
            "drain_and_apply_all() waiting for its publication",
        )
        self._apply()
        left = [self._offset + s for s in self._log.pending if s <= last]
        if left:
            raise RuntimeError(f"rank {self._rank}: drain left steps {left} unapplied (a bug)")
        if self._transport is not None:
            self._wait(
                self._transport.oldest_unsent, start, "drain_and_apply_all() waiting for a send"
            )
        elapsed = time.perf_counter() - start
        self.ledger.drains += 1
        self.ledger.drain_s += elapsed
        return elapsed

    def busy(self, reason: str):
        """Context manager: this rank is busy with work of its own (``reason``: "writing a
        checkpoint", "viewer paused"); peers waiting on it keep waiting while it lasts."""
        if self._liveness is None:
            return contextlib.nullcontext()
        return self._liveness.busy(reason)

    def rendezvous(self, what: str = "rendezvous") -> float:
        """Wait until every peer has called ``rendezvous`` as often as this rank (all ranks
        call it at the same points, e.g. before a gloo collective that follows work only
        some ranks do): ``liveness.Rendezvous``, receiving and applying meanwhile. Returns
        seconds spent."""
        begun = time.perf_counter()
        step = self._offset + self._published
        spent = self._meeting.meet(what, step, self._poll, self._apply)
        if self._silence.heard_since(begun):  # a busy peer was waited for
            self.ledger.busy_s += spent
        return spent

    def close(self) -> None:
        """Stop the transport's background threads (call after a drain)."""
        if self._transport is not None:
            self._transport.close()
        if self._liveness is not None:
            self._liveness.close()
        if self._ahead is not None:
            self._ahead.shutdown()

    def __enter__(self) -> PrimitiveSyncEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- metrics
    @property
    def metrics(self) -> list[StepMetrics]:
        """Every step's record so far (the ledger's, over every phase it saw)."""
        return self.ledger.steps

    def live_counters(self) -> dict:
        """What the live panels show (``RunLedger.live_counters``)."""
        return self.ledger.live_counters(self.config)

    def summary(self) -> dict:
        """Run totals (``RunLedger.summary``) with this replica's: rank, world size, plan,
        visibility violations."""
        return {
            "rank": self._rank,
            "world_size": self._world,
            "plan_hash": str(self._plan.plan_hash),
            "visibility_violations": self.visibility_violations,
            **self.ledger.summary(self.config),
        }

    def admission_log(self) -> list[dict]:
        """Every admitted delayed read (``RunLedger.admission_log``)."""
        return self.ledger.admission_log()

    def step_metrics(self) -> list[dict]:
        """Per-step metrics as dicts."""
        return self.ledger.step_metrics()


__all__ = [
    "MODES",
    "ParamGroupState",
    "PeerFailure",
    "PrimitiveSyncEngine",
    "ReadRecord",
    "ReadRecorder",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
]
