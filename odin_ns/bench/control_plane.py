"""Host control plane at GPU scale: one rank's engine per step, outside the data-plane kernels.

    python -m odin_ns.bench.control_plane [--rows 1000000] [--ranks 8,64] [--steps 100] \
        --out bench/control_plane.json

Rank 0 of a run (``--layouts``: replicated, every rank owning every row, and sharded) with
N Gaussians of splatfacto's row widths, on a plan
(``odin_ns.schedule.build_plan``) of the synthetic city (``bench.schedule.make_city``) whose
footprints are widened to N rows (each city primitive stands for N / N_city rows) and thinned
to ``--share`` of the rows per view. The R - 1 peers are simulated: an injected transport
answers every receive the engine posts at once with a publication of the plan's size (the
steady state of a rank that is never behind; ``--late-peers``: peers one step behind, so
that throughput-first decides at every step, as where views overlap densely) and takes
every send; it is device-resident, as the NCCL transport is, so no host wire copy is made.
Per step the engine runs what the session calls: ``before_step``, ``after_backward``.

Measured per step, R values interleaved step by step:

- ``engine_ms``: wall time of those calls;
- ``data_ms``: time inside tensor operations that read or make floating-point tensors
  (row data: gradients, publications, accumulators, parameters, moments), each operation
  timed by a ``TorchDispatchMode``; on a GPU these are kernels the host only launches;
- ``host_ms = engine_ms - data_ms - ops_per_step x the instrument's cost per operation``,
  calibrated on the same rank's own step (``instrument_overhead_us``: its twin with the data
  plane on the meta device, stepped alternately under the timer and without it; a step's
  operations carry lists of tensors, the apply's parameters and moments, that the timer
  walks, so they cost it more than the trivial one of ``dispatch_overhead_us``: 7.7-28 µs
  an operation against 5.7 on 2026-12-06; between real data operations on a CPU it costs
  more again, which ``host_twin_ms`` leaves out); ``host_trivial_calibration_ms``: the same
  with the trivial operation's cost, as reported before 2026-12-06 (so what the instrument
  adds beyond that stays in). Python bookkeeping plus operations on integer and boolean
  tensors only (``control_ms``: ids, versions, masks, positions,
  which the runtime keeps on the host): the host's work per step as it would run beside a
  GPU's kernels (an upper bound: a few of those integer operations, e.g. the visible
  mask's, are on device tensors there);
- ``host_twin_ms`` (``--twin``, on by default, CPU only): the same quantity with nothing of the
  instrument in it: a twin of the rank (the same plan, seed and peers, so the same work
  step for step) runs each step beside it without the timer, the two taking turns under
  it; the untimed one's wall time less the timed one's ``data_ms``. Its spread is wider
  (two steps' data time differ by their noise) and it needs no calibration: where the
  two disagree, the calibration's per-operation cost, taken on the meta twin, is not what
  the timer costs between real data operations (on this CPU, after each one has swept the
  caches);
- ``any_tensor_syncs``: operations that would synchronize a CUDA stream with the host
  (``_local_scalar_dense``, ``nonzero``, ``unique``, ``masked_select``, boolean-mask
  indexing, ``is_nonzero``, copies to the CPU), on any tensor: most act on the host's
  control tensors and synchronize nothing (``data_syncs``: those on floating-point tensors);
- ``device_reads`` (``syncs_per_step_max``: their largest): the reads of device values a
  step makes, counted by ``bench.device_reads`` (the data plane on a device without
  values, the host control plane real, peers one step behind so that throughput-first
  decides), per layout in quality-first and throughput-first, with the line of each: the
  synchronizations a GPU step would have; ``uploads_per_step`` (and ``uploads``, by line)
  and ``upload_mb_per_step``: the step thread's copies from the host to the device in the
  same run, and the bytes they move (tables made on a thread of their own move their lists
  there); ``device_ops_per_step`` (and ``device_ops``, by op): the step's other operations
  on the device's tensors that are not views, each a dispatch that queues device work (a
  kernel launch or more): the host's share of a step that a faster GPU does not shorten;
- ``meta_ms``: the wall time of the same rank's step with its data plane on PyTorch's
  ``meta`` device (shapes, no values; its own plan and engine, stepped right after the
  measured one): the data-plane operations cost only their dispatch, about what launching
  a CUDA kernel costs the host, and the control plane is real: the host's time per step
  beside a GPU, without the CPU's cost of allocating and freeing large row buffers that
  ``host_ms`` carries;
- ``meta_paced_ms`` (``--paced``, on by default; ``--gap-ms``, 20 by default): the same meta
  step, each one after an idle gap of that long (0: back to back), the variants' ranks in
  turns: the host beside a GPU
  whose step computes for the gap, the CPU idle meanwhile but for the tables' thread (no
  CPU rank's data operations sweep its caches between steps, as they do before ``meta_ms``;
  a GPU host's own work between the engine's calls, the model's launches and the data
  loader, is not in it). A model of the host's place beside a GPU, stated as such, not a
  measurement on one; 20 ms is the short end of a gsplat step at 1M Gaussians.
  ``host_reference_paced_ms`` / ``host_reference_warm_ms`` (medians) and their ratio
  ``host_wake_factor``: a fixed piece of host work without the engine (``HostReference``),
  taking its turn among the paced ranks after the same gap, and run again right after: how
  much slower this host runs any work after the gap (on this VM 1.5-3x, varying from hour
  to hour: 2026-12-07), which ``meta_paced_ms`` carries too;
- ``meta_host_ms`` and ``meta_paced_host_ms`` (2026-12-07, thirty-fifth session): those two
  less the step's data-plane operations' own time, the host's time outside the data-plane
  kernels, as the target defines it, read off the meta step. The meta device's kernels are
  not a CUDA launch's cost: ``cat``, ``sum`` and the compiled ops' fake kernels are Python
  there (15-150 µs a call on this CPU; sharded, R = 8: 1.1-1.2 ms of a 3 ms meta step).
  Each meta rank has a twin (the same plan: the same work, step for step), the two taking
  turns, one stepped plain, the other under ``DeviceOpTimer`` (``meta_data_ms``,
  ``meta_paced_data_ms``: the time inside operations on a meta tensor); a step's figure is
  the plain one's wall time less the timed one's data-plane time. A GPU host pays a launch
  (a few µs) for each of the ``device_ops_per_step`` instead, left out here.
  ``meta_cpu_ms``: the plain meta step's thread CPU time: on this 2-core VM the step's
  thread shares the cores with the tables' two threads (and the other ranks'), so its
  wall time can exceed it; a GPU host (16 cores beside one GPU on the lent machines) has
  cores for each;
- ``paced_threads_apart`` (``--pin-threads``, on by default; 2026-12-07, thirty-fifth
  session): the paced steps ran with their thread on a core of its own and the engines'
  helper threads (the step tables') on the others, part of the model of a GPU host they
  are (``helper_threads_apart``: the cores and the helpers pinned; None where not pinned).
  Not in the back-to-back steps: there every engine's helpers at once (eight in the
  default run) would share what is left, one core on this VM, and fall behind;
- ``bind_ms_per_plan_step``: the engine's phase start (``Engine``'s construction),
  per step of the plan. Since 2026-12-07 (thirty-second session) neither layout makes step
  tables there (a layout with pushes made every step's there before: their order needed
  them all); each step's are made as the step nears: ``sharded`` and ``replicated`` as
  beside an accelerator, on a thread of their own ``TABLES_AHEAD`` steps past the newest
  one asked for (a layout with pushes asks ``engine.PUSH_LEAD`` steps ahead, and cuts each
  step's tables on another thread while the next step's record is made), off the step's
  path; ``sharded-in-step`` and ``replicated-in-step`` as on CPU ranks, in the step, inside
  ``host_ms`` (through bb0d5d0 the benchmark made the replicated ones before its timer
  started: 5-8 ms a step at R = 8 left out of the replicated figures);
  ``host_and_phase_start_ms_per_step``: their sum, what the host spends per step of a
  phase on the step's thread, wherever it spends it;
- ``tables_mb_per_step`` and ``tables_ms_per_step``: host memory of one step's tables
  (``step_tables.Step``) and the time to make them one after another on one thread, median
  over the first 10 steps: what a rank holds per step in flight (about ``PUSH_LEAD`` +
  ``TABLES_AHEAD`` steps), and what the tables' thread spends per step (the host time the
  step's thread no longer spends; the replicated rows' writer groups included; a layout
  with pushes cuts on a second thread, so its thread's pace is below this);
- ``split``: cProfile's own time per function of ``odin_ns`` over a few separate steps
  (shares of the profiled total; cProfile slows Python code, so shares, not milliseconds),
  and ``control_lines``: the integer / boolean operations' ms per step by source line.

On the CPU (here) the engine's kernels run on the host, so ``data_ms`` is CPU time and says
nothing about a GPU's; ``host_ms`` is the figure that carries over. ``--device cuda`` (the
GPU check runs it) puts parameters, gradients and publications on the GPU: ``engine_ms``
then waits for the step's kernels, ``data_ms`` is mostly launches, ``cpu_ms`` is the step
thread's CPU time, and ``cuda_syncs`` counts real stream synchronizations (torch's sync
debug mode) over ``--profile-steps`` more steps.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import os
import pstats
import threading
import time
import traceback
import warnings
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from odin_ns.bench.device_reads import DeviceReads
from odin_ns.bench.report import put_spread, save_figure, write_json
from odin_ns.cuda.cases import SPLATFACTO_LRS, SPLATFACTO_ROWS
from odin_ns.runtime import ParamGroupState, SyncConfig
from odin_ns.runtime.transport import Arrival

SYNCING_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "masked_select",
    "is_nonzero",
    "item",
}


# ------------------------------------------------------------------------ the plan
def city_footprints(rows: int, share: float, views: int, seed: int) -> sp.csr_matrix:
    """[V, rows] bool footprints: the city's, widened to ``rows`` (each city primitive
    stands for rows / N_city consecutive rows), each view joined with the next views along
    its street until it reaches ``share`` of the rows (a wider field of view: the city's
    own views see about 1% at 320 x 240), then thinned at random to ``share``."""
    from odin_ns.bench.schedule import make_city, timed_footprints

    city_rows = min(rows, 100_000)
    F, _, _ = timed_footprints(make_city(views, city_rows, seed=seed))
    F = sp.csr_matrix(F, dtype=bool)

    def union(v: int, k: int) -> np.ndarray:
        near = [(v + j) % F.shape[0] for j in range(k)]
        return np.unique(np.concatenate([F.indices[F.indptr[u] : F.indptr[u + 1]] for u in near]))

    sample = range(0, F.shape[0], max(1, F.shape[0] // 32))
    joined = 1
    while (
        joined < 64 and np.mean([union(v, joined).size for v in sample]) < 1.2 * share * city_rows
    ):
        joined += 1
    widen = rows // city_rows
    keep = max(1, int(round(share * rows)))
    rng = np.random.default_rng(seed)
    indptr, indices = [0], []
    for v in range(F.shape[0]):
        ids = (union(v, joined).astype(np.int64)[:, None] * widen + np.arange(widen)).ravel()
        if ids.size > keep:
            ids = np.sort(rng.choice(ids, keep, replace=False))
        indices.append(ids)
        indptr.append(indptr[-1] + ids.size)
    data = np.ones(indptr[-1], dtype=bool)
    return sp.csr_matrix((data, np.concatenate(indices), np.asarray(indptr)), (F.shape[0], rows))


# --------------------------------------------------------------- simulated peers
class InjectedPeers:
    """A device-resident ``Transport`` whose peers have always published already: every
    posted receive is answered at once with a [rows, W] publication (random gradient rows,
    all visible) cut from one pool, and sends are counted.

    With ``late`` the peers run one step behind the rank: the first two looks after the
    rank's own send get only the answers of steps before its newest publication, and later
    looks (the rank waits) get everything, so throughput-first has pending publications to
    decide on and quality-first waits for them.
    """

    def __init__(self, max_rows: int, width: int, seed: int, device="cpu", late: bool = False):
        gen = torch.Generator().manual_seed(seed)
        self.pool = (torch.randn(max_rows, width, generator=gen) * 1e-3).to(device)
        self.pool[:, -1] = 1.0
        self.late = late
        self.ready: list[Arrival] = []
        self.newest_sent = -1  # the step of the rank's newest send
        self.looks = 0  # takes since that send
        self.bytes_sent = 0

    def post_recv(self, peer: int, step: int, tag: int, rows: int, cols: int) -> None:
        self.ready.append(Arrival(peer, step, self.pool[:rows, :cols]))

    def send(self, peer: int, step: int, tag: int, buf: torch.Tensor) -> None:
        self.bytes_sent += buf.numel() * buf.element_size()
        self.newest_sent, self.looks = max(self.newest_sent, step), 0

    def all_reduce(self, step: int, buf: torch.Tensor) -> None:
        raise NotImplementedError("the control-plane benchmark runs point-to-point modes")

    def take(self, timeout: float) -> list[Arrival]:
        self.looks += 1
        if self.late and self.looks <= 2:
            out = [a for a in self.ready if a.step < self.newest_sent]
            self.ready = [a for a in self.ready if a.step >= self.newest_sent]
            return out
        out, self.ready = self.ready, []
        return out

    def oldest_unsent(self) -> None:
        return None

    def inflight_bytes(self, peer: int) -> tuple[int, None]:
        return 0, None

    def failure(self) -> None:
        return None

    def close(self) -> None:
        pass


def make_groups(rows: int, seed: int, device="cpu") -> list[ParamGroupState]:
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for (name, shape), lr in zip(SPLATFACTO_ROWS.items(), SPLATFACTO_LRS, strict=True):
        param = torch.randn(rows, *shape, generator=gen).to(device)
        groups.append(
            ParamGroupState(
                name, param, torch.zeros_like(param), torch.zeros_like(param),
                lr_at=lambda s, lr=lr: lr,
            )
        )  # fmt: skip
    return groups


def odin_plan(F: sp.csr_matrix, ranks: int, steps: int, seed: int):
    """The Odin plan of ``steps`` steps of footprints ``F`` on ``ranks`` ranks."""
    from odin_ns.schedule import build_plan

    return build_plan(F, ranks, steps, seed=seed, strategy="odin")


def step_table_bytes(step) -> int:
    """Host bytes of one ``step_tables.Step``'s arrays and tensors (memory two tables share,
    once)."""
    sizes = {}  # data address -> bytes

    def visit(value) -> None:
        if isinstance(value, np.ndarray):
            sizes[value.__array_interface__["data"][0]] = value.nbytes
        elif isinstance(value, torch.Tensor):
            sizes[value.data_ptr()] = value.numel() * value.element_size()
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif dataclasses.is_dataclass(value):
            visit(list(vars(value).values()))

    visit(list(vars(step).values()))
    return sum(sizes.values())


class ShardedRankUnderTest:
    """Rank 0 of a run: its owned rows and this phase's cache; readers' gradient rows and
    owners' pushes arrive from injected peers at once. ``every_rank_owns``: every rank owns
    every row (``layout.EVERY_RANK``), the replicated layout; else locality ownership."""

    def __init__(
        self,
        F: sp.csr_matrix,
        ranks: int,
        steps: int,
        mode: str,
        seed: int,
        device="cpu",
        late: bool = False,
        plan=None,
        every_rank_owns: bool = False,
        tables_thread: bool = True,
        answer_reads: bool = False,
    ):
        from odin_ns.runtime.engine import Engine
        from odin_ns.runtime.layout import ShardLayout, cache_of, phase_read_sets, replicated_layout
        from odin_ns.schedule.ownership import assign_ownership

        self.plan = plan if plan is not None else odin_plan(F, ranks, steps, seed)
        if every_rank_owns:
            layout = replicated_layout(F.shape[1], 0)
        else:
            owner = assign_ownership(self.plan, "locality", seed)
            reads = phase_read_sets(self.plan, ranks)[0]
            layout = ShardLayout(owner, 0, cache_of(owner, 0, reads))
        self.layout = layout
        self.tables_thread = tables_thread
        owned = layout.num_owned
        self.groups = [
            ParamGroupState(
                g.name, g.param, g.exp_avg[:owned].clone(), g.exp_avg_sq[:owned].clone(),
                lr_at=g.lr_at,
            )
            for g in make_groups(layout.num_local, seed, device)
        ]  # fmt: skip
        width = sum(g.row_dim for g in self.groups) + 1
        self.peers = InjectedPeers(layout.num_local, width, seed, device, late)
        pushes = InjectedPeers(layout.num_local, width, seed + 1, device, late)
        # the version vector the session binds (on a device without values: on the host,
        # since binding copies it there once)
        at = "cpu" if torch.device(device).type == "meta" else device
        versions = torch.full((owned,), -1, dtype=torch.int64, device=at)
        config = SyncConfig(mode=mode, timeout_s=600.0)
        tic = time.perf_counter()
        self.engine = Engine(
            self.groups, layout, self.plan, 0, ranks, self.peers, pushes, step_offset=0,
            versions=versions, timeout_s=600.0, sync=config, tables_thread=tables_thread,
        )  # fmt: skip
        self.bind_s = time.perf_counter() - tic  # the engine's phase start: its step tables
        gen = torch.Generator().manual_seed(seed + 1)
        self.grads = [
            (torch.randn(g.param.shape, generator=gen) * 1e-3).to(device) for g in self.groups
        ]
        self.visible = torch.zeros(layout.num_local, dtype=torch.bool, device=device)
        self.step = 0
        # on the meta device a step that reads device values (throughput-first's decisions)
        # gets zeros from the read double, uncounted (``answer_reads``)
        self.reads = None
        if answer_reads:
            self.reads = DeviceReads()
            self.reads.counting = False

    def prepare_step(self) -> None:
        """The model's part, not measured: this step's local rows are the visible ones (read
        off the plan: the engine's step tables are made by the engine, in the step where it
        makes them)."""
        self.visible.zero_()
        reads = np.asarray(self.plan.step_footprint(self.step, self.layout.rank), dtype=np.int64)
        rows = torch.from_numpy(self.layout.local(reads)).to(self.visible.device)
        self.visible[rows] = True

    def tables(self, steps: int) -> tuple[float, float]:
        """(median host MB, median ms) of one of the first ``steps`` steps' tables
        (``step_tables.Step``), made apart by the function the engine makes them with, as the
        engine makes them (the replicated layout's made ahead: with their writer groups, up
        to ``GROUPS_AHEAD_MAX_RANKS``)."""
        from odin_ns.runtime.step_tables import groups_ahead, step_rows

        ranks = self.plan.num_ranks
        grouped = groups_ahead(self.layout, ranks, self.tables_thread)
        made = step_rows(self.plan, self.layout, ranks, steps, group_writers=grouped)
        sizes, times = [], []
        for _ in range(steps):
            tic = time.perf_counter()
            st = next(made)
            times.append(1e3 * (time.perf_counter() - tic))
            sizes.append(step_table_bytes(st) / 1e6)
        return float(np.median(sizes)), float(np.median(times))

    def run_step(self) -> None:
        """One step's engine calls, as the sharded session makes them."""
        with self.reads if self.reads is not None else contextlib.nullcontext():
            self.engine.before_step(self.step)
            self.engine.after_backward(self.step, self.grads, self.visible)
        self.step += 1


# ``--layouts``: the rank each layout name measures (one engine, two ownership maps); the
# step tables made on a thread of their own beside the engine's, as beside an accelerator
# (replicated: ahead of the steps; sharded: at the phase start, each step cut while the
# next one's record is made), or "-in-step" on the engine's thread, as on CPU ranks
RANKS_UNDER_TEST = {
    "replicated": partial(ShardedRankUnderTest, every_rank_owns=True),
    "replicated-in-step": partial(ShardedRankUnderTest, every_rank_owns=True, tables_thread=False),
    "sharded": ShardedRankUnderTest,
    "sharded-in-step": partial(ShardedRankUnderTest, tables_thread=False),
}


# --------------------------------------------------------------- instruments
def _floating(args) -> bool:
    """Any floating-point tensor in ``args`` (nested lists and tuples too)."""
    found = False

    def visit(a):
        nonlocal found
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            found = True
        elif isinstance(a, (list, tuple)):
            for b in a:
                visit(b)

    visit(args)
    return found


def _syncs(name: str, args) -> bool:
    if name in SYNCING_OPS:
        return True
    if name == "index" and len(args) > 1:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
    if name in ("_to_copy", "copy_"):  # a copy to the CPU from an accelerator
        src = args[1] if name == "copy_" else args[0]
        dst = args[0] if name == "copy_" else None
        return (
            isinstance(src, torch.Tensor)
            and src.device.type != "cpu"
            and (dst is None or dst.device.type == "cpu")
        )
    return False


class OpTimer(TorchDispatchMode):
    """Times every tensor operation and counts those that would synchronize a stream."""

    def __init__(self):
        super().__init__()
        self.data_s = 0.0
        self.control_s = 0.0
        self.ops = 0
        self.syncs: Counter[str] = Counter()
        self.data_syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        tic = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        toc = time.perf_counter()
        self.ops += 1
        floating = _floating(args) or _floating(out)  # an allocation has no tensor input
        if floating:
            self.data_s += toc - tic
        else:
            self.control_s += toc - tic
        if _syncs(name, args):
            self.syncs[name] += 1
            self.data_syncs += int(floating)
        return out


class DeviceOpTimer(TorchDispatchMode):
    """Times the operations on a device's tensors (a tensor of ``device_type`` among the
    inputs or the outputs, lists of them too): a step's data plane. On the meta device each
    is a shape-only kernel, some of them Python (``cat``, ``sum``, the compiled ops' fake
    kernels: 15-150 µs a call on this CPU, where a CUDA launch costs the host a few µs), so
    the meta step's wall time less theirs is its host time outside the data-plane kernels."""

    def __init__(self, device_type: str = "meta"):
        super().__init__()
        self.device_type = device_type
        self.device_s = 0.0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tic = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        toc = time.perf_counter()
        if any(
            isinstance(t, torch.Tensor) and t.device.type == self.device_type
            for t in tree_leaves((args, kwargs, out))
        ):
            self.device_s += toc - tic
            self.ops += 1
        return out


class ControlSites(OpTimer):
    """Also attributes each integer / boolean operation's time to its line in ``odin_ns``."""

    def __init__(self):
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.control_s
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.control_s > before:
            frames = [
                f for f in traceback.extract_stack(limit=12)
                if "odin_ns" in f.filename and "bench" not in f.filename
            ]  # fmt: skip
            if frames:
                f = frames[-1]
                self.sites[f"{Path(f.filename).name}:{f.lineno} {f.line}"] += (
                    self.control_s - before
                )
        return out


def cuda_syncs_during(fn) -> int:
    """Synchronizations of a CUDA stream with the host while ``fn()`` runs (torch's sync
    debug mode warns once per synchronizing call)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def device_reads_per_step(
    make, F: sp.csr_matrix, ranks: int, mode: str, seed: int, warmup: int, steps: int, plan=None
) -> tuple[list[int], DeviceReads, object]:
    """Reads of device values per steady-state step (``bench.device_reads``: the data plane
    on a device without values) of rank 0 built by ``make`` (a ``RANKS_UNDER_TEST``
    entry), its peers one step behind (``InjectedPeers(late=True)``).
    ``plan``: one already built for F and ``ranks`` (at least warmup + steps long).
    Returns (reads per step, the double with each read's and each upload's line, the rank
    under test)."""
    double = DeviceReads()
    counts = []
    with double:
        double.counting = False  # set-up and warm-up: plans, tables, the phase's uploads
        rank = make(F, ranks, warmup + steps, mode, seed, device="meta", late=True, plan=plan)
        for _ in range(warmup):
            rank.prepare_step()
            rank.run_step()
        double.counting = True
        for _ in range(steps):
            double.counting = False  # the model's part
            rank.prepare_step()
            double.counting = True
            before = double.total
            rank.run_step()
            counts.append(double.total - before)
    return counts, double, rank


def dispatch_overhead_s(trials: int = 20_000) -> float:
    """Seconds the ``OpTimer`` adds per operation outside what it times (subtracted)."""
    a = torch.zeros(4, dtype=torch.int64)
    for _ in range(2):
        tic = time.perf_counter()
        for _ in range(trials):
            a.add_(0)
        plain = time.perf_counter() - tic
        timer = OpTimer()
        tic = time.perf_counter()
        with timer:
            for _ in range(trials):
                a.add_(0)
        mode = time.perf_counter() - tic
    return max(0.0, (mode - (timer.data_s + timer.control_s) - plain) / trials)


def instrument_overhead_s(rank: ShardedRankUnderTest, steps: int) -> float:
    """Seconds the ``OpTimer`` adds per operation of ``rank``'s own steps (its data plane on
    the meta device, so that an operation costs little beside the timer), outside what it
    times: ``steps`` steps alternately timed and plain, (median timed - median plain) /
    median operations per step."""
    timed, plain, ops = [], [], []
    for i in range(steps):
        rank.prepare_step()
        timer = OpTimer()
        tic = time.perf_counter()
        if i % 2:
            with timer:
                rank.run_step()
            timed.append(time.perf_counter() - tic)
            ops.append(timer.ops)
        else:
            rank.run_step()
            plain.append(time.perf_counter() - tic)
    return max(0.0, (float(np.median(timed)) - float(np.median(plain))) / float(np.median(ops)))


def _untimed_step(rank: ShardedRankUnderTest, device: torch.device) -> float:
    """Wall seconds of ``rank``'s next step (the model's part before it not counted), its
    device's kernels included."""
    rank.prepare_step()
    tic = time.perf_counter()
    rank.run_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - tic


def profile_split(rank: ShardedRankUnderTest, steps: int, top: int = 12) -> tuple[list, list]:
    """cProfile's own time per ``odin_ns`` function over ``steps`` steps (shares), then the
    integer / boolean operations' ms per step by line over ``steps`` more."""
    prof = cProfile.Profile()
    sites = ControlSites()
    for _ in range(steps):
        rank.prepare_step()
        prof.enable()
        rank.run_step()
        prof.disable()
    for _ in range(steps):
        rank.prepare_step()
        with sites:
            rank.run_step()
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())
    ours = [
        (f"{Path(file).name}:{func}", tottime)
        for (file, _, func), (_, _, tottime, _, _) in stats.items()
        if "odin_ns" in file
    ]
    ours.sort(key=lambda kv: -kv[1])
    other = total - sum(t for _, t in ours)
    rows = [{"function": f, "share": t / total} for f, t in ours[:top]]
    rows.append({"function": "tensor operations and other libraries", "share": other / total})
    control = [
        {"line": line, "ms_per_step": 1e3 * sec / steps}
        for line, sec in sites.sites.most_common(top)
    ]
    return rows, control


# ------------------------------------------------------------------------ the run
class HostReference:
    """A fixed piece of host work with no engine in it, stepped like a rank in
    ``meta_paced`` to price what an idle gap does to the host itself: a numpy gather of
    100,000 of 300,000 floats and 2,000 dict look-ups, three times (about 1.4 ms back to
    back on this 2-core VM). Its ``run_step`` right after a gap against right after
    another run says how much slower the host runs any work after the gap."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.values = rng.random(300_000)
        self.picks = rng.integers(0, self.values.size, 100_000)
        self.table = {i: i for i in range(2_000)}

    def prepare_step(self) -> None:
        pass

    def run_step(self) -> float:
        total = 0.0
        for _ in range(3):
            total += float(self.values[self.picks].sum())
            total += sum(self.table[k] for k in range(2_000))
        return total


REFERENCE = "host_reference"  # meta_paced's key of the reference's runs after the gap
REFERENCE_WARM = "host_reference_warm"  # ... and of its runs right after those
DATA = "/data"  # meta_paced's key suffix of a twin's data-plane ms (``DeviceOpTimer``)


def _step_after(rank, gap_ms: float, timer: TorchDispatchMode | None = None) -> tuple[float, float]:
    """(wall, thread CPU) seconds of ``rank``'s next step (under ``timer`` if given), begun
    ``gap_ms`` after its model's part (not counted)."""
    rank.prepare_step()
    if gap_ms > 0:
        time.sleep(gap_ms / 1e3)
    tic, cpu = time.perf_counter(), time.thread_time()
    with timer if timer is not None else contextlib.nullcontext():
        rank.run_step()
    return time.perf_counter() - tic, time.thread_time() - cpu


def meta_paced(
    ranks: dict[str, ShardedRankUnderTest | HostReference],
    warmup: int,
    steps: int,
    gap_ms: float,
    twins: dict[str, ShardedRankUnderTest] | None = None,
) -> dict[str, list]:
    """Per rank of ``ranks`` (key -> rank with its data plane on the meta device, or a
    ``HostReference`` under ``REFERENCE``), the wall ms of ``steps`` steps, each begun at
    least ``gap_ms`` after the last step of any rank ended (the ranks in turns, alternating
    order), after ``warmup`` such steps: ``meta_paced_ms``. The reference also runs again
    right after each of its paced runs (``REFERENCE_WARM``): back to back, on a host just
    woken. A rank with a twin in ``twins`` (the same plan: the same work, step for step)
    has it stepped after the same gap under ``DeviceOpTimer``, the two taking turns at it:
    each step's data-plane ms under key + ``DATA``."""
    twins = twins or {}
    keys = list(ranks)
    out: dict[str, list] = {key: [] for key in keys}
    out.update({key + DATA: [] for key in twins})
    if REFERENCE in ranks:
        out[REFERENCE_WARM] = []
    for i in range(warmup + steps):
        for key in keys if i % 2 == 0 else keys[::-1]:
            rank, twin = ranks[key], twins.get(key)
            if twin is not None and i % 2:
                rank, twin = twin, rank
            wall, _ = _step_after(rank, gap_ms)
            if i >= warmup:
                out[key].append(1e3 * wall)
            if twin is not None:
                timer = DeviceOpTimer()
                _step_after(twin, gap_ms, timer)
                if i >= warmup:
                    out[key + DATA].append(1e3 * timer.device_s)
            if key == REFERENCE:
                wall, _ = _step_after(rank, 0.0)
                if i >= warmup:
                    out[REFERENCE_WARM].append(1e3 * wall)
    return out


HELPERS = "odin-step-"  # the engines' helper threads' names (step_tables: tables, cut)


@contextlib.contextmanager
def helper_threads_apart(enabled: bool):
    """The step's thread (the caller's) on a core of its own and the engines' helper
    threads alive (``HELPERS``: the step tables' maker and cutter) on the others, while the
    measured work runs (here the paced steps; ``bench.tables_gil``'s training thread and
    tables too; Linux, two cores or more; else nothing): as on a GPU host, which has a
    core for each (16 beside one GPU on the lent machines). Unpinned on this 2-core VM, a
    helper woken by the step's last call took the step thread's core in 29-48 of 100
    sharded R = 8 meta steps, for 0.2-5 ms each; pinned, in none (2026-12-07). Threads the
    helpers start inherit their cores. Yields {"step_core", "helper_cores", "helpers"} or
    None; restores every affinity it set."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if not enabled or len(cores) < 2:
        yield None
        return
    me = threading.get_native_id()
    helpers = [
        t.native_id
        for t in threading.enumerate()
        if t.name.startswith(HELPERS) and t.native_id is not None
    ]
    pinned = [(me, {cores[0]})] + [(tid, set(cores[1:])) for tid in helpers]
    try:
        for tid, where in pinned:
            with contextlib.suppress(ProcessLookupError):  # (a helper that has ended)
                os.sched_setaffinity(tid, where)
        yield {"step_core": cores[0], "helper_cores": cores[1:], "helpers": len(helpers)}
    finally:
        for tid, _ in pinned:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, set(cores))


def measure(args) -> dict:
    ranks = [int(r) for r in args.ranks.split(",")]
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    views = max(ranks) * 8
    tic = time.perf_counter()
    F = city_footprints(args.rows, args.share, views, args.seed)
    share = float(np.diff(F.indptr).mean() / args.rows)
    print(f"footprints {F.shape}, {share:.1%} of rows per view ({time.perf_counter() - tic:.0f} s)")
    total_steps = args.warmup + args.steps + max(3 * args.profile_steps, args.calibration_steps)
    if args.paced:  # the meta twins' paced steps come before their calibration's
        total_steps += args.warmup + args.steps
    overhead = dispatch_overhead_s()
    result: dict = {
        "rows": args.rows,
        "share_per_view": share,
        "mode": args.mode,
        "late_peers": args.late_peers,
        "steps": args.steps,
        "dispatch_overhead_us": overhead * 1e6,
        "device": str(device),
        "source": f"measured on {device.type} (rank 0's engine, peers injected)",
    }
    tested = {}
    variant = {}  # key -> (R, layout)

    def rank_of(key: str, on, **kwargs) -> ShardedRankUnderTest:
        """Variant ``key``'s rank under test with its parameters on ``on``."""
        r, layout = variant[key]
        return RANKS_UNDER_TEST[layout](
            F, r, total_steps, args.mode, args.seed, on, late=args.late_peers, **kwargs
        )

    for r in ranks:
        for layout in args.layouts.split(","):
            tic = time.perf_counter()
            key = f"r{r}_{layout}"
            variant[key] = (r, layout)
            tested[key] = rank_of(key, device)
            print(f"{key}: plan and engine in {time.perf_counter() - tic:.0f} s")
    keys = list(tested)
    # The same rank with its data plane on a device without values: its step's wall time
    # is the host's (Python, integer operations, one dispatch per data operation).
    without_values = {
        key: rank_of(key, "meta", answer_reads=args.late_peers, plan=tested[key].plan)
        for key in keys
    }
    # ... and its twin (the same plan: the same work, step for step): the two take turns,
    # one stepped plain (``meta_ms``), the other under ``DeviceOpTimer`` (``meta_data_ms``):
    # the plain one's wall time less the timed one's data-plane time is ``meta_host_ms``
    meta_twins = {
        key: rank_of(key, "meta", answer_reads=args.late_peers, plan=tested[key].plan)
        for key in keys
    }
    # A twin of each rank (the same plan, seed and peers: the same work, step for step), run
    # without the timer beside it, the two taking turns under the timer: the untimed one's
    # wall time less the timed one's data time is the step's host time with nothing of the
    # instrument in it (``host_twin_ms``)
    twins = {
        key: rank_of(key, device, plan=tested[key].plan)
        for key in (keys if args.twin and not cuda else [])  # (on a GPU: cpu_ms)
    }
    for key in keys:
        warmed = [tested[key], without_values[key], meta_twins[key]]
        warmed += [twins[key]] if twins else []
        for _ in range(args.warmup):
            for rank in warmed:
                rank.prepare_step()
                rank.run_step()
    per: dict[str, dict[str, list]] = {
        key: {
            k: []
            for k in (
                "engine",
                "data",
                "control",
                "host_trivial_calibration",
                "cpu",
                "syncs",
                "data_syncs",
                "ops",
                "meta",
                "meta_cpu",
                "meta_data",
                "meta_host",
                "twin",
            )
        }  # fmt: skip
        for key in keys
    }
    names: dict[str, Counter] = {key: Counter() for key in keys}
    for i in range(args.steps):
        order = keys if i % 2 == 0 else keys[::-1]  # interleaved, alternating order
        for key in order:
            timed, untimed = tested[key], twins.get(key)
            if untimed is not None and i % 2:  # the two take turns under the timer
                timed, untimed = untimed, timed
            if untimed is not None and (i // 2) % 2:  # and turns at going first
                plain = _untimed_step(untimed, device)
            timed.prepare_step()
            timer = OpTimer()
            tic, cpu = time.perf_counter(), time.thread_time()
            with timer:
                timed.run_step()
            if cuda:
                torch.cuda.synchronize(device)  # the step's kernels count as its wall time
            engine = time.perf_counter() - tic
            if untimed is not None and not (i // 2) % 2:
                plain = _untimed_step(untimed, device)
            cpu = time.thread_time() - cpu
            rec = per[key]
            rec["engine"].append(1e3 * engine)
            rec["data"].append(1e3 * timer.data_s)
            rec["control"].append(1e3 * timer.control_s)
            rec["host_trivial_calibration"].append(
                1e3 * (engine - timer.data_s - timer.ops * overhead)
            )
            rec["cpu"].append(1e3 * cpu)
            rec["syncs"].append(sum(timer.syncs.values()))
            rec["data_syncs"].append(timer.data_syncs)
            rec["ops"].append(timer.ops)
            if untimed is not None:
                rec["twin"].append(1e3 * (plain - timer.data_s))
            names[key].update(timer.syncs)
            meta, meta_timed = without_values[key], meta_twins[key]
            if i % 2:  # the twins take turns under the timer
                meta, meta_timed = meta_timed, meta
            wall, thread_cpu = _step_after(meta, 0.0)
            meta_timer = DeviceOpTimer()
            _step_after(meta_timed, 0.0, meta_timer)
            rec["meta"].append(1e3 * wall)
            rec["meta_cpu"].append(1e3 * thread_cpu)
            rec["meta_data"].append(1e3 * meta_timer.device_s)
            rec["meta_host"].append(1e3 * (wall - meta_timer.device_s))
        if (i + 1) % 10 == 0:
            print(f"step {i + 1}/{args.steps}: " + ", ".join(
                f"{k} engine {np.median(per[k]['engine']):.1f} ms" for k in keys))  # fmt: skip
    if args.paced:
        paced_ranks = {key: without_values[key] for key in keys}
        # (the model of a GPU host: the step's thread and the tables' threads apart)
        with helper_threads_apart(args.pin_threads) as apart:
            paced = meta_paced(
                {**paced_ranks, REFERENCE: HostReference(args.seed)},
                args.warmup,
                args.steps,
                args.gap_ms,
                twins=meta_twins,
            )
        result["paced_threads_apart"] = apart
        for key in keys:
            put_spread(result, f"meta_paced_ms_per_step_{key}", paced[key])
            result[f"series_meta_paced_ms_{key}"] = paced[key]
            put_spread(result, f"meta_paced_data_ms_per_step_{key}", paced[key + DATA])
            host = [w - d for w, d in zip(paced[key], paced[key + DATA], strict=True)]
            put_spread(result, f"meta_paced_host_ms_per_step_{key}", host)
            result[f"series_meta_paced_host_ms_{key}"] = host
        result["gap_ms"] = args.gap_ms
        # the host's own slowdown after the gap, in work without the engine
        put_spread(result, "host_reference_paced_ms", paced[REFERENCE])
        put_spread(result, "host_reference_warm_ms", paced[REFERENCE_WARM])
        result["host_wake_factor"] = (
            result["host_reference_paced_ms"] / result["host_reference_warm_ms"]
        )
    for key in keys:
        rec = per[key]
        cost = instrument_overhead_s(without_values[key], args.calibration_steps)
        result[f"instrument_overhead_us_{key}"] = cost * 1e6
        rec["host"] = [
            e - d - n * cost * 1e3
            for e, d, n in zip(rec["engine"], rec["data"], rec["ops"], strict=True)
        ]
        for name in (
            "engine",
            "data",
            "control",
            "host",
            "host_trivial_calibration",
            "cpu",
            "meta",
            "meta_cpu",
            "meta_data",
            "meta_host",
            "twin",
        ):
            if rec[name]:
                label = "host_twin" if name == "twin" else name
                put_spread(result, f"{label}_ms_per_step_{key}", rec[name])
        if cuda:  # real stream synchronizations, over as many steps as profiled
            counts = []
            for _ in range(args.profile_steps):
                tested[key].prepare_step()
                counts.append(cuda_syncs_during(tested[key].run_step))
            result[f"cuda_syncs_per_step_{key}_max"] = max(counts)
            result[f"cuda_syncs_per_step_{key}_median"] = float(np.median(counts))
        result[f"host_ms_per_step_{key}_p90"] = float(np.percentile(rec["host"], 90))
        plan_steps = int(np.asarray(tested[key].plan.views).shape[0])
        result[f"bind_ms_per_plan_step_{key}"] = 1e3 * tested[key].bind_s / plan_steps
        result[f"host_and_phase_start_ms_per_step_{key}"] = (
            result[f"host_ms_per_step_{key}"] + result[f"bind_ms_per_plan_step_{key}"]
        )
        mb, ms = tested[key].tables(min(10, args.steps))
        result[f"tables_mb_per_step_{key}"], result[f"tables_ms_per_step_{key}"] = mb, ms
        result[f"tables_ahead_{key}"] = tested[key].engine.steps.ahead  # 0: none made ahead
        result[f"ops_per_step_{key}"] = float(np.median(rec["ops"]))
        result[f"any_tensor_syncs_per_step_{key}_max"] = int(max(rec["syncs"]))
        result[f"any_tensor_syncs_per_step_{key}_median"] = float(np.median(rec["syncs"]))
        result[f"data_syncs_per_step_{key}_max"] = int(max(rec["data_syncs"]))
        for mode in ("quality-first", "throughput-first"):
            r, layout = variant[key]
            counts, double, _ = device_reads_per_step(
                RANKS_UNDER_TEST[layout],
                F,
                r,
                mode,
                args.seed,
                args.warmup,
                args.steps,
                tested[key].plan,
            )
            tag = f"{key}_{mode.split('-')[0]}"
            result[f"device_reads_per_step_{tag}_max"] = int(max(counts))
            result[f"device_reads_per_step_{tag}_median"] = float(np.median(counts))
            result[f"device_reads_{tag}"] = {
                f"{op} at {line}": n / args.steps for (op, line), n in double.reads.most_common()
            }
            result[f"uploads_per_step_{tag}"] = sum(double.uploads.values()) / args.steps
            result[f"upload_mb_per_step_{tag}"] = double.upload_bytes / 1e6 / args.steps
            result[f"uploads_{tag}"] = {
                line: n / args.steps for line, n in double.uploads.most_common()
            }
            result[f"device_ops_per_step_{tag}"] = sum(double.device_ops.values()) / args.steps
            result[f"device_ops_{tag}"] = {
                op: n / args.steps for op, n in double.device_ops.most_common()
            }
        result[f"sync_ops_{key}"] = {k: v / args.steps for k, v in names[key].most_common()}
        split, control = profile_split(tested[key], args.profile_steps)
        result[f"split_{key}"], result[f"control_lines_{key}"] = split, control
        result[f"series_host_ms_{key}"] = rec["host"]
        result[f"series_meta_ms_{key}"] = rec["meta"]
        result[f"series_meta_host_ms_{key}"] = rec["meta_host"]
        if rec["twin"]:
            result[f"series_host_twin_ms_{key}"] = rec["twin"]
    result["syncs_per_step_max"] = max(
        v
        for k, v in result.items()
        if k.startswith("device_reads_per_step_") and k.endswith("_max")
    )
    result["variants"] = keys
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = result["variants"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 6.5))
    for key in keys:
        label = key.replace("_", " ").replace("r", "R = ", 1)
        line = ax.plot(result[f"series_host_ms_{key}"], label=f"{label}, host")
        # (the meta steps' wall times, ``meta`` and ``meta_paced``, are in the JSON only)
        for series, style, what in (
            ("meta_host", "--", "meta step less its data-plane ops"),
            (
                "meta_paced_host",
                ":",
                f"the same, {result.get('gap_ms', 0):g} ms idle before each",
            ),
        ):
            if f"series_{series}_ms_{key}" in result:
                ax.plot(
                    result[f"series_{series}_ms_{key}"],
                    ls=style,
                    color=line[0].get_color(),
                    label=f"{label}, {what}",
                )
    ax.axhline(2.0, color="gray", ls="--", label="target R = 8: 2 ms")
    ax.axhline(4.0, color="gray", ls=":", label="target R = 64: 4 ms")
    ax.set(xlabel="step", ylabel="host ms per step", title="host control plane per step")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0.0, -0.13))
    worst = max(keys, key=lambda k: result[f"host_ms_per_step_{k}"])
    lines = result[f"control_lines_{worst}"]
    labels = [line["line"][:60] for line in lines][::-1]
    bx.barh(labels, [line["ms_per_step"] for line in lines][::-1])
    bx.set(xlabel="ms per step", title=f"integer / boolean operations by line, {worst}")
    bx.tick_params(axis="y", labelsize=7)
    fig.suptitle(
        f"bench.control_plane: rank 0's engine, N = {result['rows']:,}, "
        f"{result['share_per_view']:.1%} rows per view, {result['mode']} (measured, "
        f"{result.get('device', 'cpu')})"
    )
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m odin_ns.bench.control_plane")
    parser.add_argument("--rows", type=int, default=1_000_000, help="N Gaussians")
    parser.add_argument("--share", type=float, default=0.05, help="rows per view, at most")
    parser.add_argument("--ranks", default="8,64", help="R values, interleaved")
    parser.add_argument(
        "--layouts",
        default="replicated,sharded",
        help="interleaved too: replicated (every rank owns every row), sharded (locality)",
    )
    parser.add_argument("--steps", type=int, default=100, help="measured steady-state steps")
    parser.add_argument(
        "--twin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a twin of each rank, untimed, for host_twin_ms (twice the ranks' memory)",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=5, help="cProfile'd steps")
    parser.add_argument(
        "--calibration-steps", type=int, default=40,
        help="steps of each rank's meta twin that price the timer per operation",
    )  # fmt: skip
    parser.add_argument("--mode", default="quality-first", choices=("quality-first", "barrier",
                        "throughput-first"))  # fmt: skip
    parser.add_argument(
        "--late-peers",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the timed ranks' peers run one step behind (throughput-first decides at every "
        "step, quality-first waits), as the device-read counts' always do; the meta twin's "
        "reads of device values are then answered by bench.device_reads' double (zeros, "
        "its dispatch cost in meta_ms)",
    )
    parser.add_argument(
        "--paced", action=argparse.BooleanOptionalAction, default=True,
        help="meta_paced_ms: the meta twins stepped again, --gap-ms idle before each step",
    )  # fmt: skip
    parser.add_argument(
        "--gap-ms", type=float, default=20.0,
        help="idle ms before each meta_paced step (a GPU's step; 0: back to back)",
    )  # fmt: skip
    parser.add_argument(
        "--pin-threads", action=argparse.BooleanOptionalAction, default=True,
        help="meta_paced: the steps' thread on a core of its own, the engines' helper "
        "threads (step tables) on the others, as on a GPU host (Linux, 2 cores or more)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu", help="the parameters' device (cpu, cuda)")
    parser.add_argument("--out", type=Path, default=Path("bench/control_plane.json"))
    args = parser.parse_args(argv)
    unknown = set(args.layouts.split(",")) - set(RANKS_UNDER_TEST)
    if unknown:
        parser.error(f"--layouts: unknown {sorted(unknown)}; use {', '.join(RANKS_UNDER_TEST)}")
    torch.set_num_threads(args.threads)
    result = measure(args)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    for key in result["variants"]:
        print(
            f"{key}: host {result[f'host_ms_per_step_{key}']:.2f} ms/step "
            f"({result[f'host_ms_per_step_{key}_min']:.2f}-{result[f'host_ms_per_step_{key}_max']:.2f}), "
            f"meta {result[f'meta_ms_per_step_{key}']:.2f}, "
            + (
                f"paced {result[f'meta_paced_ms_per_step_{key}']:.2f}, "
                if f"meta_paced_ms_per_step_{key}" in result
                else ""
            )
            + f"meta less its data-plane ops {result[f'meta_host_ms_per_step_{key}']:.2f}"
            + (
                f" (paced {result[f'meta_paced_host_ms_per_step_{key}']:.2f}), "
                if f"meta_paced_host_ms_per_step_{key}" in result
                else ", "
            )
            + f"engine {result[f'engine_ms_per_step_{key}']:.1f} ms, "
            f"device reads max {result[f'device_reads_per_step_{key}_quality_max']}"
        )  # fmt: skip
    if "host_wake_factor" in result:
        print(
            f"host reference (no engine) after the {args.gap_ms:g} ms gap "
            f"{result['host_reference_paced_ms']:.2f} ms, right after "
            f"{result['host_reference_warm_ms']:.2f} ms: x{result['host_wake_factor']:.2f}"
        )
    print(f"-> {args.out}")
    return result


__all__ = ["HostReference", "InjectedPeers", "OpTimer", "city_footprints", "main"]

if __name__ == "__main__":
    main()
