"""Primitive-sync engine: replicated data parallel without a global barrier (DESIGN 3.4, 3.5).

Every rank holds a full replica. At step t rank r reads and writes exactly the rows
``plan.step_footprint(t, r)``. The update of step s is, per primitive p of the union of
the step's footprints, selective Adam with gradient = sum over p's writers in rank order
and visible = OR of the writers' flags. Every replica applies every update, per
primitive, in version (step) order, as soon as all of p's writers for that step have
published. Summing stored per-rank contributions in fixed rank order at apply time makes
the result bitwise identical in every mode and on every rank.

Every rank publishes every step, also with an empty footprint (a zero-row message still
says "rank q is past step t"), so receives per peer are FIFO and sized by the plan.

Loop per rank::

    for step in steps:
        engine.validate(step)        # block per mode (quality-first: only what F(t, r) needs)
        ...forward/backward on rows plan.step_footprint(t, r)...
        engine.publish(step, grads, visible)
        engine.progress()            # non-blocking: receive and apply what is ready
    engine.drain()                   # phase boundary / checkpoint / evaluation

Modes (``SyncConfig.mode``) differ only in what ``validate`` waits for:

- ``barrier``: every peer's publications of every earlier step;
- ``quality-first``: peer q's publications up to ``plan.dependency[t, r, q]``, the last
  step at which q wrote a row rank r reads at t (reads are always current);
- ``throughput-first``: like quality-first, except that a pending publication of q whose
  overlap with the read set is small (``<= tau`` of it), where q's recent gradients are
  weak (``< tau`` x q's mean), no more than K steps old and inside the current phase may
  be read around: the step runs on the rows' older versions (a delayed read) and the late
  update is applied when it arrives. The exact rule is in ``odin_ns.runtime.admission``;
  every decision is counted (``summary()``: ``admitted``, ``fallbacks`` by reason,
  ``staleness_hist``, ``delayed_primitive_reads``).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.runtime import kernels
from odin_ns.runtime.admission import (
    FALLBACK_REASONS,
    Decision,
    GradientEvidence,
    fallback_reason,
)
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.transport import Arrival, P2PTransport, Transport

MODES = ("barrier", "quality-first", "throughput-first")
TAG_MODULUS = 1 << 30


@dataclass
class ParamGroupState:
    """One parameter group of the replica; the tensors are the model's own (updated in place).

    ``param``, ``exp_avg``, ``exp_avg_sq``: [N, ...] with the same shape. ``lr_at(s)``
    gives the learning rate of global step s.
    """

    name: str
    param: Tensor  # [N, ...]
    exp_avg: Tensor  # [N, ...]
    exp_avg_sq: Tensor  # [N, ...]
    lr_at: Callable[[int], float]
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-15

    @property
    def row_dim(self) -> int:
        """Flattened size of one row."""
        return math.prod(self.param.shape[1:])


@dataclass
class SyncConfig:
    """Options of the primitive-sync engine.

    Attributes:
        mode: "barrier" (wait for every peer's every earlier step: the synchronous
            baseline), "quality-first" (wait only for what the step's read set depends
            on) or "throughput-first" (quality-first, but a pending low-impact peer update
            of the read set may be read around; bounded staleness).
        timeout_s: deadline of every blocking wait (validate, drain, plan check).
        idle_timeout_s: limit of the transport's background waits (a gloo wait that times
            out breaks the connection, so keep this long; deadlines above fire first).
        recv_ahead: receives are posted for peers' steps up to this many steps past the
            rank's current step (capped at the plan's end). Posted receives cannot be
            cancelled, so with recv_ahead > 0 a phase must run to its plan's last step
            before ``rebind``.
        tau: throughput-first admission threshold (>= 0): a delayed read needs overlap
            ratio <= tau and gradient-evidence ratio < tau (``odin_ns.runtime.admission``).
            0 admits nothing (reads as in quality-first). Read at every decision, so it
            may be changed between phases.
        staleness_window: K, the most steps a delayed read may lag (t - s <= K).
        verify_plan: check at bind time that all ranks hold the same plan and model size.
        record_reads: keep, per step, the version of every row read and the version
            quality-first would have required (``read_records``) and every admission
            decision (``decisions``). For tests: memory grows with the run.
    """

    mode: str = "quality-first"
    timeout_s: float = 120.0
    idle_timeout_s: float = 1800.0
    recv_ahead: int = 0
    tau: float = 0.2
    staleness_window: int = 4
    verify_plan: bool = True
    record_reads: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"SyncConfig.mode must be one of {MODES}, got {self.mode!r}")
        if not self.timeout_s > 0 or not self.idle_timeout_s > 0:
            raise ValueError(
                f"timeouts must be > 0, got timeout_s={self.timeout_s}, "
                f"idle_timeout_s={self.idle_timeout_s}"
            )
        if self.recv_ahead < 0 or self.staleness_window < 0:
            raise ValueError("recv_ahead and staleness_window must be >= 0")
        if not (math.isfinite(self.tau) and self.tau >= 0):
            raise ValueError(f"SyncConfig.tau must be a finite number >= 0, got {self.tau}")


@dataclass
class StepMetrics:
    """What one step cost this rank. Applies and bytes between validate(t) and validate(t+1)
    count for step t. ``max_version_lag``: steps between t and the oldest step with an
    update this replica has not applied yet, right after validate(t). Throughput-first:
    ``admitted`` delayed reads (pending peer publications read around), ``fallbacks``
    (decisions that waited), ``delayed_rows`` (rows of the read set read at an older
    version than quality-first would), ``max_staleness`` (largest t - s admitted)."""

    step: int
    wait_s: float = 0.0
    apply_s: float = 0.0
    bytes_sent: int = 0
    bytes_recv: int = 0
    rows_applied: int = 0
    max_version_lag: int = 0
    admitted: int = 0
    fallbacks: int = 0
    delayed_rows: int = 0
    max_staleness: int = 0


@dataclass
class ReadRecord:
    """What rank r read at a step (``SyncConfig.record_reads``): for every row of its read
    set, the version (last applied global step) it had and the version quality-first would
    have required (the last step < t whose footprints contain the row)."""

    step: int
    rows: Tensor  # [M] int64 the read set F(r, t)
    version: Tensor  # [M] int64
    required: Tensor  # [M] int64


class _PendingStep:
    """Contributions and apply state of one step's update (rows = union of footprints)."""

    def __init__(self, footprints: list[Tensor]):
        self.footprints = footprints  # per rank [M_q] int64
        ids, counts = torch.unique(torch.cat(footprints), sorted=True, return_counts=True)
        self.ids = ids  # [U] int64
        self.expected = counts.to(torch.int32)  # [U] writers per row
        self.arrived = torch.zeros_like(self.expected)  # [U]
        self.applied = torch.zeros_like(ids, dtype=torch.bool)  # [U]
        self.positions = [torch.searchsorted(ids, fp) for fp in footprints]
        self.contrib: list[Tensor | None] = [None] * len(footprints)
        self.received = [False] * len(footprints)
        self.rows_done = ids.numel() == 0

    def add(self, q: int, buf: Tensor) -> None:
        self.contrib[q] = buf
        self.received[q] = True
        self.arrived[self.positions[q]] += 1

    def unapplied(self) -> Tensor:
        return self.ids[~self.applied]


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
    ):
        self.config = config if config is not None else SyncConfig()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, R={world_size}")
        self.rank = rank
        self.world_size = world_size
        self.process_group = process_group
        self.visibility_violations = 0
        self.metrics: list[StepMetrics] = []
        self._outside = StepMetrics(step=-1)  # applies/bytes before the first validate
        self._cur = self._outside
        self._drains = 0
        self._drain_s = 0.0
        self._throughput = self.config.mode == "throughput-first"
        self._fallbacks = dict.fromkeys(FALLBACK_REASONS, 0)
        self._staleness_hist: dict[int, int] = {}
        self._delayed_reads = 0
        self.admissions: list[Decision] = []  # every admitted delayed read
        self.decisions: list[Decision] = []  # every decision (record_reads only)
        self.read_records: list[ReadRecord] = []  # record_reads only
        _check_groups(groups)
        _check_plan(plan, world_size)
        if world_size > 1 and transport is None:
            if not dist.is_initialized():
                raise ValueError(
                    "world_size > 1 needs torch.distributed initialized or a transport"
                )
            transport = P2PTransport(rank, world_size, process_group, self.config.idle_timeout_s)
        self._transport = transport
        self._bind(groups, plan, step_offset, None)

    # ----------------------------------------------------------------- binding
    def _bind(self, groups, plan, step_offset: int, versions: Tensor | None) -> None:
        n = _check_groups(groups)
        self.num_steps = _check_plan(plan, self.world_size)
        if step_offset < 0:
            raise ValueError(f"step_offset must be >= 0, got {step_offset}")
        self.groups = list(groups)
        self.plan = plan
        self.step_offset = int(step_offset)
        self.num_rows = n
        self.device = self.groups[0].param.device
        self._row_dims = [g.row_dim for g in self.groups]
        self._width = sum(self._row_dims) + 1
        self._dependency = np.asarray(plan.dependency)
        self._message_rows = np.asarray(plan.message_rows)
        if versions is None:
            versions = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        elif versions.shape != (n,) or versions.dtype != torch.int64:
            raise ValueError(f"versions must be [{n}] int64, got {tuple(versions.shape)}")
        versions = versions.to(self.device)
        self.versions = versions  # [N] int64: last global step applied per primitive
        self._scratch = torch.zeros(n, dtype=torch.bool, device=self.device)  # [N]
        self._pending: dict[int, _PendingStep] = {}  # local step -> record
        self._created = -1  # records exist (or existed) for local steps <= this
        self._recv_done = [-1] * self.world_size  # per peer: received local steps <= this
        self._posted = [-1] * self.world_size  # per peer: receives posted up to
        self._validated = -1
        self._published = -1
        self._dirty = False
        if self._throughput:
            # Evidence is per phase: after a structural change row ids mean other Gaussians.
            self._evidence = GradientEvidence(n, self.world_size, self.device)
            self._read_mask = torch.zeros(n, dtype=torch.bool, device=self.device)  # [N]
        if self.config.record_reads:
            self._last_write = versions.clone()  # [N] last planned write (global step)
            self._writes: dict[int, Tensor] = {}  # local step -> union of its footprints
            self._lw_upto = -1
        if self.world_size > 1 and self.config.verify_plan:
            self._verify_plan()

    def _verify_plan(self) -> None:
        if not isinstance(self._transport, P2PTransport):
            return
        digest = hashlib.sha256(str(self.plan.plan_hash).encode()).digest()
        mine = [int.from_bytes(digest[:7], "little"), self.num_rows, self._width]
        local = torch.tensor(mine, dtype=torch.int64)  # gloo group: CPU tensors
        gathered = [torch.zeros_like(local) for _ in range(self.world_size)]
        try:
            work = dist.all_gather(gathered, local, group=self.process_group, async_op=True)
            work.wait(timedelta(seconds=self.config.timeout_s))
        except Exception as exc:
            raise PeerFailure(self.rank, -1, None, f"plan check failed: {exc}") from exc
        for q, other in enumerate(gathered):
            if other.tolist() != mine:
                raise ValueError(
                    f"rank {self.rank} and rank {q} disagree on (plan hash, N, D+1): "
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
        if any(p > self._published for p in self._posted):
            raise RuntimeError(
                f"rank {self.rank}: receives are posted past the last published step "
                f"{self.step_offset + self._published} (recv_ahead > 0); run the plan to its "
                "end before rebind, or use recv_ahead=0"
            )
        if self._validated != self._published or self._pending:
            raise RuntimeError(
                f"rank {self.rank}: rebind() needs a drained engine; call drain() first"
            )
        last = self.step_offset + self._published
        if step_offset <= last:
            raise ValueError(f"step_offset must be > the last published step {last}")
        if versions is None and groups and groups[0].param.shape[0] == self.num_rows:
            versions = self.versions
        self._bind(groups, plan, step_offset, versions)

    # ---------------------------------------------------------------- helpers
    def _local(self, step: int, what: str) -> int:
        t = int(step) - self.step_offset
        if not 0 <= t < self.num_steps:
            raise ValueError(
                f"{what}({step}): step outside the bound plan's steps "
                f"[{self.step_offset}, {self.step_offset + self.num_steps})"
            )
        return t

    def _footprint(self, t: int, q: int) -> Tensor:
        fp = np.asarray(self.plan.step_footprint(t, q))
        return torch.as_tensor(fp, dtype=torch.int64).to(self.device)

    def _record(self, t: int) -> _PendingStep:
        """Record of local step t, creating records of all steps <= t first.

        Records come from the plan, before any publication arrives, so an update of a
        later step can never overtake an earlier update of the same primitive that this
        replica has not heard of yet.
        """
        while self._created < t:
            s = self._created + 1
            fps = [self._footprint(s, q) for q in range(self.world_size)]
            self._pending[s] = _PendingStep(fps)
            if self.config.record_reads:
                self._writes[s] = self._pending[s].ids
            self._created = s
        rec = self._pending.get(t)
        if rec is None:
            raise RuntimeError(f"rank {self.rank}: step {self.step_offset + t} already retired")
        return rec

    def _tag(self, t: int) -> int:
        return (self.step_offset + t) % TAG_MODULUS

    def _post_receives(self, t: int) -> None:
        if self._transport is None:
            return
        limit = min(t + self.config.recv_ahead, self.num_steps - 1)
        for q in range(self.world_size):
            if q == self.rank:
                continue
            for s in range(self._posted[q] + 1, limit + 1):
                rows = int(self._message_rows[s, q])
                self._transport.post_recv(q, self.step_offset + s, self._tag(s), rows, self._width)
            self._posted[q] = max(self._posted[q], limit)

    def _absorb(self, arrivals: list[Arrival]) -> None:
        for a in arrivals:
            s = a.step - self.step_offset
            if s != self._recv_done[a.peer] + 1:
                raise RuntimeError(
                    f"rank {self.rank}: publication of step {a.step} from peer {a.peer} out of "
                    "order"
                )
            rec = self._record(s)
            buf = a.buf.to(self.device)
            rec.add(a.peer, buf)
            if self._throughput:
                self._evidence.observe(a.peer, rec.footprints[a.peer], buf)
            self._recv_done[a.peer] = s
            self._cur.bytes_recv += a.buf.numel() * a.buf.element_size()
            self._dirty = True

    def _poll(self, timeout: float = 0.0) -> None:
        if self._transport is None:
            return
        self._absorb(self._transport.take(timeout))
        err = self._transport.failure()
        if err is not None:
            raise err

    def _wait(self, blocker: Callable[[], tuple[int, int] | None], deadline: float, what: str):
        """Receive and apply until ``blocker()`` is None; it names the (peer, step) awaited."""
        while True:
            self._poll()
            self._apply_ready()
            waiting = blocker()
            if waiting is None:
                return
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                peer, step = waiting
                raise SyncTimeout(
                    self.rank,
                    peer,
                    step,
                    f"timed out after {self.config.timeout_s} s in {what}",
                )
            self._poll(remaining)

    def _recv_blocker(self, need: Sequence[int]) -> Callable[[], tuple[int, int] | None]:
        def blocker():
            for q in range(self.world_size):
                if q != self.rank and self._recv_done[q] < need[q]:
                    return q, self.step_offset + self._recv_done[q] + 1
            return None

        return blocker

    def _conflict(self, t: int, fp: Tensor) -> tuple[int, int] | None:
        """(peer, step) of an unapplied update at a step < t on a row of ``fp``, or None."""
        for s in sorted(self._pending):
            if s >= t:
                break
            rec = self._pending[s]
            if rec.rows_done:
                continue
            if bool(kernels.any_marked(fp, rec.unapplied(), self._scratch)):
                missing = [q for q in range(self.world_size) if not rec.received[q]]
                return (missing[0] if missing else -1), self.step_offset + s
        return None

    def _apply_ready(self) -> int:
        """Apply every ready row of every pending step, in step order per primitive."""
        if not self._dirty:
            return 0
        self._dirty = False
        start = time.perf_counter()
        n_rows = 0
        marked: list[Tensor] = []
        for s in sorted(self._pending):
            rec = self._pending[s]
            if not rec.rows_done:
                ready = kernels.ready_mask(
                    rec.arrived, rec.expected, rec.applied, self._scratch[rec.ids]
                )
                k = ready.nonzero().squeeze(1)
                if k.numel() > 0:
                    n_rows += self._apply_rows(s, rec, k)
                rest = rec.unapplied()
                if rest.numel() > 0:
                    self._scratch[rest] = True
                    marked.append(rest)
                else:
                    rec.rows_done = True
                    rec.contrib = [None] * self.world_size
            if rec.rows_done and all(rec.received):
                del self._pending[s]
        for rest in marked:
            self._scratch[rest] = False
        self._cur.apply_s += time.perf_counter() - start
        self._cur.rows_applied += n_rows
        return n_rows

    def _apply_rows(self, s: int, rec: _PendingStep, k: Tensor) -> int:
        acc = torch.zeros(k.numel(), self._width, dtype=torch.float32, device=self.device)
        for q in range(self.world_size):  # fixed rank order: bitwise identical sums
            buf = rec.contrib[q]
            if buf is not None and buf.shape[0] > 0:
                slots = kernels.scatter_slots(rec.ids.numel(), rec.positions[q])
                kernels.accumulate_rows_(acc, slots[k], buf)
        step = self.step_offset + s
        kernels.apply_rows_(
            [g.param for g in self.groups],
            [g.exp_avg for g in self.groups],
            [g.exp_avg_sq for g in self.groups],
            rec.ids[k],
            acc,
            [g.lr_at(step) for g in self.groups],
            [g.betas for g in self.groups],
            [g.eps for g in self.groups],
            step,
            self.versions,
        )
        rec.applied[k] = True
        return int(k.numel())

    # ------------------------------------------------------------- step path
    def validate(self, step: int) -> float:
        """Block until step ``step``'s read set is up to date (per mode); returns wait seconds."""
        t = self._local(step, "validate")
        if t != self._published + 1 or self._validated != self._published:
            raise ValueError(
                f"validate({step}): expected step {self.step_offset + self._published + 1} "
                "(steps run in order; publish() each validated step)"
            )
        self._validated = t
        self._cur = StepMetrics(step=int(step))
        self.metrics.append(self._cur)
        start = time.perf_counter()
        apply_before = self._cur.apply_s
        deadline = start + self.config.timeout_s
        self._post_receives(t)
        if self._throughput:
            self._validate_throughput(t, int(step), deadline)
        else:
            if self.config.mode == "barrier":
                need = [t - 1] * self.world_size
            else:
                need = [int(d) for d in self._dependency[t, self.rank]]
            self._wait(
                self._recv_blocker(need), deadline, f"validate({step}) waiting for its publication"
            )
            fp = self._record(t).footprints[self.rank]
            if self._conflict(t, fp) is not None:
                # The plan's dependency table missed a writer: a bug upstream. Stay exact.
                self.visibility_violations += 1
                self._wait(
                    lambda: self._conflict(t, fp),
                    deadline,
                    f"validate({step}) waiting for an update of a row it reads",
                )
        pending_rows = [s for s, rec in self._pending.items() if not rec.rows_done and s < t]
        self._cur.max_version_lag = t - min(pending_rows) if pending_rows else 0
        self._cur.wait_s = time.perf_counter() - start - (self._cur.apply_s - apply_before)
        if self.config.record_reads:
            self._record_reads(t)
        return self._cur.wait_s

    # ------------------------------------------------------ throughput-first
    def _validate_throughput(self, t: int, step: int, deadline: float) -> None:
        """Decide on every pending overlapping peer publication; wait for the fallbacks and
        decide again until every remaining one is admitted (odin_ns.runtime.admission)."""
        fp = self._record(t).footprints[self.rank]
        while True:
            self._poll()
            self._apply_ready()
            decided, need = self._decide(t, fp)
            fallbacks = [d for d, _, _ in decided if not d.admitted]
            if not fallbacks:
                break
            self._count(fallbacks)
            self._wait(
                self._recv_blocker(need), deadline, f"validate({step}) waiting for its publication"
            )
        self._count([d for d, _, _ in decided])
        excuse = None  # [M] per read row: the earliest admitted pending step that writes it
        if decided:
            excuse = torch.full_like(fp, self.num_steps)
            for _, ids, s in decided:
                pos = torch.searchsorted(fp, ids)
                excuse[pos] = excuse[pos].clamp(max=s)
        conflict, stale = self._stale_reads(t, fp, excuse)
        if conflict is not None:
            # An unapplied update of a read row that no admitted decision explains: the
            # plan's dependency table missed a writer (a bug upstream). Stay exact.
            self.visibility_violations += 1
            self._wait(
                lambda: self._stale_reads(t, fp, excuse)[0],
                deadline,
                f"validate({step}) waiting for an update of a row it reads",
            )
            _, stale = self._stale_reads(t, fp, excuse)
        self._cur.delayed_rows = stale
        self._delayed_reads += stale

    def _decide(self, t: int, fp: Tensor) -> tuple[list[tuple[Decision, Tensor, int]], list[int]]:
        """Decisions on peers' pending publications that overlap ``fp`` (newest first per
        peer, up to the first fallback); returns ([(decision, overlap ids, local s)], need)
        with need[q] the local step to wait for from q (-1: none)."""
        need = [-1] * self.world_size
        decided: list[tuple[Decision, Tensor, int]] = []
        if fp.numel() == 0:
            return decided, need
        tau, window = float(self.config.tau), int(self.config.staleness_window)
        mask = self._read_mask
        mask[fp] = True
        try:
            for q in range(self.world_size):
                if q == self.rank:
                    continue
                for s in range(int(self._dependency[t, self.rank, q]), self._recv_done[q], -1):
                    fq = self._pending[s].footprints[q]
                    hit = mask[fq]
                    n = int(hit.sum())
                    if n == 0:
                        continue
                    ids = fq[hit]
                    reason, ratio = fallback_reason(
                        self.step_offset + t,
                        self.step_offset + s,
                        self.step_offset,
                        n,
                        fp.numel(),
                        lambda q=q, ids=ids: self._evidence.ratio(q, ids),
                        tau,
                        window,
                    )
                    decision = Decision(
                        self.step_offset + t, q, self.step_offset + s, n, fp.numel(), ratio, reason
                    )
                    decided.append((decision, ids, s))
                    if reason is not None:
                        need[q] = s  # q's older publications arrive before s: no decision
                        break
        finally:
            mask[fp] = False
        return decided, need

    def _count(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if d.admitted:
                self.admissions.append(d)
                self._staleness_hist[d.staleness] = self._staleness_hist.get(d.staleness, 0) + 1
                self._cur.admitted += 1
                self._cur.max_staleness = max(self._cur.max_staleness, d.staleness)
            else:
                self._fallbacks[str(d.reason)] += 1
                self._cur.fallbacks += 1
            if self.config.record_reads:
                self.decisions.append(d)

    def _stale_reads(
        self, t: int, fp: Tensor, excuse: Tensor | None
    ) -> tuple[tuple[int, int] | None, int]:
        """(peer, step) of an unapplied update of a row of ``fp`` at a step < t that no
        admitted decision explains (``excuse[i] > s``), or None; and how many rows of
        ``fp`` have an unapplied update at a step < t (rows read stale)."""
        stale = torch.zeros_like(fp, dtype=torch.bool)
        conflict = None
        for s in sorted(self._pending):
            if s >= t:
                break
            rec = self._pending[s]
            if rec.rows_done:
                continue
            rest = rec.unapplied()
            self._scratch[rest] = True
            hit = self._scratch[fp]
            self._scratch[rest] = False
            if not bool(hit.any()):
                continue
            stale |= hit
            if conflict is None:
                bad = hit if excuse is None else hit & (excuse > s)
                if bool(bad.any()):
                    missing = [q for q in range(self.world_size) if not rec.received[q]]
                    conflict = (missing[0] if missing else -1), self.step_offset + s
        return conflict, int(stale.sum())

    def _record_reads(self, t: int) -> None:
        while self._lw_upto < t - 1:
            s = self._lw_upto + 1
            self._last_write[self._writes.pop(s)] = self.step_offset + s
            self._lw_upto = s
        fp = self._record(t).footprints[self.rank]
        self.read_records.append(
            ReadRecord(
                self.step_offset + t,
                fp.clone(),
                self.versions[fp].clone(),
                self._last_write[fp].clone(),
            )
        )

    @torch.no_grad()
    def publish(self, step: int, grads: Mapping[str, Tensor | None], visible: Tensor) -> None:
        """Publish this rank's update of ``step``: gradient rows of its footprint + visibility.

        Args:
            step: the step last passed to ``validate``.
            grads: per group name a full [N, ...] gradient, or None for zero.
            visible: [N] bool rows visible in this rank's views (all inside the footprint).
        """
        t = self._local(step, "publish")
        if t != self._validated or t == self._published:
            raise ValueError(
                f"publish({step}): validate({step}) must come first, once per step "
                f"(last validated step {self.step_offset + self._validated})"
            )
        names = [g.name for g in self.groups]
        if set(grads) != set(names):
            raise ValueError(f"grads must have exactly the keys {names}, got {sorted(grads)}")
        for g in self.groups:
            grad = grads[g.name]
            if grad is not None and grad.shape != g.param.shape:
                raise ValueError(
                    f"grad of {g.name!r} has shape {tuple(grad.shape)}, "
                    f"expected {tuple(g.param.shape)}"
                )
        if visible.shape != (self.num_rows,) or visible.dtype != torch.bool:
            raise ValueError(f"visible must be a [{self.num_rows}] bool mask")
        rec = self._record(t)
        fp = rec.footprints[self.rank]
        if int(self._message_rows[t, self.rank]) != fp.numel():
            raise ValueError(
                f"plan.message_rows[{t}, {self.rank}] = {int(self._message_rows[t, self.rank])} "
                f"but the footprint has {fp.numel()} rows"
            )
        if int(visible.sum()) != int(visible[fp].sum()):
            raise ValueError(
                f"publish({step}): visible rows outside the planned footprint; a rank may only "
                "read and write plan.step_footprint(t, rank)"
            )
        buf = kernels.pack_rows([grads[n] for n in names], self._row_dims, fp, visible)
        if self._transport is not None:
            wire = buf.cpu()  # one host copy for all peers (gloo moves CPU tensors)
            for q in range(self.world_size):
                if q != self.rank:
                    self._transport.send(q, int(step), self._tag(t), wire)
                    self._cur.bytes_sent += buf.numel() * buf.element_size()
        rec.add(self.rank, buf)
        self._published = t
        self._dirty = True

    def progress(self) -> int:
        """Non-blocking: take what has arrived and apply what is ready; returns rows applied."""
        self._poll()
        return self._apply_ready()

    def drain(self) -> float:
        """Receive and apply every publication up to the last published step; wait for sends.

        All ranks must call it after the same step. Afterwards every replica is bitwise
        identical and ``versions`` is equal on all ranks. Returns seconds spent.
        """
        if self._validated != self._published:
            raise ValueError("drain() between validate() and publish() of a step")
        start = time.perf_counter()
        deadline = start + self.config.timeout_s
        last = self._published
        self._wait(
            self._recv_blocker([last] * self.world_size),
            deadline,
            "drain() waiting for its publication",
        )
        self._apply_ready()
        left = [s for s, rec in self._pending.items() if s <= last]
        if left:
            raise RuntimeError(f"rank {self.rank}: drain left steps {left} unapplied (a bug)")
        if self._transport is not None:
            self._wait(self._transport.oldest_unsent, deadline, "drain() waiting for a send to it")
        elapsed = time.perf_counter() - start
        self._drains += 1
        self._drain_s += elapsed
        return elapsed

    def close(self) -> None:
        """Stop the transport's background threads (call after a drain)."""
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> PrimitiveSyncEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- metrics
    def summary(self) -> dict:
        """Run totals (JSON-ready). The admission keys (``admitted`` ... ``staleness_hist``)
        are zero / empty outside throughput-first; ``decisions`` = admitted + fallbacks."""
        ms = self.metrics
        waits = [m.wait_s for m in ms]
        every = [*ms, self._outside]
        admitted = len(self.admissions)
        decisions = admitted + sum(self._fallbacks.values())
        overlap = [d.overlap_ratio for d in self.admissions]
        evidence = [d.evidence_ratio for d in self.admissions]
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "mode": self.config.mode,
            "plan_hash": str(self.plan.plan_hash),
            "steps": len(ms),
            "wait_s_total": float(sum(waits)),
            "wait_s_mean": float(np.mean(waits)) if waits else 0.0,
            "wait_s_max": float(max(waits)) if waits else 0.0,
            "apply_s_total": float(sum(m.apply_s for m in every)),
            "bytes_sent": int(sum(m.bytes_sent for m in every)),
            "bytes_recv": int(sum(m.bytes_recv for m in every)),
            "rows_applied": int(sum(m.rows_applied for m in every)),
            "max_version_lag": int(max((m.max_version_lag for m in ms), default=0)),
            "visibility_violations": self.visibility_violations,
            "drains": self._drains,
            "drain_s_total": self._drain_s,
            "tau": float(self.config.tau),
            "staleness_window": int(self.config.staleness_window),
            "admitted": admitted,
            "fallbacks": dict(self._fallbacks),
            "decisions": decisions,
            "admitted_fraction": admitted / decisions if decisions else 0.0,
            "delayed_steps": int(sum(1 for m in ms if m.admitted)),
            "delayed_primitive_reads": int(self._delayed_reads),
            "max_staleness": max(self._staleness_hist, default=0),
            "staleness_hist": {str(k): v for k, v in sorted(self._staleness_hist.items())},
            "overlap_ratio_admitted_mean": float(np.mean(overlap)) if overlap else 0.0,
            "overlap_ratio_admitted_max": float(max(overlap, default=0.0)),
            "evidence_ratio_admitted_mean": float(np.mean(evidence)) if evidence else 0.0,
            "evidence_ratio_admitted_max": float(max(evidence, default=0.0)),
        }

    def admission_log(self) -> list[dict]:
        """Every admitted delayed read: step, peer, pub_step, staleness, overlap rows and
        ratio, evidence ratio (JSON-ready)."""
        return [
            {
                "step": d.step,
                "peer": d.peer,
                "pub_step": d.pub_step,
                "staleness": d.staleness,
                "overlap_rows": d.overlap_rows,
                "read_rows": d.read_rows,
                "overlap_ratio": d.overlap_ratio,
                "evidence_ratio": d.evidence_ratio,
            }
            for d in self.admissions
        ]

    def step_metrics(self) -> list[dict]:
        """Per-step metrics as dicts."""
        return [asdict(m) for m in self.metrics]


__all__ = [
    "MODES",
    "ParamGroupState",
    "PeerFailure",
    "PrimitiveSyncEngine",
    "ReadRecord",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
]
