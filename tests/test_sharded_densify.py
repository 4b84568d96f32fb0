"""Owners' grow / prune (odin_ns.distributed.sharded_densify) equals gsplat's on the whole
model, bitwise, for 1-3 owners: same rows in the same global order, same split noise per
Gaussian, same moments. Owners run as threads; the two flag all-reduces are a barrier."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
from gsplat.strategy import DefaultStrategy

from odin_ns.distributed import sharded_densify
from odin_ns.distributed.densify import seeded_global_rng
from odin_ns.distributed.sharded_densify import (
    OwnedRows,
    balance_new_rows,
    grow_and_prune,
    reset_opacities,
)
from odin_ns.model import GAUSSIAN_GROUPS
from odin_ns.schedule.ownership import capacity, random_ownership

SHAPES = {
    "means": (3,),
    "scales": (3,),
    "quats": (4,),
    "features_dc": (3,),
    "features_rest": (15, 3),
    "opacities": (1,),
}


def _model(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(n, *s, generator=g) * 0.5 for k, s in SHAPES.items()}
    params["scales"] = torch.rand(n, 3, generator=g) * 4.0 - 6.0  # log scales around 0.01
    params["opacities"] = torch.randn(n, 1, generator=g) * 2.0
    m = {k: torch.randn(n, *s, generator=g) for k, s in SHAPES.items()}
    v = {k: torch.rand(n, *s, generator=g) for k, s in SHAPES.items()}
    state = {
        "grad2d": torch.rand(n, generator=g) * 0.001,
        "count": torch.randint(0, 4, (n,), generator=g).float(),
        "radii": torch.rand(n, generator=g) * 0.1,
        "scene_scale": 1.0,
    }
    return params, m, v, state


def _strategy() -> DefaultStrategy:
    return DefaultStrategy(
        prune_opa=0.1, grow_grad2d=0.0002, grow_scale3d=0.01, grow_scale2d=0.05,
        prune_scale3d=0.5, prune_scale2d=0.15, refine_scale2d_stop_iter=4000,
        refine_start_iter=20, refine_stop_iter=15000, reset_every=450, refine_every=15,
        pause_refine_after_reset=31, absgrad=False, revised_opacity=False, verbose=False,
    )  # fmt: skip


def _gsplat(params, m, v, state, step, seed):
    p = torch.nn.ParameterDict({k: torch.nn.Parameter(t.clone()) for k, t in params.items()})
    opts = {k: torch.optim.Adam([p[k]], lr=1e-3) for k in p}
    for k in p:
        opts[k].state[p[k]] = {"step": torch.tensor(1.0), "exp_avg": m[k].clone(),
                               "exp_avg_sq": v[k].clone()}  # fmt: skip
    st = {k: (t.clone() if torch.is_tensor(t) else t) for k, t in state.items()}
    strategy = _strategy()
    with seeded_global_rng(seed * 1_000_003 + step):
        strategy._grow_gs(p, opts, st, step)
        strategy._prune_gs(p, opts, st, step)
    moments = {k: (opts[k].state[p[k]]["exp_avg"], opts[k].state[p[k]]["exp_avg_sq"]) for k in p}
    return {k: p[k].data for k in p}, moments


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_owners_grow_and_prune_like_gsplat(monkeypatch, ranks):
    n, step, seed = 3000, 45, 7
    params, m, v, state = _model(n, seed=ranks)
    owner = random_ownership(n, ranks, seed=3)
    barrier = threading.Barrier(ranks)
    flags: dict[int, list] = {}
    lock = threading.Lock()

    def sum_flags(t, group=None):  # the all-reduce, across owner threads
        with lock:
            flags.setdefault(id(barrier), []).append(t.clone())
        barrier.wait()
        total = torch.stack(flags[id(barrier)]).sum(0)
        barrier.wait()
        with lock:
            flags.pop(id(barrier), None)
        barrier.wait()
        return total.numpy()

    rng_lock = threading.Lock()

    @contextlib.contextmanager
    def locked_rng(s):
        with rng_lock, seeded_global_rng(s):
            yield

    monkeypatch.setattr(sharded_densify, "_sum_flags", sum_flags)
    monkeypatch.setattr(sharded_densify, "seeded_global_rng", locked_rng)
    outs: dict[int, tuple] = {}

    def run(q):
        owned = np.flatnonzero(owner == q)
        ids = torch.from_numpy(owned)
        rows = OwnedRows(
            {k: t[ids].clone() for k, t in params.items()},
            {k: t[ids].clone() for k, t in m.items()},
            {k: t[ids].clone() for k, t in v.items()},
        )
        outs[q] = grow_and_prune(_strategy(), state, rows, owned, owner, q, step, seed)

    threads = [threading.Thread(target=run, args=(q,)) for q in range(ranks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ref_params, ref_moments = _gsplat(params, m, v, state, step, seed)
    new_owner = outs[0][1]
    assert new_owner.size == ref_params["means"].shape[0] != n  # the model changed
    for q in range(ranks):
        assert np.array_equal(outs[q][1], new_owner)
        mine = torch.from_numpy(np.flatnonzero(new_owner == q))
        rows = outs[q][0]
        for k in GAUSSIAN_GROUPS:
            assert torch.equal(rows.params[k], ref_params[k][mine]), (q, k)
            assert torch.equal(rows.exp_avg[k], ref_moments[k][0][mine]), (q, k)
            assert torch.equal(rows.exp_avg_sq[k], ref_moments[k][1][mine]), (q, k)


def test_reset_opacities_like_gsplat():
    params, m, v, _ = _model(100, seed=0)
    rows = OwnedRows(
        {k: t.clone() for k, t in params.items()},
        {k: t.clone() for k, t in m.items()},
        {k: t.clone() for k, t in v.items()},
    )
    reset_opacities(rows, 0.1)  # gsplat's DefaultStrategy resets to 2 x prune_opa
    cap = torch.logit(torch.tensor(0.2)).item()
    assert torch.equal(rows.params["opacities"], torch.clamp(params["opacities"], max=cap))
    assert not rows.exp_avg["opacities"].any() and not rows.exp_avg_sq["opacities"].any()
    assert torch.equal(rows.exp_avg["means"], m["means"])


def test_balance_new_rows_caps_every_rank_and_moves_only_new_rows():
    rng = np.random.default_rng(0)
    n, ranks = 5000, 4
    owner = np.where(rng.random(n) < 0.5, 0, rng.integers(1, ranks, n))  # rank 0 overloaded
    is_new = rng.random(n) < 0.6  # rank 0 has more new rows than its excess
    prefer = rng.integers(0, 5, (ranks, n))
    out = balance_new_rows(owner, is_new, prefer)
    assert np.bincount(out, minlength=ranks).max() <= capacity(n, ranks)
    assert (out[~is_new] == owner[~is_new]).all()  # old rows (with moments) never move
    assert np.array_equal(out, balance_new_rows(owner, is_new, prefer))  # deterministic
    balanced = np.arange(n) % ranks  # every rank under the cap: nothing moves
    assert np.array_equal(balance_new_rows(balanced, is_new, None), balanced)
