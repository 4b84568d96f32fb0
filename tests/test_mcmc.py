"""odin-splatfacto-mcmc: counter-based noise, lazy == eager, cap_max, quality-first == barrier.

The MCMC strategy perturbs every Gaussian's mean every step. Odin draws the noise as a
pure function of (seed, step, Gaussian id) and applies it lazily, per row, in version order
with the row's Adam updates (``odin_ns.distributed.mcmc_noise``). These tests show the draw
is gsplat's formula and independent of how rows are batched, that lazy catch-up gives the
eager bits, that relocation respects ``cap_max``, that 2- and 3-rank quality-first training
equals barrier training bit for bit across two relocation steps, and that the dependency
table is the one the footprints imply (the noise adds no dependency rows).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.fork_server import ForkServer
from harness.runs import TrainJob, train_side_by_side

from odin_ns.bench.commands import run_dir, run_env
from odin_ns.distributed.densify import MCMCDensifier
from odin_ns.distributed.mcmc_noise import (
    MCMCNoise,
    catch_up_noise_,
    counter_hash,
    counter_normal,
    noise_basis,
    noise_from_basis,
)

BIN = Path(sys.executable).parent
_M64 = (1 << 64) - 1


def _mix_ref(x: int) -> int:
    x &= _M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _hash_ref(seed: int, step: int, pid: int, c: int) -> int:
    key = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _M64
    return _mix_ref(_mix_ref(((step * 4 + c) & _M64) ^ key) + pid * 0x9E3779B97F4A7C15)


def test_counter_hash_is_splitmix64_over_int64():
    steps = torch.tensor([0, 1, 7, 29_999, 123_456])
    ids = torch.tensor([0, 5, 99_999, 2**40 + 3, 12])
    for c in range(3):
        got = counter_hash(11, steps, ids, c)
        for i in range(steps.numel()):
            assert int(got[i]) & _M64 == _hash_ref(11, int(steps[i]), int(ids[i]), c)


def test_counter_normal_is_standard_normal_and_independent_of_batching():
    n = 200_000
    z = counter_normal(3, torch.randint(0, 30_000, (n,)), torch.arange(n))
    assert z.dtype == torch.float64 and z.shape == (n, 3)
    assert z.mean(0).abs().max() < 0.01
    assert (z.std(0) - 1).abs().max() < 0.01
    assert (z[:, 0] * z[:, 1]).mean().abs() < 0.01
    assert ((z.abs() > 3).double().mean() - 0.0027).abs() < 0.0005  # normal tails
    # a row's draw does not depend on which rows share the call (vectorized vs tail loops)
    ids, steps = torch.arange(1000), torch.full((1000,), 5)
    full = counter_normal(3, steps, ids)
    for lo, hi in ((7, 20), (0, 1), (993, 1000), (3, 900)):
        assert torch.equal(counter_normal(3, steps[lo:hi], ids[lo:hi]), full[lo:hi])
    assert not torch.equal(counter_normal(4, steps, ids), full)
    assert not torch.equal(counter_normal(3, steps + 1, ids), full)


def _gaussians(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "means": torch.randn(n, 3, generator=gen),
        "scales": torch.randn(n, 3, generator=gen) * 0.5 - 2.0,
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.randn(n, 1, generator=gen) * 2.0 - 4.0,
    }


def test_noise_is_gsplats_formula(monkeypatch):
    """Same numbers as gsplat's ``inject_noise_to_position`` given the same normal draw
    (gsplat's CUDA covariance swapped for its own torch implementation on CPU)."""
    import gsplat.strategy.ops as gsplat_ops
    from gsplat.cuda._torch_impl import _quat_scale_to_covar_preci

    gen = torch.Generator().manual_seed(0)
    params = _gaussians(500, gen)
    z = counter_normal(1, torch.full((500,), 9), torch.arange(500))
    scaler = 1.6e-4 * 5e5
    ours = noise_from_basis(
        noise_basis(params["scales"], params["quats"], params["opacities"]),
        z,
        torch.full((500,), scaler, dtype=torch.float64),
    )
    monkeypatch.setattr(gsplat_ops, "quat_scale_to_covar_preci", _quat_scale_to_covar_preci)
    monkeypatch.setattr(torch, "randn_like", lambda t: z.to(t.dtype))
    theirs = {k: v.clone() for k, v in params.items()}
    gsplat_ops.inject_noise_to_position(theirs, {}, {}, scaler=scaler)
    expected = theirs["means"] - params["means"]
    assert ours.abs().max() > 1e-4  # the case has noise that matters
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-6)


def _simulate(schedule: str, steps: int = 40, n: int = 300) -> dict[str, torch.Tensor]:
    """A toy replica under the runtime's order: per step an Adam-like write of a random row
    set (and at steps 13 and 27 a structural change that appends rows); eager adds every
    row's noise after every step, lazy only around writes (``before_apply`` /
    ``after_apply``), before random reads, and at the end (a drain)."""
    gen = torch.Generator().manual_seed(5)
    params = _gaussians(n, gen)
    structural = {13, 27}
    noise = MCMCNoise(params, noise_lr=5e5, seed=9, num_rows=n, skip_step=structural.__contains__)
    noise.lr_at = lambda s: 1.6e-4 * 0.99**s
    for s in range(steps):
        rows = params["means"].shape[0]
        written = torch.randperm(rows, generator=gen)[: rows // 4].sort().values
        read = torch.randperm(rows, generator=gen)[: rows // 3].sort().values
        deltas = {
            k: torch.randn(written.numel(), *params[k].shape[1:], generator=gen) * 0.05
            for k in params
        }
        if schedule == "lazy":
            noise.catch_up(read, s - 1)  # a rank about to render reads these rows
            noise.before_apply(s, written)
        for key, delta in deltas.items():  # the step's update of the written rows
            params[key][written] += delta
        if schedule == "lazy":
            noise.after_apply(s, written)
        if s in structural:  # what MCMCDensifier.apply does around relocation / sampling
            noise.catch_up_all(s - 1)
            extra = {k: v[: rows // 10].clone() for k, v in params.items()}
            for key in params:
                params[key] = torch.cat([params[key], extra[key]])
            noise.resize(params["means"].shape[0], s - 1)
            noise.catch_up_all(s)
        elif schedule == "eager":
            noise.catch_up_all(s)
    noise.catch_up_all(steps - 1)
    return params


def test_lazy_noise_equals_eager_bitwise():
    eager, lazy = _simulate("eager"), _simulate("lazy")
    for key in eager:
        assert torch.equal(eager[key], lazy[key]), key


def test_rows_equally_behind_get_the_bits_of_the_sorted_pairs():
    """Rows all as far behind (eager noise, an apply's rows) take a catch-up without the
    sort by step; their noise is the same, bit for bit, as where one more row lagging less
    sends the catch-up through the sort."""
    params = _gaussians(40, torch.Generator().manual_seed(2))
    rows = torch.arange(1, 40)
    out = []
    for extra in (False, True):
        means = {k: v.detach().clone() for k, v in params.items()}
        version = torch.zeros(40, dtype=torch.int64)
        version[0] = 2  # lags 1 step at through = 3; the others 3
        ids = torch.cat([torch.tensor([0]), rows]) if extra else rows
        catch_up_noise_(means, version, ids, 3, lambda s: 1e-3 * s, seed=5)
        assert version[rows].eq(3).all()
        out.append(means["means"][rows])
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], params["means"][rows])


def test_lazy_noise_refuses_to_overtake_an_update():
    params = _gaussians(10, torch.Generator().manual_seed(1))
    noise = MCMCNoise(params, noise_lr=5e5, seed=0, num_rows=10)
    noise.lr_at = lambda s: 1e-4
    noise.catch_up(torch.arange(5), 4)
    with pytest.raises(RuntimeError, match="before step"):
        noise.before_apply(3, torch.tensor([2]))


def _optimizers(params):
    opts = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for p, opt in zip(params.values(), opts.values(), strict=True):
        p.grad = torch.ones_like(p)
        opt.step()
        p.grad = None
    return opts


def test_relocation_keeps_the_count_at_or_under_cap_max():
    from gsplat.strategy import MCMCStrategy

    gen = torch.Generator().manual_seed(3)
    params = torch.nn.ParameterDict(_gaussians(400, gen))
    params["opacities"].data = torch.randn(400, 1, generator=gen) * 2.0 - 3.0
    opts = _optimizers(params)
    strategy = MCMCStrategy(cap_max=450, refine_start_iter=0, refine_every=1, min_opacity=0.05)
    noise = MCMCNoise(params, noise_lr=5e5, seed=0, num_rows=400)
    noise.lr_at = lambda s: 1e-4
    densifier = MCMCDensifier(strategy, strategy.initialize_state(), seed=1, noise=noise)
    counts, relocated = [], 0
    for step in range(1, 8):
        densifier.apply(step, params, opts)
        counts.append(params["means"].shape[0])
        relocated += densifier.last_change[0]
        assert noise.version.tolist() == [step] * counts[-1]
        for key, opt in opts.items():  # the optimizers follow the new parameters
            assert opt.param_groups[0]["params"][0] is params[key]
    assert counts == [420, 441, 450, 450, 450, 450, 450]
    assert relocated > 0


# ------------------------------------------------------------------ training runs

TRAINING = {
    "--vis": "tensorboard",
    "--steps-per-eval-all-images": "0",
    "--steps-per-eval-image": "0",
    "--steps-per-save": "1000",
    "--pipeline.model.num-downscales": "0",
    "--pipeline.model.warmup-length": "2",
    "--pipeline.model.refine-every": "4",
    "--pipeline.model.cap-max": "1250",
    "--pipeline.model.random-init": "True",
    "--pipeline.model.num-random": "1100",
    "--pipeline.model.init-opacity": "0.03",
    "--pipeline.model.mcmc-min-opacity": "0.02",
}
CAP_MAX = 1250
# Distributed runs count steps, not views, so 2 and 3 ranks share one schedule: 6 steps,
# relocation + sampling at steps 2 and 4, checkpoints after steps 2 and 4 (a checkpoint
# step ends a phase: the phase of steps 3-4 is planned from the step-2 checkpoint's model).
# A Gaussian whose opacity drops one Adam step (lr 0.05 in logit space) from 0.03 is dead.
DISTRIBUTED = {
    "--pipeline.schedule-in-views": "False",
    "--pipeline.model.warmup-length": "1",
    "--pipeline.model.refine-every": "2",
    "--pipeline.model.mcmc-min-opacity": "0.029",
    "--steps-per-save": "2",
    "--save-only-latest-checkpoint": "False",
    # Shuffled steps: the phase of steps 3-4 then reads a peer's previous step (the
    # low-conflict order avoids that), so the dependency check below has rows to compare.
    "--pipeline.plan-step-order": "shuffled",
}
DISTRIBUTED_STEPS = 6
REFINE_STEPS = [2, 4]


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return {k: v for k, v in state.items() if "gauss_params" in k}


def _command(
    data: Path, out: Path, name: str, iterations: int, options: dict[str, str], ranks: int
) -> list[str]:
    launcher = [str(BIN / "ns-train")]
    if ranks > 1:
        port = 29500 + (os.getpid() * 7 + 101 * len(name) + 13 * ranks) % 2000
        launcher = [
            str(BIN / "odin-ns-train"), "--nproc-per-node", str(ranks),
            "--master-port", str(port),
        ]  # fmt: skip
    flags = [x for item in {**TRAINING, **options}.items() for x in item]
    return [
        *launcher, "odin-splatfacto-mcmc", "--data", str(data), "--output-dir", str(out),
        "--experiment-name", "mcmc", "--timestamp", name,
        "--max-num-iterations", str(iterations), *flags,
    ]  # fmt: skip


def _train(
    data: Path,
    out: Path,
    iterations: int,
    ranks: int,
    runs: dict[str, dict[str, str]],
    server: ForkServer,
) -> dict[str, Path]:
    """One run per entry of ``runs`` (name -> options over ``TRAINING``), side by side (their
    parameters never depend on timing), one thread per rank; returns their run folders."""
    jobs = [
        TrainJob(
            name,
            _command(data, out, name, iterations, opts, ranks),
            run_dir(out, "mcmc", name, method="odin-splatfacto-mcmc"),
            env=run_env(threads=1),
        )
        for name, opts in runs.items()
    ]
    return {
        name: r.check() for name, r in train_side_by_side(jobs, out / "logs", server=server).items()
    }


@pytest.mark.slow
def test_single_process_eager_noise_equals_lazy(street_scene, fork_server, tmp_path):
    runs = _train(
        street_scene, tmp_path, 10, ranks=1,
        runs={s: {"--pipeline.model.noise-schedule": s} for s in ("eager", "lazy")},
        server=fork_server,
    )  # fmt: skip
    eager, lazy = _final(runs["eager"]), _final(runs["lazy"])
    assert eager.keys() == lazy.keys()
    for key in eager:
        assert torch.equal(eager[key], lazy[key]), key
    n = eager["_model.gauss_params.means"].shape[0]
    assert 1100 < n <= CAP_MAX  # sampled new Gaussians at refine steps, within the cap


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def sync_mode_runs(request, street_scene, fork_server, tmp_path_factory) -> dict[str, Path]:
    """Barrier and quality-first runs of odin-splatfacto-mcmc on 2 and 3 ranks."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"mcmc_{ranks}ranks")
    modes = ("barrier", "quality-first")
    return _train(
        street_scene, out, DISTRIBUTED_STEPS, ranks,
        runs={m: {**DISTRIBUTED, "--pipeline.sync.mode": m} for m in modes},
        server=fork_server,
    )  # fmt: skip


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "odin_run.json").read_text())


@pytest.mark.slow
def test_quality_first_equals_barrier_across_relocations(sync_mode_runs):
    barrier, quality = _final(sync_mode_runs["barrier"]), _final(sync_mode_runs["quality-first"])
    assert barrier.keys() == quality.keys()
    for key in barrier:
        assert torch.equal(quality[key], barrier[key]), key  # bitwise

    ranks = _summary(sync_mode_runs["quality-first"])["ranks"]
    assert len({r["replica_hash"] for r in ranks}) == 1
    changes = ranks[0]["structural_changes"]
    assert all(r["structural_changes"] == changes for r in ranks)  # replicated decisions
    assert [c["step"] for c in changes] == REFINE_STEPS
    relocations = [c for c in changes if c["relocated"] > 0]
    assert len(relocations) >= 2, changes  # dead Gaussians moved at two refine steps
    assert all(c["added"] > 0 for c in changes)  # and new ones sampled
    counts = [p["num_gaussians"] for p in ranks[0]["phases"]]
    assert len(set(counts)) == len(changes) + 1, counts  # a phase after each refine step
    assert max(counts) <= CAP_MAX and barrier["_model.gauss_params.means"].shape[0] <= CAP_MAX


def _plan_from_checkpoint(run_dir: Path, step: int, num_steps: int):
    """The plan that the footprints of the model checkpointed after ``step`` imply for a
    phase of ``num_steps`` steps starting at ``step + 1`` (rebuilt in this process)."""
    from nerfstudio.utils.eval_utils import eval_setup

    from odin_ns.distributed.phase import local_footprints
    from odin_ns.schedule import PlanOptions, build_plan

    def at_step(config):
        config.load_step = step
        return config

    config, pipeline, ckpt_path, _ = eval_setup(
        run_dir / "config.yml", test_mode="test", update_config_callback=at_step
    )
    resume = torch.load(ckpt_path, map_location="cpu", weights_only=False)["odin"]["phase"]
    cameras = pipeline.datamanager.train_dataset.cameras
    footprints = local_footprints(
        pipeline.model, cameras, np.arange(len(cameras)), config.pipeline.footprint_margin_px
    )
    pending = resume["pending"]
    return build_plan(
        footprints,
        num_ranks=_summary(run_dir)["world_size"],
        num_steps=num_steps,
        views_per_rank=config.pipeline.views_per_rank,
        seed=int(config.pipeline.datamanager.train_cameras_sampling_seed),
        strategy=config.pipeline.plan_strategy,
        epoch=resume["epoch"],
        pending=None if pending is None else np.asarray(pending, dtype=np.int64),
        options=PlanOptions(step_order=config.pipeline.plan_step_order),
    )


@pytest.mark.slow
def test_dependency_table_is_what_the_footprints_imply(sync_mode_runs):
    """The noise writes every row every step, yet adds no dependency: the per-step
    dependency rows the run recorded equal those of the plan rebuilt from the footprints of
    the checkpointed model (the phase of steps 3-4, planned after the step-2 checkpoint)."""
    run_dir = sync_mode_runs["quality-first"]
    summary = _summary(run_dir)
    phase = next(p for p in summary["ranks"][0]["phases"] if p["start_step"] == REFINE_STEPS[0] + 1)
    plan = _plan_from_checkpoint(run_dir, REFINE_STEPS[0], phase["num_steps"])
    executed = min(phase["num_steps"], DISTRIBUTED_STEPS - phase["start_step"])
    checked = 0
    for rank in summary["ranks"]:
        r = rank["rank"]
        for record in rank["steps"]:
            t = record["step"] - phase["start_step"]
            if not 0 <= t < executed:
                continue
            assert record["view"] == int(plan.views[t, r, 0])
            assert record["footprint_rows"] == plan.step_footprint(t, r).size
            assert record["dependency_rows"] == int(plan.dependency_rows[t, r].sum())
            checked += 1
    assert executed == 2 and checked == summary["world_size"] * executed
    assert plan.dependency_rows[1:executed].sum() > 0  # the phase's second step does wait for rows
    # the run's headline figure is the per-step mean of the rows summed over ranks
    per_step: dict[int, int] = {}
    for rank in summary["ranks"]:
        for record in rank["steps"]:
            per_step[record["step"]] = per_step.get(record["step"], 0) + record["dependency_rows"]
    assert len(per_step) == DISTRIBUTED_STEPS
    expected = sum(per_step.values()) / DISTRIBUTED_STEPS
    assert summary["mean_dependency_rows_per_step"] == pytest.approx(expected)
