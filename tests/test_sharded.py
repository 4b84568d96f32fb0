"""Sharded mode (--pipeline.parallel sharded): owners hold rows and moments, readers cache.

Real runs (gloo, street scene, across densifications; the session's shared 2- and 3-rank
runs of tests/harness/street_runs.py): the merged checkpoint of sharded quality-first
training equals replicated barrier training's checkpoint bitwise (parameters
and Adam moments), each rank owns at most 1.1 N/R rows, the 2-rank sharded checkpoint
evaluates in single-process ns-eval, and the 3-rank one gives the replicated run's ns-eval
PSNR and exports one PLY with every Gaussian (what ns-eval and ns-export run, in this
process). Sharded runs feed the sync panels and odin_run.json as replicated runs do.
Evaluation during training runs in the 2-rank runs and the live viewer in the sharded one:
the sharded run's evaluation metrics (rank 0 renders its gathered copy of the model) equal
the replicated run's at every evaluation step, and the viewer's copy is refreshed whole at
every phase start. Unit tests: the per-rank step tables agree pairwise
(every push / gradient message one rank sends is a receive its peer posts, same order,
same size), and bad input fails with one line before any rank starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from harness import assert_same_ids
from harness.runs import ns_eval_in_process, ns_export_splat_in_process, preflight_last_line

from odin_ns.cuda import ops
from odin_ns.runtime.layout import EVERY_RANK, ShardLayout, cache_of, phase_read_sets
from odin_ns.runtime.step_kernels import (
    StepKernels,
    first_lacking_reference,
    lacking_rows_reference,
    step_record_reference,
)
from odin_ns.runtime.step_tables import owner_rows_reference, reader_rows_reference, step_tables
from odin_ns.runtime.update_log import VersionTest
from odin_ns.schedule import build_plan
from odin_ns.schedule.ownership import random_ownership


def _checkpoint(run: Path) -> dict:
    path = sorted((run / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def runs(street_runs_2, street_runs_3):
    """The session's shared runs (tests/harness/street_runs.py) by (ranks, mode)."""
    return {
        (2, "replicated"): street_runs_2["barrier"],
        (2, "sharded"): street_runs_2["sharded"],  # with evaluation and the live viewer
        (2, "sharded-tf"): street_runs_2["sharded-tf"],  # tau 0
        (2, "sharded-barrier"): street_runs_2["sharded-barrier"],  # per-step delays
        (2, "sharded-jitter"): street_runs_2["sharded-jitter"],  # quality-first, same delays
        (3, "replicated"): street_runs_3["barrier"],
        (3, "sharded"): street_runs_3["sharded"],  # random owners, credits of one message
    }


@pytest.mark.slow
def test_credits_bound_inflight_bytes(runs):
    """With max_inflight_bytes 1 (the 3-rank run; its checkpoint is replicated barrier's
    bitwise, below), a rank has at most one message in flight to a peer on a stream."""
    # Whether the cap binds in this lockstep run depends on timing; tests/test_sharded_credits.py
    # makes both paths bind.
    summary = json.loads((runs[3, "sharded"] / "odin_run.json").read_text())
    steps = [s for r in summary["ranks"] for s in r["steps"]]
    # in flight to one peer on one stream: at most one message, never more than a step sent
    assert max(s["inflight_bytes_max"] for s in steps) <= max(s["bytes_sent"] for s in steps)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_checkpoint_equals_replicated_barrier(runs, ranks):
    rep, shard = _checkpoint(runs[ranks, "replicated"]), _checkpoint(runs[ranks, "sharded"])
    assert rep["step"] == shard["step"]
    keys = [k for k in rep["pipeline"] if "gauss_params" in k]
    assert len(keys) == 6
    for key in keys:
        assert torch.equal(shard["pipeline"][key], rep["pipeline"][key]), key  # bitwise
    for name, opt in rep["optimizers"].items():
        if opt["state"]:
            for moment in ("exp_avg", "exp_avg_sq"):
                a, b = opt["state"][0][moment], shard["optimizers"][name]["state"][0][moment]
                assert torch.equal(a, b), (name, moment)

    summary = json.loads((runs[ranks, "sharded"] / "odin_run.json").read_text())
    counts = {p["num_gaussians"] for p in summary["ranks"][0]["phases"]}
    assert len(counts) > 1, counts  # crossed a densification
    # a step's record carries the waits of its structural change's drain and rendezvous, and
    # no other step's does (a phase start's drain is in the phase's record)
    changed = {c["step"] for c in summary["ranks"][0]["structural_changes"]}
    for r in summary["ranks"]:
        assert all(s["drain_wait_s"] >= 0.0 for s in r["steps"])
        assert all(s["drain_wait_s"] == 0.0 for s in r["steps"] if s["step"] not in changed)
    n = rep["pipeline"]["_model.gauss_params.means"].shape[0]
    owned = [r["owned_rows"] for r in summary["ranks"]]
    assert sum(owned) == n
    assert max(owned) <= 1.1 * n / ranks, owned
    for report in summary["ranks"][0]["ownership"]:  # every phase start
        assert report["owned_rows_max_over_fair"] <= 1.1, report
    for r in summary["ranks"]:
        assert r["resident_rows"] < n  # owned + cache, not the whole model

    # Footprint reuse: the same rows recomputed at every phase start in both modes, and
    # after a densification some rows carried their (or their parent's) footprint.
    replicated = json.loads((runs[ranks, "replicated"] / "odin_run.json").read_text())
    computed = {
        mode: [(p["num_gaussians"], p["footprint_rows_computed"]) for p in s["ranks"][0]["phases"]]
        for mode, s in (("replicated", replicated), ("sharded", summary))
    }
    assert computed["sharded"] == computed["replicated"], computed
    assert any(0 < c < n_rows for n_rows, c in computed["sharded"][1:]), computed


def _compute_starts_and_ends(run: Path) -> tuple[list[dict], list[dict], set[int]]:
    """Per rank, step -> when its compute began (the step's start plus its wait) and when
    the step ended; and the steps to leave out: phase starts (their collectives and the
    phase start's own time precede the compute) and steps after a structural change."""
    summary = json.loads((run / "odin_run.json").read_text())
    starts = [{s["step"]: s["start"] + s["wait_s"] for s in r["steps"]} for r in summary["ranks"]]
    ends = [{s["step"]: s["end"] for s in r["steps"]} for r in summary["ranks"]]
    rank0 = summary["ranks"][0]
    skip = {p["start_step"] for p in rank0["phases"]}
    skip |= {c["step"] + 1 for c in rank0["structural_changes"]}
    return starts, ends, skip


@pytest.mark.slow
def test_sharded_barrier_is_a_barrier(runs):
    """Sharded barrier under per-step compute delays (mean 80 ms per rank and step, the
    same in both runs): its checkpoint is replicated barrier's bitwise, and no rank began
    computing step t before its peer had ended step t - 1. Sharded quality-first under the
    same delays does: a rank runs ahead where its reads do not depend on the slower peer.
    Slack for the barrier: 100 ms, and two steps of 70 past it (a peer records a step's end
    after it signalled it, and can be descheduled in between: seen at 112 and 290 ms)."""
    rep, barrier = _checkpoint(runs[2, "replicated"]), _checkpoint(runs[2, "sharded-barrier"])
    keys = [k for k in rep["pipeline"] if "gauss_params" in k]
    for key in keys:
        assert torch.equal(barrier["pipeline"][key], rep["pipeline"][key]), key
    summary = json.loads((runs[2, "sharded-barrier"] / "odin_run.json").read_text())
    assert summary["ranks"][0]["engine"]["mode"] == "barrier"

    def lead_s(mode: str) -> list[float]:
        """Per (rank, step t): how long before its peer ended t - 1 the rank began t."""
        starts, ends, skip = _compute_starts_and_ends(runs[2, mode])
        return [
            ends[1 - r][t - 1] - start
            for r in (0, 1)
            for t, start in starts[r].items()
            if t > 0 and t not in skip and t - 1 in ends[1 - r]
        ]

    barrier_leads, qf_leads = lead_s("sharded-barrier"), lead_s("sharded-jitter")
    assert len(barrier_leads) >= 40, len(barrier_leads)
    # The count tells them apart, not the largest lead: a rank descheduled between its signal
    # and its step's end record (4 ranks and the test share 2 cores) makes one lead of any
    # size. Quality-first leads by 0.3-0.7 s on about 14 of 70 steps.
    late = [lead for lead in barrier_leads if lead >= 0.1]
    assert len(late) <= 2, sorted(barrier_leads)[-5:]
    assert sum(lead >= 0.15 for lead in qf_leads) >= 5, sorted(qf_leads)[-8:]


@pytest.mark.slow
def test_sharded_throughput_first_tau_zero_equals_replicated_barrier(runs):
    """Throughput-first in sharded mode (pushes carry the rows' evidence, every pending
    source is decided) with tau = 0: bitwise replicated barrier's checkpoint."""
    rep, shard = _checkpoint(runs[2, "replicated"]), _checkpoint(runs[2, "sharded-tf"])
    keys = [k for k in rep["pipeline"] if "gauss_params" in k]
    for key in keys:
        assert torch.equal(shard["pipeline"][key], rep["pipeline"][key]), key
    summary = json.loads((runs[2, "sharded-tf"] / "odin_run.json").read_text())
    for r in summary["ranks"]:
        engine = r["engine"]
        assert engine["mode"] == "throughput-first" and engine["admitted"] == 0, engine
        assert engine["phases"] == len(r["phases"]) and engine["steps"] == len(r["steps"])
        assert engine["decisions"] == sum(engine["fallbacks"].values())
        # merged over the phases: at tau 0 the rule (the default, impact) refused every
        # decision that got as far as it; the other rule's reasons never came up
        assert engine["admission"] == "impact" and engine["stale_gradients"] == "apply"
        fallbacks = engine["fallbacks"]
        assert fallbacks["overlap"] == fallbacks["evidence"] == 0, fallbacks
        assert (
            fallbacks["impact"] + fallbacks["staleness"] + fallbacks["phase"] == engine["decisions"]
        )


@pytest.mark.slow
def test_locality_ownership_sends_less_than_replicated(runs):
    def bytes_per_step(run):
        ranks = json.loads((run / "odin_run.json").read_text())["ranks"]
        return max(sum(s["bytes_sent"] for s in r["steps"]) / len(r["steps"]) for r in ranks)

    assert bytes_per_step(runs[2, "sharded"]) < 0.1 * bytes_per_step(runs[2, "replicated"])


def _eval_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's tensorboard scalars of evaluation during training: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("Eval")]
    timings = ("rays", "fps", "time")  # how fast, not what was rendered
    tags = [t for t in tags if not any(word in t.lower() for word in timings)]
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags}


@pytest.mark.slow
def test_evaluation_during_sharded_training_equals_replicated(runs):
    """Rank 0 evaluates its gathered copy of the sharded model: the same metrics as
    replicated barrier training at every evaluation step (the parameters are the same)."""
    rep, shard = _eval_scalars(runs[2, "replicated"]), _eval_scalars(runs[2, "sharded"])
    psnr = "Eval Images Metrics Dict (all images)/psnr"
    assert psnr in shard and len(shard[psnr]) >= 2, sorted(shard)
    assert shard.keys() == rep.keys()
    for tag, values in rep.items():
        assert shard[tag] == values, tag


@pytest.mark.slow
def test_live_viewer_copy_is_whole_at_every_phase_start(runs):
    summary = json.loads((runs[2, "sharded"] / "odin_run.json").read_text())
    phases = summary["ranks"][0]["phases"]
    assert len(phases) >= 3
    for p in phases:
        assert p["eval_copy_rows"] == p["num_gaussians"], p
    assert all(p["eval_copy_rows"] is None for p in summary["ranks"][1]["phases"])


@pytest.mark.slow
def test_sharded_runs_feed_the_sync_panels(runs):
    """A sharded run logs what a replicated one does (the step fields the panels, bench.sync
    and bench.trace read), and rank 0's live panels had a snapshot of both ranks at the end;
    ns-viewer's snapshot of the saved run shows the same ranks and plan."""
    from odin_ns.viewer_ext.snapshot import snapshot_from_run

    summary = json.loads((runs[2, "sharded"] / "odin_run.json").read_text())
    assert (summary["sync"], summary["parallel"], summary["world_size"]) == (
        "quality-first",
        "sharded",
        2,
    )
    assert summary["mean_dependency_rows_per_step"] is not None
    for rank in summary["ranks"]:
        steps = rank["steps"]
        assert steps and all(
            {"view", "dependency_rows", "visible_rows", "pixels", "bytes_sent"} <= set(s)
            for s in steps
        )
        assert all(0 < s["visible_rows"] <= s["footprint_rows"] for s in steps)
        # per rank, the latest step of theirs the read set depends on (for a replay)
        assert all(len(s["depends_on"]) == 2 and s["depends_on"][rank["rank"]] == -1 for s in steps)
        assert all(-1 <= d < s["step"] for s in steps for d in s["depends_on"])
        assert any(d >= 0 for s in steps for d in s["depends_on"])
        assert rank["structural_changes"]  # the refines, with the Gaussians before / after
    live = summary["live_snapshot"]  # the panels' last snapshot: the whole end
    assert [r["rank"] for r in live["ranks"]] == [0, 1]
    assert live["step"] == max(s["step"] for s in summary["ranks"][0]["steps"])
    assert live["plan"]["num_gaussians"] == summary["ranks"][0]["phases"][-1]["num_gaussians"]
    saved = snapshot_from_run(summary)
    assert [r["rank"] for r in saved["ranks"]] == [0, 1] and "plan" in saved
    assert all(len(r["bytes_sent"]) == len(r["steps"]) for r in saved["ranks"])

    tf = json.loads((runs[2, "sharded-tf"] / "odin_run.json").read_text())
    fallbacks = snapshot_from_run(tf)["fallbacks"]  # tau 0: every pending source waited
    assert sum(fallbacks.values()) == sum(r["engine"]["decisions"] for r in tf["ranks"]) > 0


@pytest.mark.slow
def test_model_renders_its_eval_copy_when_not_training(runs):
    """The sharded checkpoint's model, its table cut to 7 rows and the whole model as
    ``eval_copy``: evaluation renders the copy (the whole model's image), training the
    table."""
    import yaml

    run = runs[2, "sharded"]
    config = yaml.load((run / "config.yml").read_text(), Loader=yaml.Loader)
    config.pipeline.datamanager.data = config.data or config.pipeline.datamanager.data
    pipeline = config.pipeline.setup(device="cpu", test_mode="test")
    state = _checkpoint(run)
    pipeline.load_pipeline(state["pipeline"], state["step"])
    model = pipeline.model
    camera = pipeline.datamanager.eval_dataset.cameras[0:1]
    model.eval()
    with torch.no_grad():
        whole = model.get_outputs_for_camera(camera)["rgb"]
        model.eval_copy = {n: p.detach().clone() for n, p in model.gauss_params.items()}
        for param in model.gauss_params.values():
            param.data = param.data[:7].clone()
        copied = model.get_outputs_for_camera(camera)["rgb"]
        model.eval_copy = None
        table = model.get_outputs_for_camera(camera)["rgb"]
    assert torch.equal(copied, whole)
    assert not torch.equal(table, whole)


@pytest.mark.slow
def test_sharded_checkpoint_evaluates_in_single_process(runs, tmp_path):
    assert _ns_eval_psnr(runs[2, "sharded"], tmp_path / "eval.json") > 10.0


def _ns_eval_psnr(run: Path, out: Path) -> float:
    return float(ns_eval_in_process(run / "config.yml", out)["psnr"])


@pytest.mark.slow
def test_3_rank_sharded_checkpoint_evaluates_and_exports_as_one_model(runs, tmp_path):
    """The 3-rank sharded checkpoint in single-process tools: ns-eval gives the replicated
    run's PSNR (the parameters are bitwise equal), and ns-export writes one PLY with every
    Gaussian."""
    sharded, replicated = runs[3, "sharded"], runs[3, "replicated"]
    psnr = _ns_eval_psnr(sharded, tmp_path / "sharded.json")
    assert psnr == _ns_eval_psnr(replicated, tmp_path / "replicated.json") and psnr > 10.0
    means = _checkpoint(sharded)["pipeline"]["_model.gauss_params.means"]
    assert torch.isfinite(means).all()
    ns_export_splat_in_process(sharded / "config.yml", tmp_path / "ply")
    plys = list((tmp_path / "ply").glob("*.ply"))
    assert len(plys) == 1
    header = plys[0].read_bytes().split(b"end_header")[0].decode()
    assert f"element vertex {means.shape[0]}" in header, header


def _toy_plan(ranks: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    F = sp.random(12, 300, density=0.2, format="csr", random_state=seed, dtype=bool)
    F.data[:] = True
    return build_plan(F, ranks, 9, seed=int(rng.integers(100)), strategy="random")


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_step_tables_agree_pairwise(ranks):
    """What owner o pushes to reader r is, in order and size, what r expects from o; every
    gradient message r sends o at step t is a writer part o expects at t."""
    plan = _toy_plan(ranks)
    owner = random_ownership(plan.footprints.shape[1], ranks, seed=1)
    reads = phase_read_sets(plan, ranks)
    layouts = [ShardLayout(owner, q, cache_of(owner, q, reads[q])) for q in range(ranks)]
    tables = [step_tables(plan, layouts[q], ranks) for q in range(ranks)]
    for o in range(ranks):
        for r in range(ranks):
            if o == r:
                continue
            out, inn = tables[o][1][r], tables[r][2][o]
            assert [(p.ready, p.step, p.rows.size) for p in out] == [
                (p.ready, p.step, p.rows.size) for p in inn
            ]
            for p_out, p_in in zip(out, inn, strict=True):  # same global rows, same order
                assert np.array_equal(layouts[o].gids[p_out.rows], layouts[r].gids[p_in.rows])
                assert p_out.ready < p_out.step
            for t in range(plan.num_steps):
                sent = tables[r][0][t].grad_out.get(o)
                expected = tables[o][0][t].writes.positions[r]  # (no rows: nothing sent)
                expected = expected.numpy() if expected.numel() else None
                assert (sent is None) == (expected is None)
                if sent is not None:
                    assert sent.size == expected.size
    # every non-owned read with an earlier write in the phase is pushed exactly once
    for r in range(ranks):
        steps = tables[r][0]
        last = np.full(owner.size, -1)
        for t in range(plan.num_steps):
            mine = plan.step_footprint(t, r)
            need = mine[(owner[mine] != r) & (last[mine] >= 0)]
            pushed = np.concatenate(
                [layouts[r].gids[p.rows] for p in steps[t].pushes_in] or [need[:0]]
            )
            assert np.array_equal(np.sort(pushed), need)
            last[np.unique(np.concatenate([plan.step_footprint(t, q) for q in range(ranks)]))] = t


def _version_kernels(kind: str) -> StepKernels:
    """A version test's host kernels ("kernel"; skips where the CPU library is not built) or
    their twins."""
    if kind == "twin":
        return StepKernels()
    if ops.host_op("first_lacking") is None:
        pytest.skip("the CPU library is not built (python -m odin_ns.cuda build)")
    return StepKernels.resolve()


@pytest.mark.parametrize("kind", ["kernel", "twin"])
@pytest.mark.parametrize("rows", [1, 2, 70, 700])
def test_version_test_finds_every_lacking_row(rows, kind):
    """``VersionTest.current`` reads on from the first row not yet seen current (the host
    kernel ``first_lacking`` or its twin): whichever row alone still lacks its step, and
    wherever the last test stopped, it answers as the whole test does (``not
    lacking(versions, through).any()``); a row whose step is at or below ``through`` (the
    update log's ``applied_through``) has it whatever its version says; and it answers so
    while versions and ``through`` grow in random order, naming a row that still lacks its
    step (``waiting_on``) whenever it refuses."""
    kernels = _version_kernels(kind)
    rng = np.random.default_rng(rows)
    owned = 3 * rows
    test_rows = np.sort(rng.choice(owned, rows, replace=False))
    need = rng.integers(0, 20, rows)
    have = np.full(owned, 99, dtype=np.int64)  # every row current
    none = -1  # no step is applied through the log's prefix
    for start in sorted({0, rows // 3, rows - 1}):
        for lacking in range(start, rows):
            test = VersionTest(test_rows, need, kernels)
            versions = have.copy()
            versions[test_rows[start]] = -1  # the last test stopped at row `start`
            assert not test.current(versions, none)
            versions[test_rows[start]] = 99
            versions[test_rows[lacking]] = need[lacking] - 1
            assert not test.current(versions, none)
            assert test.current(versions, need[lacking])  # its step applied through the prefix
            versions[test_rows[lacking]] = need[lacking]
            assert test.current(versions, none)
    test, versions = VersionTest(test_rows, need, kernels), np.full(owned, -1, dtype=np.int64)
    answers, through = [], none
    while not answers or not answers[-1]:
        raised = rng.choice(owned, max(1, owned // 50), replace=False)
        versions[raised] = np.maximum(versions[raised], rng.integers(0, 20, raised.size))
        through += int(rng.integers(0, 2))  # the prefix of applied steps grows now and then
        answers.append(test.current(versions, through))
        assert answers[-1] == (test.lacking(versions, through).size == 0)
        if not answers[-1]:  # what it waits on (``_flush_pushes``' pre-filter) still lacks
            row, step = test.waiting_on()
            assert row in test_rows and versions[row] < step and step > through
    assert len(answers) > 1 and test.current(versions, through)  # once current, current
    assert test.waiting_on()[1] == np.iinfo(np.int64).min  # nothing: any version passes
    # every step the rows need at or before ``through`` (the steady state): current without
    # a row read, whatever the versions say, wherever an earlier question stopped
    test = VersionTest(test_rows, need, kernels)
    assert not test.current(np.full(owned, -1, dtype=np.int64), int(need.max()) - 1)
    assert test.current(np.full(owned, -1, dtype=np.int64), int(need.max()))
    assert test.waiting_on()[1] == np.iinfo(np.int64).min


def test_version_test_kernels_equal_their_twins_and_refuse_bad_input():
    """The host kernels ``first_lacking`` (the first row of a version test that lacks its
    step, from a start) and ``lacking_rows`` (every such row's position) return their twins'
    answers on random tests from every start and prefix of applied steps, and the first of
    ``lacking_rows`` is ``first_lacking``; both refuse rows outside the versions and a start
    outside [0, K] with one line (ValueError) before they read on, and ``first_lacking``
    int32 input."""
    kernels = _version_kernels("kernel")
    first_lacking, lacking_rows = kernels.first_lacking, kernels.lacking_rows
    rng = np.random.default_rng(5)
    versions = torch.from_numpy(rng.integers(-1, 30, 400))
    for k in (0, 1, 9, 300):
        rows = torch.from_numpy(np.sort(rng.choice(400, k, replace=False)))
        need = torch.from_numpy(rng.integers(-1, 12, k))
        for through in (-1, 4, 11):
            for start in range(k + 1):
                args = versions, rows, need, start, through
                first = first_lacking_reference(*args)
                assert first_lacking(*args) == first
                got = lacking_rows(*args)
                assert got.dtype == torch.int64 and torch.equal(got, lacking_rows_reference(*args))
                assert (int(got[0]) if got.numel() else k) == first
    rows, need = torch.tensor([3, 400]), torch.tensor([-5, 0])
    for kernel in (first_lacking, lacking_rows):
        with pytest.raises(ValueError, match="rows out of range"):
            kernel(versions, rows, need, 0, 99)  # checked even where no version is read
        with pytest.raises(ValueError, match="start 3 outside"):
            kernel(versions, rows, need, 3, -1)
    with pytest.raises(ValueError, match="rows out of range: 400"):
        first_lacking(versions, rows, need, 0, 99)
    with pytest.raises(ValueError, match="must be torch.int64"):
        first_lacking(versions.int(), rows, need, 0, -1)


def _table_kernels():
    """The host kernels ``owner_rows`` and ``reader_rows`` (skips where the CPU library is not
    built)."""
    kernels = ops.host_op("owner_rows"), ops.host_op("reader_rows")
    if None in kernels:
        pytest.skip("the CPU library is not built (python -m odin_ns.cuda build)")
    return kernels


def test_step_table_kernels_equal_their_twins_and_refuse_bad_input(monkeypatch):
    """The host kernels ``owner_rows`` and ``reader_rows`` return their twins' lists on
    random steps of random ownership maps (single owners, rows every rank owns, a rank that
    reads nothing, rows written before or not), so a phase's tables made with them equal the
    tables made with the twins; they refuse an owner entry that is not a rank, a read the
    local table lacks, positions or ids out of range and int64 maps with one line
    (ValueError)."""
    as_owner, as_reader = _table_kernels()
    rng = np.random.default_rng(11)
    for trial in range(12):
        ranks, n = int(rng.integers(2, 6)), int(rng.integers(1, 300))
        owner = rng.integers(0, ranks, n)
        owner[rng.random(n) < (0.0, 0.3, 1.0)[trial % 3]] = EVERY_RANK
        reads = [np.sort(rng.choice(n, int(rng.integers(0, n + 1)), replace=False))
                 for _ in range(ranks)]  # fmt: skip
        reads[trial % ranks] = reads[trial % ranks][: trial % 2]  # a rank reading little
        last = torch.from_numpy(rng.integers(-1, 3, n))
        ids, positions, prev = step_record_reference([torch.from_numpy(r) for r in reads], last, 3)
        maps = torch.from_numpy(owner.astype(np.int32))
        for me in range(ranks):
            layout = ShardLayout(owner, me, cache_of(owner, me, reads[me]))
            local_of = torch.from_numpy(layout.local_of.astype(np.int32))
            args = (ids, positions, prev, maps, local_of, me)
            assert_same_ids(as_owner(*args), owner_rows_reference(*args))
            args = (ids, positions[me], prev, maps, local_of, me, ranks)
            assert_same_ids(as_reader(*args), reader_rows_reference(*args))
    plan = _toy_plan(3)
    owner = random_ownership(plan.footprints.shape[1], 3, seed=2)
    owner[::5] = EVERY_RANK
    layout = ShardLayout(owner, 1, cache_of(owner, 1, phase_read_sets(plan, 3)[1]))
    made = step_tables(plan, layout, 3)
    # each step cut on a thread of its own while the next step's record is made: the same
    assert repr(step_tables(plan, layout, 3, aside=True)) == repr(made)
    monkeypatch.setattr(ops, "host_op", lambda name: None)  # every host kernel's twin
    assert repr(step_tables(plan, layout, 3)) == repr(made)
    # refusals: one line, whichever pass meets the bad value
    ids, prev = torch.tensor([0, 2]), torch.tensor([-1, 0])
    maps, local_of = torch.tensor([0, 1, 0], dtype=torch.int32), torch.tensor([0, -1, 1]).int()
    with pytest.raises(ValueError, match="row 2 has owner 5, not a rank in"):
        as_owner(ids, [ids[:0], ids[:0]], prev, torch.tensor([0, 1, 5]).int(), local_of, 0)
    with pytest.raises(ValueError, match="rank 0 reads row 1, which its local table"):
        as_reader(torch.tensor([1]), torch.tensor([0]), prev[:1], maps, local_of, 0, 2)
    with pytest.raises(ValueError, match="positions out of range: 2"):
        as_owner(ids, [torch.tensor([0, 2]), ids[:0]], prev, maps, local_of, 0)
    with pytest.raises(ValueError, match="ids out of range: 3"):
        as_reader(torch.tensor([3]), torch.tensor([0]), prev[:1], maps, local_of, 0, 2)
    with pytest.raises(ValueError, match="owner must be torch.int32"):
        as_owner(ids, [ids[:0], ids[:0]], prev, maps.long(), local_of, 0)


@pytest.mark.parametrize(
    ("ranks", "extra", "needle"),
    [
        (1, [], "needs at least 2 ranks"),
        (2, ["--pipeline.model.camera-optimizer.mode", "SO3xR3"], "dense parameters"),
        (2, ["--pipeline.model.use-bilateral-grid", "True"], "dense parameters"),
        (2, ["--pipeline.eval-copy-max-rows", "-1"], "eval-copy-max-rows must be >= 0"),
        (2, ["--pipeline.sync.mode", "ddp"], "is a replicated baseline"),
        (2, ["--mixed-precision", "True"], "--mixed-precision True is for one process"),
    ],
)
def test_bad_input_is_one_line_before_training(street_scene, tmp_path, ranks, extra, needle):
    args = ["--nproc-per-node", str(ranks), "odin-splatfacto", "--data", str(street_scene)]
    args += ["--vis", "tensorboard", "--pipeline.parallel", "sharded"]
    args += ["--steps-per-eval-image", "0", "--steps-per-eval-batch", "0"]
    args += ["--steps-per-eval-all-images", "0", *extra]
    code, last = preflight_last_line(args, tmp_path / "out")
    assert code != 0
    assert last.startswith("odin-ns-train: error:") and needle in last, last
    assert not (tmp_path / "out").exists()  # nothing started
