"""Throughput-first in the sharded engine (``odin_ns.runtime.sharded_admission``), on an
in-process loopback: two ranks in threads, rank 0 slow, over a hand-made plan in which rank
1 reads, every step, a row rank 0 owns and writes (a push source) and a row it owns that
rank 0 writes too (an owned source waiting for rank 0's gradient).

- ``tau = 0`` admits nothing: the owners' rows are bitwise quality-first's, and rank 1's
  waits are fallbacks (overlap).
- ``tau`` large, ``K = 2``: rank 1 reads around rank 0 (admitted delayed reads), never
  more than K steps stale (checked row by row at every read against the owned rows'
  applied versions and the cache's versions), the late pushes still land, and the owners'
  rows differ from quality-first's. Against a synchronous reference that replays what each
  rank read: every row read outside the rows read around is the row's value before the
  step, every row read around is its value before one of the K steps before, and the
  owners' rows and moments equal, bit for bit, the reference's sum in rank order with
  selective Adam in which the rows read around carry no update from their reader
  (``stale_gradients`` "drop") or their reader's gradient of the values it read ("apply").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import torch
from harness.sharded_loopback import loopback_plan, pull_targets, run_sharded_loopback
from harness.toy import LoopbackHub, toy_groups

from odin_ns.optim import selective_adam_update_
from odin_ns.runtime import SyncConfig

N, T = 64, 16
SEED = 5
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63
SLOW_S = 0.03  # rank 0's extra seconds per step


def _footprints() -> list[list[list[int]]]:
    """Rank 0: its rows 0..7 and rank 1's row 32. Rank 1: its rows 56..63 and 32, and rank
    0's row 0: at every step t >= 1 rank 1 needs rank 0's gradient of row 32 at t - 1 (owned
    source) and rank 0's push of row 0 after t - 1 (push source)."""
    return [[list(range(8)) + [32], list(range(56, 64)) + [0, 32]] for _ in range(T)]


def _staleness_bound(engine, t: int) -> int:
    """The largest staleness bound of any row local step t reads (0: every row current)."""
    if engine.admission is None:
        return 0
    st = engine.steps[t]
    worst = 0
    lagging, oldest = engine.lagging_owned_reads(t)  # owned reads lacking an update
    if lagging.size:
        worst = t - oldest
    cached = st.reads[st.reads >= engine.layout.num_owned]
    if cached.size:
        worst = max(worst, t - engine.admission.oldest_missing(cached))
    return worst


class Read(NamedTuple):
    """What one local step read, after its ``before_step``: global ids in the local read
    order, per group their values, and the global ids it read around."""

    rows: torch.Tensor
    values: list[torch.Tensor]
    around: torch.Tensor


def _observe(engine, t: int) -> tuple[int, Read]:
    reads = engine.steps[t].reads
    gids = engine.layout.gids
    read = Read(
        torch.from_numpy(gids[reads]),
        [g.param[torch.from_numpy(reads)].clone() for g in engine.groups],
        torch.from_numpy(gids[engine.read_around(t)]),
    )
    return _staleness_bound(engine, t), read


def _run(sync: SyncConfig | None):
    """(the whole model per group from the owners' rows, per rank (engine, the worst
    staleness bound it read at, its ``Read`` per step), per rank its owned global ids)."""
    plan = loopback_plan(_footprints(), N)
    params, out = run_sharded_loopback(
        plan, OWNER, [LoopbackHub(2), LoopbackHub(2)], seed=SEED, slow_s=SLOW_S,
        observe=_observe, sync=sync,
    )  # fmt: skip
    ranks = {
        r: (x.engine, max(bound for bound, _ in x.observed), [read for _, read in x.observed])
        for r, x in out.items()
    }
    owned = {r: x.owned for r, x in out.items()}
    return params, ranks, owned


def _reference(reads: dict[int, list[Read]], stale_gradients: str):
    """The synchronous run of the same plan from what each rank read: rank r's step t
    pulls the rows it read, at the values it read, towards the harness's per-(rank, step)
    target (``sharded_loopback.pull_targets``); the rows read around get no update from it
    (``stale_gradients`` "drop"); summed in rank order, selective Adam. Returns (groups,
    per step the values before it)."""
    groups = toy_groups(N, seed=SEED)
    before = []
    for t in range(T):
        before.append([g.param.clone() for g in groups])
        total = [torch.zeros_like(g.param) for g in groups]
        visible = torch.zeros(N, dtype=torch.bool)
        for r in sorted(reads):
            read = reads[r][t]
            fresh = ~torch.isin(read.rows, read.around)
            if stale_gradients == "apply":
                fresh[:] = True
            targets = pull_targets(r, t, read.rows.numel(), groups)
            for value, target, acc in zip(read.values, targets, total, strict=True):
                grad = value - target
                grad[~fresh] = 0.0
                acc[read.rows] += grad
            visible[read.rows[fresh]] = True
        for g, acc in zip(groups, total, strict=True):
            b1, b2 = g.betas
            selective_adam_update_(
                g.param, acc, g.exp_avg, g.exp_avg_sq, visible, g.lr_at(t), b1, b2, g.eps,
                step=t + 1,
            )  # fmt: skip
    return groups, before


def test_tau_zero_reads_what_quality_first_reads():
    exact, _, _ = _run(None)
    zero, out, _ = _run(SyncConfig(mode="throughput-first", tau=0.0, staleness_window=4))
    for a, b in zip(exact, zero, strict=True):
        assert torch.equal(a, b)
    engine, worst, _ = out[1]
    summary = engine.summary()
    assert summary["mode"] == "throughput-first" and summary["admitted"] == 0
    assert summary["fallbacks"][engine.config.admission] > 0  # rank 1 waited for the slow 0
    assert worst == 0  # every row read current


@pytest.mark.parametrize("stale_gradients", ["drop", "apply"])
def test_admitted_reads_stay_within_k_steps_and_equal_the_stale_read_reference(stale_gradients):
    exact, _, _ = _run(None)
    k = 2
    cfg = SyncConfig(
        mode="throughput-first", tau=10.0, staleness_window=k, stale_gradients=stale_gradients
    )
    stale, out, owned = _run(cfg)
    engine, worst, _ = out[1]
    summary = engine.summary()
    assert summary["admitted"] > 0, summary  # rank 1 read around the slow rank 0
    assert 0 < summary["max_staleness"] <= k
    assert 0 < worst <= k  # row by row, at every read
    log = engine.ledger.admissions
    assert all(d.staleness <= k and d.overlap_ratio <= 10.0 for d in log)
    assert all(d.evidence_ratio < 10.0 for d in log)
    # every push rank 0 sent reached rank 1, late or not, and every step was applied
    assert engine.push_recv[0] == len(engine.inn[0])
    assert all(e.log.oldest_unapplied(T) is None for e, _, _ in out.values())
    assert summary["fallbacks"]["staleness"] > 0  # K bounded how far rank 1 ran ahead
    for a in stale:
        assert torch.isfinite(a).all()
    assert any(not torch.equal(a, b) for a, b in zip(exact, stale, strict=True))

    # the synchronous reference of what each rank read
    reads = {r: x[2] for r, x in out.items()}
    ref, before = _reference(reads, stale_gradients)
    around = 0
    for r in reads:
        for t, read in enumerate(reads[r]):
            fresh = ~torch.isin(read.rows, read.around)
            for value, now in zip(read.values, before[t], strict=True):
                assert torch.equal(value[fresh], now[read.rows[fresh]]), (r, t)
            for i in (~fresh).nonzero().squeeze(1).tolist():  # a value of the last K steps
                p = int(read.rows[i])
                assert any(
                    all(
                        torch.equal(v[i], b[p]) for v, b in zip(read.values, before[s], strict=True)
                    )
                    for s in range(max(0, t - k), t + 1)
                ), (r, t, p)
            around += int((~fresh).sum())
    assert around > 0  # rows were read around, at rank 1
    for r, (eng, _, _) in out.items():
        rows = torch.from_numpy(owned[r])
        o = eng.layout.num_owned
        for g, h in zip(eng.groups, ref, strict=True):
            assert torch.equal(g.param.data[:o], h.param[rows]), (r, g.name)
            assert torch.equal(g.exp_avg, h.exp_avg[rows]), (r, g.name)
            assert torch.equal(g.exp_avg_sq, h.exp_avg_sq[rows]), (r, g.name)
    for a, h in zip(stale, ref, strict=True):
        assert torch.equal(a, h.param)
    other = {"drop": "apply", "apply": "drop"}[stale_gradients]  # the test tells them apart
    assert any(
        not torch.equal(a, h.param) for a, h in zip(stale, _reference(reads, other)[0], strict=True)
    )
