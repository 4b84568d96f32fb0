"""The replicated densifiers against gsplat 1.4.0's own strategies (public API only).

``ReplicatedDensifier`` is the one adapter over gsplat's private strategy functions; these
tests pin it: its per-step statistics over a footprint-restricted render equal what
``DefaultStrategy.step_post_backward`` accumulates from a full render, and its structural
change equals ``step_post_backward``'s at a refine step, bit for bit. ``MCMCDensifier``'s
relocation and sampling equal ``MCMCStrategy.step_post_backward``'s, bit for bit.
"""

from __future__ import annotations

import math

import gsplat
import numpy as np
import pytest
import torch
from gsplat.strategy import DefaultStrategy, MCMCStrategy
from gsplat.strategy import ops as gsplat_ops
from harness.toy import spawn_ranks

from odin_ns.distributed.densify import (
    MCMCDensifier,
    ReplicatedDensifier,
    compute_relocation_torch,
    make_densifier,
    next_phase_end,
    seeded_global_rng,
)
from odin_ns.distributed.phase import PhaseController

N = 400
SEED = 7


def test_pinned_gsplat_version():
    assert gsplat.__version__ == "1.4.0", "ReplicatedDensifier is pinned to gsplat 1.4.0"


def _strategy(absgrad: bool) -> DefaultStrategy:
    return DefaultStrategy(
        prune_opa=0.05,
        grow_grad2d=2e-4,
        grow_scale3d=0.01,
        refine_start_iter=2,
        refine_stop_iter=1000,
        refine_every=5,
        reset_every=30,
        pause_refine_after_reset=0,
        refine_scale2d_stop_iter=1000,
        absgrad=absgrad,
        verbose=False,
    )


def _params(gen: torch.Generator) -> torch.nn.ParameterDict:
    return torch.nn.ParameterDict(
        {
            "means": torch.randn(N, 3, generator=gen),
            "scales": torch.randn(N, 3, generator=gen) * 0.5 - 3.0,
            "quats": torch.randn(N, 4, generator=gen),
            "opacities": torch.randn(N, generator=gen),
            "colors": torch.rand(N, 3, generator=gen),
        }
    )


def _optimizers(params) -> dict[str, torch.optim.Optimizer]:
    opts = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for k, p in params.items():  # give every optimizer moments, as after a step
        p.grad = torch.ones_like(p)
        opts[k].step()
        p.grad = None
    return opts


def _clone(params: torch.nn.ParameterDict) -> torch.nn.ParameterDict:
    return torch.nn.ParameterDict({k: p.detach().clone() for k, p in params.items()})


def _infos(gen: torch.Generator, rows: torch.Tensor, absgrad: bool, width=64, height=48):
    """A full render's info and the same render restricted to ``rows`` (radii 0 elsewhere)."""
    grad = torch.randn(1, N, 2, generator=gen) * 1e-3
    radii = (torch.rand(1, N, generator=gen) * 20).to(torch.int32)
    outside = torch.ones(N, dtype=torch.bool)
    outside[rows] = False
    radii[:, outside] = 0
    grad[:, outside] = 0.0
    full_means2d = torch.zeros(1, N, 2)
    sub_means2d = torch.zeros(1, rows.numel(), 2)
    for t, g in ((full_means2d, grad), (sub_means2d, grad[:, rows])):
        t.grad = g.clone()
        t.absgrad = g.abs()
    common = {"width": width, "height": height, "n_cameras": 1, "gaussian_ids": None}
    full = dict(common, means2d=full_means2d, radii=radii)
    sub = dict(common, means2d=sub_means2d, radii=radii[:, rows])
    return full, sub


@pytest.mark.parametrize("absgrad", [False, True])
def test_accumulate_equals_gsplat_update_state(absgrad):
    gen = torch.Generator().manual_seed(0)
    params = _params(gen)
    strategy = _strategy(absgrad)
    theirs = strategy.initialize_state()
    ours = ReplicatedDensifier(strategy, strategy.initialize_state(), SEED)
    opts = _optimizers(params)
    for step in (1, 3, 4):  # not refine steps: step_post_backward only accumulates
        rows = torch.randperm(N, generator=gen)[: N // 3].sort().values
        full, sub = _infos(gen, rows, absgrad)
        strategy.step_post_backward(params, opts, theirs, step, full)
        ours.accumulate(step, sub, rows, N)
    for key in ("grad2d", "count", "radii"):
        assert torch.equal(ours.state[key], theirs[key]), key


def test_apply_equals_gsplat_refine_step():
    gen = torch.Generator().manual_seed(1)
    base = _params(gen)
    strategy = _strategy(absgrad=False)
    rows = torch.arange(0, N, 2)
    full, sub = _infos(gen, rows, absgrad=False)
    full["means2d"].grad *= 50.0  # large gradients: some Gaussians grow
    sub["means2d"].grad *= 50.0
    step = 10
    assert _strategy(False).refine_every == 5

    theirs_params = _clone(base)
    theirs_opts = _optimizers(theirs_params)
    theirs_state = strategy.initialize_state()
    with seeded_global_rng(SEED * 1_000_003 + step):
        strategy.step_post_backward(theirs_params, theirs_opts, theirs_state, step, full)

    ours_params = _clone(base)
    ours_opts = _optimizers(ours_params)
    densifier = ReplicatedDensifier(strategy, strategy.initialize_state(), SEED)
    assert densifier.is_structural(step) and densifier.is_refine_step(step)
    densifier.accumulate(step, sub, rows, N)
    before = _clone(ours_params)  # after the optimizers' first step
    parents = densifier.apply(step, ours_params, ours_opts)

    assert ours_params["means"].shape[0] != N, "the case must change the Gaussian count"
    for key in base:
        assert torch.equal(ours_params[key], theirs_params[key]), key
        mine = ours_opts[key].state[ours_params[key]]
        ref = theirs_opts[key].state[theirs_params[key]]
        assert torch.equal(mine["exp_avg"], ref["exp_avg"]), key
    for key in ("grad2d", "count", "radii"):
        assert torch.equal(densifier.state[key], theirs_state[key]), key
    assert set(densifier.state) == set(theirs_state)  # the parent counter does not stay

    # Each row's parent: kept and duplicated rows are bitwise their parent; split children
    # keep its rotation and colour, with scales 1/1.6 of its and means drawn around it.
    m = ours_params["means"].shape[0]
    assert parents.shape == (m,) and parents.dtype == np.int64
    assert 0 <= parents.min() and parents.max() < N
    same = (ours_params["means"] == before["means"][parents]).all(1)
    kinds = torch.bincount(torch.from_numpy(parents), minlength=N)
    assert 0 < int(same.sum()) < m, "kept rows and split children"
    assert int((kinds == 2).sum()) > 0  # a duplicated or a split parent has two rows
    for key in ("quats", "opacities", "colors"):
        assert torch.equal(ours_params[key], before[key][parents]), key
    child = ~same
    expected = before["scales"][parents][child] - math.log(1.6)
    assert torch.allclose(ours_params["scales"][child], expected, atol=1e-6)


def statistics_rank(rank: int, world_size: int) -> dict:
    """One of two ranks: its own statistics (rank-dependent), a reset-only step 0, then a
    refine step 5; the statistics each step leaves, and the sum the refine saw."""
    gen = torch.Generator().manual_seed(2)
    params = _params(gen)
    opts = _optimizers(params)
    strategy = _strategy(absgrad=False)
    densifier = ReplicatedDensifier(strategy, strategy.initialize_state(), SEED)
    assert densifier.is_reset_step(0) and not densifier.is_refine_step(0)
    assert densifier.is_refine_step(5)
    densifier.ensure_state(N, torch.device("cpu"))
    own = torch.arange(N, dtype=torch.float32) * (rank + 1) * 1e-6  # below the grow threshold
    densifier.state["grad2d"] += own
    densifier.state["count"] += rank + 1
    densifier.apply(0, params, opts)
    after_reset = {k: densifier.state[k].clone() for k in ("grad2d", "count")}
    seen = {}
    real = strategy._grow_gs

    def grow(params, optimizers, state, step):  # record what the refine reads
        seen.update({k: state[k].clone() for k in ("grad2d", "count")})
        return real(params, optimizers, state, step)

    strategy._grow_gs = grow
    densifier.apply(5, params, opts)
    return {"own": own, "after_reset": after_reset, "refine_saw": seen}


def test_statistics_are_summed_once_at_the_refine_not_at_a_reset(tmp_path):
    """A reset-only structural step leaves every rank its own statistics; the next refine
    reads their plain sum (summing at the reset too would count those steps R times)."""
    codes, results, errors, _ = spawn_ranks(statistics_rank, 2, tmp_path, timeout_s=120)
    assert codes == [0, 0], errors
    for rank, res in enumerate(results):
        assert torch.equal(res["after_reset"]["grad2d"], res["own"])
        assert torch.equal(res["after_reset"]["count"], torch.full((N,), float(rank + 1)))
        assert torch.equal(res["refine_saw"]["grad2d"], results[0]["own"] + results[1]["own"])
        assert torch.equal(res["refine_saw"]["count"], torch.full((N,), 3.0))


def test_schedule_matches_gsplat_conditions():
    strategy = _strategy(absgrad=False)
    densifier = ReplicatedDensifier(strategy, strategy.initialize_state(), SEED)
    for step in range(0, 200):
        refine = (
            step > strategy.refine_start_iter
            and step % strategy.refine_every == 0
            and step % strategy.reset_every >= strategy.pause_refine_after_reset
        )
        assert densifier.is_refine_step(step) == refine
        assert densifier.is_reset_step(step) == (step % strategy.reset_every == 0)
    assert next_phase_end(densifier, 6, 100) == 10
    assert next_phase_end(densifier, 11, 14) is None
    # step 0 resets opacities only: structural, but the phase (and its plan) runs on
    assert densifier.is_structural(0) and not densifier.ends_phase(0)
    assert next_phase_end(densifier, 0, 5) is None


def test_phase_boundary_is_the_first_refine_or_checkpoint_step():
    strategy = _strategy(absgrad=False)  # refines at 5, 10, 15, ...; step 0 resets only
    densifier = ReplicatedDensifier(strategy, strategy.initialize_state(), SEED)
    phases = PhaseController(0, 1, SEED, "odin", max_phase_steps=8, margin_px=0.0)
    assert phases.boundary(6, densifier, checkpoint_every=0) == 10  # the refine
    assert phases.boundary(6, densifier, checkpoint_every=7) == 7  # the checkpoint first
    assert phases.boundary(0, densifier, checkpoint_every=3) == 3  # k >= 1: never step 0
    assert phases.boundary(0, densifier, checkpoint_every=0) == 5  # not the step-0 reset
    short = PhaseController(0, 1, SEED, "odin", max_phase_steps=4, margin_px=0.0)
    assert short.boundary(11, densifier, checkpoint_every=0) is None  # 15 is the stop
    assert short.boundary(11, densifier, checkpoint_every=14) == 14
    assert short.boundary(11, densifier, checkpoint_every=15) is None


def test_reset_in_place_equals_gsplat_reset_opa():
    """A reset-only step's in-place reset: the values gsplat's ``reset_opa`` gives (opacities
    clamped, their moments zeroed, other groups untouched) on the same tensor objects."""
    gen = torch.Generator().manual_seed(3)
    strategy = _strategy(absgrad=False)
    theirs = _params(gen)
    ours = _clone(theirs)
    before = theirs["opacities"].detach().clone()
    theirs_opts, ours_opts = _optimizers(theirs), _optimizers(ours)  # moments to reset
    gsplat_ops.reset_opa(theirs, theirs_opts, {}, value=strategy.prune_opa * 2.0)
    assert not torch.equal(theirs["opacities"], before), "the case must clamp some rows"
    tensor = ours["opacities"]
    moment = ours_opts["opacities"].state[tensor]["exp_avg"]
    ReplicatedDensifier(strategy, {}, SEED).reset_in_place(ours, ours_opts)
    assert ours["opacities"] is tensor and ours_opts["opacities"].state[tensor]["exp_avg"] is moment
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
        mine, ref = ours_opts[key].state[ours[key]], theirs_opts[key].state[theirs[key]]
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(mine[name], ref[name]), (key, name)


def test_seeded_rng_restores_the_global_stream():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with seeded_global_rng(5):
        inside = torch.rand(3)
    with seeded_global_rng(5):
        assert torch.equal(torch.rand(3), inside)
    assert torch.equal(torch.rand(3), expected)


# ------------------------------------------------------------------ MCMC


def _mcmc_strategy(cap_max: int) -> MCMCStrategy:
    return MCMCStrategy(
        cap_max=cap_max, refine_start_iter=2, refine_stop_iter=1000, refine_every=5,
        min_opacity=0.05,
    )  # fmt: skip


def _mcmc_params(gen: torch.Generator) -> torch.nn.ParameterDict:
    params = _params(gen)
    params["opacities"] = torch.randn(N, 1, generator=gen) * 2.0 - 2.0  # some are dead
    return params


@pytest.mark.parametrize("cap_max", [N + 7, 2 * N])
def test_mcmc_apply_equals_gsplat_refine_step(monkeypatch, cap_max):
    """MCMCDensifier.apply (relocate, add) == MCMCStrategy.step_post_backward at a refine
    step, bit for bit, with the noise left out of both (it is tested in test_mcmc.py). On
    CPU both use the torch twin of gsplat's CUDA relocation kernel."""
    import gsplat.strategy.mcmc as gsplat_mcmc

    monkeypatch.setattr(gsplat_mcmc, "inject_noise_to_position", lambda **kwargs: None)
    monkeypatch.setattr(gsplat_ops, "compute_relocation", compute_relocation_torch)
    gen = torch.Generator().manual_seed(2)
    base = _mcmc_params(gen)
    strategy = _mcmc_strategy(cap_max)
    step = 10
    dead = int((torch.sigmoid(base["opacities"]) <= strategy.min_opacity).sum())
    assert 0 < dead < N, "the case must relocate some Gaussians"

    theirs_params = _clone(base)
    theirs_opts = _optimizers(theirs_params)
    with seeded_global_rng(SEED * 1_000_003 + step):
        strategy.step_post_backward(
            theirs_params, theirs_opts, strategy.initialize_state(), step, {}, lr=1e-3
        )

    ours_params = _clone(base)
    ours_opts = _optimizers(ours_params)
    densifier = MCMCDensifier(strategy, strategy.initialize_state(), SEED)
    assert densifier.is_structural(step)
    densifier.apply(step, ours_params, ours_opts)

    assert densifier.last_change == (dead, min(cap_max, int(1.05 * N)) - N)
    assert ours_params["means"].shape[0] == min(cap_max, int(1.05 * N))
    for key in base:
        assert torch.equal(ours_params[key], theirs_params[key]), key
        mine = ours_opts[key].state[ours_params[key]]
        ref = theirs_opts[key].state[theirs_params[key]]
        assert torch.equal(mine["exp_avg"], ref["exp_avg"]), key
        assert torch.equal(mine["exp_avg_sq"], ref["exp_avg_sq"]), key


def test_mcmc_schedule_matches_gsplat_condition():
    strategy = _mcmc_strategy(cap_max=N)
    densifier = MCMCDensifier(strategy, strategy.initialize_state(), SEED)
    for step in range(0, 1100):
        expected = 2 < step < 1000 and step % 5 == 0
        assert densifier.is_structural(step) == expected, step
    assert next_phase_end(densifier, 0, 100) == 5
    assert next_phase_end(densifier, 996, 2000) is None
    assert isinstance(make_densifier(strategy, {}, SEED), MCMCDensifier)
    assert isinstance(make_densifier(_strategy(False), {}, SEED), ReplicatedDensifier)
