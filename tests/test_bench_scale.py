"""Benchmark-side scale evidence: simulator on hand-made plans, trace fit, repeat order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from odin_ns.bench.allreduce import AllReduceSample, calibration_record, fit_ring
from odin_ns.bench.scale import allreduce_calibration, predict_round
from odin_ns.bench.simulate import (
    PUBLICATION_ROW_BYTES,
    Network,
    Phase,
    Replicated,
    Sharded,
    StepPlan,
    lagged_overlaps,
    replay,
    ring_allreduce_seconds,
    tf_needs,
    trace_admissions,
)
from odin_ns.bench.sync import (
    CONTROL,
    IMPACT,
    TRAIN_MODE,
    aggregate_rounds,
    pair_ratios,
    rotated_orders,
    round_psnrs,
    runs_to_evaluate,
    seed_control_figures,
)
from odin_ns.bench.trace import critical_path_wait, fit_cost_model, fit_jitter, replay_run

FAST = Network("ideal", 0.5, 1e30)  # 0.5 s latency, no bandwidth cost


def two_rank_plan() -> StepPlan:
    # views: 0 = {0, 1}, 1 = {2, 3}, 2 = {1, 2}, 3 = {0}; step 0: (0, 1), step 1: (3, 2)
    F = sp.csr_matrix(
        np.array([[1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 1, 0], [1, 0, 0, 0]], dtype=bool)
    )
    return StepPlan.from_views(F, np.array([[[0], [1]], [[3], [2]]]))


def phase(plan: StepPlan, compute, overhead=0.0, start=0.0) -> Phase:
    compute = np.asarray(compute, dtype=np.float64)
    return Phase(plan, compute, np.full_like(compute, overhead), num_rows=4, phase_start_s=start)


def test_replay_by_hand_every_mode():
    plan = two_rank_plan()
    # rank 1's step 1 (view 2 = {1, 2}) reads what rank 0 wrote at step 0 ({0, 1}) and
    # its own; rank 0's step 1 (view 3 = {0}) needs nobody else's step 0 ({2, 3}).
    assert plan.dependency[1, 1, 0] == 0 and plan.dependency[1, 0, 1] == -1
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])
    bar = replay([ph], "barrier", FAST)
    # step 1 starts at max(1, 3) + 0.5 = 3.5, ends 4.5; its publications arrive at 5.0
    assert bar.total_time == pytest.approx(5.0)
    np.testing.assert_allclose(bar.wait_per_rank, [2.5 + 0.5, 0.5 + 0.5])  # + drain
    # the run ends 1 s after the busiest rank's 4 s of compute; rank 0's idle beside a
    # busier rank 1 is not wait that lengthened the run
    assert bar.critical_path_wait == pytest.approx(1.0)
    qf = replay([ph], "quality-first", FAST)
    # rank 0: 1..2 (nobody needed); rank 1: needs rank 0's step 0 (1.5) -> 3..4; drain 4.5
    assert qf.total_time == pytest.approx(4.5)
    # rank 0 idles 2.5 s in the drain, beside rank 1's compute; rank 1 only 0.5 s there
    np.testing.assert_allclose(qf.wait_per_rank, [2.5, 0.5])
    assert qf.critical_path_wait == pytest.approx(0.5)
    ddp = replay([ph], "ddp", FAST)
    # all-reduce on 2 ranks: 2 messages of 0.5 s latency = 1 s; 3 + 1 = 4 -> 5; + 1 = 6
    assert ring_allreduce_seconds(944.0, 2, FAST) == pytest.approx(1.0)
    assert ddp.total_time == pytest.approx(6.0)
    assert ddp.views == 4 and bar.views == 4
    # phase starts and overheads add up: two phases, 0.25 s start each, 0.1 s overhead
    two = replay([phase(plan, [[1.0, 3.0], [1.0, 1.0]], 0.1, 0.25)] * 2, "quality-first", FAST)
    one = replay([phase(plan, [[1.0, 3.0], [1.0, 1.0]], 0.1, 0.25)], "quality-first", FAST)
    assert two.total_time == pytest.approx(2 * one.total_time)


def test_bandwidth_and_ownership_traffic():
    plan = two_rank_plan()
    traffic = Replicated().traffic(plan, 10.0)  # [T, sender, receiver] bytes
    np.testing.assert_allclose(traffic[0], [[0, 20], [20, 0]])
    np.testing.assert_allclose(traffic[1], [[0, 10], [20, 0]])
    slow = Network("slow", 0.0, 10.0)  # 10 bytes/s: a 20-byte publication takes 2 s
    bar = replay([phase(plan, [[1.0, 1.0], [1.0, 1.0]])], "barrier", slow, row_bytes=10.0)
    # step 0 ends at 1, publications arrive at 3; step 1 3..4; arrivals max(egress, ingress)
    # = 2 s -> 6
    assert bar.total_time == pytest.approx(6.0)
    assert bar.bytes_per_rank_per_step == pytest.approx(70 / 4)


def test_throughput_first_admits_small_overlaps_only():
    # 2 ranks, 3 steps; rank 1 at step 2 overlaps rank 0's step 1 in 1 row of 10 (10%)
    rows = [set(range(0, 10)), set(range(10, 20)), set(range(20, 30)), set(range(30, 40))]
    rows += [set(range(9, 19)) | {29}, set(range(40, 50))]
    dense = np.zeros((6, 60), dtype=bool)
    for v, r in enumerate(rows):
        dense[v, sorted(r)] = True
    F = sp.csr_matrix(dense)
    views = np.array([[[0], [1]], [[2], [3]], [[5], [4]]])  # step 2 rank 1: view 4
    plan = StepPlan.from_views(F, views)
    ov = lagged_overlaps(plan, 2)
    assert ov[2, 1, 0, 1] == 1  # view 4 ∩ view 2 = {29}
    assert ov[2, 1, 0, 2] == 1 and ov[2, 1, 1, 2] == 9  # view 4 ∩ views 0 / 1
    need, admitted = tf_needs(plan, tau=0.2, window=4)
    assert plan.dependency[2, 1, 0] == 1
    # rank 0's step 1 (1 of 10 rows) and step 0 (1 of 10) are both admitted
    assert need[2, 1, 0] == -1 and admitted == 2
    need, admitted = tf_needs(plan, tau=0.05, window=4)  # 10% > tau: wait for step 1
    assert need[2, 1, 0] == 1 and admitted == 0
    need, _ = tf_needs(plan, tau=0.2, window=4, evidence=0.5)  # evidence too strong
    assert need[2, 1, 0] == 1
    # a measured run's admissions replayed: only step 1 of rank 0 was read around
    recorded = trace_admissions(np.array([[12, 1, 0, 11], [12, 1, 0, 99]]), np.arange(10, 13))
    assert recorded == {(2, 1, 0, 1)}  # global steps 10..12 are local 0..2; 99 is elsewhere
    need, admitted = tf_needs(plan, tau=0.2, window=4, recorded=recorded)
    assert need[2, 1, 0] == 0 and admitted == 1
    need, admitted = tf_needs(plan, tau=0.2, window=4, recorded=set())  # none: quality-first
    assert (need == plan.dependency).all() and admitted == 0
    compute = np.array([[1.0, 1.0], [3.0, 1.0], [1.0, 1.0]])
    qf = replay([Phase(plan, compute, np.zeros_like(compute), 60)], "quality-first", FAST)
    tf = replay([Phase(plan, compute, np.zeros_like(compute), 60)], "throughput-first", FAST)
    assert tf.total_time <= qf.total_time and tf.admitted_reads == 2


def test_trace_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    rows = rng.integers(1000, 20000, 400).astype(float)
    pixels = rng.choice([160 * 96, 320 * 192], 400).astype(float)
    truth = 2e-3 + 3e-6 * rows + 1e-7 * pixels
    noise = rng.lognormal(0.0, 0.05, 400)
    model = fit_cost_model(rows, pixels, truth * noise)
    assert model.per_row == pytest.approx(3e-6, rel=0.05)
    assert model.per_pixel == pytest.approx(1e-7, rel=0.1)
    assert model.r2 > 0.95 and model.median_rel_error < 0.06
    jitter = fit_jitter(model, rows, pixels, truth * noise)
    assert jitter.lognormal_sigma == pytest.approx(0.05, rel=0.2)
    exact = fit_cost_model(rows, np.full(400, 100.0), 1e-3 + 2e-6 * rows)  # constant pixels
    assert exact.per_pixel == 0.0 and exact.per_row == pytest.approx(2e-6)
    assert exact.r2 == pytest.approx(1.0)


def _run_log(mode: str, compute: list[list[float]], depends: list[list[list[int]]]) -> dict:
    """An ``odin_run.json`` of 2 ranks: step t of rank r took ``compute[t][r]`` seconds and
    read rank q's step ``depends[t][r][q]``; one phase."""
    ranks = [
        {
            "rank": r,
            "phases": [{"start_step": 0}],
            "steps": [
                {"step": t, "compute_s": c[r], "depends_on": d[r]}
                for t, (c, d) in enumerate(zip(compute, depends, strict=True))
            ],
        }
        for r in range(2)
    ]
    return {"sync": mode, "ranks": ranks}


def test_replay_of_a_run_log_by_hand():
    """``trace.replay_run``: the run's own compute through its plan's dependencies, and the
    wait that lengthens the run (``critical_path_wait``), not the most any rank waited."""
    # Rank 0 takes 3 s a step, rank 1 1 s; rank 1 reads rank 0's step t - 2 at t = 2 and 3.
    compute = [[3.0, 1.0]] * 4
    none = [[-1, -1], [-1, -1]]
    depends = [none, none, [[-1, -1], [0, -1]], [[-1, -1], [1, -1]]]
    # quality-first: rank 1 waits 1 s before step 2 and 2 s before step 3, barrier 2 s
    # before each of steps 1..3; rank 0 never waits and ends at 12 s either way: rank 1's
    # waits are rank 0's extra work, not wait on the run's path
    for mode in ("quality-first", "barrier"):
        assert replay_run(_run_log(mode, compute, depends), 0) == 0.0
        assert replay_run(_run_log(mode, compute, depends), 0, balanced=True) == 0.0
    assert critical_path_wait(np.array([12.0, 7.0]), np.array([0.0, 3.0])) == 0.0
    # The ranks take turns being slow (3 s and 1 s): barrier ends steps 1..3 at 6, 9, 12 s,
    # where each rank alone would end at 8 s (10 s less 2 s waited, 12 s less 4 s): 4 s on
    # the run's path (the most any rank waited is 4 s too). Quality-first with no
    # dependency: no wait; reading the peer's previous step (t - 1) makes it a barrier.
    turns = [[3.0, 1.0], [1.0, 3.0]] * 2
    assert replay_run(_run_log("barrier", turns, [none] * 4), 0) == pytest.approx(4.0)
    assert replay_run(_run_log("quality-first", turns, [none] * 4), 0) == 0.0
    previous = [none] + [[[-1, t - 1], [t - 1, -1]] for t in range(1, 4)]
    assert replay_run(_run_log("quality-first", turns, previous), 0) == pytest.approx(4.0)
    # a second phase starting at step 1 meets every rank (as a rendezvous): rank 1 waits
    # there from 1 s to 3 s, and the run ends at 10 s instead of 8 s
    log = _run_log("quality-first", turns, [none] * 4)
    log["ranks"][0]["phases"].append({"start_step": 1})
    assert replay_run(log, 0) == pytest.approx(2.0)
    assert replay_run(_run_log("throughput-first", compute, depends), 0) is None
    del log["ranks"][1]["steps"][0]["depends_on"]  # a log from before the field
    assert replay_run(log, 0) is None


def test_rotated_orders_and_same_round_ratios():
    modes = ["ddp", "barrier", "quality-first", "throughput-first"]
    orders = rotated_orders(modes, 5)
    assert orders[0] == modes and orders[1] == modes[1:] + modes[:1]
    assert orders[3] == modes[3:] + modes[:3] and orders[4] == modes
    for i in range(4):  # every mode takes every position once in 4 rounds
        assert sorted(o[i] for o in orders[:4]) == sorted(modes)
    rounds = [
        {
            "barrier": {"views_per_second": b, "critical_path_wait_s": 1.0},
            "quality-first": {"views_per_second": q, "critical_path_wait_s": 0.5},
        }
        for b, q in ((10.0, 11.0), (20.0, 21.0), (10.0, 10.0))
    ]
    pairs = pair_ratios(rounds, ["barrier", "quality-first"])
    np.testing.assert_allclose(pairs["qf_vs_barrier"]["throughput"], [1.1, 1.05, 1.0])
    assert "wait_hidden_replay" not in pairs["qf_vs_barrier"]  # runs without a replay
    replayed = [
        {
            m: dict(r[m], replay_wait_s=w, replay_wait_s_balanced=w / 2)
            for m, w in zip(r, (2, 1), strict=True)
        }
        for r in rounds
    ]
    pairs = pair_ratios(replayed, ["barrier", "quality-first"])
    np.testing.assert_allclose(pairs["qf_vs_barrier"]["wait_hidden_replay"], [0.5] * 3)
    np.testing.assert_allclose(pairs["qf_vs_barrier"]["wait_hidden_balanced"], [0.5] * 3)
    agg = aggregate_rounds([r["barrier"] for r in rounds])
    assert agg["views_per_second"] == 10.0 and agg["views_per_second_max"] == 20.0
    # the A/A control trains barrier and is reported against it like any mode
    assert TRAIN_MODE[CONTROL] == "barrier"
    control = [dict(r, **{CONTROL: r["quality-first"]}) for r in rounds]
    pairs = pair_ratios(control, ["barrier", CONTROL])
    np.testing.assert_allclose(pairs["again_vs_barrier"]["throughput"], [1.1, 1.05, 1.0])
    # throughput-first modes are also paired with quality-first (what admission buys)
    tf = [dict(r, **{m: r["barrier"] for m in ("throughput-first", IMPACT)}) for r in rounds]
    pairs = pair_ratios(tf, ["barrier", "quality-first", "throughput-first", IMPACT])
    assert {"tf_vs_qf", "tfi_vs_qf"} <= set(pairs) and "barrier_vs_qf" not in pairs
    np.testing.assert_allclose(pairs["tf_vs_qf"]["throughput"], [10 / 11, 20 / 21, 1.0])
    np.testing.assert_allclose(pairs["tfi_vs_qf"]["wait_hidden"], [-1.0, -1.0, -1.0])


def test_sharded_ownership_by_hand():
    plan = two_rank_plan()
    # locality: rank 0 owns {0, 1} (it reads {0, 1} then {0}), rank 1 owns {2, 3}
    local = Sharded(np.array([0, 0, 1, 1]))
    traffic = local.traffic(plan, row_bytes=1.0)
    # only rank 1's step 1 reads a row it does not own (row 1): gradient out, row back
    expected = np.zeros((2, 2, 2))
    expected[1, 1, 0] = expected[1, 0, 1] = 1.0
    np.testing.assert_array_equal(traffic, expected)
    remote = Sharded(np.array([1, 1, 0, 0])).traffic(plan, row_bytes=1.0)
    # swapped owners: 6 of the 7 row reads are remote (all but rank 1's row 1), both ways
    assert remote.sum() == 2 * 6
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])
    qf = replay([ph], "quality-first", FAST, ownership=local, row_bytes=1.0)
    # two hops: 1 s per message. rank 1's step 1 needs rank 0's step 0 (arrives 1 + 1 = 2)
    # and starts at 3 (its own step 0 sent nothing to owners); ends 4; its message to rank
    # 0 arrives at 5: the drain ends at 5
    assert qf.total_time == pytest.approx(5.0)
    # random ownership sends more and waits for its own round trips
    slow = replay([ph], "quality-first", FAST, ownership=Sharded(np.array([1, 1, 0, 0])))
    assert slow.total_time > qf.total_time


def test_ring_allreduce_by_hand():
    net = Network("hand", 1e-3, 1e9)
    # 4 ranks, 8 MB: 2 (4 - 1) = 6 messages of 8e6 / 4 = 2e6 bytes, 1 ms + 2 ms each
    assert ring_allreduce_seconds(8e6, 4, net) == pytest.approx(6 * (1e-3 + 2e-3))
    assert ring_allreduce_seconds(8e6, 2, net) == pytest.approx(2 * (1e-3 + 4e-3))
    assert ring_allreduce_seconds(8e6, 1, net) == 0.0


def test_fit_ring_recovers_latency_and_bandwidth():
    truth = Network("truth", 4e-4, 1.5e9)
    samples = [
        AllReduceSample(r, b, ring_allreduce_seconds(b, r, truth), 1)
        for r in (2, 3)
        for b in (2**21, 2**23, 2**25)
    ]
    fit = fit_ring(samples)
    assert fit.latency_s == pytest.approx(4e-4, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(1.5e9, rel=1e-6)


def test_ddp_all_reduce_priced_on_the_collective_network():
    plan = two_rank_plan()
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])  # num_rows = 4: 960 dense bytes
    collective = Network("collective", 0.1, 1e30)
    # 2 ranks: 2 messages of 0.1 s = 0.2 s; step 1 starts at 3 + 0.2, ends 4.2; + 0.2
    ddp = replay([ph], "ddp", FAST, collective=collective)
    assert ddp.total_time == pytest.approx(4.4)
    # the point-to-point network (FAST: 0.5 s per message) prices the other modes only
    assert replay([ph], "barrier", FAST, collective=collective).total_time == pytest.approx(5.0)
    slow_bw = Network("slow", 0.0, 960.0)  # 2 x 480 bytes at 960 B/s = 1 s
    assert replay([ph], "ddp", FAST, collective=slow_bw).total_time == pytest.approx(3 + 1 + 1 + 1)
    assert ddp.bytes_per_rank_per_step == pytest.approx(2 * (2 - 1) / 2 * 4 * PUBLICATION_ROW_BYTES)


def synthetic_table(waits: float, steps: int = 12) -> dict:
    """A measured barrier-like run (``bench.trace.step_table`` layout) of 2 ranks: 4 views
    over 8 rows, compute 0.10 / 0.12 s, 5 ms after each step and 1 ms between steps; every
    step starts on both ranks together, after the slower one and ``waits`` more seconds."""
    F = sp.csr_matrix(np.kron(np.eye(4), np.ones((1, 2))).astype(bool))  # view v: rows 2v, 2v+1
    T, R = steps, 2
    step = np.repeat(np.arange(T)[:, None], R, axis=1)
    view = (2 * step + np.arange(R)) % 4
    compute = np.tile([0.10, 0.12], (T, 1))
    wait = waits + compute.max(axis=1, keepdims=True) - compute
    start = 0.146 * step + (waits - 0.02) * step
    end = start + wait + compute + 0.005
    return {
        "step": step,
        "view": view,
        "compute_s": compute,
        "wait_s": wait,
        "start": start,
        "end": end,
        "footprints": F,
        "footprint_rows": np.full((T, R), 2.0),
        "phases": [{"start_step": 0, "num_steps": T, "num_gaussians": 8}],
    }


def test_a_drains_wait_is_no_step_overhead():
    """A step whose structural change waited for peers (``drain_wait_s``, in its wall time)
    replays with the overhead it had without that wait: the replay's phase boundary is
    where the simulator makes ranks wait."""
    from odin_ns.bench.scale import _phases_from_trace

    table = synthetic_table(0.02)
    drained = {**table, "end": table["end"].copy(), "drain_wait_s": np.zeros_like(table["end"])}
    drained["end"][-1, 1] += 0.3  # rank 1's last step waited 0.3 s in its drain
    drained["drain_wait_s"][-1, 1] = 0.3
    (plain,), _ = _phases_from_trace(table)
    (phase,), _ = _phases_from_trace(drained)
    np.testing.assert_allclose(phase.overhead, plain.overhead, atol=1e-12)
    unrecorded = {k: v for k, v in drained.items() if k != "drain_wait_s"}  # older logs
    assert _phases_from_trace(unrecorded)[0][0].overhead[-1, 1] > plain.overhead[-1, 1] + 0.29


def test_validation_reads_only_calibration_inputs():
    collective = Network("micro-benchmark", 0.005, 1e9)
    base = {"barrier": synthetic_table(0.02), "ddp": synthetic_table(0.03)}
    cross, own, net = predict_round(base, collective)
    # the ddp run's own waits (its measured all-reduce time) never enter the prediction:
    # the same compute and overhead with ten times the wait predict the same ratio
    cross2, own2, net2 = predict_round({**base, "ddp": synthetic_table(0.3)}, collective)
    assert own2["ddp_vs_barrier"] == pytest.approx(own["ddp_vs_barrier"])
    assert net2.latency_s == net.latency_s and cross2 == cross
    # the micro-benchmark's fit does: a slower all-reduce predicts a slower ddp
    _, slow, _ = predict_round(base, Network("slower", 0.05, 1e9))
    assert slow["ddp_vs_barrier"] < own["ddp_vs_barrier"]
    # ddp from the barrier trace: its steps (0.146 s: the slower rank's 0.126 s of compute
    # and overhead, then 20 ms wait) with the all-reduce (2 x 5 ms) in place of the wait
    assert cross["ddp_vs_barrier"] == pytest.approx(0.146 / (0.126 + 0.01), rel=0.01)


def test_saved_allreduce_calibration_round_trip(tmp_path):
    truth = Network("truth", 1e-3, 2e9)
    samples = [
        AllReduceSample(2, b, ring_allreduce_seconds(b, 2, truth), 5) for b in (2**21, 2**25)
    ]
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps({"allreduce_calibration": calibration_record(samples, {}, 0.99)}))
    record, fits = allreduce_calibration([2], [], saved=path)
    assert fits[2].latency_s == pytest.approx(1e-3) and fits[2].bandwidth_Bps == pytest.approx(2e9)
    assert record["samples"][0]["num_bytes"] == 2**21 and record["cpu_idle_before"] == 0.99
    with pytest.raises(ValueError, match="no sample on 3 ranks"):
        allreduce_calibration([3], [], saved=path)


def test_sync_control_without_barrier_is_refused_before_any_run(tmp_path, capsys):
    from odin_ns.bench import sync

    out = tmp_path / "sync.json"
    argv = ["--data", str(tmp_path), "--modes", "quality-first", "--control", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        sync.main([*argv, "--work-dir", str(tmp_path / "runs")])
    assert exc.value.code == 2
    assert "--modes must include barrier" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_sync_evaluates_every_run_whose_parameters_differ_from_barrier():
    """Barrier once (deterministic); a quality-first run bitwise barrier's takes barrier's
    PSNR; every throughput-first run (parameters differ) is evaluated in its own round."""
    modes = ["barrier", "quality-first", "throughput-first", CONTROL]
    rounds = [
        {
            "barrier": {},
            "quality-first": {"max_param_diff_vs_barrier": 0.0},
            "throughput-first": {"max_param_diff_vs_barrier": 0.02 * (i + 1)},
            CONTROL: {"max_param_diff_vs_barrier": 0.0},
        }
        for i in range(3)
    ]
    evaluated = runs_to_evaluate(rounds, modes)
    assert evaluated == [
        ("barrier", 0),
        ("throughput-first", 0),
        *(("throughput-first", i) for i in (1, 2)),
    ]
    measured = {("barrier", 0): 20.0, **{("throughput-first", i): 19.5 + i for i in range(3)}}
    psnrs = round_psnrs(rounds, modes, measured)
    assert psnrs == {
        "barrier": [20.0, 20.0, 20.0],
        "quality-first": [20.0, 20.0, 20.0],
        "throughput-first": [19.5, 20.5, 21.5],
    }
    without_barrier = runs_to_evaluate([{"quality-first": {}}] * 2, ["quality-first"])
    assert without_barrier == [("quality-first", 0), ("quality-first", 1)]


def test_sync_paired_seeds_evaluate_barrier_in_every_round():
    """With a seed per round, barrier differs between rounds: each round's barrier is
    evaluated, and a run bitwise its round's barrier takes that round's PSNR."""
    modes = ["barrier", "quality-first", "throughput-first"]
    rounds = [
        {
            "barrier": {},
            "quality-first": {"max_param_diff_vs_barrier": 0.0},
            "throughput-first": {"max_param_diff_vs_barrier": 0.1},
        }
        for _ in range(2)
    ]
    evaluated = runs_to_evaluate(rounds, modes, paired_seeds=True)
    assert evaluated == [
        ("barrier", 0),
        ("throughput-first", 0),
        ("barrier", 1),
        ("throughput-first", 1),
    ]
    measured = {("barrier", 0): 20.0, ("barrier", 1): 21.0}
    measured |= {("throughput-first", 0): 19.9, ("throughput-first", 1): 21.2}
    psnrs = round_psnrs(rounds, modes, measured, paired_seeds=True)
    assert psnrs["quality-first"] == [20.0, 21.0]
    assert psnrs["throughput-first"] == [19.9, 21.2]


def test_seed_control_range_includes_barrier_itself():
    figures = seed_control_figures(20.0, [20.25, 19.5])
    assert figures["psnr_seed_deltas"] == [0.25, -0.5]
    assert (figures["psnr_seed_delta_min"], figures["psnr_seed_delta_max"]) == (-0.5, 0.25)
    assert figures["psnr_seed_spread"] == 0.75
    assert seed_control_figures(20.0, [20.5])["psnr_seed_delta_min"] == 0.0


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--modes", "quality-first"], "needs barrier and ns-eval"),
        (["--no-eval"], "needs barrier and ns-eval"),
        (["--seed-control", "-1"], "--seed-control must be >= 0"),
        (["--paired-seeds"], "leave out --seed-control"),
    ],
)
def test_sync_seed_control_refusals_come_before_any_run(tmp_path, capsys, extra, reason):
    from odin_ns.bench import sync

    out = tmp_path / "sync.json"
    argv = ["--data", str(tmp_path), "--seed-control", "2", "--out", str(out), *extra]
    with pytest.raises(SystemExit) as exc:
        sync.main([*argv, "--work-dir", str(tmp_path / "runs")])
    assert exc.value.code == 2
    assert reason in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists() and not (tmp_path / "runs").exists()


# ------------------------------------------------ transports, host work, Grendel-style


def test_topology_prices_each_pair_on_its_link_and_host_copies():
    from odin_ns.bench.simulate import Topology, allreduce_seconds, message_seconds

    fast = Network("in node", 1.0, 10.0)  # 1 s + 10 bytes/s
    slow = Network("between nodes", 5.0, 1.0)
    topo = Topology("2 x 2", fast, slow, per_node=2)
    traffic = np.zeros((1, 4, 4))
    traffic[0, 0, 1] = 20.0  # same node: 1 + 20 / 10 = 3 s
    traffic[0, 0, 2] = 3.0  # other node: 5 + 3 / 1 = 8 s
    nothing = np.zeros((1, 4))
    dur = message_seconds(traffic, topo, nothing)
    assert dur[0, 0, 1] == pytest.approx(3.0) and dur[0, 0, 2] == pytest.approx(8.0)
    staged = Topology("2 x 2 staged", fast, slow, per_node=2, copy_Bps=10.0)
    copied = np.array([[23.0, 0.0, 0.0, 0.0]])  # what rank 0 took off its device
    dur = message_seconds(traffic, staged, copied)
    assert dur[0, 0, 1] == pytest.approx(3.0 + (23 + 20) / 10)
    # one node: the intra link's ring; two nodes: the rails' inter-node links in parallel
    assert allreduce_seconds(8.0, 2, topo) == pytest.approx(ring_allreduce_seconds(8.0, 2, fast))
    rails = Network("rails", 5.0, min(10.0, 2 * 1.0))
    assert allreduce_seconds(8.0, 4, topo) == pytest.approx(ring_allreduce_seconds(8.0, 4, rails))


def test_host_work_is_paid_by_odin_modes_not_by_ddp():
    plan = two_rank_plan()
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])
    instant = Network("instant", 0.0, 1e30)  # nothing to hide the host work behind
    for mode in ("barrier", "quality-first", "throughput-first"):
        base = replay([ph], mode, instant).total_time
        # rank 1 (3 s, then 1 s) is the critical path and pays it after both steps
        assert replay([ph], mode, instant, host_s=0.25).total_time == pytest.approx(base + 0.5)
    # behind a message's latency (0.5 s) the host work is hidden: a rank waits anyway
    assert replay([ph], "barrier", FAST, host_s=0.25).total_time == pytest.approx(5.0)
    assert replay([ph], "ddp", FAST, host_s=0.25).total_time == replay([ph], "ddp", FAST).total_time


def test_tables_made_ahead_pace_the_steps_without_adding_to_them(tmp_path):
    """Tables a thread makes ahead (``tables_s``): the phase's first step makes its own, and
    a rank starts a step no sooner than ``tables_s`` after it started the previous one; they
    are not added after every step as the host work is. ``HostWork`` reads their time from
    a layout the benchmark marks as made ahead, scaled by rows per view like integer work."""
    from odin_ns.bench.scale import HostWork

    plan = two_rank_plan()
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])
    instant = Network("instant", 0.0, 1e30)
    base = replay([ph], "quality-first", instant).total_time  # rank 1: 3 s, then 1 s
    # faster than the steps: only the first step's own tables show
    assert replay([ph], "quality-first", instant, tables_s=0.5).total_time == pytest.approx(
        base + 0.5
    )
    # slower than the steps: rank 1 starts step 1 at 5 + 5, not when its step 0 ended (8)
    assert replay([ph], "quality-first", instant, tables_s=5.0).total_time == pytest.approx(11.0)
    cp = {"rows": 1000, "share_per_view": 0.1, "code": "test"}  # 100 rows per view
    for layout, ahead in (("replicated", 2), ("sharded", 0)):
        for r in (8, 64):
            cp[f"meta_ms_per_step_r{r}_{layout}"] = 2.0
            cp[f"control_ms_per_step_r{r}_{layout}"] = 1.0
            cp[f"tables_ms_per_step_r{r}_{layout}"] = 3.0 if r == 8 else 12.0
            cp[f"tables_ahead_r{r}_{layout}"] = ahead
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(cp))
    host = HostWork.load(path)
    assert host.seconds("replicated", 8, 100.0) == pytest.approx(2e-3)  # not the tables
    assert host.tables_seconds("replicated", 8, 200.0) == pytest.approx(6e-3)
    assert host.tables_seconds("replicated", 64, 100.0) == pytest.approx(12e-3)
    assert host.tables_seconds("sharded", 8, 100.0) == 0.0  # not made ahead: none apart


def test_host_work_interpolates_in_log_ranks_and_scales_its_integer_part(tmp_path):
    from odin_ns.bench.scale import HostWork

    cp = {"rows": 1000, "share_per_view": 0.1, "code": "test"}  # 100 rows per view
    cp.update({"host_ms_per_step_r8_replicated": 10.0, "control_ms_per_step_r8_replicated": 4.0})
    cp.update({"host_ms_per_step_r64_replicated": 40.0, "control_ms_per_step_r64_replicated": 10.0})
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(cp))
    host = HostWork.load(path)
    assert host.seconds("replicated", 8, 100.0) == pytest.approx(10e-3)
    assert host.seconds("replicated", 64, 200.0) == pytest.approx((30.0 + 20.0) * 1e-3)
    # halfway in log R (8 -> 64 through sqrt(512)), and constant outside the measured sizes
    assert host.seconds("replicated", int(round(np.sqrt(512))), 100.0) == pytest.approx(
        25e-3, rel=0.01
    )
    assert host.seconds("replicated", 2, 100.0) == pytest.approx(10e-3)
    assert host.basis == "host_ms"
    # the wall time with the data plane on a device without values is preferred
    cp.update({"meta_ms_per_step_r8_replicated": 6.0, "meta_ms_per_step_r64_replicated": 12.0})
    path.write_text(json.dumps(cp))
    host = HostWork.load(path)
    assert host.basis == "meta_ms"
    assert host.seconds("replicated", 8, 200.0) == pytest.approx((2.0 + 8.0) * 1e-3)
    # the phase start per plan step (step tables made there) is host work on row ids too
    cp.update({"bind_ms_per_plan_step_r8_replicated": 3.0})
    path.write_text(json.dumps(cp))
    assert HostWork.load(path).seconds("replicated", 8, 200.0) == pytest.approx(16e-3)


def test_grendel_style_step_by_hand():
    from odin_ns.bench.simulate import (
        GRENDEL_BACKWARD_BYTES,
        GRENDEL_FORWARD_BYTES,
        owned_reads,
        replay_grendel,
    )

    plan = two_rank_plan()  # step 0: rank 0 reads {0, 1}, rank 1 {2, 3}; step 1: {0}, {1, 2}
    owner = np.array([1, 1, 0, 0])  # every read at step 0 is remote
    reads = owned_reads(plan, owner)
    np.testing.assert_array_equal(reads[0], [[0, 2], [2, 0]])  # [owner, reader]
    np.testing.assert_array_equal(reads[1], [[0, 1], [1, 0]])
    net = Network("hand", 0.5, 1e30)  # latency only
    ph = phase(plan, [[1.0, 3.0], [1.0, 1.0]])
    balanced = np.array([[2.0, 2.0], [1.0, 1.0]])
    g = replay_grendel(ph, balanced, net, owner, num_rows=4)
    # per step: the slower rank's balanced compute + forward and backward all-to-all (0.5 s
    # each) + the counts' all-gather ((R - 1) x 0.5 s) + redistribution / 1000 (~0.5 ms)
    per_step_extra = 3 * 0.5 + (0.5 + 0) / 1000
    assert g.total_time == pytest.approx(2.0 + 1.0 + 2 * per_step_extra, rel=1e-9)
    assert g.bytes_per_rank_per_step == pytest.approx(
        6 * (GRENDEL_FORWARD_BYTES + GRENDEL_BACKWARD_BYTES) / 4
    )


def test_dependency_share_counts_rows_a_peer_wrote_before():
    from odin_ns.bench.simulate import dependency_share

    plan = two_rank_plan()
    # step 1: rank 1 reads {1, 2}: row 1 rank 0 wrote at step 0; rank 0 reads {0}, its own
    assert dependency_share(plan) == pytest.approx(1 / 3)
    assert plan.dependency_rows[1].sum() == 1  # the training runs' count, for two ranks
    # three ranks all reading row 0 every step: each row counts once, not once per peer
    F = sp.csr_matrix(np.array([[1, 1], [1, 0], [1, 0]], dtype=bool))
    three = StepPlan.from_views(F, np.array([[[0], [1], [2]], [[0], [1], [2]]]))
    assert dependency_share(three) == pytest.approx(3 / 4)  # rows {0,1}, {0}, {0}: 3 of 4


def test_trace_store_round_trip(tmp_path):
    from odin_ns.bench.trace_store import CASE_FILE, FOOTPRINTS_FILE, load_case, save_table

    table = synthetic_table(0.02)
    table.update(world_size=2, sources={"footprint_rows": "run log"})
    table.update(
        visible_rows=table["footprint_rows"],
        pixels=np.full((12, 2), 100.0),
        num_rows=np.full(12, 8),
        # 12 admitted reads (as many as steps: not sliced as a per-step array)
        admitted=np.array([[8, 1, 0, 7]] * 11 + [[2, 0, 1, 1]], dtype=np.int64),
    )
    save_table(table, tmp_path / "barrier-r0.npz")
    sp.save_npz(tmp_path / FOOTPRINTS_FILE, table["footprints"])
    case = {
        "data": "x",
        "ranks": 2,
        "steps": 12,
        "measured": {},
        "traces": {"barrier": ["barrier-r0.npz"]},
    }
    (tmp_path / CASE_FILE).write_text(json.dumps(case))
    meta, tables = load_case(tmp_path)
    back = tables["barrier"][0]
    for key in ("step", "view", "compute_s", "start", "end", "pixels"):
        np.testing.assert_array_equal(back[key], table[key])
    assert back["phases"] == table["phases"] and back["world_size"] == 2
    assert (back["footprints"] != table["footprints"]).nnz == 0
    np.testing.assert_array_equal(back["admitted"], table["admitted"])
    from odin_ns.bench.scale import _phases_from_trace

    # replayed from step 5 on: global step 8 is local 3; the read at step 2 is left out
    (phase,), _ = _phases_from_trace(back, recorded=True)
    assert phase.admitted == {(3, 1, 0, 2)}
    assert _phases_from_trace(back)[0][0].admitted is None  # the rule decides
    # the validation's inputs come back whole: the fitted delay is the same
    from odin_ns.bench.scale import calibrate_on_barrier

    assert calibrate_on_barrier(back).latency_s == pytest.approx(
        calibrate_on_barrier(table).latency_s
    )


def test_p2p_fit_recovers_latency_and_bandwidth():
    from odin_ns.bench.p2p import P2PSample, fit_link

    samples = [P2PSample(b, 5e-5 + b / 2e9, 0.0, 0.0, 1) for b in (4096, 2**18, 2**22, 2**25)]
    fit = fit_link(samples)
    assert fit.latency_s == pytest.approx(5e-5, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)


def test_scale_rebuilds_from_the_repository(tmp_path, monkeypatch):
    """``python -m odin_ns.bench.scale`` reads only committed files; its validation,
    recomputed here from the committed traces, gives the committed figure."""
    from pathlib import Path

    from odin_ns.bench import scale

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    committed = json.loads((root / "bench/scale.json").read_text())
    out = tmp_path / "scale.json"
    argv = ["--ranks", "2,8", "--city-views", "480", "--drive-views", "48", "--max-steps", "6"]
    result = scale.main([*argv, "--out", str(out)])
    assert result["validation_error_max"] == pytest.approx(committed["validation_error_max"])
    assert all(not Path(p).is_absolute() for p in result["inputs"]["traces"])
    for key in ("host", "device", "device_transport_target_host"):
        tail = key if key.endswith("host") and key != "host" else f"{key}_transport"
        assert np.isfinite(result[f"sim_qf_vs_ddp_nccl_8_{tail}"])
    assert {r["scene_key"] for r in result["scaling"]} == {"city", "drive", "street", "fox"}
    assert out.exists() and out.with_suffix(".png").exists()
