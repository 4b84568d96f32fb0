"""The shared multi-rank runs of the suite: one family of 2-rank runs and one of 3-rank runs
on the built-in street scene, trained once per test session (``tests/conftest.py``) and
read by tests/test_distributed.py, test_sharded.py, test_sharded_resume.py and
test_sharded_rebalance.py.

Every run of a family has the same scene, seed, schedule and steps; only the mode flags
differ (and two runs sleep per-step delays, :data:`JITTERED`, which change no parameter), so
any two of them are comparable parameter for parameter. The schedule is in
steps (not views) so runs and checkpoints compare step by step:

- 2 ranks, :data:`STEPS` = 40 steps, refines at steps 24 and 32 (9600 -> ~22k -> ~52k
  Gaussians; the step-0 opacity reset runs inside the first phase), checkpoints at step
  :data:`SAVED` = 28 (between the refines: a resumed run needs moments, densification
  statistics, generators and the plan's position) and at the last step, evaluation during
  training every 10 steps (rank 0 of a sharded run renders its gathered copy);
- 3 ranks, :data:`STEPS_3` = 30 steps, the refine at step 24, a checkpoint at step 28,
  under ``odin-ns-train --deterministic`` (what the GPU check's bitwise runs use): the
  family's comparisons show it changes no CPU result.
"""

from __future__ import annotations

from pathlib import Path

from harness.fork_server import ForkServer
from harness.runs import TrainJob, train_side_by_side
from odin_ns.bench.commands import (
    free_port,
    module_launcher,
    quiet_flags,
    run_dir,
    schedule_flags,
    train_command,
)

STEPS = 40  # 2-rank runs
STEPS_3 = 30  # 3-rank runs: one refine (step 24) is enough there
SAVED = 28  # the checkpoint resumed from: steps 29..39 remain
CAP = 32000  # below the 2-rank model's ~52k Gaussians, above each sharded rank's ~27k rows
EXPERIMENT = "street"

TRAINING = [
    *quiet_flags(save_every=SAVED, keep_checkpoints=True),
    *schedule_flags(warmup=10, refine_every=8, densify_grad_thresh=0.0002),
    *("--pipeline.schedule-in-views", "False"),
]
# Evaluation during training every 10 steps (2-rank runs): one batch, one image, all images.
EVAL = [
    *("--steps-per-eval-batch", "10", "--steps-per-eval-image", "10"),
    *("--steps-per-eval-all-images", "10"),
]
BARRIER = ["--pipeline.sync.mode", "barrier"]
QUALITY_FIRST = ["--pipeline.sync.mode", "quality-first"]
SHARDED = ["--pipeline.parallel", "sharded", *QUALITY_FIRST]


def live_viewer() -> list[str]:
    """The live viser viewer in rank 0, quitting when training ends."""
    return [
        *("--vis", "viewer+tensorboard", "--viewer.quit-on-train-completion", "True"),
        *("--viewer.websocket-port", str(free_port())),
    ]


# name -> mode flags of each family (every run also gets TRAINING; 2-rank runs get EVAL)
TWO_RANK_RUNS: dict[str, list[str]] = {
    "barrier": BARRIER,
    "quality-first": QUALITY_FIRST,
    "throughput-first": ["--pipeline.sync.mode", "throughput-first"],
    # sharded quality-first, under a row cap below the whole model, with the live viewer
    "sharded": [*SHARDED, "--pipeline.max-rows-per-rank", str(CAP)],
    # throughput-first with tau = 0 admits nothing: it reads what quality-first reads
    "sharded-tf": [
        *("--pipeline.parallel", "sharded", "--pipeline.sync.mode", "throughput-first"),
        *("--pipeline.sync.tau", "0"),
    ],
    "sharded-rebalance": [*SHARDED, "--pipeline.rebalance", "always"],
    # sharded barrier and sharded quality-first under the same per-step compute delays
    "sharded-barrier": ["--pipeline.parallel", "sharded", *BARRIER],
    "sharded-jitter": SHARDED,
}
# Runs launched through odin_ns.bench.jitter: every rank sleeps an exponential delay (mean
# 80 ms, drawn per (seed, rank, step), so the same in both runs) before each step's loss,
# so ranks finish steps far apart; sleeping changes no parameter.
JITTERED = {"sharded-barrier", "sharded-jitter"}
JITTER = ["--jitter-ms", "80", "--jitter-seed", "0"]
DETERMINISTIC = ["--deterministic"]  # 3-rank runs: torch's deterministic kernels
THREE_RANK_RUNS: dict[str, list[str]] = {
    "barrier": BARRIER,
    # random ownership: most reads are remote, so pushes and gradient rows carry the run;
    # credits of one message: every send waits until the peer took the previous one
    "sharded": [
        *SHARDED,
        *("--pipeline.ownership", "random", "--pipeline.sync.max-inflight-bytes", "1"),
    ],
    # a random first deal: the first rebalance moves most rows, with non-zero moments
    "sharded-rebalance": [
        *SHARDED,
        *("--pipeline.rebalance", "always", "--pipeline.ownership", "random"),
    ],
}


def street_command(
    data: Path, out: Path, ranks: int, name: str, extra: list[str], steps: int
) -> list[str]:
    """The family's ``odin-ns-train`` command for run ``name`` with ``extra`` flags (through
    ``odin_ns.bench.jitter`` for the :data:`JITTERED` runs)."""
    jittered = name in JITTERED
    launcher_flags = [*(JITTER if jittered else ()), *(DETERMINISTIC if ranks == 3 else ())]
    return train_command(
        data,
        out,
        ranks=ranks,
        experiment=EXPERIMENT,
        name=name,
        steps=steps,
        flags=[*TRAINING, *extra],
        launcher=module_launcher("odin_ns.bench.jitter") if jittered else None,
        launcher_flags=launcher_flags,
    )


def train_family(
    data: Path, out: Path, ranks: int, server: ForkServer | None = None
) -> dict[str, Path]:
    """Train every run of the 2- or 3-rank family side by side (forked from ``server``, the
    ``fork_server`` fixture, when given); name -> run folder."""
    runs, steps = (TWO_RANK_RUNS, STEPS) if ranks == 2 else (THREE_RANK_RUNS, STEPS_3)
    jobs = []
    for name, flags in runs.items():
        extra = [*flags, *EVAL] if ranks == 2 else list(flags)
        if ranks == 2 and name == "sharded":
            extra += live_viewer()
        cmd = street_command(data, out, ranks, name, extra, steps)
        jobs.append(TrainJob(name, cmd, run_dir(out, EXPERIMENT, name)))
    results = train_side_by_side(jobs, out / "logs", server=server)
    return {name: result.check() for name, result in results.items()}


def resume_job(data: Path, out: Path, name: str, ranks: int, source: Path, *extra: str) -> TrainJob:
    """A run resumed from ``source``'s step-SAVED checkpoint on ``ranks`` ranks, to the 2-rank
    family's last step (nerfstudio resumes at SAVED + 1 and counts --max-num-iterations
    from there), with the family's evaluation steps."""
    ckpt = checkpoint_path(source, SAVED)
    flags = [*EVAL, *extra, "--load-checkpoint", str(ckpt)]
    cmd = street_command(data, out, ranks, name, flags, STEPS - SAVED - 1)
    return TrainJob(name, cmd, run_dir(out, EXPERIMENT, name))


def checkpoint_path(run: Path, step: int) -> Path:
    return run / "nerfstudio_models" / f"step-{step:09d}.ckpt"


__all__ = [
    "BARRIER",
    "CAP",
    "EVAL",
    "JITTER",
    "JITTERED",
    "QUALITY_FIRST",
    "SAVED",
    "SHARDED",
    "STEPS",
    "STEPS_3",
    "THREE_RANK_RUNS",
    "TRAINING",
    "TWO_RANK_RUNS",
    "checkpoint_path",
    "live_viewer",
    "resume_job",
    "street_command",
    "train_family",
]
