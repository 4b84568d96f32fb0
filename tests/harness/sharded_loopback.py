"""Ranks of ``Engine`` in threads over in-process loopbacks, on a hand-made plan.

Imported as ``harness.sharded_loopback``. Every rank starts from the same whole toy model
(``toy_groups``), keeps its owned rows and caches the rest it reads, and trains each step
on a quadratic pull of the rows it reads towards a per-(rank, step) target; rank 0 sleeps
``slow_s`` per step, so rank 1 runs ahead of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from harness.toy import ListPlan, LoopbackHub, toy_groups
from odin_ns.runtime import ParamGroupState
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import ShardLayout, cache_of, phase_read_sets


def loopback_plan(footprints: Sequence[Sequence[Sequence[int]]], num_rows: int) -> ListPlan:
    """A ``ListPlan`` of ``footprints`` (T lists of R row lists) with its CSR footprints."""
    plan = ListPlan(footprints)
    plan.num_steps = len(footprints)
    dense = np.zeros((plan.views.size, num_rows), dtype=bool)
    for t, step in enumerate(footprints):
        for r, f in enumerate(step):
            dense[plan.views[t, r, 0], f] = True
    plan.footprints = sp.csr_matrix(dense)
    return plan


@dataclass
class LoopbackRank:
    owned: np.ndarray  # [O] global ids this rank owns
    tables: list[torch.Tensor]  # per group, the owned rows after the drain
    engine: Engine
    observed: list  # what ``observe(engine, t)`` returned after each before_step


def _rank_engine(
    plan: ListPlan,
    owner: np.ndarray,
    hubs: Sequence[LoopbackHub],
    rank: int,
    seed: int,
    step_offset: int,
    **engine_kwargs,
) -> tuple[Engine, list[ParamGroupState]]:
    """Rank ``rank``'s engine over its owned and cached rows of the toy model."""
    n, world = owner.size, plan.views.shape[1]
    full = toy_groups(n, seed=seed)
    reads = phase_read_sets(plan, world)[rank]
    layout = ShardLayout(owner, rank, cache_of(owner, rank, reads))
    o = layout.num_owned
    groups = [
        ParamGroupState(
            g.name,
            g.param[torch.from_numpy(layout.gids)].clone(),
            torch.zeros_like(g.param[:o]),
            torch.zeros_like(g.param[:o]),
            lr_at=g.lr_at,
            betas=g.betas,
            eps=g.eps,
        )
        for g in full
    ]
    engine_kwargs.setdefault("timeout_s", 30.0)
    engine = Engine(
        groups,
        layout,
        plan,
        rank,
        world,
        hubs[0].transport(rank),
        hubs[1].transport(rank),
        step_offset=step_offset,
        versions=torch.from_numpy(
            np.random.default_rng(seed).integers(-1, step_offset, n)[layout.owned]
        ),
        **engine_kwargs,
    )
    return engine, groups


def pull_targets(rank: int, t: int, num_rows: int, groups) -> list[torch.Tensor]:
    """Per group the [num_rows, ...] targets rank ``rank``'s local step t pulls the rows it
    reads towards (in its read order)."""
    gen = torch.Generator().manual_seed(100 * rank + t)
    return [torch.randn(num_rows, *g.param.shape[1:], generator=gen) for g in groups]


def _train_step(engine: Engine, groups: list[ParamGroupState], t: int) -> None:
    """Backward of local step t: a quadratic pull of the rows read towards a per-(rank,
    step) target (``pull_targets``), handed to ``after_backward``."""
    rows = torch.from_numpy(engine.steps[t].reads)
    grads = []
    for g, target in zip(groups, pull_targets(engine.rank, t, rows.numel(), groups), strict=True):
        grad = torch.zeros_like(g.param)
        grad[rows] = g.param[rows] - target
        grads.append(grad)
    visible = torch.zeros(engine.layout.num_local, dtype=torch.bool)
    visible[rows] = True
    engine.after_backward(t, grads, visible)


def run_sharded_loopback(
    plan: ListPlan,
    owner: np.ndarray,  # [N] int64
    hubs: Sequence[LoopbackHub],  # two: gradients, pushes
    seed: int,
    slow_s: float,
    observe: Callable[[Engine, int], object] | None = None,
    step_offset: int = 0,
    **engine_kwargs,
) -> tuple[list[torch.Tensor], dict[int, LoopbackRank]]:
    """Train both ranks over ``plan``; (the whole model per group assembled from the owners'
    rows, per rank its ``LoopbackRank``). ``step_offset`` > 0: the phase starts at that
    global step, and the owned rows' versions are what an earlier phase left (each row's
    last update some step before ``step_offset``, seeded)."""
    out: dict[int, LoopbackRank] = {}
    n = owner.size
    world = plan.views.shape[1]

    def rank_main(rank: int) -> None:
        engine, groups = _rank_engine(plan, owner, hubs, rank, seed, step_offset, **engine_kwargs)
        observed = []
        for t in range(plan.num_steps):
            engine.before_step(t)
            if observe is not None:
                observed.append(observe(engine, t))
            if rank == 0:
                time.sleep(slow_s)  # the slow rank: rank 1 runs ahead of it
            _train_step(engine, groups, t)
        engine.drain()
        o = engine.layout.num_owned
        out[rank] = LoopbackRank(engine.layout.owned, [g.param[:o].clone() for g in groups],
                                 engine, observed)  # fmt: skip

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(out) == list(range(world)), "a rank did not finish"
    params = []  # (a row every rank owns: the last rank's copy)
    for gi in range(len(out[0].tables)):
        whole = torch.zeros(n, *out[0].tables[gi].shape[1:])
        for rank in out.values():
            whole[torch.from_numpy(rank.owned)] = rank.tables[gi]
        params.append(whole)
    return params, out


def stall_sharded_loopback(
    plan: ListPlan,
    owner: np.ndarray,
    hubs: Sequence[LoopbackHub],
    stalled: int,
    at_step: int,
    timeout_s: float,
) -> dict[int, BaseException]:
    """Every rank trains ``plan`` except that rank ``stalled`` stops, alive and silent,
    before local step ``at_step``; returns what each other rank raised."""
    world = plan.views.shape[1]
    errors: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        engine, groups = _rank_engine(plan, owner, hubs, rank, 0, 0, timeout_s=timeout_s)
        try:
            for t in range(plan.num_steps):
                if rank == stalled and t == at_step:
                    return
                engine.before_step(t)
                _train_step(engine, groups, t)
            engine.drain()
        except Exception as exc:  # what the run would end with
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout_s + 30)
    return errors
