"""Sharded mode resumes, caps its rows, and refuses checkpoints that do not fit.

Real runs (gloo, street scene, 1 torch thread per rank, steps not views; the session's
shared runs of tests/harness/street_runs.py, and the resumed and capped runs side by side):
40 steps with
checkpoints at step 28, between the refines at steps 24 and 32 (9600 -> ~22k -> ~52k
Gaussians), so a resumed run needs the loaded moments, the densification statistics of
steps 25-28, every rank's generators and the plan's epoch position to continue exactly.

- a sharded checkpoint resumed on the same 2 ranks ends bitwise where the uninterrupted
  sharded run ends (parameters and Adam moments of the final merged checkpoint);
- sharded quality-first is bitwise replicated barrier, and the two modes' checkpoints
  carry the same resume state, so a sharded checkpoint resumed in replicated barrier mode
  ends bitwise where the uninterrupted replicated run ends, and the other way round;
- a 3-rank sharded checkpoint resumes on 2 ranks (a note says the trajectory differs),
  keeps its Gaussians at the resume point, trains through a refine and evaluates sanely;
- a resumed sharded rank reads only its contiguous range of the checkpoint's rows (a memory
  map), so a checkpoint above the row cap resumes sharded; the launcher refuses it for
  replicated training, or when a range is above the cap, in one line;
- ``--pipeline.max-rows-per-rank``: a cap below the model but above every rank's resident
  rows trains sharded and stops replicated training with one line; a cap below a rank's
  share stops sharded training at its first phase start;
- a checkpoint whose Gaussians do not fit the config fails in the launcher, one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.runs import (
    RunResult,
    TrainJob,
    ns_eval_in_process,
    preflight_last_line,
    train_side_by_side,
)
from harness.street_runs import (
    BARRIER,
    CAP,
    SAVED,
    SHARDED,
    STEPS,
    checkpoint_path,
    street_command,
)

from odin_ns.bench.commands import run_dir
from odin_ns.distributed.sharded_checkpoint import row_ranges
from odin_ns.errors import OdinInputError
from odin_ns.preflight import check_checkpoint_gaussians, gaussian_row_shapes

PREFIX = "odin-ns-train: error: "


def _load(run: Path, step: int = STEPS - 1) -> dict:
    return torch.load(checkpoint_path(run, step), map_location="cpu", weights_only=True)


def _gaussians_and_moments(ckpt: dict) -> dict[str, torch.Tensor]:
    """Every Gaussian parameter and both Adam moments of every group, by name."""
    out = {k: v for k, v in ckpt["pipeline"].items() if "gauss_params" in k}
    for name, opt in ckpt["optimizers"].items():
        if opt["state"]:
            for moment in ("exp_avg", "exp_avg_sq"):
                out[f"{name}.{moment}"] = opt["state"][0][moment]
    assert len(out) == 18, sorted(out)  # 6 groups x (parameters, exp_avg, exp_avg_sq)
    return out


def _assert_bitwise(ours: dict, theirs: dict) -> None:
    a, b = _gaussians_and_moments(ours), _gaussians_and_moments(theirs)
    assert ours["step"] == theirs["step"] == STEPS - 1
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape, (key, a[key].shape, b[key].shape)
        assert torch.equal(a[key], b[key]), key  # bitwise


@pytest.fixture(scope="module")
def runs(street_runs_2):
    """The session's uninterrupted 2-rank runs: sharded (with the row cap) and replicated
    barrier."""
    return {"sharded": street_runs_2["sharded"], "replicated": street_runs_2["barrier"]}


@pytest.fixture(scope="module")
def cap_runs(street_scene, runs, fork_server, tmp_path_factory) -> dict[str, RunResult]:
    """Runs the row cap stops or lets through, side by side; name -> result:

    - ``capped``: replicated barrier under the cap (stops when the model outgrows it);
    - ``resumed-capped``: the final sharded checkpoint (above the cap) resumed sharded under
      the cap for three steps without densifying (the next refine would grow the model past
      what two ranks may hold), then the final merged checkpoint;
    - ``tiny-barrier`` / ``tiny-sharded``: a cap below a rank's share of the initial model.
    """
    out = tmp_path_factory.mktemp("cap")
    cap = ["--pipeline.max-rows-per-rank", str(CAP)]
    tiny = ["--pipeline.max-rows-per-rank", "4000"]
    final = checkpoint_path(runs["sharded"], STEPS - 1)
    resumed = [*SHARDED, *cap, "--pipeline.model.stop-split-at", str(STEPS - 1)]
    resumed += ["--load-checkpoint", str(final)]
    specs = {
        "capped": ([*BARRIER, *cap], STEPS),
        "resumed-capped": (resumed, 3),
        "tiny-barrier": ([*BARRIER, *tiny], STEPS),
        "tiny-sharded": ([*SHARDED, *tiny], STEPS),
    }
    jobs = [
        TrainJob(
            name,
            street_command(street_scene, out, 2, name, flags, steps),
            run_dir(out, "street", name),
        )
        for name, (flags, steps) in specs.items()
    ]
    return train_side_by_side(jobs, out / "logs", server=fork_server)


@pytest.mark.slow
def test_sharded_checkpoint_carries_the_replicated_resume_state(runs):
    sharded, replicated = _load(runs["sharded"], SAVED), _load(runs["replicated"], SAVED)
    for ckpt, parallel in ((sharded, "sharded"), (replicated, "replicated")):
        odin = ckpt["odin"]
        assert odin["parallel"] == parallel
        assert len(odin["ranks"]) == 2
        assert set(odin["ranks"][0]) == {"rng", "strategy", "datamanager"}
    # the same phase position, and per rank the same statistics of steps 25-28 (same plan)
    assert sharded["odin"]["phase"] == replicated["odin"]["phase"]
    for ours, theirs in zip(sharded["odin"]["ranks"], replicated["odin"]["ranks"], strict=True):
        assert ours["strategy"]["count"].sum() > 0
        for key in ("grad2d", "count", "radii"):
            assert torch.equal(ours["strategy"][key], theirs["strategy"][key]), key
    _assert_bitwise(_load(runs["sharded"]), _load(runs["replicated"]))  # the premise


@pytest.mark.slow
def test_sharded_resume_on_the_same_world_size_is_exact(runs, street_resumed):
    resumed = street_resumed["sharded"].check()
    _assert_bitwise(_load(resumed), _load(runs["sharded"]))
    # each rank read only its contiguous range of the checkpoint's rows
    n = _load(runs["sharded"], SAVED)["pipeline"]["_model.gauss_params.means"].shape[0]
    summary = json.loads((resumed / "odin_run.json").read_text())
    loaded = [r["loaded_rows"] for r in summary["ranks"]]
    assert loaded == np.diff(row_ranges(n, 2)).tolist(), (loaded, n)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly_in_replicated_barrier(runs, street_resumed):
    resumed = street_resumed["sharded-as-barrier"].check()
    _assert_bitwise(_load(resumed), _load(runs["replicated"]))


@pytest.mark.slow
def test_replicated_checkpoint_resumes_exactly_in_sharded(runs, street_resumed):
    resumed = street_resumed["barrier-as-sharded"].check()
    _assert_bitwise(_load(resumed), _load(runs["sharded"]))


NOTE = re.compile(r"note: checkpoint of a (\d)-rank run resumed on (\d) rank\(s\)")


@pytest.mark.slow
def test_3_rank_sharded_checkpoint_resumes_on_2_ranks(street_runs_3, street_resumed, tmp_path):
    """The 3-rank sharded run's step-28 checkpoint (random owners), resumed sharded on 2."""
    saved = _load(street_runs_3["sharded"], SAVED)
    n = saved["pipeline"]["_model.gauss_params.means"].shape[0]
    assert n > 9600  # densified at step 24
    resumed = street_resumed["3-on-2"]
    code, lines, two = resumed.code, resumed.lines, resumed.run_dir
    output = "\n".join(lines[-40:])
    assert code == 0, output
    notes = {m.groups() for line in lines for m in [NOTE.search(line)] if m}
    assert notes == {("3", "2")}, output

    summary = json.loads((two / "odin_run.json").read_text())
    first = summary["ranks"][0]["phases"][0]
    assert (first["start_step"], first["num_gaussians"]) == (SAVED + 1, n)  # the whole model
    owners = summary["ranks"][0]["ownership"][0]  # the first phase's owners: every row once
    assert (owners["start_step"], owners["num_rows"], sum(owners["owned_rows"])) == (
        SAVED + 1,
        n,
        n,
    )
    final = _load(two)
    assert final["pipeline"]["_model.gauss_params.means"].shape[0] > n  # refined at step 32
    for key, tensor in _gaussians_and_moments(final).items():
        assert torch.isfinite(tensor).all(), key

    assert ns_eval_in_process(two / "config.yml", tmp_path / "eval.json")["psnr"] > 10.0


@pytest.mark.slow
def test_row_cap_trains_sharded_and_stops_replicated(runs, cap_runs):
    summary = json.loads((runs["sharded"] / "odin_run.json").read_text())
    n = _load(runs["sharded"])["pipeline"]["_model.gauss_params.means"].shape[0]
    resident = [max(s["resident_rows"] for s in r["steps"]) for r in summary["ranks"]]
    assert max(resident) <= CAP < n, (resident, CAP, n)  # trained with the cap

    code, lines = cap_runs["capped"].code, cap_runs["capped"].lines
    assert code != 0
    reason = re.fullmatch(rf"{PREFIX}rank [01]: (.*)", lines[-1])  # every rank fails so
    assert reason is not None, "\n".join(lines[-30:])
    assert reason.group(1) == (
        f"--pipeline.max-rows-per-rank {CAP}: the model has {n} Gaussians after step 32, and "
        "replicated training holds all of them on every rank; train with "
        "--pipeline.parallel sharded or raise the cap"
    )


@pytest.mark.slow
def test_model_above_the_cap_resumes_sharded_and_is_refused_replicated(
    runs, cap_runs, street_scene, tmp_path
):
    """A checkpoint of more Gaussians than the cap: sharded resume reads one range per rank
    (below the cap) and trains; replicated resume, or ranges above the cap, are refused by
    the launcher in one line before any rank starts or any output exists."""
    final = STEPS - 1
    ckpt = checkpoint_path(runs["sharded"], final)
    n = _load(runs["sharded"])["pipeline"]["_model.gauss_params.means"].shape[0]
    assert -(-n // 2) <= CAP < n, (n, CAP)
    cap = ["--pipeline.max-rows-per-rank", str(CAP)]
    run = cap_runs["resumed-capped"].check()  # three steps under the cap (see cap_runs)
    summary = json.loads((run / "odin_run.json").read_text())
    loaded = [r["loaded_rows"] for r in summary["ranks"]]
    resident = [max(s["resident_rows"] for s in r["steps"]) for r in summary["ranks"]]
    assert loaded == np.diff(row_ranges(n, 2)).tolist()
    assert max(loaded) <= CAP and max(resident) <= CAP, (loaded, resident, CAP)
    merged = _load(run, final + 3)["pipeline"]["_model.gauss_params.means"]
    assert merged.shape[0] == n and torch.isfinite(merged).all()

    base = ["--nproc-per-node", "2", "odin-splatfacto", "--data", str(street_scene)]
    base += ["--vis", "tensorboard", "--steps-per-eval-image", "0", "--steps-per-eval-batch", "0"]
    base += ["--steps-per-eval-all-images", "0", "--load-checkpoint", str(ckpt)]
    small = str(-(-n // 2) - 1)
    cases = [
        (
            [*BARRIER, *cap],
            f"--pipeline.max-rows-per-rank {CAP}: the model has {n} Gaussians in checkpoint "
            f"'{ckpt}', and replicated training holds all of them on every rank",
        ),
        (
            [*SHARDED, "--pipeline.max-rows-per-rank", small],
            f"--pipeline.max-rows-per-rank {small}: resuming from '{ckpt}' reads "
            f"{-(-n // 2)} of its {n} Gaussians on one of 2 ranks",
        ),
    ]
    for extra, needle in cases:
        out = tmp_path / "refused"
        code, last = preflight_last_line([*base, *extra], out)
        assert code != 0
        assert last.startswith(f"{PREFIX}{needle}"), last
        assert not out.exists()  # nothing started


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("tiny-barrier", "the model has 9600 Gaussians before training"),
        ("tiny-sharded", "at step 0 rank "),
    ],
)
def test_row_cap_below_a_ranks_share_is_one_line(cap_runs, name, needle):
    code, lines = cap_runs[name].code, cap_runs[name].lines
    assert code != 0
    assert lines[-1].startswith(f"{PREFIX}rank ") and needle in lines[-1], "\n".join(lines[-30:])
    assert "--pipeline.max-rows-per-rank 4000" in lines[-1]


@pytest.mark.slow
def test_checkpoint_that_does_not_fit_is_one_line_before_training(runs, street_scene, tmp_path):
    state = torch.load(
        checkpoint_path(runs["sharded"], SAVED), map_location="cpu", weights_only=True
    )
    rows = state["pipeline"]["_model.gauss_params.features_dc"].shape[0]
    state["pipeline"]["_model.gauss_params.features_dc"] = state["pipeline"][
        "_model.gauss_params.features_dc"
    ][:-5]
    cut = tmp_path / "cut.ckpt"
    torch.save(state, cut)
    base = ["--nproc-per-node", "2", "odin-splatfacto", "--data", str(street_scene)]
    base += ["--vis", "tensorboard", "--steps-per-eval-image", "0", "--steps-per-eval-batch", "0"]
    base += ["--steps-per-eval-all-images", "0", *SHARDED]
    cases = [
        (
            ["--load-checkpoint", str(cut)],
            f"its Gaussian groups have different row counts (means {rows}, scales {rows}, "
            f"quats {rows}, features_dc {rows - 5}, features_rest {rows}, opacities {rows})",
        ),
        (
            [
                "--load-checkpoint",
                str(checkpoint_path(runs["sharded"], SAVED)),
                "--pipeline.model.sh-degree",
                "1",
            ],
            "its 'features_rest' rows are [15, 3] but this config builds [3, 3]",
        ),
    ]
    for extra, needle in cases:
        out = tmp_path / "out"
        code, last = preflight_last_line([*base, *extra], out)
        assert code != 0
        assert last.startswith(f"{PREFIX}cannot resume from checkpoint '") and needle in last, last
        assert not out.exists()  # nothing started


def test_checkpoint_gaussians_check_names_what_does_not_fit():
    """The ranks' check (the same function the launcher runs): groups, rows, moments."""
    shapes = gaussian_row_shapes(type("Config", (), {"sh_degree": 3})())
    n = 7
    params = {f"_model.gauss_params.{k}": torch.zeros(n, *s) for k, s in shapes.items()}
    moments = {k: {"state": {0: {"exp_avg": torch.zeros(n, *s)}}} for k, s in shapes.items()}
    check_checkpoint_gaussians("ok.ckpt", params, moments, shapes)  # fits: no error
    bad = dict(moments, quats={"state": {0: {"exp_avg_sq": torch.zeros(n + 1, 4)}}})
    with pytest.raises(OdinInputError, match=r"Adam moment exp_avg_sq of 'quats' is \[8, 4\]"):
        check_checkpoint_gaussians("m.ckpt", params, bad, shapes)
    missing = {k: v for k, v in params.items() if not k.endswith("opacities")}
    with pytest.raises(OdinInputError, match="has no Gaussian group 'opacities'"):
        check_checkpoint_gaussians("g.ckpt", missing, None, shapes)
    assert gaussian_row_shapes(type("Config", (), {"sh_degree": 0})())["features_rest"] == (0, 3)
