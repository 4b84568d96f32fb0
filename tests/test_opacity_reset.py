"""An opacity reset alone does not end a phase: every replica (or owner, and every reader's
cache) lowers opacities in place after a drain, and the plan runs on.

Real runs (gloo, street scene, 2 ranks, steps not views, side by side), with splatfacto's
reset every 2 x refine_every = 16 steps and densification paused after each reset (so steps
0, 16 and 32 reset and nothing refines): replicated barrier, replicated quality-first and
sharded quality-first. Sharded readers hold cached rows whose owners reset them, and pushes
cross the resets. Two ranks (three before): each rank is one peer's reader and the other's
owner, which is all a reset in the phase touches; 3-rank exactness across refines and
relocations is tests/test_sharded.py's and tests/test_mcmc.py's. The three final checkpoints
are bitwise equal (parameters and Adam moments), each run has one phase start (step 0) and
three structural records of an unchanged count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from harness.fork_server import ForkServer
from harness.runs import TrainJob, train_side_by_side

from odin_ns.bench.commands import quiet_flags, run_dir, schedule_flags, train_command

STEPS = 40
FLAGS = [
    *quiet_flags(save_every=1000),
    *schedule_flags(warmup=10, refine_every=8),
    *("--pipeline.model.reset-alpha-every", "2"),
    *("--pipeline.schedule-in-views", "False"),
    *("--pipeline.max-phase-steps", "100"),
]
MODES = {
    "barrier": ["--pipeline.sync.mode", "barrier"],
    "quality-first": ["--pipeline.sync.mode", "quality-first"],
    "sharded": ["--pipeline.sync.mode", "quality-first", "--pipeline.parallel", "sharded"],
}


def _train_side_by_side(data: Path, out: Path, server: ForkServer) -> dict[str, Path]:
    """The three runs, side by side (their parameters never depend on timing)."""
    jobs = [
        TrainJob(
            name,
            train_command(
                data,
                out,
                ranks=2,
                experiment="reset",
                name=name,
                steps=STEPS,
                flags=[*FLAGS, *extra],
            ),
            run_dir(out, "reset", name),
        )
        for name, extra in MODES.items()
    ]
    return {
        name: r.check() for name, r in train_side_by_side(jobs, out / "logs", server=server).items()
    }


def _state(run: Path) -> dict[str, torch.Tensor]:
    path = sorted((run / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    out = {k: v for k, v in ckpt["pipeline"].items() if "gauss_params" in k}
    for name, opt in ckpt["optimizers"].items():
        for moment in ("exp_avg", "exp_avg_sq"):
            if opt["state"]:
                out[f"{name}.{moment}"] = opt["state"][0][moment]
    return out


@pytest.mark.slow
def test_resets_run_in_phase_and_every_mode_agrees(street_scene, fork_server, tmp_path):
    runs = _train_side_by_side(street_scene, tmp_path, fork_server)
    reference = _state(runs["barrier"])
    assert len(reference) == 18
    for name, run in runs.items():
        state = _state(run)
        assert state.keys() == reference.keys(), name
        for key, value in reference.items():
            assert torch.equal(state[key], value), (name, key)
        summary = json.loads((run / "odin_run.json").read_text())
        for rank in summary["ranks"]:
            assert [p["start_step"] for p in rank["phases"]] == [0], name  # one plan
            changes = rank["structural_changes"]
            assert [c["step"] for c in changes] == [0, 16, 32], name
            assert all(c["gaussians_before"] == c["gaussians_after"] for c in changes)
