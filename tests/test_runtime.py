"""Tests of the primitive-sync engine (odin_ns/runtime) in the replicated layout (every rank
owns every row) against a synchronous single-process reference (in-process loopback with
1-3 ranks, 2-3 processes over gloo) in every mode, ddp included; no global barrier in
quality-first; dead / stuck peers. Its inner loops (``odin_ns.cuda.ops``) are tested against
their references in test_cuda_ext.py; the sharded layout in test_sharded*.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading

import numpy as np
import pytest
import torch
from harness import (
    ListPlan,
    LoopbackHub,
    Phase,
    ToyRun,
    assert_same_ids,
    random_footprints,
    reference_train,
    replicated_engine,
    run_threads,
    run_toy_rank,
    spawn_ranks,
    toy_grads,
    toy_groups,
    toy_runs_worker,
    train_step,
)

from odin_ns.cuda import ops
from odin_ns.runtime import MODES, SyncConfig
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import ShardLayout, replicated_layout
from odin_ns.runtime.step_kernels import (
    StepKernels,
    add_arrivals_reference,
    any_unapplied_reference,
    mark_ready_reference,
    step_record_reference,
    take_ready_reference,
    write_versions_reference,
    writer_groups_reference,
)
from odin_ns.runtime.step_tables import GROUPS_AHEAD_MAX_RANKS, PhaseSteps, groups_ahead, step_rows
from odin_ns.runtime.update_log import SumBuffers, UpdateLog


def _same(groups_a, groups_b) -> bool:
    return all(
        torch.equal(a.param, b.param)
        and torch.equal(a.exp_avg, b.exp_avg)
        and torch.equal(a.exp_avg_sq, b.exp_avg_sq)
        for a, b in zip(groups_a, groups_b, strict=True)
    )


def _two_phases(world: int, seed: int, steps=(12, 6)) -> list[Phase]:
    """A phase on 300 rows, then 40 rows appended (densification) and a second phase."""
    p1 = ListPlan(random_footprints(300, steps[0], world, seed=seed))
    p2 = ListPlan(random_footprints(340, steps[1], world, seed=seed + 1))
    return [Phase(p1, 0), Phase(p2, steps[0] + 3, grow=40)]


# ---------------------------------------------------------------- plan / input
def test_list_plan_dependency_by_hand():
    plan = ListPlan(
        [
            [[0, 1], [5]],
            [[2], [1, 6]],
            [[7], [8]],
            [[5, 6], [0]],
        ]
    )
    assert plan.message_rows.tolist() == [[2, 1], [1, 2], [1, 1], [2, 1]]
    dep = plan.dependency
    assert dep[1, 1, 0] == 0  # rank 1 reads row 1 at t=1, written by rank 0 at t=0
    assert dep[1, 0, 1] == -1
    assert dep[3, 0, 1] == 1  # rows 5, 6: rank 1 wrote 6 at t=1 (and 5 at t=0)
    assert dep[3, 1, 0] == 0  # row 0: rank 0 at t=0
    assert dep[2].tolist() == [[-1, -1], [-1, -1]]


def _engine(plan, groups=None, **cfg):
    groups = groups if groups is not None else toy_groups(300)
    return replicated_engine(groups, plan, 0, 1, SyncConfig(**cfg))


def _backward(engine, groups, t: int, visible=None) -> None:
    grads, vis = toy_grads(groups, t, engine.plan.step_footprint(t, engine.rank))
    mask = vis if visible is None else visible
    engine.after_backward(t, [grads[g.name] for g in groups], mask)


def test_visible_rows_outside_the_footprint_are_rejected():
    """A step whose visible rows leave its read set is refused at its backward on the host
    (on an accelerator the count stays on the device until the phase's drain)."""
    plan = ListPlan([[np.arange(10), np.arange(10)]] * 2)
    groups = toy_groups(300)
    _, visible = toy_grads(groups, 0, plan.step_footprint(0, 0))
    outside = visible.clone()
    outside[100] = True
    eng = replicated_engine(groups, plan, 0, 2, transport=LoopbackHub(2).transport(0))
    eng.before_step(0)
    with pytest.raises(ValueError, match=r"step 0: visible rows outside the step's read set"):
        _backward(eng, groups, 0, outside)


def test_bad_input_is_rejected():
    plan = ListPlan([[np.arange(10)], [np.arange(5, 20)]])
    with pytest.raises(ValueError, match="mode"):
        SyncConfig(mode="fast")
    with pytest.raises(ValueError, match="tau"):
        SyncConfig(mode="throughput-first", tau=-0.1)
    with pytest.raises(ValueError, match="tau"):
        SyncConfig(mode="throughput-first", tau=float("nan"))
    with pytest.raises(ValueError, match="staleness_window"):
        SyncConfig(mode="throughput-first", staleness_window=-1)
    with pytest.raises(ValueError, match="stale_gradients must be 'drop' or 'apply'"):
        SyncConfig(mode="throughput-first", stale_gradients="scale")
    groups = toy_groups(300)
    eng = _engine(plan, groups)
    with pytest.raises(ValueError, match=r"before_step\(0\) must come first"):
        _backward(eng, groups, 0)
    with pytest.raises(ValueError, match="expected local step 0"):
        eng.before_step(1)
    eng.before_step(0)
    with pytest.raises(ValueError):  # one gradient per group
        eng.after_backward(0, [None], torch.zeros(300, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool mask"):
        eng.after_backward(0, [None] * 3, torch.zeros(10, dtype=torch.bool))
    with pytest.raises(ValueError, match="between before_step"):
        eng.drain()
    _backward(eng, groups, 0)
    eng.before_step(1)
    _backward(eng, groups, 1)
    with pytest.raises(ValueError, match="outside the bound plan"):
        eng.before_step(2)
    eng.drain()
    owner = np.repeat([0, 1], 150)  # sharded: ddp is a replicated baseline
    layout = ShardLayout(owner, 0, np.empty(0, dtype=np.int64))
    two = ListPlan([[np.arange(10), np.arange(5, 20)]])
    with pytest.raises(ValueError, match="every rank to own every row"):
        Engine(groups, layout, two, 0, 2, None, None, 0, torch.full((150,), -1),
                      sync=SyncConfig(mode="ddp"))  # fmt: skip


def test_step_kernels_equal_their_twins():
    """The update log's per-step host kernels equal their torch twins bit for bit:
    ``step_record`` (union, positions, previous writes; row tables reused across calls, and
    ``last_write`` advanced in place; int64 or int32 footprints, of every row or of the rows
    a caller holds), ``writer_groups`` (the rows grouped by their writers),
    ``add_arrivals`` (the rows each arrival completes), ``take_ready`` (in order, or
    checking versions against the planned previous writes beyond the step every earlier
    one is applied through, the versions only read), ``mark_ready`` (every candidate),
    ``write_versions`` and ``any_unapplied``; empty footprints and refused calls included."""
    record, group, arrivals, take_ready = (
        ops.host_op(name) for name in ("step_record", "writer_groups", "add_arrivals", "take_ready")
    )
    if record is None:
        pytest.skip("the CPU library is not built (python -m odin_ns.cuda build)")
    rng = np.random.default_rng(3)
    held = []  # candidates the version test held back, per world
    for world in (1, 2, 5, 8):
        sizes = rng.integers(0, 120, world)
        sizes[rng.integers(world)] = 0
        fps = [torch.from_numpy(np.sort(rng.choice(500, k, replace=False))) for k in sizes]
        last = torch.from_numpy(rng.integers(-1, 9, 500))
        last_want = last.clone()
        got, want = record(fps, last, 11), step_record_reference(fps, last_want, 11)
        for a, b in zip((got[0], got[2], last), (want[0], want[2], last_want), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert all(torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))
        # int32 footprints (the plan's), of every row or of the rows a caller holds
        narrow = [f.int() for f in fps]
        for kept in (None, torch.from_numpy(rng.random(500) < 0.3)):
            last_held, last_held_want = last.clone(), last.clone()
            got_held = record(narrow, last_held, 12, kept)
            want_held = step_record_reference(narrow, last_held_want, 12, kept)
            assert torch.equal(last_held, last_held_want)
            assert kept is None or bool(kept[got_held[0]].all())
            assert_same_ids(got_held, want_held)
        ids, positions, prev = got
        u = ids.numel()
        expected = torch.bincount(torch.cat(positions), minlength=u).int()  # writers per row
        groups, groups_want = group(positions, u), writer_groups_reference(positions, u)
        assert all(
            a.dtype == b.dtype and torch.equal(a, b)
            for a, b in zip(groups, groups_want, strict=True)
        )
        group_ptr, group_rows, need, writer_ptr, writer_groups = groups
        assert torch.equal(need.repeat_interleave(group_ptr.diff())[group_rows.argsort()], expected)
        need_got, need_want = need.clone(), need.clone()
        complete = []
        for q in rng.permutation(world):  # writers arrive in any order
            mine = writer_groups[writer_ptr[q] : writer_ptr[q + 1]]
            a = arrivals(need_got, mine, group_ptr, group_rows)
            b = add_arrivals_reference(need_want, mine, group_ptr, group_rows)
            assert torch.equal(a, b) and torch.equal(need_got, need_want)
            complete.append(a)
        complete = torch.cat(complete)  # every row, once: each completes with its last writer
        assert torch.equal(complete.sort().values, torch.arange(u)) and not need_got.any()
        applied = torch.zeros(u, dtype=torch.bool)
        applied[complete[: u // 5]] = True
        candidates = complete[u // 5 :]
        versions = torch.from_numpy(rng.integers(-1, 12, 500))
        local_prev = torch.where(prev >= 0, prev - 3, torch.full_like(prev, -1))  # offset 3
        for through, write in ((10, -1), (6, -1), (2, -1), (6, 11)):  # 10: every earlier
            done, done_want = applied.clone(), applied.clone()  # step applied (in order)
            v, v_want = versions.clone(), versions.clone()
            a = take_ready(candidates, done, ids, local_prev, 3, v, through, write)
            b = take_ready_reference(
                candidates, done_want, ids, local_prev, 3, v_want, through, write
            )
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
            assert torch.equal(done, done_want) and torch.equal(v, v_want)
            expect = versions.clone()  # -1: only read; else the taken rows' versions set
            expect[ids[a[1]]] = write if write >= 0 else expect[ids[a[1]]]
            assert torch.equal(v, expect)
            assert a[1].numel() + a[2].numel() == candidates.numel()
            assert torch.equal(a[1], a[0].nonzero().squeeze(1))  # the rows taken, in order
            # taken: covered by ``through`` or by the versions; held: neither
            wants = local_prev[candidates] + 3
            taken = (wants <= through) | (versions[ids[candidates]] >= wants)
            assert torch.equal(a[0][candidates], taken)
            assert torch.equal(a[2], candidates[~taken].sort().values)
            if through == 10:
                assert a[2].numel() == 0
            elif write < 0:
                held.append(0 < a[2].numel() < candidates.numel())
    assert any(held)  # the version test held some rows back, not all
    # mark_ready: every candidate ready (every previous write applied), none looked at;
    # without candidates every row not applied, less the blocked (missing writers') rows;
    # versions only read, or the ready rows' set; the ready rows counted
    mark = ops.host_op("mark_ready")
    blocked = [positions[0], positions[-1]]  # two writers still missing
    cases = [(c, [], w) for c in (candidates, None) for w in (-1, 11)]
    for cands, stop, write in [*cases, (None, blocked, -1), (None, blocked, 11)]:
        done, done_want = applied.clone(), applied.clone()
        v, v_want = versions.clone(), versions.clone()
        a, n = mark(cands, stop, done, ids, v, write)
        b, m = mark_ready_reference(cands, stop, done_want, ids, v_want, write)
        assert torch.equal(a, b) and torch.equal(done, done_want) and torch.equal(v, v_want)
        want = ~applied  # (the candidates are every row not applied)
        for rows in stop:
            want[rows] = False
        assert torch.equal(a, want) and n == m == int(want.sum())
        assert torch.equal(done, applied | want)
        expect = versions.clone()
        if write >= 0:
            expect[ids[a]] = write
        assert torch.equal(v, expect)
    for bad, stop, error, match in (
        (candidates[:1].repeat(2), [], RuntimeError, "twice"),
        (complete[:1], [], RuntimeError, "already applied"),
        (torch.tensor([0, u]), [], ValueError, "out of range"),
        (candidates, blocked, ValueError, "blocked rows go with no candidates"),
        (None, [torch.tensor([0, u])], ValueError, "blocked rows out of range"),
    ):
        for kernel in (mark, mark_ready_reference):
            before, v = applied.clone(), versions.clone()
            with pytest.raises(error, match=match):
                kernel(bad, stop, before, ids, v, 11)
            assert torch.equal(before, applied) and torch.equal(v, versions)  # nothing written
    # a ready row's id outside the versions: refused before anything is written; a row not
    # ready may hold any id (its version is not written)
    far = ids.clone()
    far[candidates[0]] = versions.numel()
    for kernel in (mark, mark_ready_reference):
        before, v = applied.clone(), versions.clone()
        with pytest.raises(ValueError, match="ids out of range"):
            kernel(candidates, [], before, far, v, 11)
        assert torch.equal(before, applied) and torch.equal(v, versions)
        kernel(candidates[1:], [], before, far, v, 11)
        assert (
            v[far[candidates[1]]] == 11
            and int(before.sum()) == int(applied.sum()) + len(candidates) - 1
        )
    # write_versions: the versions a look left unwritten, the ready rows' set (a row of
    # ids written once; rows not ready keep theirs); an id out of range writes nothing
    write = ops.host_op("write_versions")
    for ready in (a, torch.zeros(u, dtype=torch.bool), torch.ones(u, dtype=torch.bool)):
        v, v_want = versions.clone(), versions.clone()
        write(v, ids, ready, 12)
        write_versions_reference(v_want, ids, ready, 12)
        assert torch.equal(v, v_want)
        expect = versions.clone()
        expect[ids[ready]] = 12
        assert torch.equal(v, expect)
    bad = ids.clone()
    bad[-1] = versions.numel()
    for kernel in (write, write_versions_reference):
        v = versions.clone()
        with pytest.raises(ValueError, match="out of range"):
            kernel(v, bad, torch.ones(u, dtype=torch.bool), 12)
        assert torch.equal(v, versions)
        unready = torch.ones(u, dtype=torch.bool)
        unready[-1] = False  # (the ready rows' ids are the ones read)
        kernel(v, bad, unready, 12)
        assert (
            torch.equal(v[ids[:-1]], torch.full((u - 1,), 12)) and v[ids[-1]] == versions[ids[-1]]
        )
    # any_unapplied: whether some of a read's rows are rows of the step not applied yet
    unapplied = ops.host_op("any_unapplied")
    outside = torch.from_numpy(np.setdiff1d(np.arange(500), ids.numpy()))[:7]
    done = torch.zeros(u, dtype=torch.bool)
    done[::2] = True
    reads = [ids[1::2][:3], ids[::2], torch.cat([outside, ids[-1:]]).sort().values, outside,
             ids[:0], ids]  # fmt: skip
    for rows in (r.contiguous() for r in reads):
        want = bool((~done[torch.isin(ids, rows)]).any())
        for kernel in (unapplied, any_unapplied_reference):
            assert kernel(ids, done, rows) is want, rows
            assert kernel(ids, torch.ones(u, dtype=torch.bool), rows) is False
    assert unapplied(ids[:0], done[:0], ids) is any_unapplied_reference(ids[:0], done[:0], ids)
    with pytest.raises(RuntimeError, match="already applied"):
        take_ready(
            candidates, torch.ones(u, dtype=torch.bool), ids, local_prev, 3, versions, 10, -1
        )
    last = torch.zeros(500, dtype=torch.int64)
    with pytest.raises(ValueError, match="out of range"):
        record([torch.tensor([3, 500])], last, 1)
    assert not last.any()  # refused before anything was written
    with pytest.raises(ValueError, match="out of range"):
        arrivals(need.clone(), torch.tensor([need.numel()]), group_ptr, group_rows)
    with pytest.raises(ValueError, match="no writer left"):
        arrivals(need_got, writer_groups[:1], group_ptr, group_rows)  # all arrived already
    with pytest.raises(ValueError, match="no writer"):
        group([torch.tensor([0, 2])], 3)  # row 1 has none
    nine, every_row = torch.zeros(9, dtype=torch.int64), torch.ones(9, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"held must have shape \[9\]"):
        record([torch.tensor([1, 3])], nine, 0, every_row[:8])
    with pytest.raises(ValueError, match=r"sorted and unique \(3 before 1\)"):
        record([torch.tensor([0, 2]), torch.tensor([3, 1, 4])], nine, 0, every_row)
    with pytest.raises(ValueError, match=r"out of range: values span \[0, 9\]"):
        record([torch.tensor([0, 2]), torch.tensor([0, 9]).int()], nine, 0, every_row)
    with pytest.raises(ValueError, match="must be torch.int64 or torch.int32, got torch.float32"):
        record([torch.tensor([0.0, 2.0])], nine, 0)
    assert not nine.any()  # refused before anything was written
    none = [torch.zeros(0, dtype=torch.int64)] * 3  # a step with no rows (nothing owned)
    for a, b in zip(group(none, 0), writer_groups_reference(none, 0), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    with pytest.raises(ValueError, match="versions must be torch.int64"):
        take_ready(candidates, applied, ids, local_prev, 3, versions.int(), 2, -1)
    applied_before, versions_before = applied.clone(), versions.clone()
    with pytest.raises(ValueError, match="candidates out of range"):
        take_ready(torch.tensor([0, u]), applied, ids, local_prev, 3, versions, 10, 11)
    assert torch.equal(applied, applied_before)  # refused before anything was written
    assert torch.equal(versions, versions_before)
    # the tables it keeps between calls are left clear: a smaller step after a larger one,
    # and a refused call in between, give the twin's answer
    small = [torch.tensor([7, 9]), torch.tensor([2, 9])]
    last, last_want = torch.zeros(20, dtype=torch.int64), torch.zeros(20, dtype=torch.int64)
    got, want = record(small, last, 4), step_record_reference(small, last_want, 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))
    assert torch.equal(last, last_want)


def test_sum_buffers_reuse_memory_and_hand_out_zeros():
    """A step's [U, W] sum comes zeroed from memory an earlier step gave back (the engine's
    exactness below does not show reuse: a fresh buffer gives the same sums)."""
    sums = SumBuffers(width=3, device=torch.device("cpu"), keep=1)
    first = sums.take(8)
    assert first.shape == (8, 3) and not first.any()
    first.fill_(5.0)
    second = sums.take(4)  # the first is lent: another buffer
    assert second.data_ptr() != first.data_ptr()
    sums.give(first)
    again = sums.take(6)  # fits in the first one's memory: reused, zeroed
    assert again.data_ptr() == first.data_ptr() and again.shape == (6, 3) and not again.any()
    sums.give(second)
    sums.give(again)
    assert len(sums.free) == 1 and sums.free[0].shape[0] >= 8  # keep=1: the larger stays
    with pytest.raises(KeyError):
        sums.give(torch.zeros(2, 3))  # not one of its own


# ------------------------------------------------- engine vs reference (in-process)
def test_single_rank_matches_reference():
    phases = _two_phases(1, seed=5)
    ref, ref_versions = reference_train(toy_groups(300), phases)
    run = ToyRun(phases)
    groups, engine, ledger, _ = run_toy_rank(0, 1, run)
    assert _same(groups, ref)
    assert torch.equal(engine.versions, ref_versions)
    s = json.loads(json.dumps(ledger.summary(run.config)))
    assert s["steps"] == 18 and s["drains"] == 2
    steps = ledger.step_metrics()
    assert [m["step"] for m in steps] == list(range(12)) + list(range(15, 21))
    touched = sum(
        len(ph.plan.step_footprint(t, 0)) for ph in phases for t in range(ph.plan.views.shape[0])
    )
    assert s["rows_applied"] == sum(m["rows_applied"] for m in steps) == touched
    assert s["bytes_sent"] == 0 and s["max_version_lag"] == 0


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", ["barrier", "quality-first", "ddp"])
def test_threaded_ranks_match_reference(world, mode, monkeypatch):
    """Ranks in threads over a loopback transport, random per-step delays: any
    interleaving must give the synchronous result bit for bit on every replica, whether
    each step's tables are made in the step or ahead on a thread of their own (as beside
    an accelerator; then each step's path is made there too, all but a phase's first)."""
    made_on: list[str] = []
    make_path = Engine._make_path

    def recorded(engine, step):
        made_on.append(threading.current_thread().name)
        return make_path(engine, step)

    monkeypatch.setattr(Engine, "_make_path", recorded)
    for seed, aside in ((11, False), (12, True)):
        made_on.clear()
        phases = _two_phases(world, seed=seed)
        ref, ref_versions = reference_train(toy_groups(300), phases)
        cfg = SyncConfig(mode=mode, timeout_s=20)
        run = ToyRun(phases, cfg, jitter_s=0.002, tables_thread=aside)
        for groups, engine, _, _ in run_threads(world, run):
            assert _same(groups, ref)
            assert torch.equal(engine.versions, ref_versions)
        ahead = sum(name.startswith("odin-step-tables") for name in made_on)
        steps = world * sum(ph.plan.views.shape[0] for ph in phases)
        assert len(made_on) == steps  # one path a step and rank
        assert ahead == (steps - world * len(phases) if aside else 0)


def test_ddp_mode_is_dense_and_equals_barrier():
    """ddp all-reduces every row [N, W] every step: same parameters as barrier (and the
    reference), N x W x 4 bytes per step."""
    assert "ddp" in MODES and SyncConfig(mode="ddp").mode == "ddp"
    phases = _two_phases(2, seed=7)
    ref, ref_versions = reference_train(toy_groups(300), phases)
    run = ToyRun(phases, SyncConfig(mode="ddp", timeout_s=20))
    for groups, engine, ledger, _ in run_threads(2, run):
        assert _same(groups, ref) and torch.equal(engine.versions, ref_versions)
        s = ledger.summary(run.config)
        assert s["mode"] == "ddp"
        width = 3 + 12 + 1 + 1
        assert s["bytes_sent"] == (12 * 300 + 6 * 340) * width * 4
    single, engine, _, _ = run_toy_rank(
        0, 1, ToyRun(_two_phases(1, seed=5), SyncConfig(mode="ddp"))
    )
    ref1, ref1_versions = reference_train(toy_groups(300), _two_phases(1, seed=5))
    assert _same(single, ref1) and torch.equal(engine.versions, ref1_versions)


def test_version_order_across_peers():
    """Rank 0 hears of rank 1's step-1 update of row 0 before rank 2's step-0 update of the
    same row: it must hold the step-1 update back until step 0 is applied."""
    plan = ListPlan(
        [
            [[10], [11], [0]],  # rank 2 writes row 0 at step 0
            [[10], [0], [12]],  # rank 1 writes row 0 at step 1 (after waiting for rank 2)
            [[0], [13], [14]],  # rank 0 reads row 0 at step 2
        ]
    )
    ref, ref_versions = reference_train(toy_groups(20), [Phase(plan, 0)])
    hub = LoopbackHub(3)
    hub.hold(2, 0)
    groups = [toy_groups(20) for _ in range(3)]
    engines = [
        replicated_engine(groups[r], plan, r, 3, transport=hub.transport(r)) for r in range(3)
    ]

    def step(r: int, t: int) -> None:
        train_step(engines[r], groups[r], t)

    for r in (2, 1):
        for t in range(3):
            step(r, t)
    step(0, 0)
    step(0, 1)
    # (the apply op's exact vector: the host's is written on demand, ``settle_versions``)
    applied = engines[0].log.versions_data
    assert applied[0] == -1  # step 1 of row 0 is complete but must wait
    hub.release(2, 0)
    engines[0].poll()
    assert applied[0] == 1
    step(0, 2)
    for eng, grp in zip(engines, groups, strict=True):
        eng.drain()
        assert _same(grp, ref)
        assert torch.equal(eng.versions, ref_versions)


def test_tables_made_ahead_are_the_tables_made_in_the_step():
    """``PhaseSteps(ahead=2)`` (a thread makes the next steps' tables, started at the end of
    each step by ``make_ahead``, nothing before) hands out the tables the step itself would
    make, step for step; a table that cannot be made fails the step that asks for it, with
    the maker's error; the thread ends once the last step has been asked for."""
    n, steps, world = 120, 9, 3
    plan = ListPlan(random_footprints(n, steps, world, seed=4))

    def tables():
        return step_rows(plan, replicated_layout(n, 1), world)

    def same(a, b) -> bool:
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, (np.ndarray, torch.Tensor)):
            return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
        if dataclasses.is_dataclass(a):
            return same(vars(a), vars(b))
        return a == b

    made = tables()
    in_step, ahead = PhaseSteps(tables(), steps), PhaseSteps(made, steps, ahead=2)
    for t in range(steps):
        assert same(in_step[t], ahead[t]), t
        assert t > 0 or not ahead._coming  # nothing started before the first step's end
        ahead.make_ahead()  # the end of step t: steps t + 1, t + 2 made or being made
        assert ahead.made == t + 1 and ahead.made + len(ahead._coming) == min(t + 3, steps)
        assert (ahead._maker is None) == (t + 2 >= steps - 1)  # last step asked: thread ends
    assert made.gi_frame is None  # every step handed over: the tables' generator closed

    def failing():
        yield from itertools.islice(tables(), 3)
        raise ValueError("step_record: footprint 1 has row 999 outside [0, 120)")

    steps_ahead = PhaseSteps(failing(), steps, ahead=2)
    for t in range(3):
        steps_ahead[t]
        steps_ahead.make_ahead()
    with pytest.raises(ValueError, match="row 999 outside"):
        steps_ahead[3]


def test_tables_group_writers_ahead_only_where_it_pays():
    """The tables' thread groups a step's rows by writer set only for the replicated layout,
    its tables made ahead, up to ``GROUPS_AHEAD_MAX_RANKS`` (beyond, the groups cost that
    thread more than a step lasts)."""
    replicated, limit = replicated_layout(50, 0), GROUPS_AHEAD_MAX_RANKS
    assert groups_ahead(replicated, 8, True) and groups_ahead(replicated, limit, True)
    assert not groups_ahead(replicated, limit + 1, True)
    assert not groups_ahead(replicated, 8, False)  # CPU ranks: made when a step needs them
    owner = np.arange(50) % 2
    sharded = ShardLayout(owner, 0, np.flatnonzero(owner == 1))
    assert not groups_ahead(sharded, 2, True)


@pytest.mark.parametrize(
    "on_take, world, grouped",
    [(False, 3, False), (True, 3, False), (False, 5, False), (True, 5, False), (False, 5, True)],
)
def test_host_versions_are_written_when_asked(on_take, world, grouped, monkeypatch):
    """The update log applies rows without writing the host's version vector (or, with
    ``versions_on_take``, as it takes them); asked (``settle_versions``), the host vector
    says, of every row, what the apply op's exact vector says wherever that is after
    ``applied_through``, and never more; every step through ``applied_through`` is
    applied. Arrivals in random order across steps and writers (rows applied out of step
    order, steps retired out of order), checked after every arrival; at the end (a drain)
    the host vector is the exact one, and the parameters equal those of arrivals in step
    order, bit for bit; after every arrival, every row whose writers are all in and whose
    previous planned write is applied is applied, and no other. (A step first looked at
    with at most two writers missing finds its complete rows by a mask, with more it counts
    its writers: 3 ranks take the first way only, 5 ranks both; ``grouped``: the tables
    bring the rows grouped by writer set, as beside an accelerator, and the counting leaves
    those groups as they were made.)"""
    n, steps, offset = 90, 10, 7
    plan = ListPlan(random_footprints(n, steps, world, seed=2))
    # the engine's step tables
    tables = step_rows(plan, replicated_layout(n, 0), world, group_writers=grouped)
    writes = PhaseSteps(tables, steps)
    made = [writes[t].writes.groups for t in range(steps)]
    assert all((g is not None) == grouped for g in made)
    made_need = [None if g is None else g[2].clone() for g in made]
    counted = []  # the writers' arrivals counted down by groups
    if grouped:  # a step takes the groups its tables made and makes none
        real = StepKernels.resolve()

        def refuse(*_):
            raise AssertionError("a step grouped rows its tables had grouped")

        def count(*args):
            counted.append(1)
            return real.add_arrivals(*args)

        kernels = dataclasses.replace(real, writer_groups=refuse, add_arrivals=count)
        monkeypatch.setattr(StepKernels, "resolve", classmethod(lambda cls: kernels))
    width = 3 + 12 + 1 + 1
    gen = torch.Generator().manual_seed(5)
    parts = {  # (a writer with no row of a step sends nothing)
        (t, q): torch.randn(rows.numel(), width, generator=gen)
        for t in range(steps)
        for q, rows in enumerate(writes[t].writes.positions)
        if rows.numel()
    }
    for part in parts.values():
        part[:, -1] = 1.0  # every writer saw its rows
    rng = np.random.default_rng(8)
    results = []
    for order in (sorted(parts), [list(parts)[i] for i in rng.permutation(len(parts))]):
        groups = toy_groups(n)
        versions = torch.full((n,), offset - 1)
        log = UpdateLog(groups, writes, world, offset, versions, versions_on_take=on_take)
        skipped = ahead = False  # host rows left unwritten; rows applied past the prefix
        arrived = set()
        for t, q in order:
            log.add(t, q, parts[(t, q)].clone())
            log.apply_ready()
            arrived.add((t, q))
            for s, rec in log.pending.items():  # a row is applied as soon as it can be:
                waiting = torch.zeros(rec.ids.numel(), dtype=torch.bool)  # a writer not in
                for w, rows in enumerate(writes[s].writes.positions):
                    waiting[rows] |= (s, w) not in arrived
                # or its previous planned write not applied
                waiting |= log.versions_data[rec.ids] < offset + rec.prev
                assert torch.equal(rec.applied, ~waiting)
            through = log.settle_versions(offset + steps)
            exact, host = log.versions_data, log.versions
            later = exact > through
            assert torch.equal(host[later], exact[later]) and bool((host <= exact).all())
            for rec in log.pending.values():  # (retired steps are applied)
                assert rec.done or rec.step > through
            skipped, ahead = skipped or bool((host < exact).any()), ahead or bool(later.any())
        assert log.oldest_unapplied(steps) is None
        log.settle_after_drain()
        assert torch.equal(log.versions, log.versions_data)
        results.append(groups)
        assert skipped != on_take and ahead  # (written on take: the host vector is exact)
    assert _same(*results)
    for g, need in zip(made, made_need, strict=True):  # the tables' groups as made
        assert g is None or torch.equal(g[2], need)
    assert bool(counted) == grouped


def test_the_plans_dependency_table_is_not_read():
    """The engine waits for what the footprints say (``step_tables``): a plan whose
    dependency table misses every writer trains exactly."""
    fps = [[np.arange(0, 200), np.arange(100, 300)] for _ in range(8)]
    honest = ListPlan(fps)
    broken = ListPlan(fps, dependency=np.full_like(honest.dependency, -1))
    ref, _ = reference_train(toy_groups(300), [Phase(honest, 0)])
    run = ToyRun([Phase(broken, 0)], SyncConfig(timeout_s=20), sleep_s={1: 0.02})
    for groups, _, _, _ in run_threads(2, run):
        assert _same(groups, ref)


# ------------------------------------------------------ 2 processes over gloo
@pytest.mark.slow
def test_gloo_exact_and_no_global_barrier(tmp_path):
    """barrier == quality-first == ddp == single-process reference (bitwise, both ranks,
    with a rebind), and with disjoint footprints and a slow rank 1, rank 0 does not wait in
    quality-first but waits for rank 1 every step in barrier mode."""
    phases = _two_phases(2, seed=3)
    disjoint = ListPlan(
        [[np.arange(0, 150, 2) + t % 2, np.arange(150, 300, 2) + t % 2] for t in range(16)]
    )
    slow = {1: 0.05}
    runs = [
        ToyRun(phases, SyncConfig(mode="barrier", timeout_s=20)),
        ToyRun(phases, SyncConfig(mode="quality-first", timeout_s=20)),
        ToyRun([Phase(disjoint, 0)], SyncConfig(mode="quality-first", timeout_s=20), sleep_s=slow),
        ToyRun([Phase(disjoint, 0)], SyncConfig(mode="barrier", timeout_s=20), sleep_s=slow),
        ToyRun(phases, SyncConfig(mode="ddp", timeout_s=20)),
    ]
    codes, results, errors, _ = spawn_ranks(toy_runs_worker, 2, tmp_path, (runs,), timeout_s=90)
    assert codes == [0, 0], errors
    ref, ref_versions = reference_train(toy_groups(300), phases)
    for r in range(2):
        for i in (0, 1, 4):
            res = results[r][i]
            for g in ref:
                assert torch.equal(res["params"][g.name], g.param), (r, i, g.name)
                assert torch.equal(res["exp_avg"][g.name], g.exp_avg), (r, i, g.name)
            assert torch.equal(res["versions"], ref_versions)
            assert res["summary"]["bytes_sent"] > 0 and res["summary"]["bytes_recv"] > 0
    for i in (2, 3):
        assert torch.equal(results[0][i]["versions"], results[1][i]["versions"])
        for name, p in results[0][i]["params"].items():
            assert torch.equal(p, results[1][i]["params"][name])
    qf_wait = results[0][2]["summary"]["wait_s_total"]
    barrier_wait = results[0][3]["summary"]["wait_s_total"]
    print(f"rank 0 total wait: quality-first {qf_wait:.4f} s, barrier {barrier_wait:.4f} s")
    assert barrier_wait > 0.3  # ~16 x 50 ms of rank 1's sleep
    assert qf_wait < 0.2 * barrier_wait


@pytest.mark.slow
def test_gloo_ddp_three_ranks_close_to_barrier(tmp_path):
    """3 processes over gloo: ddp's all-reduce may sum in another order than the rank
    order, so its parameters equal barrier's up to 1e-6; replicas are identical."""
    phases = _two_phases(3, seed=4, steps=(8, 4))
    runs = [
        ToyRun(phases, SyncConfig(mode="barrier", timeout_s=30)),
        ToyRun(phases, SyncConfig(mode="ddp", timeout_s=30)),
    ]
    codes, results, errors, _ = spawn_ranks(toy_runs_worker, 3, tmp_path, (runs,), timeout_s=120)
    assert codes == [0, 0, 0], errors
    barrier, ddp = results[0]
    for name, p in barrier["params"].items():
        torch.testing.assert_close(ddp["params"][name], p, atol=1e-6, rtol=0)
    assert torch.equal(ddp["versions"], barrier["versions"])
    for r in (1, 2):
        for name, p in results[r][1]["params"].items():
            assert torch.equal(p, ddp["params"][name])


def _overlap_run(**kw) -> ToyRun:
    plan = ListPlan([[np.arange(0, 200), np.arange(100, 300)] for _ in range(12)])
    return ToyRun([Phase(plan, 0)], **kw)


@pytest.mark.slow
def test_gloo_dead_peer_fails_fast(tmp_path):
    run = _overlap_run(config=SyncConfig(timeout_s=10), die_at={1: 5})
    codes, _, errors, elapsed = spawn_ranks(toy_runs_worker, 2, tmp_path, ([run],), timeout_s=40)
    assert codes[1] == 1
    assert codes[0] not in (0, None), "rank 0 must fail, not hang or succeed"
    first_line = errors[0].splitlines()[0]
    # rank 1's sends leave on threads, and os._exit at step 5 can end them before its step-4
    # publication has left: rank 0 then fails waiting on step 4 (seen once under load)
    assert re.match(
        r"PeerFailure: rank 0: peer 1 \(step [456]\): (receive|send) failed", first_line
    )
    assert elapsed < 30


@pytest.mark.slow
def test_gloo_stuck_peer_times_out(tmp_path):
    run = _overlap_run(config=SyncConfig(timeout_s=1.0), stall_at={1: (5, 3.0)})
    codes, _, errors, elapsed = spawn_ranks(toy_runs_worker, 2, tmp_path, ([run],), timeout_s=40)
    assert codes[0] not in (0, None) and codes[1] not in (0, None)
    assert errors[0].startswith("SyncTimeout: rank 0: peer 1 (step 5): timed out after 1.0 s")
    assert errors[1].startswith("PeerFailure: rank 1: peer 0")
    assert elapsed < 30


def test_ddp_publishes_only_the_footprint_rows():
    """A gradient on a row the rank did not draw (MCMC's regularisers reach every row) is
    not part of its dense publication, so ddp sums what barrier sums."""
    plan = ListPlan([[np.array([1, 4])]])
    groups = toy_groups(6)
    before = [g.param.clone() for g in groups]
    eng = replicated_engine(groups, plan, 0, 1, SyncConfig(mode="ddp"))
    eng.before_step(0)
    grads = [torch.ones_like(g.param) for g in groups]  # every row has a gradient
    visible = torch.zeros(6, dtype=torch.bool)
    visible[[1, 4]] = True
    eng.after_backward(0, grads, visible)
    eng.drain()
    others = torch.tensor([0, 2, 3, 5])
    for g, p in zip(groups, before, strict=True):
        assert torch.equal(g.param[others], p[others]) and not g.exp_avg[others].any()
        assert not torch.equal(g.param[[1, 4]], p[[1, 4]])


def test_a_log_refuses_tables_moved_to_another_device():
    """A step's lists go to the parameters' device with its tables (one copy); a log whose
    parameters are elsewhere refuses them when it records the step, naming both."""
    n, steps, world = 90, 3, 2
    plan = ListPlan(random_footprints(n, steps, world, seed=3))
    tables = step_rows(plan, replicated_layout(n, 0), world, device="meta")
    writes = PhaseSteps(tables, steps)
    rows = writes[0].writes
    assert rows.ids_data.device.type == "meta" and rows.ids_data.shape == rows.ids.shape
    assert [p.shape for p in rows.positions_data] == [p.shape for p in rows.positions]
    log = UpdateLog(toy_groups(n), writes, world, 0, torch.full((n,), -1))
    with pytest.raises(ValueError, match="moved to meta, the parameters are on cpu"):
        log.record(0)


def test_gloo_transport_copies_a_device_publication_to_the_host_once():
    """The engine sends one packed publication to each of its owners in turn; over gloo a
    device buffer is copied to the host once for all of them (not once per peer), a new
    buffer again; host buffers go as they are."""
    from types import SimpleNamespace

    from odin_ns.runtime.transport import P2PTransport

    class DeviceBuffer:  # stands in for a CUDA tensor (no GPU here)
        device = torch.device("cuda")

        def __init__(self):
            self.copies = 0

        def cpu(self):
            self.copies += 1
            return torch.zeros(2, 3)

    transport = SimpleNamespace(_last_copy=None)
    first, second = DeviceBuffer(), DeviceBuffer()
    host = [P2PTransport._host(transport, first) for _ in range(3)]
    assert first.copies == 1 and all(h is host[0] for h in host)
    assert P2PTransport._host(transport, second) is not host[0] and second.copies == 1
    cpu = torch.ones(4)
    assert P2PTransport._host(transport, cpu) is cpu
