"""Test helpers for the runtime: explicit plans, a toy model, a single-process reference,
an in-process loopback transport and a multi-process gloo harness.

Imported as ``harness.toy`` (``tests/`` is on ``sys.path``; spawned ranks inherit it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from harness.memory_liveness import MemoryBoard, MemoryLiveness
from odin_ns.optim import selective_adam_update_
from odin_ns.runtime import (
    ALL_PEERS,
    Arrival,
    P2PTransport,
    ParamGroupState,
    PeerFailure,
    RunLedger,
    SyncConfig,
    SyncError,
)
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import replicated_layout
from odin_ns.runtime.liveness import Liveness, PeerSilence, StoreLiveness
from odin_ns.runtime.step_signal import StepSignal


class ListPlan:
    """A ``Plan`` from explicit per-(t, r) footprints; dependency found by brute force.

    Args:
        footprints: T lists of R primitive-id sequences (rank r's rows at step t).
        dependency: optional [T, R, R] override (to test a plan with a wrong table).
    """

    def __init__(self, footprints: Sequence[Sequence[Sequence[int]]], dependency=None):
        self._fp = [[np.unique(np.asarray(f, dtype=np.int64)) for f in step] for step in footprints]
        num_steps, world = len(self._fp), len(self._fp[0])
        if any(len(step) != world for step in self._fp):
            raise ValueError("every step needs one footprint per rank")
        self.num_steps = num_steps
        self.views = np.arange(num_steps * world, dtype=np.int64).reshape(num_steps, world, 1)
        self.message_rows = np.array(
            [[len(f) for f in step] for step in self._fp], dtype=np.int64
        ).reshape(num_steps, world)
        dep = np.full((num_steps, world, world), -1, dtype=np.int64)
        for t in range(num_steps):
            for r in range(world):
                for q in range(world):
                    if q == r:
                        continue
                    for s in range(t - 1, -1, -1):
                        if np.intersect1d(self._fp[s][q], self._fp[t][r]).size:
                            dep[t, r, q] = s
                            break
        self.dependency = dep if dependency is None else np.asarray(dependency, dtype=np.int64)
        digest = hashlib.sha256()
        for step in self._fp:
            for f in step:
                digest.update(f.tobytes() + b"|")
        digest.update(self.dependency.tobytes())
        self.plan_hash = digest.hexdigest()

    def step_footprint(self, t: int, r: int) -> np.ndarray:
        return self._fp[t][r]


def assert_same_ids(a: Tensor | Sequence[Tensor], b: Tensor | Sequence[Tensor]) -> None:
    """Equal host-kernel outputs of ids: int64 tensors of one shape and values, or lists of
    them (nested), element by element."""
    if isinstance(a, Tensor):
        assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_ids(x, y)


def random_footprints(
    num_rows: int,
    num_steps: int,
    world_size: int,
    seed: int,
    size: int = 40,
    spread: float = 0.6,
) -> list[list[np.ndarray]]:
    """Footprints where rank r draws from its own window of rows that overlaps its
    neighbours' windows (``spread`` of the rows per window), so dependencies vary."""
    rng = np.random.default_rng(seed)
    win = int(num_rows * spread)
    starts = np.linspace(0, num_rows - win, world_size).astype(int)
    out = []
    for _ in range(num_steps):
        step = []
        for r in range(world_size):
            k = int(rng.integers(0, size + 1))
            step.append(np.sort(rng.choice(np.arange(starts[r], starts[r] + win), k, False)))
        out.append(step)
    return out


# ------------------------------------------------------------------- toy model
def toy_groups(num_rows: int, seed: int = 0) -> list[ParamGroupState]:
    """Three groups with splatfacto-like row shapes: [N, 3], [N, 4, 3], [N, 1]."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"means": (3,), "features": (4, 3), "opacities": (1,)}
    lrs = {"means": 0.05, "features": 0.02, "opacities": 0.1}
    groups = []
    for name, shape in shapes.items():
        param = torch.randn(num_rows, *shape, generator=g)
        groups.append(
            ParamGroupState(
                name,
                param,
                torch.zeros_like(param),
                torch.zeros_like(param),
                lr_at=lambda s, base=lrs[name]: base * 0.97**s,
                betas=(0.9, 0.99),
                eps=1e-15,
            )
        )
    return groups


def grow_groups(groups: Sequence[ParamGroupState], extra: int, seed: int):
    """Append ``extra`` rows (new params, zero moments), like a densification step."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for grp in groups:
        new = torch.randn(extra, *grp.param.shape[1:], generator=g)
        z = torch.zeros_like(new)
        out.append(
            ParamGroupState(
                grp.name,
                torch.cat([grp.param, new]),
                torch.cat([grp.exp_avg, z]),
                torch.cat([grp.exp_avg_sq, z]),
                grp.lr_at,
                grp.betas,
                grp.eps,
            )
        )
    return out


WEAK_SCALE = 1e-3


def toy_grads(
    groups: Sequence[ParamGroupState],
    view: int,
    footprint: np.ndarray,
    weak: tuple[int, int] | None = None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Gradient of a per-view quadratic loss ``w_v * |theta_p - target_v,p|^2`` over the
    footprint rows (a deterministic function of the rows read), and a visible subset.
    Rows in ``weak = (lo, hi)`` get ``WEAK_SCALE`` x that gradient (low-impact primitives,
    for throughput-first's gradient evidence)."""
    n = groups[0].param.shape[0]
    rows = torch.as_tensor(footprint, dtype=torch.int64)
    gen = torch.Generator().manual_seed(1000 + int(view))
    weight = 1.0 + (int(view) % 3)
    grads = {}
    for grp in groups:
        target = torch.randn(rows.numel(), *grp.param.shape[1:], generator=gen)
        grad = torch.zeros_like(grp.param)
        grad[rows] = 2.0 * weight * (grp.param[rows] - target)
        if weak is not None:
            low = rows[(rows >= weak[0]) & (rows < weak[1])]
            grad[low] *= WEAK_SCALE
        grads[grp.name] = grad
    visible = torch.zeros(n, dtype=torch.bool)
    visible[rows[(rows + int(view)) % 4 != 0]] = True
    return grads, visible


@dataclass
class Phase:
    """One phase of a toy run: a plan, its first global step, rows appended before it."""

    plan: Any
    step_offset: int
    grow: int = 0


def _as_read(
    groups: Sequence[ParamGroupState],
    footprint: np.ndarray,
    version: Tensor,
    pre: dict[int, dict[str, Tensor]],
    writes: dict[int, list[int]],
) -> tuple[list[ParamGroupState], Tensor]:
    """The replica as a rank saw it: row p of ``footprint`` at version ``version[i]``, i.e.
    its value just before its first write after that version (current if none); and the
    [K] int64 rows it read stale (written since, ``writes`` holding the earlier steps')."""
    params = {g.name: g.param.clone() for g in groups}
    stale = []
    for p, v in zip(footprint.tolist(), version.tolist(), strict=True):
        later = [w for w in writes.get(p, []) if w > v]
        if later:
            stale.append(p)
            for name, param in params.items():
                param[p] = pre[later[0]][name][p]
    seen = [
        ParamGroupState(g.name, params[g.name], g.exp_avg, g.exp_avg_sq, g.lr_at, g.betas, g.eps)
        for g in groups
    ]
    return seen, torch.as_tensor(stale, dtype=torch.int64)


def reference_train(
    groups: Sequence[ParamGroupState],
    phases: Sequence[Phase],
    weak: tuple[int, int] | None = None,
    reads: Mapping[tuple[int, int], Tensor] | None = None,
    stale_gradients: str = "apply",
):
    """Synchronous single-process reference: the same sum in rank order, selective Adam.

    With ``reads`` ((rank, global step) -> [M] int64 versions of the rows of
    ``step_footprint`` that rank read, e.g. from ``ToyRank.reads``), each
    rank's gradient is computed from the rows at those versions instead of the current
    ones: the reference for runs with delayed reads. With ``stale_gradients`` "drop" the
    rows it read stale (behind their last write before the step) get no update from it;
    with "apply" (``SyncConfig``'s default) they get the gradient of the values read.

    Returns (groups, versions [N] int64).
    """
    groups = list(groups)
    versions = torch.full((groups[0].param.shape[0],), -1, dtype=torch.int64)
    pre: dict[int, dict[str, Tensor]] = {}  # global step -> replica before that step
    writes: dict[int, list[int]] = {}  # row -> global steps that wrote it
    for i, ph in enumerate(phases):
        if ph.grow:
            groups = grow_groups(groups, ph.grow, seed=i)
            versions = torch.cat([versions, torch.full((ph.grow,), -1, dtype=torch.int64)])
        world = ph.plan.views.shape[1]
        for t in range(ph.plan.views.shape[0]):
            step = ph.step_offset + t
            if reads is not None:
                pre[step] = {g.name: g.param.clone() for g in groups}
            outs = []
            for r in range(world):
                fp = ph.plan.step_footprint(t, r)
                seen, stale = groups, None
                if reads is not None:
                    seen, stale = _as_read(groups, fp, reads[(r, step)], pre, writes)
                grads, vis = toy_grads(seen, ph.plan.views[t, r, 0], fp, weak)
                if stale is not None and stale_gradients == "drop":  # no update from them
                    vis[stale] = False
                    for g in grads.values():
                        g[stale] = 0.0
                outs.append((fp, grads, vis))
            touched = torch.zeros(groups[0].param.shape[0], dtype=torch.bool)
            visible = torch.zeros_like(touched)
            total = {g.name: torch.zeros_like(g.param) for g in groups}
            for fp, grads, vis in outs:  # rank order
                rows = torch.as_tensor(fp, dtype=torch.int64)
                touched[rows] = True
                visible |= vis
                for g in groups:
                    total[g.name][rows] += grads[g.name][rows]
            for g in groups:
                b1, b2 = g.betas
                selective_adam_update_(
                    g.param,
                    total[g.name],
                    g.exp_avg,
                    g.exp_avg_sq,
                    visible,
                    g.lr_at(step),
                    b1,
                    b2,
                    g.eps,
                    step=step + 1,
                )
            versions[touched] = step
            if reads is not None:
                for p in touched.nonzero().squeeze(1).tolist():
                    writes.setdefault(p, []).append(step)
    return groups, versions


@dataclass
class ToyRun:
    """Options of one rank's toy training loop (``run_toy_rank``)."""

    phases: list[Phase]
    config: SyncConfig = field(default_factory=SyncConfig)
    seed: int = 0
    num_rows: int = 300
    sleep_s: dict[int, float] = field(default_factory=dict)  # rank -> sleep per step
    jitter_s: float = 0.0  # random extra sleep per step, up to this
    die_at: dict[int, int] = field(default_factory=dict)  # rank -> os._exit(1) at step
    stall_at: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (step, s)
    busy_at: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (step, s)
    weak: tuple[int, int] | None = None  # rows with WEAK_SCALE x gradient (toy_grads)
    record: bool = False  # keep every step's read versions (``ToyRank.reads``)
    tables_thread: bool | None = None  # ``Engine``'s (None: its default for the device)


class ReadRecord(NamedTuple):
    """What one step read: its rows, the step each had applied, the step quality-first
    reads it at (``Engine.read_versions``)."""

    step: int
    rows: np.ndarray
    version: Tensor
    required: Tensor


def read_record(engine: Engine, t: int) -> ReadRecord:
    """What local step t reads, after its ``before_step``."""
    rows, have, need = engine.read_versions(t)
    return ReadRecord(engine.offset + t, rows, torch.from_numpy(have), torch.from_numpy(need))


class ToyRank(NamedTuple):
    """One rank's outcome of ``run_toy_rank``."""

    groups: list[ParamGroupState]
    engine: Engine  # the last phase's
    ledger: RunLedger  # every phase's steps and decisions
    reads: list[ReadRecord]  # with ``ToyRun.record``, else empty


def replicated_engine(
    groups: Sequence[ParamGroupState],
    plan: Any,
    rank: int,
    world_size: int,
    config: SyncConfig | None = None,
    transport=None,
    step_offset: int = 0,
    versions: Tensor | None = None,
    silence: PeerSilence | None = None,
    step_signal=None,
    ledger: RunLedger | None = None,
    tables_thread: bool | None = None,
) -> Engine:
    """The engine of one replicated phase: every rank owns every row (``EVERY_RANK``);
    ``versions`` default all -1."""
    config = config if config is not None else SyncConfig()
    n = groups[0].param.shape[0]
    return Engine(
        groups,
        replicated_layout(n, rank),
        plan,
        rank,
        world_size,
        transport,
        None,
        step_offset=step_offset,
        versions=versions if versions is not None else torch.full((n,), -1, dtype=torch.int64),
        timeout_s=config.timeout_s,
        silence=silence,
        max_inflight_bytes=config.max_inflight_bytes,
        sync=config,
        step_signal=step_signal,
        ledger=ledger,
        tables_thread=tables_thread,
    )


def train_step(
    engine: Engine,
    groups: Sequence[ParamGroupState],
    t: int,
    weak: tuple[int, int] | None = None,
    reads: list | None = None,
) -> None:
    """``before_step``, the toy backward of rank ``engine.rank``'s view at local step t,
    ``after_backward``; the step's ``ReadRecord`` appended to ``reads`` if given."""
    engine.before_step(t)
    if reads is not None:
        reads.append(read_record(engine, t))
    plan = engine.plan
    grads, visible = toy_grads(groups, plan.views[t, engine.rank, 0],
                               plan.step_footprint(t, engine.rank), weak)  # fmt: skip
    engine.after_backward(t, [grads[g.name] for g in groups], visible)


def run_toy_rank(
    rank: int,
    world_size: int,
    run: ToyRun,
    transport=None,
    liveness: Liveness | None = None,
    step_signal=None,
    keep: list | None = None,
) -> ToyRank:
    """One rank's replicated loop: before_step, toy forward/backward on the read set,
    after_backward; drain and a new engine between phases; drain at the end.

    Without ``transport`` the rank is a gloo process (``spawn_ranks``): a ``P2PTransport``
    on the default group, ``StoreLiveness`` and (barrier) a ``StepSignal`` of its own.
    ``stall_at``: a silent sleep before backward (a stuck rank); ``busy_at``: a sleep after
    the step inside ``liveness.busy`` (rank-0-only work, announced). ``keep``: the run's
    ledger is appended to it (to read its metrics after a failure)."""
    cfg = run.config
    spawned = transport is None and world_size > 1
    if spawned:
        transport = P2PTransport(rank, world_size, None, cfg.idle_timeout_s)
        liveness = StoreLiveness(rank, world_size, cfg.beat_s)
        if cfg.mode == "barrier":
            step_signal = StepSignal(dist.new_group(backend="gloo"))
    silence = PeerSilence(liveness, rank, world_size, cfg.beat_s, cfg.timeout_s)
    ledger = RunLedger()
    if keep is not None:
        keep.append(ledger)
    groups = toy_groups(run.num_rows, run.seed)
    versions = torch.full((run.num_rows,), -1, dtype=torch.int64)
    rng = np.random.default_rng(run.seed * 100 + rank)
    reads: list[ReadRecord] = []
    engine = None
    for i, ph in enumerate(run.phases):
        if i > 0:
            engine.drain()
            if ph.grow:
                groups = grow_groups(groups, ph.grow, seed=i)
                versions = torch.cat([versions, torch.full((ph.grow,), -1, dtype=torch.int64)])
        engine = replicated_engine(
            groups, ph.plan, rank, world_size, cfg, transport, ph.step_offset, versions,
            silence, step_signal, ledger, run.tables_thread,
        )  # fmt: skip
        for t in range(ph.plan.views.shape[0]):
            step = ph.step_offset + t
            engine.before_step(t)
            if run.record:
                reads.append(read_record(engine, t))
            if run.die_at.get(rank) == step:
                os._exit(1)
            if rank in run.stall_at and run.stall_at[rank][0] == step:
                time.sleep(run.stall_at[rank][1])
            fp = ph.plan.step_footprint(t, rank)
            grads, visible = toy_grads(groups, ph.plan.views[t, rank, 0], fp, run.weak)
            pause = run.sleep_s.get(rank, 0.0) + run.jitter_s * float(rng.random())
            if pause:
                time.sleep(pause)
            engine.after_backward(t, [grads[g.name] for g in groups], visible)
            if rank in run.busy_at and run.busy_at[rank][0] == step:
                with liveness.busy("toy busy section"):
                    time.sleep(run.busy_at[rank][1])
    engine.drain()
    if spawned:  # its threads end with the run
        transport.close()
        liveness.close()
    return ToyRank(groups, engine, ledger, reads)


def toy_result(res: ToyRank, config: SyncConfig) -> dict:
    """Picklable outcome of a toy run."""
    groups, engine, ledger, reads = res
    return {
        "params": {g.name: g.param.clone() for g in groups},
        "exp_avg": {g.name: g.exp_avg.clone() for g in groups},
        "versions": engine.versions.clone(),
        "summary": ledger.summary(config),
        "steps": ledger.step_metrics(),
        "admissions": ledger.admission_log(),
        "reads": [tuple(r) for r in reads],
    }


def toy_outcome_worker(rank: int, world_size: int, run: ToyRun) -> dict:
    """Spawned-process entry: one toy run; its summary and step metrics also when it fails
    (``error``: the failure's first line, None on success)."""
    keep: list = []
    error = None
    try:
        run_toy_rank(rank, world_size, run, keep=keep)
    except SyncError as err:
        error = f"{type(err).__name__}: {err}"
    ledger = keep[0] if keep else None
    return {
        "error": error,
        "summary": ledger.summary(run.config) if ledger is not None else None,
        "steps": ledger.step_metrics() if ledger is not None else [],
    }


def toy_runs_worker(rank: int, world_size: int, runs: Sequence[ToyRun]) -> list[dict]:
    """Spawned-process entry: several toy runs in a row on the default process group."""
    return [toy_result(run_toy_rank(rank, world_size, run), run.config) for run in runs]


class LoopbackSignal:
    """Barrier mode's global step signal between rank threads (``runtime.step_signal``'s
    protocol): every rank's last finished step, shared."""

    def __init__(self, world_size: int):
        self.lock = threading.Lock()
        self.done = [-1] * world_size

    def port(self, rank: int) -> _SignalPort:
        return _SignalPort(self, rank)


class _SignalPort:
    def __init__(self, hub: LoopbackSignal, rank: int):
        self.hub, self.rank = hub, rank

    def finished(self, step: int) -> None:
        with self.hub.lock:
            self.hub.done[self.rank] = step

    def everyone_finished(self, step: int) -> bool:
        with self.hub.lock:
            return min(self.hub.done) >= step

    def settled(self) -> bool:
        return True


# ---------------------------------------------------------- loopback transport
class LoopbackHub:
    """In-process transport between R engines in threads (exercises arbitrary
    interleavings quickly; the real transport is ``P2PTransport``)."""

    def __init__(self, world_size: int):
        self.lock = threading.Lock()
        self.ports = [LoopbackTransport(self, r) for r in range(world_size)]
        self.mail: dict[tuple[int, int, int], tuple[int, Tensor]] = {}
        self.held: set[tuple[int, int]] = set()
        self.reducing: dict[int, dict[int, Tensor]] = {}  # step -> rank -> buffer

    def all_reduce(self, rank: int, step: int, buf: Tensor) -> None:
        """Contribute ``buf``; once every rank has, each gets the sum in rank order."""
        with self.lock:
            parts = self.reducing.setdefault(step, {})
            parts[rank] = buf.clone()
            if len(parts) < len(self.ports):
                return
            del self.reducing[step]
            total = parts[0].clone()
            for r in range(1, len(self.ports)):
                total += parts[r]
            for port in self.ports:
                with port.cond:
                    port.inbox.append(Arrival(ALL_PEERS, step, total.clone()))
                    port.cond.notify_all()

    def transport(self, rank: int) -> LoopbackTransport:
        return self.ports[rank]

    def hold(self, src: int, dst: int) -> None:
        """Delay delivery from ``src`` to ``dst`` (to force a cross-peer arrival order)."""
        with self.lock:
            self.held.add((src, dst))

    def release(self, src: int, dst: int) -> None:
        """Deliver what was held from ``src`` to ``dst`` (all at once) and stop holding."""
        with self.lock:
            self.held.discard((src, dst))
            port = self.ports[dst]
            with port.cond:  # re-entrant: the receiver sees all of it or none of it
                for (peer, tag), spec in sorted(port.posted.items(), key=lambda kv: kv[1][0]):
                    msg = self.mail.pop((src, dst, tag), None) if peer == src else None
                    if msg is not None:
                        del port.posted[(peer, tag)]
                        port._deliver(peer, spec, *msg)


class LoopbackTransport:
    """One rank's end of a ``LoopbackHub``: matches sends to posted receives by tag."""

    def __init__(self, hub: LoopbackHub, rank: int):
        self.hub = hub
        self.rank = rank
        self.cond = threading.Condition()
        self.inbox: list[Arrival] = []
        self.posted: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.error: SyncError | None = None

    def _deliver(self, peer: int, spec: tuple[int, int, int], step: int, buf: Tensor) -> None:
        with self.cond:
            if (spec[0], spec[1], spec[2]) != (step, *buf.shape):
                self.error = PeerFailure(self.rank, peer, step, "message size mismatch")
            else:
                self.inbox.append(Arrival(peer, step, buf.clone()))
            self.cond.notify_all()

    def post_recv(self, peer: int, step: int, tag: int, rows: int, cols: int) -> None:
        with self.hub.lock:
            held = (peer, self.rank) in self.hub.held
            msg = None if held else self.hub.mail.pop((peer, self.rank, tag), None)
            if msg is None:
                self.posted[(peer, tag)] = (step, rows, cols)
            else:
                self._deliver(peer, (step, rows, cols), *msg)

    def send(self, peer: int, step: int, tag: int, buf: Tensor) -> None:
        with self.hub.lock:
            dst = self.hub.ports[peer]
            held = (self.rank, peer) in self.hub.held
            spec = None if held else dst.posted.pop((self.rank, tag), None)
            if spec is None:
                self.hub.mail[(self.rank, peer, tag)] = (step, buf.clone())
            else:
                dst._deliver(self.rank, spec, step, buf)

    def all_reduce(self, step: int, buf: Tensor) -> None:
        self.hub.all_reduce(self.rank, step, buf)

    def take(self, timeout: float) -> list[Arrival]:
        with self.cond:
            if not self.inbox and self.error is None and timeout > 0:
                self.cond.wait(timeout)
            items, self.inbox = self.inbox, []
        return items

    def oldest_unsent(self) -> tuple[int, int] | None:
        return None

    def inflight_bytes(self, peer: int) -> tuple[int, int | None]:
        return 0, None  # delivered at once (or held by the hub, not by this rank)

    def failure(self) -> SyncError | None:
        return self.error

    def close(self) -> None:
        pass


def run_threads(world_size: int, run: ToyRun, hub=None) -> list[ToyRank]:
    """Run ``run_toy_rank`` for every rank in threads over ``hub`` (anything whose
    ``transport(rank)``, called on the rank's thread, gives its transport; default a
    ``LoopbackHub``)."""
    hub = hub if hub is not None else LoopbackHub(world_size)
    signal = LoopbackSignal(world_size) if run.config.mode == "barrier" else None
    board = MemoryBoard()
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def target(r: int) -> None:
        live = MemoryLiveness(board, r, run.config.beat_s)
        try:
            results[r] = run_toy_rank(
                r,
                world_size,
                run,
                transport=hub.transport(r),
                liveness=live,
                step_signal=None if signal is None else signal.port(r),
            )
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(world_size)]
    for th in threads:
        th.start()
    limit = run.config.timeout_s + 30 + sum(s for _, s in run.busy_at.values())
    for th in threads:
        th.join(timeout=limit)
    if errors:
        raise errors[0]
    if any(r is None for r in results):
        raise RuntimeError("a rank thread did not finish (hang)")
    return results


# ------------------------------------------------------------ process harness
def _child(rank: int, world_size: int, workdir: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(workdir, "store"), world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    out = Path(workdir) / f"rank{rank}"
    try:
        result = fn(rank, world_size, *args)
    except BaseException as exc:
        msg = f"{type(exc).__name__}: {exc}"
        out.with_suffix(".err").write_text(msg + "\n\n" + traceback.format_exc())
        raise
    torch.save(result, out.with_suffix(".pt"))
    dist.destroy_process_group()


# What the ranks' forkserver imports once, before it forks any rank: torch, the harness and
# the heavy libraries the rank functions' modules import (nerfstudio through odin_ns.model,
# gsplat, scipy). A spawned rank paid these imports again every time (3-10 s of a core per
# rank); a rank forked from the server starts in milliseconds.
FORKSERVER_PRELOAD = [
    "harness.toy",
    "harness.runs",
    "scipy.sparse",
    "gsplat.strategy",
    "odin_ns.model",
    "odin_ns.distributed.phase",
    "odin_ns.distributed.sharded_checkpoint",
    "odin_ns.distributed.sharded_eval",
]


def spawn_ranks(
    fn: Callable, world_size: int, workdir: str | Path, args: tuple = (), timeout_s: float = 60.0
) -> tuple[list[int | None], list[Any], list[str | None], float]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes over gloo.

    The processes are forked from ``multiprocessing``'s forkserver (one per test session,
    started on first use from this process's ``sys.path`` and environment, with
    :data:`FORKSERVER_PRELOAD` imported): each rank starts from a process that has never run
    an OpenMP region, as a spawned one would, without paying the imports again. ``fn`` must
    be importable (module level). Returns (exit codes, per-rank results of ``fn`` or None,
    per-rank error text or None, seconds until all exited). A process still alive after
    ``timeout_s`` is killed (exit code None).
    """
    import torch.multiprocessing as mp

    workdir = str(workdir)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    procs = [
        ctx.Process(target=_child, args=(r, world_size, workdir, fn, args))
        for r in range(world_size)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    codes: list[int | None] = []
    for p in procs:
        p.join(max(0.0, timeout_s - (time.perf_counter() - start)))
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    elapsed = time.perf_counter() - start
    results, errors = [], []
    for r in range(world_size):
        pt = Path(workdir) / f"rank{r}.pt"
        err = Path(workdir) / f"rank{r}.err"
        results.append(torch.load(pt, weights_only=False) if pt.exists() else None)
        errors.append(err.read_text() if err.exists() else None)
    return codes, results, errors, elapsed
