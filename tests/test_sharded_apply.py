"""The sharded owner applies per row: a row's step-s update waits only for that row's
writers at s (and its previous update), not for every writer of the step.

On an in-process loopback (two ranks in threads, ``harness.sharded_loopback``): rank 1 owns
rows 32..63 and reads (and writes) only its rows 56..63, every step; the slow rank 0 reads
its rows 0..7 and rank 1's row 40, every step. Rank 1 never reads anything rank 0 writes,
so it must never wait for rank 0: applying step s as a whole (waiting for rank 0's gradient
of row 40) would make it wait about rank 0's delay every step. The rows equal those of a run
in which rank 0 is not slow, bitwise (timing changes nothing in quality-first).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from harness.sharded_loopback import loopback_plan, run_sharded_loopback
from harness.toy import LoopbackHub, random_footprints, toy_groups

from odin_ns.runtime.layout import EVERY_RANK

N, T = 64, 16
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63
SLOW_S = 0.03


def _run(slow_s: float, step_offset: int = 0):
    footprints = [[list(range(8)) + [40], list(range(56, 64))] for _ in range(T)]
    plan = loopback_plan(footprints, N)
    hubs = [LoopbackHub(2), LoopbackHub(2)]
    return run_sharded_loopback(plan, OWNER, hubs, seed=3, slow_s=slow_s, step_offset=step_offset)


def test_a_row_waits_only_for_its_own_writers():
    slow, out = _run(SLOW_S)
    waited = sum(m.wait_s for m in out[1].engine.metrics)
    assert waited < 0.25 * T * SLOW_S, waited  # rank 1 ran on, rank 0 slept T x SLOW_S
    # where rank 1 paid for running ahead: its drain waited for rank 0's last rows of row 40
    drained = sum(m.drain_wait_s for m in out[1].engine.metrics)
    assert drained > 0.5 * T * SLOW_S, drained
    assert out[1].engine.ledger.summary(out[1].engine.config)["drain_wait_s_total"] == drained
    # rank 0's gradients of row 40 reached rank 1 and were applied, in step order
    assert out[1].engine.log.oldest_unapplied(T) is None
    assert int(out[1].engine.versions[40 - 32]) == T - 1
    fast, _ = _run(0.0)
    for a, b in zip(slow, fast, strict=True):
        assert torch.equal(a, b)


def test_each_steps_tables_are_made_as_the_step_nears():
    """No step's tables at the phase start: by step t's reads a rank has made those through
    t - 1 + PUSH_LEAD (the pushes it registers, PUSH_LEAD past its last finished step; on
    CPU ranks nothing is made ahead), so it holds a
    few steps' tables, not a phase's, with the slow rank behind too; and the rows are a
    run's without the slow rank, bitwise."""
    from odin_ns.runtime.engine import PUSH_LEAD

    footprints = [[list(range(8)) + [40], list(range(56, 64)) + [t % 8]] for t in range(T)]
    plan = loopback_plan(footprints, N)

    def run(slow_s: float):
        hubs = [LoopbackHub(2), LoopbackHub(2)]
        return run_sharded_loopback(
            plan, OWNER, hubs, seed=3, slow_s=slow_s, observe=lambda e, t: e.steps.made
        )

    slow, out = run(SLOW_S)
    for rank in out.values():
        assert rank.observed == [min(t + PUSH_LEAD, T) for t in range(T)]
        assert rank.engine.registered == T - 1  # every push registered by the end
    fast, _ = run(0.0)
    for a, b in zip(slow, fast, strict=True):
        assert torch.equal(a, b)


def test_a_later_phase_reads_rows_an_earlier_phase_updated():
    """A phase that starts at step 20 with rows last updated anywhere in steps -1..19 (a
    phase start without a structural change): a row's first read in the phase needs no
    update of the phase, whatever its version."""
    _, out = _run(SLOW_S, step_offset=20)
    waited = sum(m.wait_s for m in out[1].engine.metrics)
    assert waited < 0.25 * T * SLOW_S, waited
    assert int(out[1].engine.versions[40 - 32]) == 20 + T - 1


def _halves_layout(plan):
    """Rank 0's view of 8 rows, rank 0 owning rows 0..3 and rank 1 rows 4..7, caching what
    ``plan`` has it read of rank 1's."""
    from odin_ns.runtime.layout import ShardLayout, cache_of, phase_read_sets

    owner = np.repeat([0, 1], 4).astype(np.int64)
    return ShardLayout(owner, 0, cache_of(owner, 0, phase_read_sets(plan, 2)[0]))


def _rank0_with_injected_peers(plan, layout):
    """Rank 0's engine over toy rows (8 of them, 2 ranks) whose peer answers every receive
    at once (``bench.control_plane.InjectedPeers``)."""
    from odin_ns.bench.control_plane import InjectedPeers
    from odin_ns.runtime import ParamGroupState
    from odin_ns.runtime.engine import Engine

    groups = [
        ParamGroupState(
            g.name, g.param[torch.from_numpy(layout.gids)].clone(),
            torch.zeros_like(g.param[: layout.num_owned]),
            torch.zeros_like(g.param[: layout.num_owned]), lr_at=g.lr_at,
        )
        for g in toy_groups(8, seed=1)
    ]  # fmt: skip
    return Engine(
        groups, layout, plan, 0, 2, InjectedPeers(8, 32, 0), InjectedPeers(8, 32, 1),
        step_offset=0, versions=torch.full((layout.num_owned,), -1), timeout_s=5.0,
    )  # fmt: skip


def _after_backward(engine, t: int) -> None:
    """Step t's zero gradients, every row it reads visible."""
    visible = torch.zeros(engine.layout.num_local, dtype=torch.bool)
    visible[torch.from_numpy(engine.steps[t].reads)] = True
    engine.after_backward(t, [torch.zeros_like(g.param) for g in engine.groups], visible)


def test_a_step_applied_before_its_own_after_backward():
    """Rank 0 holds none of its owned rows in any step's footprint, and rank 1's gradient
    rows of step t (for rank 0's rows 0, 1) arrive at once (peers injected, as a rank running
    behind sees them): step t is applied and retired during before_step(t), and
    after_backward(t) must go on (it asked for the retired step's record and failed)."""
    steps = 3
    plan = loopback_plan([[[4, 5], [0, 1]] for _ in range(steps)], 8)
    engine = _rank0_with_injected_peers(plan, _halves_layout(plan))
    for t in range(steps):
        engine.before_step(t)
        _after_backward(engine, t)
    engine.drain()
    assert engine.versions[:2].tolist() == [steps - 1] * 2  # rows 0, 1: rank 1's updates
    assert engine.versions[2:].tolist() == [-1, -1]  # rows 2, 3: nobody wrote them


@pytest.mark.parametrize("replicated", [False, True], ids=["sharded", "replicated"])
def test_a_steps_wait_leaves_out_its_own_bookkeeping(monkeypatch, replicated):
    """The wait a step reports is the time it waited for peers: making its step tables (a
    sharded rank registers the pushes PUSH_LEAD steps ahead, and makes those steps' tables
    then) is the rank's own work. With peers that answer at once there is nothing to wait
    for, however slow the tables are (counted as wait, a 2-rank street run's hidden share
    of barrier's wait under stragglers read 8 points low: docs/benchmarks.md)."""
    import odin_ns.runtime.engine as engine_module
    from odin_ns.runtime.layout import replicated_layout

    slow_s, steps = 0.05, 6
    made = engine_module.step_rows

    def slow_tables(*args, **kwargs):
        for st in made(*args, **kwargs):
            time.sleep(slow_s)
            yield st

    monkeypatch.setattr(engine_module, "step_rows", slow_tables)
    plan = loopback_plan([[[4, 5, t % 4], [0, 1, 6]] for t in range(steps)], 8)
    layout = replicated_layout(8, 0) if replicated else _halves_layout(plan)
    engine = _rank0_with_injected_peers(plan, layout)
    waits, spent = [], []
    for t in range(steps):
        tic = time.perf_counter()
        waits.append(engine.before_step(t))
        spent.append(time.perf_counter() - tic)
        _after_backward(engine, t)
    engine.drain()
    assert spent[0] >= slow_s  # (the tables were slow, and made in before_step)
    assert max(waits) < slow_s, waits
    assert [m.wait_s for m in engine.metrics] == waits


def test_every_rank_owning_every_row_is_replicated_training():
    """Replicated training is the ownership map in which every rank owns every row
    (``EVERY_RANK``): nothing is cached or pushed, every gradient row goes to every peer,
    and every rank applies every update. On a plan with overlapping reads and a slow rank,
    each rank's whole table equals the one-owner-per-row model, bitwise; so do rows owned
    by every rank beside single-owner ones. (These two make their step tables on a thread
    of their own, as beside an accelerator: ahead of the steps, or cut at the phase start
    while the next step's record is made; the model they equal makes them on one.)"""
    n, ranks = 48, 3
    plan = loopback_plan(random_footprints(n, 12, ranks, seed=5, size=20), n)
    split = np.repeat(np.arange(ranks), n // ranks).astype(np.int64)
    mixed = split.copy()
    mixed[::4] = EVERY_RANK
    want, _ = run_sharded_loopback(plan, split, [LoopbackHub(ranks), LoopbackHub(ranks)], 7, 0.01)
    for owner in (np.full(n, EVERY_RANK, dtype=np.int64), mixed):
        hubs = [LoopbackHub(ranks), LoopbackHub(ranks)]
        got, out = run_sharded_loopback(plan, owner, hubs, 7, 0.01, tables_thread=True)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        if (owner == EVERY_RANK).all():
            for rank in out.values():
                engine = rank.engine
                assert engine.layout.num_local == n  # every row owned, nothing cached
                assert not any(engine.out.values()) and not any(engine.inn.values())  # no push
                for table, whole in zip(rank.tables, want, strict=True):
                    assert torch.equal(table, whole)
