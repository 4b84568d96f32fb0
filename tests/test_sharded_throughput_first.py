"""Throughput-first in the sharded engine (``odin_ns.runtime.sharded_admission``), on an
in-process loopback: two ranks in threads, rank 0 slow, over a hand-made plan in which rank
1 reads, every step, a row rank 0 owns and writes (a push source) and a row it owns that
rank 0 writes too (an owned source waiting for rank 0's gradient).

- ``tau = 0`` admits nothing: the owners' rows are bitwise quality-first's, and rank 1's
  waits are fallbacks (overlap).
- ``tau`` large, ``K = 2``: rank 1 reads around rank 0 (admitted delayed reads), never
  more than K steps stale (checked row by row at every read against the engine's applied
  step and the cache's versions), the late pushes still land, and the owners' rows differ
  from quality-first's (the stale reads' gradients were applied).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import scipy.sparse as sp
import torch
from harness.toy import ListPlan, LoopbackHub, toy_groups

from odin_ns.runtime import ParamGroupState, SyncConfig
from odin_ns.runtime.sharded import ShardedEngine, ShardLayout, phase_read_sets

N, T = 64, 16
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63
SLOW_S = 0.03  # rank 0's extra seconds per step


def _footprints() -> list[list[list[int]]]:
    """Rank 0: its rows 0..7 and rank 1's row 32. Rank 1: its rows 56..63 and 32, and rank
    0's row 0: at every step t >= 1 rank 1 needs rank 0's gradient of row 32 at t - 1 (owned
    source) and rank 0's push of row 0 after t - 1 (push source)."""
    return [[list(range(8)) + [32], list(range(56, 64)) + [0, 32]] for _ in range(T)]


def _plan() -> ListPlan:
    plan = ListPlan(_footprints())
    plan.num_steps = T
    dense = np.zeros((plan.views.size, N), dtype=bool)
    for t, step in enumerate(_footprints()):
        for r, f in enumerate(step):
            dense[plan.views[t, r, 0], f] = True
    plan.footprints = sp.csr_matrix(dense)
    return plan


def _rank(rank, plan, hubs, sync, out) -> None:
    full = toy_groups(N, seed=5)
    reads = phase_read_sets(plan, 2)[rank]
    layout = ShardLayout(OWNER, rank, reads[OWNER[reads] != rank])
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
    engine = ShardedEngine(
        groups,
        layout,
        plan,
        rank,
        2,
        hubs[0].transport(rank),
        hubs[1].transport(rank),
        step_offset=0,
        versions=torch.full((o,), -1, dtype=torch.int64),
        timeout_s=30.0,
        sync=sync,
    )
    worst = 0  # largest staleness bound of any row read (steps)
    for t in range(T):
        engine.before_step(t)
        st = engine.steps[t]
        if engine.admission is not None:
            lagging = st.own_prev > engine.applied  # owned reads lacking an update
            if lagging.any():
                worst = max(worst, t - (engine.applied + 1))
            cached = st.reads[st.reads >= o]
            if cached.size:
                worst = max(worst, t - engine.admission.oldest_missing(cached))
        rows = torch.from_numpy(st.reads)
        gen = torch.Generator().manual_seed(100 * rank + t)
        grads = []
        for g in groups:  # a quadratic pull of the rows read towards a per-step target
            grad = torch.zeros_like(g.param)
            grad[rows] = g.param[rows] - torch.randn(
                rows.numel(), *g.param.shape[1:], generator=gen
            )
            grads.append(grad)
        visible = torch.zeros(layout.num_local, dtype=torch.bool)
        visible[rows] = True
        if rank == 0:
            time.sleep(SLOW_S)
        engine.after_backward(t, grads, visible)
    engine.drain()
    out[rank] = (layout.owned, [g.param[:o].clone() for g in groups], engine, worst)


def _run(sync: SyncConfig | None):
    plan = _plan()
    hubs = [LoopbackHub(2), LoopbackHub(2)]
    out: dict = {}
    threads = [threading.Thread(target=_rank, args=(r, plan, hubs, sync, out)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(out) == [0, 1], "a rank did not finish"
    params = []
    for gi in range(len(out[0][1])):
        whole = torch.zeros(N, *out[0][1][gi].shape[1:])
        for owned, tables, _, _ in out.values():
            whole[torch.from_numpy(owned)] = tables[gi]
        params.append(whole)
    return params, out


def test_tau_zero_reads_what_quality_first_reads():
    exact, _ = _run(None)
    zero, out = _run(SyncConfig(mode="throughput-first", tau=0.0, staleness_window=4))
    for a, b in zip(exact, zero, strict=True):
        assert torch.equal(a, b)
    summary = out[1][2].summary()
    assert summary["mode"] == "throughput-first" and summary["admitted"] == 0
    assert summary["fallbacks"]["overlap"] > 0  # rank 1 waited for the slow rank 0
    assert out[1][3] == 0  # every row read current


def test_admitted_reads_stay_within_k_steps_and_late_updates_land():
    exact, _ = _run(None)
    k = 2
    stale, out = _run(SyncConfig(mode="throughput-first", tau=10.0, staleness_window=k))
    engine, worst = out[1][2], out[1][3]
    summary = engine.summary()
    assert summary["admitted"] > 0, summary  # rank 1 read around the slow rank 0
    assert 0 < summary["max_staleness"] <= k
    assert 0 < worst <= k  # row by row, at every read
    log = engine.admission.admissions
    assert all(d.staleness <= k and d.overlap_ratio <= 10.0 for d in log)
    assert all(d.evidence_ratio < 10.0 for d in log)
    # every push rank 0 sent reached rank 1, late or not, and every step was applied
    assert engine.push_recv[0] == len(engine.inn[0])
    assert all(e.applied == T - 1 for _, _, e, _ in out.values())
    assert summary["fallbacks"]["staleness"] > 0  # K bounded how far rank 1 ran ahead
    for a in stale:
        assert torch.isfinite(a).all()
    assert any(not torch.equal(a, b) for a, b in zip(exact, stale, strict=True))
