"""Ownership rebalance at phase starts (``--pipeline.rebalance``, DESIGN 3.11).

Unit tests of ``ownership.rebalance_ownership``: a carried ownership outside N/R +- 10% is
rebalanced, the fresh assignment is sticky (nothing moves when nothing changed, unread rows
stay), the decision weighs remote-read bytes against migration bytes, and it is
deterministic. End to end (gloo ranks, street scene, across densifications): with
rebalancing at every phase start, rows migrate with their Adam moments and versions, and
the merged checkpoint still equals replicated barrier training's bitwise.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from test_ownership import street_footprints
from test_sharded import _checkpoint

from odin_ns.schedule import build_plan
from odin_ns.schedule.ownership import (
    assign_ownership,
    capacity,
    is_balanced,
    locality_ownership,
    random_ownership,
    rebalance_ownership,
    remote_reads,
    step_read_counts,
)


def _hand_plan(footprints: np.ndarray, views: np.ndarray) -> SimpleNamespace:
    """A plan as ``ownership`` reads it: footprints [V, N] bool, views [T, R, 1]."""
    F = sp.csr_matrix(footprints.astype(bool))
    return SimpleNamespace(
        footprints=F, views=views, num_ranks=views.shape[1], groups=None, assignment="random"
    )


def _two_regions(n: int = 40, steps: int = 4) -> SimpleNamespace:
    """2 views, each reading its half of n rows; rank r trains view r at every step."""
    fp = np.zeros((2, n), dtype=bool)
    fp[0, : n // 2] = True
    fp[1, n // 2 :] = True
    views = np.tile(np.array([0, 1]).reshape(1, 2, 1), (steps, 1, 1))
    return _hand_plan(fp, views)


def test_the_random_baseline_rebalances_to_a_random_deal_never_to_locality():
    plan = _two_regions(n=40, steps=4)
    rand = random_ownership(40, 2, seed=3)
    kept = rebalance_ownership(plan, rand, "auto", strategy="random", seed=3)
    assert not kept.rebalanced and np.array_equal(kept.owner, rand)  # balanced, nothing saved
    skewed = np.zeros(40, dtype=np.int64)  # rank 0 owns everything: out of balance
    d = rebalance_ownership(plan, skewed, "auto", strategy="random", seed=3)
    assert d.reason == "balance" and np.array_equal(d.owner, rand)
    local = rebalance_ownership(plan, skewed, "auto")
    assert np.array_equal(local.owner, np.repeat([0, 1], 20))  # what locality would do
    with pytest.raises(ValueError, match="ownership strategy"):
        rebalance_ownership(plan, rand, "auto", strategy="grendel")


def test_swapped_owners_move_when_reads_outweigh_migration():
    plan = _two_regions(n=40, steps=4)
    owner = np.repeat([1, 0], 20)  # each rank owns the half the other reads
    d = rebalance_ownership(plan, owner, "auto", read_row_bytes=10, migrate_row_bytes=30)
    # every read is remote: 4 steps x 2 ranks x 20 rows, 2 directions x 10 bytes
    assert d.carried_bytes == 2 * 10 * 160 and d.fresh_bytes == 0
    assert d.rebalanced and d.reason == "bytes"
    assert np.array_equal(d.owner, np.repeat([0, 1], 20))
    assert d.moved_rows == 40 and d.migrated_bytes == 40 * 30
    assert d.remote_read_fraction_before == 1.0 and d.remote_read_fraction_after == 0.0
    assert d.report()["saved_bytes"] == 3200 and "owner" not in d.report()
    # the same phase where moving a row costs more than its reads save: kept
    kept = rebalance_ownership(plan, owner, "auto", read_row_bytes=10, migrate_row_bytes=81)
    assert not kept.rebalanced and kept.reason == "kept" and np.array_equal(kept.owner, owner)
    assert kept.moved_rows == 0 and kept.migrated_bytes == 0
    assert kept.fresh_moved_rows == 40 and kept.fresh_migration_bytes == 40 * 81
    assert kept.remote_read_fraction_after == kept.remote_read_fraction_before == 1.0
    # the modes that do not weigh
    assert rebalance_ownership(plan, owner, "always", 10, 10**6).moved_rows == 40
    never = rebalance_ownership(plan, owner, "never", 10, 1)
    assert not never.rebalanced and np.array_equal(never.owner, owner)


def test_unbalanced_owners_are_rebalanced_whatever_the_bytes():
    plan = _two_regions(n=40, steps=1)
    owner = np.zeros(40, dtype=np.int64)
    owner[35:] = 1  # rank 0 owns 35 of 40: outside N/R +- 10%
    assert not is_balanced(owner, 2)
    d = rebalance_ownership(plan, owner, "auto", read_row_bytes=1, migrate_row_bytes=10**6)
    assert d.rebalanced and d.reason == "balance"
    assert is_balanced(d.owner, 2)
    assert np.array_equal(d.owner, np.repeat([0, 1], 20))
    assert d.moved_rows == 15  # rows 20..34, rank 1's region
    # ``never`` leaves it as it is (the knob's promise)
    assert np.array_equal(rebalance_ownership(plan, owner, "never").owner, owner)


def test_sticky_assignment_keeps_unread_rows_and_ties():
    counts = np.array([[2, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]])
    plain = locality_ownership(counts)
    current = np.array([1, 1, 1, 1, 0, 0])
    sticky = locality_ownership(counts, current=current)
    assert plain[1] == 0 and sticky[1] == 1  # a tie goes to the current owner
    assert sticky[0] == 0  # a read count beats the bonus
    assert sticky[2:].tolist() == [1, 1, 0, 0]  # nobody reads them: they stay (room left)
    assert np.bincount(sticky, minlength=2).max() <= capacity(6, 2)
    # the cap still holds when every row would like to stay on one rank
    crowd = locality_ownership(np.zeros((3, 90), np.int64), current=np.zeros(90, np.int64))
    assert is_balanced(crowd, 3) and (np.bincount(crowd) <= capacity(90, 3)).all()


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_street_scene_no_moves_when_nothing_changed_and_balance(street_scene, ranks):
    F = street_footprints(street_scene)
    plan = build_plan(F, ranks, 40, seed=0)
    owner = assign_ownership(plan)
    for mode in ("always", "auto"):
        d = rebalance_ownership(plan, owner, mode)
        assert d.fresh_moved_rows == 0 and np.array_equal(d.owner, owner), mode
    # a later phase: a different epoch of a re-seeded plan, from a badly carried ownership
    later = build_plan(F, ranks, 15, seed=5, epoch=3)
    carried = np.roll(owner, F.shape[1] // 3)  # regions no longer match the streams
    d = rebalance_ownership(later, carried, "auto")
    assert d.rebalanced and d.reason in ("bytes", "balance")
    assert is_balanced(d.owner, ranks)
    assert d.remote_read_fraction_after < d.remote_read_fraction_before
    steps = step_read_counts(later)
    assert d.carried_bytes == 2 * 4 * 59 * remote_reads(steps, carried)
    assert d.migrated_bytes == d.moved_rows * (3 * 4 * 59 + 8)
    assert d.carried_bytes - d.fresh_bytes > d.migrated_bytes
    again = rebalance_ownership(later, carried, "auto")  # deterministic
    assert np.array_equal(again.owner, d.owner) and again.report() == d.report()


def test_bad_mode():
    with pytest.raises(ValueError, match="rebalance mode"):
        rebalance_ownership(_two_regions(), np.zeros(40, np.int64), "sometimes")


# ---------------------------------------------------------------- end to end (gloo ranks)
@pytest.fixture(scope="module")
def rebalance_runs(street_runs_2, street_runs_3):
    """The session's shared runs (tests/harness/street_runs.py): replicated barrier and
    sharded quality-first rebalancing at every phase start (3 ranks: from a random deal)."""
    return {
        (2, "replicated"): street_runs_2["barrier"],
        (2, "sharded"): street_runs_2["sharded-rebalance"],
        (3, "replicated"): street_runs_3["barrier"],
        (3, "sharded"): street_runs_3["sharded-rebalance"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_rebalanced_checkpoint_equals_replicated_barrier(rebalance_runs, ranks):
    rep = _checkpoint(rebalance_runs[ranks, "replicated"])
    shard = _checkpoint(rebalance_runs[ranks, "sharded"])
    assert rep["step"] == shard["step"]
    keys = [k for k in rep["pipeline"] if "gauss_params" in k]
    assert len(keys) == 6
    for key in keys:
        assert torch.equal(shard["pipeline"][key], rep["pipeline"][key]), key  # bitwise
    moments = 0
    for name, opt in rep["optimizers"].items():
        if opt["state"]:
            for moment in ("exp_avg", "exp_avg_sq"):
                a, b = opt["state"][0][moment], shard["optimizers"][name]["state"][0][moment]
                assert torch.equal(a, b), (name, moment)
                moments += 1
    assert moments == 12

    summary = json.loads((rebalance_runs[ranks, "sharded"] / "odin_run.json").read_text())
    phases = summary["ranks"][0]["phases"]
    assert len({p["num_gaussians"] for p in phases}) > 1  # crossed a densification
    reports = summary["ranks"][0]["ownership"]
    later = [r["rebalance"] for r in reports[1:]]
    assert later and all(r["mode"] == "always" and r["rebalanced"] for r in later)
    assert sum(r["moved_rows"] for r in later) > 0  # rows (with moments) actually moved
    for r in summary["ranks"][1:]:  # every rank recorded the same decisions
        assert [x["rebalance"] for x in r["ownership"][1:]] == later
    n = rep["pipeline"]["_model.gauss_params.means"].shape[0]
    owned = [r["owned_rows"] for r in summary["ranks"]]
    assert sum(owned) == n and max(owned) <= 1.1 * n / ranks, owned
    for report in reports[1:]:
        assert 0.9 <= report["owned_rows_min_over_fair"] <= 1.0, report
        assert report["owned_rows_max_over_fair"] <= 1.1, report
