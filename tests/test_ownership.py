"""Ownership from the AOT plan (odin_ns.schedule.ownership): balance, coverage,
determinism, and locality beating the random (Grendel-style) deal on street scenes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from odin_ns.bench.schedule import load_transforms_scene, make_city
from odin_ns.schedule import build_plan, compute_footprints
from odin_ns.schedule.ownership import (
    assign_ownership,
    capacity,
    locality_ownership,
    ownership_report,
    random_ownership,
)


def read_ply_points(path: Path) -> np.ndarray:
    """[N, 3] float32 xyz of the synthetic scene's binary ply (x, y, z float; r, g, b uchar)."""
    raw = path.read_bytes()
    head, _, body = raw.partition(b"end_header\n")
    n = int(next(line.split()[-1] for line in head.decode().splitlines() if "vertex" in line))
    rec = np.frombuffer(body[: n * 15], dtype=[("xyz", "<f4", 3), ("rgb", "u1", 3)])
    return np.ascontiguousarray(rec["xyz"])


def street_footprints(street_scene: Path):
    scene = load_transforms_scene(street_scene, 16, downscale=1)
    xyz = torch.from_numpy(read_ply_points(street_scene / "sparse_pc.ply"))
    n = xyz.shape[0]
    gen = torch.Generator().manual_seed(0)
    return compute_footprints(
        xyz,
        torch.full((n, 3), 0.05),
        torch.randn(n, 4, generator=gen),
        torch.full((n,), 0.1),
        scene.viewmats,
        scene.Ks,
        scene.width,
        scene.height,
        margin_px=16.0,
    )


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_street_scene_balance_coverage_and_locality(street_scene, ranks):
    F = street_footprints(street_scene)
    plan = build_plan(F, ranks, 40, seed=0)
    owner = assign_ownership(plan)
    n = F.shape[1]
    assert owner.shape == (n,) and owner.min() >= 0 and owner.max() < ranks  # every row owned
    owned = np.bincount(owner, minlength=ranks)
    assert owned.sum() == n
    assert owned.max() <= 1.1 * n / ranks and owned.min() >= 0.9 * n / ranks
    assert np.array_equal(owner, assign_ownership(build_plan(F, ranks, 40, seed=0)))
    report = ownership_report(plan, owner)
    assert report["remote_read_fraction"] < 0.8 * report["random_remote_read_fraction"]
    # random: exactly balanced and reads remote rows in about (R-1)/R of reads
    rnd = random_ownership(n, ranks, seed=0)
    assert np.bincount(rnd, minlength=ranks).max() - np.bincount(rnd).min() <= 1
    assert abs(report["random_remote_read_fraction"] - (ranks - 1) / ranks) < 0.1


def test_city_locality_far_below_random():
    s = make_city(240, 8000, seed=0)
    F = compute_footprints(
        s.means, s.scales, s.quats, s.opacities, s.viewmats, s.Ks, s.width, s.height
    )
    plan = build_plan(F, 4, 60, strategy="odin")
    report = ownership_report(plan, assign_ownership(plan))
    assert report["owned_rows_max_over_fair"] <= 1.1
    assert report["remote_read_fraction"] < 0.5 * report["random_remote_read_fraction"]


def test_capacitated_greedy_by_hand():
    # 6 rows, 2 ranks, everyone prefers rank 0: cap(6, 2) = 3, so the three rows with the
    # largest counts for rank 0 stay there, the rest move to rank 1; unread row fills room.
    counts = np.array([[5, 4, 3, 2, 1, 0], [0, 0, 0, 0, 0, 0]])
    assert capacity(6, 2) == 3
    assert locality_ownership(counts).tolist() == [0, 0, 0, 1, 1, 1]
    counts = np.array([[1, 0, 2, 0], [0, 3, 0, 0]])
    assert locality_ownership(counts).tolist() == [0, 1, 0, 1]
    # the lower bound holds for any R: R - 1 ranks at the cap leave >= 0.9 N/R to the last
    for r, n in ((2, 1000), (3, 1000), (4, 1000), (8, 10_000), (64, 1_000_000)):
        assert n - (r - 1) * capacity(n, r) >= 0.9 * n / r


def test_bad_strategy():
    with pytest.raises(ValueError, match="locality' or 'random"):
        assign_ownership(type("P", (), {})(), strategy="nope")
