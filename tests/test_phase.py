"""Phase starts: the gathered footprints equal the footprints of every view computed at once,
and the footprint-reuse bound is a true bound on how far a footprint moves on screen."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
import torch
from harness.toy import spawn_ranks

from odin_ns.distributed.phase import (
    footprint_reference,
    gather_footprints,
    max_screen_shift,
)


def _random_csr(views: np.ndarray, num_prims: int, seed: int) -> sp.csr_matrix:
    """Deterministic footprints of ``views``: row v depends only on (seed, v)."""
    rows = []
    for v in views:
        rng = np.random.default_rng([seed, int(v)])
        ids = np.unique(rng.integers(0, num_prims, size=int(rng.integers(0, 40))))
        rows.append(np.isin(np.arange(num_prims), ids))
    return sp.csr_matrix(np.array(rows, dtype=bool).reshape(len(views), num_prims))


def gather_rank(rank: int, world_size: int, num_views: int, num_prims: int) -> bool:
    views = np.arange(rank, num_views, world_size)
    gathered = gather_footprints(_random_csr(views, num_prims, 3), num_views, rank, world_size)
    expected = _random_csr(np.arange(num_views), num_prims, 3)
    return (
        gathered.shape == expected.shape
        and gathered.has_canonical_format
        and (gathered != expected).nnz == 0
    )


def test_gathered_footprints_equal_all_views_at_once(tmp_path):
    # 3 ranks over 7 views: uneven shares, and a rank may hold empty rows.
    codes, results, errors, _ = spawn_ranks(gather_rank, 3, tmp_path, args=(7, 50))
    assert codes == [0, 0, 0], errors
    assert results == [True, True, True]


def _cameras(num_views: int, focal: float = 100.0):
    """Cameras on a circle of radius 4 looking at the origin (nerfstudio / OpenGL poses)."""
    from nerfstudio.cameras.cameras import Cameras

    poses = []
    for i in range(num_views):
        a = 2 * math.pi * i / num_views
        eye = torch.tensor([4 * math.cos(a), 4 * math.sin(a), 0.5])
        back = eye / eye.norm()  # OpenGL: the camera looks down -z
        right = torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0]), back)
        right = right / right.norm()
        up = torch.linalg.cross(back, right)
        poses.append(torch.stack([right, up, back, eye], dim=1))
    return Cameras(
        camera_to_worlds=torch.stack(poses),
        fx=focal,
        fy=focal,
        cx=32.0,
        cy=24.0,
        width=64,
        height=48,
    )


def _model(means: torch.Tensor, log_scales: torch.Tensor):
    return SimpleNamespace(means=means, scales=log_scales, num_points=means.shape[0])


def test_screen_shift_bound_holds_and_triggers():
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(200, 3, generator=gen) * 0.5
    scales = torch.full((200, 3), -3.0)
    cameras = _cameras(6)
    ref = footprint_reference(sp.csr_matrix((6, 200), dtype=bool), _model(means, scales), cameras)
    assert max_screen_shift(ref, _model(means.clone(), scales)) == 0.0

    moved = means + 1e-3 * torch.randn(200, 3, generator=gen)
    bound = max_screen_shift(ref, _model(moved, scales))
    # The true largest shift of a projected centre, over all views, is below the bound.
    from odin_ns.model import get_viewmat

    viewmats = get_viewmat(cameras.camera_to_worlds)
    true_shift = 0.0
    for vm in viewmats:
        cam0 = means @ vm[:3, :3].T + vm[:3, 3]
        cam1 = moved @ vm[:3, :3].T + vm[:3, 3]
        p0, p1 = 100.0 * cam0[:, :2] / cam0[:, 2:], 100.0 * cam1[:, :2] / cam1[:, 2:]
        true_shift = max(true_shift, float((p1 - p0).norm(dim=1).max()))
    assert 0 < true_shift <= bound * 1.01  # first order: allow 1% for the neglected term
    assert bound < 4.0  # a small motion is reusable at the default threshold

    grown = scales.clone()
    grown[0] = math.log(0.5)  # one Gaussian grows a lot: no reuse
    assert max_screen_shift(ref, _model(means, grown)) > 4.0
    assert max_screen_shift(ref, _model(means[:100], scales[:100])) == float("inf")
