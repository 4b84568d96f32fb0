"""Phase starts: the gathered footprints equal the footprints of every Gaussian computed at
once, and the footprint-reuse bound is a true bound on how far a footprint moves on screen."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
import torch
from harness.toy import spawn_ranks

from odin_ns.distributed.phase import (
    footprint_reference,
    gather_footprint_columns,
    max_screen_shift,
)


def _random_csr(num_views: int, num_prims: int, seed: int) -> sp.csr_matrix:
    """Deterministic random footprints [num_views, num_prims] (some views empty)."""
    rng = np.random.default_rng(seed)
    dense = rng.random((num_views, num_prims)) < 0.15
    dense[1] = False
    return sp.csr_matrix(dense)


def gather_rank(rank: int, world_size: int, num_views: int, num_prims: int) -> bool:
    expected = _random_csr(num_views, num_prims, 3)
    # the replicated split (one range per rank, in rank order) and the owners' (interleaved)
    contiguous = np.array_split(np.arange(num_prims), world_size)[rank]
    interleaved = np.arange(rank, num_prims, world_size)
    ok = True
    for columns in (contiguous, interleaved):
        gathered = gather_footprint_columns(expected[:, columns], columns, num_prims, world_size)
        ok &= bool(
            gathered.shape == expected.shape
            and gathered.has_canonical_format
            and (gathered != expected).nnz == 0
        )
    return ok


def test_gathered_footprints_equal_all_columns_at_once(tmp_path):
    # 3 ranks over 50 primitives: uneven shares, and a view with no primitive.
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


# ------------------------------------------------------ footprints across a structural step
def _gaussians(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        means=torch.randn(n, 3, generator=gen) * 0.7,
        scales=torch.full((n, 3), -3.0) + 0.3 * torch.randn(n, 3, generator=gen),
        quats=torch.nn.functional.normalize(torch.randn(n, 4, generator=gen), dim=1),
        opacities=torch.randn(n, 1, generator=gen),
        num_points=n,
    )


def _densified(model, seed: int):
    """gsplat's shape of a refine step: duplicate some rows (appended copies), replace some
    by two new children (appended), prune some, reset opacities to at most 0.01."""
    gen = torch.Generator().manual_seed(seed)
    n = model.num_points
    dupli, split = torch.arange(0, n, 7), torch.arange(3, n, 11)
    rest = torch.ones(n, dtype=torch.bool)
    rest[split] = False
    out = {}
    for name in ("means", "scales", "quats", "opacities"):
        p = getattr(model, name)
        child = p[split].repeat(2, 1)
        if name == "means":
            child = child + 0.05 * torch.randn(child.shape, generator=gen)
        if name == "scales":
            child = child - math.log(1.6)
        out[name] = torch.cat([p, p[dupli]])[torch.cat([rest, torch.ones(len(dupli), dtype=bool)])]
        out[name] = torch.cat([out[name], child])
    keep = torch.rand(out["means"].shape[0], generator=gen) > 0.1  # prune 10%
    out = {k: v[keep] for k, v in out.items()}
    out["opacities"] = out["opacities"].clamp(max=math.log(0.01 / 0.99))  # opacity reset
    return SimpleNamespace(**out, num_points=int(keep.sum()))


def carried_rank(rank: int, world_size: int) -> dict:
    from odin_ns.distributed.phase import PhaseController, geometry_keys, row_sources

    cameras = _cameras(8)
    model = _gaussians(600, seed=5)
    phases = PhaseController(rank, world_size, 0, "odin", 50, 2.0, reuse_shift_px=4.0)
    phases.start(0, model, cameras, next_boundary=9)
    after = _densified(model, seed=6)
    sources = row_sources(geometry_keys(model), geometry_keys(after))
    phases.end_after(9, sources)
    carried, record = phases.start(10, after, cameras, next_boundary=None)

    fresh = PhaseController(rank, world_size, 0, "odin", 50, 2.0, reuse_shift_px=4.0)
    recomputed, _ = fresh.start(10, after, cameras, next_boundary=None)

    # a re-plan without a structural change: only the Gaussians that moved are recomputed
    some = after.means.clone()
    some[:10] += 0.5
    some_moved = SimpleNamespace(**{**vars(after), "means": some})
    replanned, some_record = phases.start(20, some_moved, cameras, next_boundary=None)
    again, _ = fresh.start(20, some_moved, cameras, next_boundary=None)

    moved = SimpleNamespace(**{**vars(after), "means": after.means + 0.5})
    phases.end_after(29, row_sources(geometry_keys(some_moved), geometry_keys(moved)))
    moved_plan, moved_record = phases.start(30, moved, cameras, next_boundary=None)
    moved_again, _ = fresh.start(30, moved, cameras, next_boundary=None)
    return {
        "equal": (carried.footprints != recomputed.footprints).nnz == 0,
        "replanned_equal": (replanned.footprints != again.footprints).nnz == 0,
        "some_computed": some_record.footprint_rows_computed,
        "moved_equal": (moved_plan.footprints != moved_again.footprints).nnz == 0,
        "nnz": int(recomputed.footprints.nnz),
        "new_rows": int((sources < 0).sum()),
        "computed": record.footprint_rows_computed,
        "reused": record.footprints_reused,
        "moved_computed": moved_record.footprint_rows_computed,
        "n": after.num_points,
        "split": [
            (r.footprint_compute_s, r.gather_s, r.reference_s, r.footprint_seconds)
            for r in (record, some_record, moved_record)
        ],
    }


def test_row_sources_find_kept_duplicated_and_new_rows():
    from odin_ns.distributed.phase import geometry_keys, row_sources

    model = _gaussians(50, seed=1)
    after = _densified(model, seed=2)
    sources = row_sources(geometry_keys(model), geometry_keys(after))
    found = sources >= 0
    assert 0 < found.sum() < after.num_points  # kept or duplicated rows, and new children
    assert torch.equal(after.means[torch.from_numpy(found)], model.means[sources[found]])
    assert torch.equal(after.scales[torch.from_numpy(found)], model.scales[sources[found]])
    # a row whose opacity crosses the footprint threshold is new geometry
    faded = SimpleNamespace(**{**vars(model), "opacities": torch.full((50, 1), -10.0)})
    assert (row_sources(geometry_keys(model), geometry_keys(faded)) < 0).sum() > 0


def test_footprints_carried_across_a_structural_step_equal_recomputed(tmp_path):
    """After a densification (duplicates, split children, prunes, an opacity reset) the
    next phase computes only the new rows' footprints, and gets every footprint a full
    recompute would; a re-plan recomputes only the Gaussians that moved too far."""
    codes, results, errors, _ = spawn_ranks(carried_rank, 2, tmp_path)
    assert codes == [0, 0], errors
    for r in results:
        assert r["equal"] and r["nnz"] > 1000, r
        assert not r["reused"] and r["computed"] == r["new_rows"] > 0, r  # some computed
        assert r["replanned_equal"] and r["some_computed"] == 10, r
        # all moved: every row is recomputed but those provably still behind every camera
        assert r["moved_equal"] and 0.9 * r["n"] < r["moved_computed"] <= r["n"], r
        # the record's split: computing, gathering and the reference are parts of the
        # footprint seconds, and every phase start here computed and gathered some rows
        for compute_s, gather_s, reference_s, footprint_s in r["split"]:
            assert compute_s > 0 and gather_s > 0 and reference_s > 0, r["split"]
            assert compute_s + gather_s + reference_s <= footprint_s, r["split"]


def test_phase_start_split_sums_the_slowest_ranks_phases():
    from odin_ns.bench.sync import PHASE_START_SPLIT, phase_start_split

    def phase(total: float, part: float) -> dict:
        return {"phase_start_s": total, **{k: part for k in PHASE_START_SPLIT}}

    fast = {"phases": [phase(1.0, 0.1), phase(1.0, 0.1)]}
    slow = {"phases": [phase(2.0, 0.2), phase(1.5, 0.1)]}
    split = phase_start_split([fast, slow])
    assert split["phase_starts"] == 2
    assert split["phase_split_gather_s"] == 0.2 + 0.1  # the slow rank's
    parts = sum(
        v for k, v in split.items() if k.startswith("phase_split_") and k != "phase_split_other_s"
    )
    assert abs(parts + split["phase_split_other_s"] - 3.5) < 1e-12
    assert phase_start_split([{"phases": [{"phase_start_s": 1.0}]}]) == {}  # older run logs
