"""Reliability: bounded in-flight memory (credits), slow is not dead (busy notices), a NaN
gradient on one rank, resume on another world size.

Engine-level cases use the toy harness (threads over a loopback, or 2 processes over gloo);
the cases that need nerfstudio's loop run ``odin-ns-train`` with a test-only wrapper worker
(``tests/harness/fault_worker.py``) that injects the fault from the outside.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import (
    ListPlan,
    Phase,
    ToyRun,
    reference_train,
    run_threads,
    spawn_ranks,
    toy_groups,
    toy_outcome_worker,
)
from harness.fork_server import ForkServer
from harness.runs import RunResult, TrainJob, ns_eval_in_process, train_side_by_side

from odin_ns.bench.commands import (
    module_launcher,
    quiet_flags,
    run_dir,
    run_env,
    schedule_flags,
    train_command,
)
from odin_ns.runtime import SyncConfig, SyncTimeout
from odin_ns.runtime.errors import PeerFailure
from odin_ns.runtime.liveness import PeerSilence, Rendezvous, StoreLiveness

TESTS = Path(__file__).resolve().parent
PREFIX = "odin-ns-train: error: "


def _disjoint_plan(steps: int) -> ListPlan:
    """Rank 0 and rank 1 never share a row: quality-first never waits, so rank 0 runs ahead
    of a stalled rank 1 as far as its credits let it."""
    return ListPlan(
        [[np.arange(0, 150, 2) + t % 2, np.arange(150, 300, 2) + t % 2] for t in range(steps)]
    )


def _overlap_plan(steps: int) -> ListPlan:
    return ListPlan([[np.arange(0, 200), np.arange(100, 300)] for _ in range(steps)])


# ------------------------------------------------------------------------- credits
@pytest.mark.slow
def test_stalled_peer_bounded_inflight_then_timeout(tmp_path):
    """Rank 1 stops (a silent 10 s sleep) at step 2; rank 0 runs ahead until its unreceived
    publications to rank 1 reach the cap, waits for credits (visible in its metrics), and
    ends with SyncTimeout naming rank 1, its in-flight bytes never above the cap."""
    width = 3 + 12 + 1 + 1
    one = 75 * width * 4  # bytes of one publication
    cap = 3 * one
    config = SyncConfig(timeout_s=2.0, max_inflight_bytes=cap)
    run = ToyRun([Phase(_disjoint_plan(40), 0)], config, stall_at={1: (2, 10.0)})
    codes, results, errors, elapsed = spawn_ranks(
        toy_outcome_worker, 2, tmp_path, (run,), timeout_s=60
    )
    assert results[0] is not None, errors
    rank0 = results[0]
    assert rank0["error"] is not None and rank0["error"].startswith(
        "SyncTimeout: rank 0: peer 1 (step "
    ), rank0
    assert "waiting for credits" in rank0["error"], rank0["error"]
    summary = rank0["summary"]
    assert 0 < summary["inflight_bytes_max"] <= cap, summary
    assert summary["credit_wait_s_total"] >= config.timeout_s, summary
    assert max(m["inflight_bytes_max"] for m in rank0["steps"]) <= cap
    assert summary["steps"] < 40, "rank 0 ran the whole plan: no credit bound"
    assert results[1] is not None and results[1]["error"] is not None, results[1]
    assert results[1]["error"].startswith(("PeerFailure: rank 1: peer 0", "SyncTimeout: rank 1"))
    assert elapsed < 45


def test_credits_do_not_change_results():
    """A cap below one publication still lets one through: the run equals the reference."""
    phases = [Phase(_overlap_plan(8), 0)]
    ref, ref_versions = reference_train(toy_groups(300), phases)
    run = ToyRun(phases, SyncConfig(timeout_s=20, max_inflight_bytes=1), jitter_s=0.002)
    for res in run_threads(2, run):
        for a, b in zip(res.groups, ref, strict=True):
            assert torch.equal(a.param, b.param)
        assert torch.equal(res.engine.versions, ref_versions)


def test_config_rejects_bad_reliability_options():
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        SyncConfig(max_inflight_bytes=0)
    with pytest.raises(ValueError, match="heartbeat_s"):
        SyncConfig(heartbeat_s=0)
    assert SyncConfig(timeout_s=1.0, heartbeat_s=2.0).beat_s == 0.25


# ------------------------------------------------------------------ slow is not dead
def test_busy_peer_is_waited_for_threads():
    """Rank 0 is busy (announced) for 3 x timeout_s between steps: rank 1 waits, both
    finish with the reference's parameters; the same pause unannounced times out."""
    phases = [Phase(_overlap_plan(8), 0)]
    ref, _ = reference_train(toy_groups(300), phases)
    config = SyncConfig(timeout_s=0.8, heartbeat_s=0.1)
    results = run_threads(2, ToyRun(phases, config, busy_at={0: (3, 2.4)}))
    for res in results:
        for a, b in zip(res.groups, ref, strict=True):
            assert torch.equal(a.param, b.param)
    assert results[1].engine.summary()["busy_wait_s_total"] >= 2.0
    with pytest.raises(SyncTimeout, match=r"rank 1: peer 0 \(step 3\): timed out after 0.8 s"):
        run_threads(2, ToyRun(phases, config, stall_at={0: (3, 2.4)}))


def test_sharded_timeout_names_the_peer_and_step():
    """A sharded rank that waits on a silent peer ends with the peer and the step it waited
    for (the engines' one wait loop, ``liveness.wait_until``). Rank 0 reads rank 1's row 4
    at every step, so its read at step 1 needs rank 1's push of row 4 after step 0, which
    needs rank 1's own gradient of step 0; rank 1 stalls before step 0."""
    from harness.sharded_loopback import loopback_plan, stall_sharded_loopback
    from harness.toy import LoopbackHub

    plan = loopback_plan([[[0, 1, 4], [4, 5]] for _ in range(5)], 8)
    owner = np.repeat([0, 1], 4).astype(np.int64)
    errors = stall_sharded_loopback(
        plan, owner, [LoopbackHub(2), LoopbackHub(2)], stalled=1, at_step=0, timeout_s=0.5
    )
    assert sorted(errors) == [0]
    assert isinstance(errors[0], SyncTimeout)
    assert str(errors[0]).startswith(
        "rank 0: peer 1 (step 1): timed out after 0.5 s in before_step(1) waiting for owners'"
    )


@pytest.mark.slow
def test_busy_peer_is_waited_for_gloo(tmp_path):
    """The same over gloo, the busy notices going through the process group's store."""
    config = SyncConfig(timeout_s=1.0, heartbeat_s=0.2)
    run = ToyRun([Phase(_overlap_plan(8), 0)], config, busy_at={0: (3, 4.0)})
    codes, results, errors, elapsed = spawn_ranks(
        toy_outcome_worker, 2, tmp_path, (run,), timeout_s=60
    )
    assert codes == [0, 0], errors
    assert [r["error"] for r in results] == [None, None]
    assert results[1]["summary"]["busy_wait_s_total"] >= 3.0
    assert elapsed < 45


def _peer_in_a_store(store, delay_setup_s: float, run_s: float, arrive: bool) -> None:
    """Rank 1 of a rendezvous: sets up for ``delay_setup_s`` (no liveness yet), runs
    ``run_s`` (pulsing, not busy), then reaches the rendezvous (``arrive``) or ends without
    it (its pulses stop, as a killed process's do)."""
    time.sleep(delay_setup_s)
    live = StoreLiveness(1, 2, 0.05, store=store, namespace="t")
    time.sleep(run_s)
    if arrive:
        live.arrive()
    live.close()


@pytest.mark.parametrize("dies", [True, False])
def test_a_dead_peer_ends_a_rendezvous_at_once_a_slow_one_is_waited_for(dies):
    """Nothing reads a peer's connection in a rendezvous (a phase start's, before its
    collectives): a peer that has ended is noticed by its pulses (``PeerSilence``), within
    ten pulse periods, not at the sync deadline. A slow peer, setting up or running longer
    than that, pulses and is waited for (``dies`` False)."""
    import threading

    store = torch.distributed.HashStore()
    live = StoreLiveness(0, 2, 0.05, store=store, namespace="t")
    silence = PeerSilence(live, 0, 2, beat_s=0.05, timeout_s=20.0)  # gone after 0.5 s
    meeting = Rendezvous(live, silence, 0, 2, timeout_s=20.0)
    peer = threading.Thread(target=_peer_in_a_store, args=(store, 0.8, 0.8, not dies))
    peer.start()
    tic = time.perf_counter()
    try:
        if dies:
            with pytest.raises(PeerFailure) as failure:
                meeting.meet("a phase start")
            assert re.fullmatch(
                r"rank 0: peer 1 \(no step\): its process stopped answering \(no pulse for "
                r"0\.\d s\): .* \(waiting in a phase start \(rendezvous 1\)\)",
                str(failure.value),
            ), str(failure.value)
            assert time.perf_counter() - tic < 5.0  # 1.6 s of life, then 0.5 s of silence
        else:
            assert 1.5 <= meeting.meet("a phase start") < 5.0
    finally:
        peer.join()
        live.close()


# ------------------------------------------------------------- odin-ns-train runs
STEPS = 20
TRAINING = [*quiet_flags(save_every=4), *schedule_flags(warmup=5, refine_every=8)]


def _job(
    data: Path,
    out: Path,
    name: str,
    nproc: int,
    *extra: str,
    fault: dict | None = None,
    report: Path | None = None,
    launcher: tuple[str, ...] = (),
) -> TrainJob:
    """odin-ns-train through the fault-injection worker (``odin_ns.bench.fault_worker``)."""
    import json

    cmd = train_command(
        data,
        out,
        ranks=nproc,
        experiment="rel",
        name=name,
        steps=STEPS,
        flags=[*TRAINING, *extra],
        launcher=module_launcher("odin_ns.bench.fault_worker"),
        launcher_flags=launcher,
    )
    env = run_env()
    env["ODIN_NS_FAULT"] = json.dumps(fault or {})
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        env["ODIN_NS_FAULT_REPORT"] = str(report)
    return TrainJob(name, cmd, run_dir(out, "rel", name), env=env, timeout_s=300)


def _side_by_side(out: Path, server: ForkServer, *jobs: TrainJob) -> dict[str, RunResult]:
    """The runs side by side: no check below depends on how fast a run goes, only on what
    a rank waits for (sync timeouts of 3 s and more, heartbeats keeping busy ranks alive)."""
    return train_side_by_side(jobs, out / "logs", server=server)


def _checkpoints(run: Path) -> list[Path]:
    return sorted((run / "nerfstudio_models").glob("step-*.ckpt"))


def _step(path: Path) -> int:
    return int(path.name[len("step-") : -len(".ckpt")])


def _finite_checkpoint(path: Path) -> bool:
    state = torch.load(path, map_location="cpu", weights_only=True)
    tensors = [v for k, v in state["pipeline"].items() if "gauss_params" in k]
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors)


@pytest.fixture(scope="module")
def fault_runs(street_scene, fork_server, tmp_path_factory) -> dict[str, RunResult]:
    """Side by side:

    - ``slow``: 2 ranks; rank 0 takes 15 s (5 x timeout_s, more than gloo's own 12 s
      timeout) to write its first checkpoint;
    - ``nan``: 2 ranks; NaN in rank 1's gradient at step 7 (its report in ``out/report``);
    - ``one``: 1 rank, 8 steps (resumed on 2 ranks below).
    """
    out = tmp_path_factory.mktemp("faults")
    slow = _job(
        street_scene,
        out,
        "slow",
        2,
        *("--pipeline.sync.timeout-s", "3", "--pipeline.sync.heartbeat-s", "0.5"),
        fault={"kind": "slow_checkpoint", "write": 1, "seconds": 15},
        launcher=("--distributed-timeout-s", "12"),
    )
    nan = _job(
        street_scene,
        out,
        "nan",
        2,
        *("--pipeline.sync.timeout-s", "30"),
        fault={"kind": "nan_grad", "rank": 1, "step": 7},
        report=out / "report",
    )
    one = _job(street_scene, out, "one", 1, "--max-num-iterations", "8")
    return {"out": out, **_side_by_side(out, fork_server, slow, nan, one)}


@pytest.fixture(scope="module")
def resumed_runs(street_scene, fault_runs, fork_server) -> dict[str, RunResult]:
    """Side by side: the slow 2-rank run resumed on 1 rank (``r21``), the 1-rank run on 2
    (``r12``), 8 steps each."""
    out = fault_runs["out"]
    r21 = _job(
        street_scene,
        out,
        "r21",
        1,
        *("--load-dir", str(fault_runs["slow"].run_dir / "nerfstudio_models")),
        *("--max-num-iterations", "8"),
    )
    r12 = _job(
        street_scene,
        out,
        "r12",
        2,
        *("--load-dir", str(fault_runs["one"].run_dir / "nerfstudio_models")),
        *("--max-num-iterations", "8"),
    )
    return _side_by_side(out, fork_server, r21, r12)


@pytest.mark.slow
def test_slow_checkpoint_write_is_not_a_timeout(fault_runs):
    import json

    slow = fault_runs["slow"]
    code, lines, run, seconds = slow.code, slow.lines, slow.run_dir, slow.seconds
    assert code == 0, "\n".join(lines[-30:])
    assert seconds > 15
    summary = json.loads((run / "odin_run.json").read_text())
    peer = summary["ranks"][1]["engine"]
    assert peer["busy_wait_s_total"] >= 12.0, peer  # rank 1 waited on busy rank 0
    assert _finite_checkpoint(_checkpoints(run)[-1])


@pytest.mark.slow
def test_nan_gradient_on_rank_1_stops_every_rank(fault_runs, tmp_path):
    """NaN in rank 1's gradient at step 7: rank 1 refuses to publish and fails; torchrun ends
    rank 0; the launcher prints rank 1's reason last; both replicas are still finite when
    they end; the last checkpoint (before step 7) is finite and evaluates in ns-eval."""
    import json

    report = fault_runs["out"] / "report"
    nan = fault_runs["nan"]
    code, lines, run = nan.code, nan.lines, nan.run_dir
    output = "\n".join(lines[-30:])
    assert code == 1, output
    assert lines[-1] == (
        PREFIX + "rank 1: non-finite gradient of 'means' at step 7; refusing to publish it"
    ), output
    for rank in (0, 1):
        finite = json.loads((report / f"rank{rank}.finite").read_text())["finite"]
        assert finite is True, (rank, finite)
    ckpts = _checkpoints(run)
    assert ckpts and _step(ckpts[-1]) < 7, ckpts
    assert _finite_checkpoint(ckpts[-1])
    psnr = ns_eval_in_process(run / "config.yml", tmp_path / "eval.json")["psnr"]
    assert math.isfinite(psnr)


NOTE = re.compile(r"note: checkpoint of a (\d)-rank run resumed on (\d) rank\(s\)")


def _resumed(lines: list[str]) -> set[tuple[str, str]]:
    return {m.groups() for line in lines for m in [NOTE.search(line)] if m}


@pytest.mark.slow
def test_resume_2_ranks_on_1(fault_runs, resumed_runs):
    run, resumed = fault_runs["slow"].run_dir, resumed_runs["r21"]
    code, lines = resumed.code, resumed.lines
    assert code == 0, "\n".join(lines[-30:])
    assert _resumed(lines) == {("2", "1")}, "\n".join(lines[-30:])
    assert _step(_checkpoints(resumed.run_dir)[-1]) > _step(_checkpoints(run)[-1])


@pytest.mark.slow
def test_resume_1_rank_on_2(fault_runs, resumed_runs):
    single = fault_runs["one"]
    assert single.code == 0, "\n".join(single.lines[-30:])
    resumed = resumed_runs["r12"]
    code, lines = resumed.code, resumed.lines
    assert code == 0, "\n".join(lines[-30:])
    assert _resumed(lines) == {("1", "2")}, "\n".join(lines[-30:])
    assert _step(_checkpoints(resumed.run_dir)[-1]) > _step(_checkpoints(single.run_dir)[-1])


def test_viewer_pause_is_a_busy_section():
    """The viewer sets ``trainer.training_state``: "paused" opens the session's busy section
    (rank 0 beats while paused), "training" closes it."""
    from contextlib import contextmanager

    from odin_ns.distributed.session import ReplicatedSession
    from odin_ns.trainer import OdinTrainer

    events: list[str] = []

    class Liveness:
        @contextmanager
        def busy(self, reason):
            events.append(f"enter {reason}")
            yield
            events.append("exit")

    session = ReplicatedSession.__new__(ReplicatedSession)
    session.liveness, session._paused = Liveness(), None
    trainer = OdinTrainer.__new__(OdinTrainer)
    trainer.training_state = "training"  # before the session exists (Trainer.__init__)
    trainer.session = session
    trainer.training_state = "paused"
    trainer.training_state = "paused"
    assert trainer.training_state == "paused"
    trainer.training_state = "training"
    assert events == ["enter viewer paused", "exit"]


def test_preflight_refuses_broken_checkpoints_and_read_only_outputs(tmp_path):
    """The launcher reads a checkpoint's archive (CRC of every record) before any rank
    starts, and refuses an output folder it cannot write."""
    from odin_ns.errors import OdinInputError
    from odin_ns.preflight import check_checkpoint_readable, check_output_writable

    good = tmp_path / "good.ckpt"
    torch.save({"step": 3, "pipeline": {"x": torch.arange(4096.0)}}, good)
    check_checkpoint_readable(good)
    data = good.read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(OdinInputError, match="not a complete checkpoint"):
        check_checkpoint_readable(tmp_path / "cut.ckpt")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # inside the tensor record
    (tmp_path / "flipped.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(OdinInputError, match="is corrupt"):
        check_checkpoint_readable(tmp_path / "flipped.ckpt")
    check_output_writable(tmp_path / "not" / "yet")
    if os.geteuid() != 0:  # root writes anywhere; the fault matrix mounts a read-only tmpfs
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OdinInputError, match="not writable"):
            check_output_writable(locked / "out")
