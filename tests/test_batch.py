"""Batches of views: B views per rank, batch scaling of Adam, schedules read in views.

- B = 2 quality-first, replicated and sharded, equals barrier bitwise (three real 2-rank
  ``odin-ns-train`` runs; the module's five real runs go side by side);
- schedule in views: the conversion of every step-based setting, refine / reset / lr decay
  at the same view counts for 1, 2 and 4 views per step, and a real 2-rank run of V views
  that takes V / 2 optimizer steps and refines where the conversion says;
- the sqrt rule's values are Grendel-GS's / gsplat's formula.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from harness.runs import RunResult, TrainJob, train_side_by_side

from odin_ns.bench.commands import BIN, quiet_flags, run_dir, run_env, train_command

SMALL = [*quiet_flags(save_every=4000), "--pipeline.model.num-downscales", "0"]
SMALL += ["--pipeline.model.densify-grad-thresh", "0.0002"]


def _method_config():
    from odin_ns.method_configs.odin_splatfacto import odin_splatfacto

    return copy.deepcopy(odin_splatfacto.config)


# ---------------------------------------------------------------------------- sqrt rule
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 8, 16])
def test_sqrt_rule_is_the_published_formula(batch):
    """Grendel-GS (lr_scale_mode="sqrt"): lr * sqrt(bsz), eps / sqrt(bsz), beta ** bsz;
    gsplat's simple_trainer: lr * sqrt(BS), eps / sqrt(BS), betas to first order."""
    from odin_ns.distributed.optimizer_binding import adam_batch_scaling

    s = adam_batch_scaling("sqrt", batch)
    assert s.lr_factor == math.sqrt(batch)
    assert s.eps_factor == 1.0 / math.sqrt(batch)
    assert s.betas((0.9, 0.999)) == (0.9**batch, 0.999**batch)
    # gsplat's betas (1 - BS * (1 - beta)) are the first-order expansion of beta ** BS
    for beta, got in zip((0.9, 0.999), s.betas((0.9, 0.999)), strict=True):
        assert abs(got - (1 - batch * (1 - beta))) <= (batch * (1 - beta)) ** 2
    lin = adam_batch_scaling("linear", batch)
    assert (lin.lr_factor, lin.eps_factor, lin.betas((0.9, 0.999))) == (batch, 1.0, (0.9, 0.999))
    none = adam_batch_scaling("none", batch)
    assert (none.lr_factor, none.eps_factor, none.beta_power) == (1.0, 1.0, 1)


def test_sqrt_rule_applied_to_the_methods_optimizers():
    """Every group's lr (whole schedule), eps and betas, as the runtime reads them."""
    from nerfstudio.engine.optimizers import Optimizers

    from odin_ns.distributed.optimizer_binding import apply_batch_scaling, learning_rate_at

    config = _method_config()
    names = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")

    def build():
        params = {n: [torch.nn.Parameter(torch.zeros(4, 3))] for n in names}
        return Optimizers(copy.deepcopy({n: config.optimizers[n] for n in names}), params)

    plain, scaled = build(), build()
    apply_batch_scaling(scaled, "sqrt", 4)
    for name in names:
        g0 = plain.optimizers[name].param_groups[0]
        g1 = scaled.optimizers[name].param_groups[0]
        assert g1["lr"] == pytest.approx(2.0 * g0["lr"], rel=1e-12)
        assert g1["eps"] == pytest.approx(g0["eps"] / 2.0, rel=1e-12)
        assert g1["betas"] == (g0["betas"][0] ** 4, g0["betas"][1] ** 4)
        for step in (0, 100, 20000, 30000):
            want = 2.0 * learning_rate_at(plain, name)(step)
            assert learning_rate_at(scaled, name)(step) == pytest.approx(want, rel=1e-12)
    scaled.scheduler_step_all(10)
    plain.scheduler_step_all(10)
    lr0 = plain.optimizers["means"].param_groups[0]["lr"]
    assert scaled.optimizers["means"].param_groups[0]["lr"] == pytest.approx(2 * lr0, rel=1e-12)


# ---------------------------------------------------------------------- schedule in views
def test_conversion_of_every_step_setting():
    from odin_ns.distributed import batch_schedule as bs

    config = _method_config()
    config.max_num_iterations = 601
    model = config.pipeline.model
    before = {
        k: getattr(model, k) for k in bs.MODEL_INTERVALS + bs.MODEL_THRESHOLDS if hasattr(model, k)
    }
    changes = bs.convert_trainer_config(config, 2)
    names = {c.name for c in changes}
    assert config.max_num_iterations == 301  # rounded up: at least the 601 views
    assert model.refine_every == before["refine_every"] // 2
    assert model.warmup_length == before["warmup_length"] // 2
    assert model.stop_split_at == before["stop_split_at"] // 2
    assert model.stop_screen_size_at == before["stop_screen_size_at"] // 2
    assert model.sh_degree_interval == before["sh_degree_interval"] // 2
    assert model.resolution_schedule == before["resolution_schedule"] // 2
    assert model.reset_alpha_every == 30  # counts refinements: follows refine_every
    means = config.optimizers["means"]["scheduler"]
    assert means.max_steps == 15000
    camera = config.optimizers["camera_opt"]["scheduler"]
    assert (camera.max_steps, camera.warmup_steps) == (15000, 500)
    assert config.steps_per_save == 1000
    assert {"max_num_iterations", "pipeline.model.refine_every"} <= names
    assert "optimizers.means.scheduler.max_steps" in names
    assert bs.convert_trainer_config(_method_config(), 1) == []  # one view per step: as is
    assert bs.interval_steps(1, 4) == 1 and bs.interval_steps(0, 4) == 0
    assert bs.threshold_steps(6, 4) == 2 and bs.budget_steps(6, 4) == 2


def _structural_views(config, num_train_views: int, batch: int) -> tuple[list[int], list[int]]:
    """(refine, reset) view counts (first view of the step: step * batch) of a run whose
    config is ``config`` read in views, on ``batch`` views per step; the strategy built as
    odin_ns.model builds it."""
    from gsplat.strategy import DefaultStrategy

    from odin_ns.distributed import batch_schedule as bs
    from odin_ns.distributed.densify import ReplicatedDensifier

    config = copy.deepcopy(config)
    total = config.max_num_iterations
    if batch > 1:
        bs.convert_trainer_config(config, batch)
    m = config.pipeline.model
    strategy = DefaultStrategy(
        refine_start_iter=m.warmup_length,
        refine_stop_iter=m.stop_split_at,
        reset_every=m.reset_alpha_every * m.refine_every,
        refine_every=m.refine_every,
        pause_refine_after_reset=num_train_views + m.refine_every,
        refine_scale2d_stop_iter=m.stop_screen_size_at,
    )
    if batch > 1:
        strategy.pause_refine_after_reset = bs.pause_refine_after_reset_steps(
            num_train_views, m.refine_every, batch
        )
    d = ReplicatedDensifier(strategy, {}, seed=0)
    steps = range(config.max_num_iterations)
    assert len(steps) * batch >= total
    refine = [s * batch for s in steps if d.is_refine_step(s)]
    reset = [s * batch for s in steps if d.is_reset_step(s)]
    return refine, reset


@pytest.mark.parametrize("batch", [2, 4])
def test_refine_and_reset_at_the_same_view_counts(batch):
    config = _method_config()  # splatfacto's schedule: warm-up 500, refine 100, reset 3000
    config.max_num_iterations = 30000
    single = _structural_views(config, num_train_views=200, batch=1)
    batched = _structural_views(config, num_train_views=200, batch=batch)
    assert single[0] and single[1]
    assert batched == single


@pytest.mark.parametrize("batch", [2, 4])
def test_learning_rate_at_the_same_view_counts(batch):
    from nerfstudio.engine.optimizers import Optimizers

    from odin_ns.distributed import batch_schedule as bs
    from odin_ns.distributed.optimizer_binding import learning_rate_at

    config = _method_config()
    converted = copy.deepcopy(config)
    bs.convert_trainer_config(converted, batch)

    def lr(cfg, step):
        params = {"means": [torch.nn.Parameter(torch.zeros(2, 3))]}
        return learning_rate_at(Optimizers({"means": cfg.optimizers["means"]}, params), "means")(
            step
        )

    for views in (0, 1000, 12000, 30000):
        assert lr(converted, views // batch) == pytest.approx(lr(config, views), rel=1e-9)


# ------------------------------------------------------------------------- real runs
B2 = [
    *("--max-num-iterations", "80", "--pipeline.views-per-rank", "2"),
    *("--pipeline.model.warmup-length", "8", "--pipeline.model.refine-every", "24"),
]
VIEWS_40 = [
    *("--max-num-iterations", "40"),
    *("--pipeline.model.warmup-length", "8", "--pipeline.model.refine-every", "8"),
]


@pytest.fixture(scope="module")
def runs(street_scene, fork_server, tmp_path_factory) -> dict[str, RunResult]:
    """The module's real runs side by side (timing never matters to what they check):

    - ``barrier`` / ``quality-first`` / ``sharded``: B = 2, 2 ranks, 80 views;
    - ``views``: 2 ranks, 40 views, the schedule in views;
    - ``one``: one process (``ns-train``), B = 2, 40 views.
    """
    out = tmp_path_factory.mktemp("batch")
    variants = {
        "barrier": [*B2, "--pipeline.sync.mode", "barrier"],
        "quality-first": [*B2, "--pipeline.sync.mode", "quality-first"],
        "sharded": [*B2, "--pipeline.sync.mode", "quality-first", "--pipeline.parallel", "sharded"],
        "views": VIEWS_40,
    }
    jobs = [
        TrainJob(
            name,
            train_command(data=street_scene, out=out, ranks=2, experiment="batch", name=name,
                          flags=[*SMALL, *extra]),
            run_dir(out, "batch", name),
        )
        for name, extra in variants.items()
    ]  # fmt: skip
    one = [
        str(BIN / "ns-train"), "odin-splatfacto", "--data", str(street_scene),
        "--output-dir", str(out), "--experiment-name", "batch", "--timestamp", "one",
        *SMALL, *VIEWS_40, "--pipeline.views-per-rank", "2",
    ]  # fmt: skip
    jobs.append(TrainJob("one", one, run_dir(out, "batch", "one"), env=run_env(None)))
    return train_side_by_side(jobs, out / "logs", server=fork_server)


def _final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return {k: v for k, v in state.items() if "gauss_params" in k}


def _final_moments(run_dir: Path) -> dict[tuple[str, str], torch.Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["optimizers"]
    return {
        (name, moment): opt["state"][0][moment]
        for name, opt in state.items()
        if opt["state"]
        for moment in ("exp_avg", "exp_avg_sq")
    }


@pytest.mark.slow
def test_two_views_per_rank_quality_first_equals_barrier(runs):
    """B = 2, 2 ranks, 20 optimizer steps (80 views) across densifications: quality-first,
    replicated and sharded, ends bitwise equal to barrier (parameters; the sharded run's
    merged checkpoint also its Adam moments)."""
    runs = {name: runs[name].check() for name in ("barrier", "quality-first", "sharded")}
    barrier = _final_params(runs["barrier"])
    for name in ("quality-first", "sharded"):
        params = _final_params(runs[name])
        assert barrier.keys() == params.keys()
        for key in barrier:
            assert torch.equal(params[key], barrier[key]), (name, key)
    moments = {name: _final_moments(runs[name]) for name in ("barrier", "sharded")}
    assert moments["barrier"].keys() == moments["sharded"].keys()
    for key, value in moments["barrier"].items():
        assert torch.equal(moments["sharded"][key], value), key
    sharded = json.loads((runs["sharded"] / "odin_run.json").read_text())["ranks"]
    assert {p["views_per_rank"] for p in sharded[0]["phases"]} == {2}
    assert len({p["num_gaussians"] for p in sharded[0]["phases"]}) > 1
    summary = json.loads((runs["quality-first"] / "odin_run.json").read_text())
    ranks = summary["ranks"]
    assert ranks[0]["replica_hash"] == ranks[1]["replica_hash"]
    assert len(ranks[0]["steps"]) == 20
    assert {p["views_per_rank"] for p in ranks[0]["phases"]} == {2}
    # densified at steps 12 and 18 (views 48, 72: refine every 24 views, pause 16 + 24 after
    # the step-0 reset)
    assert len({p["num_gaussians"] for p in ranks[0]["phases"]}) > 1


@pytest.mark.slow
def test_two_ranks_train_v_views_in_v_over_2_steps(runs):
    """Schedule in views (the default): 40 views on 2 ranks = 20 steps; refine every 8
    views after an 8-view warm-up and a pause of 16 + 8 views after the step-0 reset: the
    single-process run refines at views 24 and 32, so the 2-rank run at steps 12 and 16
    (a refine ends a phase: the next phases start at 13 and 17; the step-0 opacity reset
    runs in the first phase)."""
    run = runs["views"].check()
    ranks = json.loads((run / "odin_run.json").read_text())["ranks"]
    assert [len(r["steps"]) for r in ranks] == [20, 20]
    assert [s["step"] for s in ranks[0]["steps"]] == list(range(20))
    starts = [p["start_step"] for p in ranks[0]["phases"]]
    assert starts == [0, 13, 17], starts  # 12, 16: refine (the step-0 reset: in phase)

    config = _method_config()
    config.max_num_iterations = 40
    config.pipeline.model.warmup_length = 8
    config.pipeline.model.refine_every = 8
    refine, _ = _structural_views(config, num_train_views=16, batch=1)
    assert refine == [24, 32]
    assert _structural_views(config, num_train_views=16, batch=2)[0] == refine
    log = "\n".join(runs["views"].lines)
    assert "max_num_iterations" in log and "40 -> 20" in log


@pytest.mark.slow
def test_one_process_two_views_per_step(runs):
    """One process, B = 2: 40 views in 20 optimizer steps (schedule in views), refining at
    views 24 and 32 as the B = 1 run does (steps 12 and 16), selective Adam on the OR of
    the two views' visible rows."""
    one = runs["one"].check()
    assert "40 -> 20" in "\n".join(runs["one"].lines)
    ckpts = sorted((one / "nerfstudio_models").glob("*.ckpt"))
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)
    assert state["step"] == 19
    means = next(v for k, v in state["pipeline"].items() if k.endswith("gauss_params.means"))
    assert means.shape[0] != 16 * 600  # densified (the street cloud has 600 points per view)
