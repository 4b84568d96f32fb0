"""Sharded checkpoints without the whole model in one rank's memory (``sharded_checkpoint``).

- contiguous ranges: np.array_split's split, every row in exactly one range;
- ``take_rows`` reads one range of every Gaussian group and Adam moment from a memory-mapped
  checkpoint and leaves everything else as it was;
- ``merge_owned_rows`` over 3 gloo ranks, in messages of a few rows: rank 0's [N, ...]
  tensors equal the model, row for row, and live in the row files (file-backed), which
  ``remove_row_files`` removes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from harness.toy import spawn_ranks

from odin_ns.cuda.cases import SPLATFACTO_ROWS
from odin_ns.distributed.sharded_checkpoint import (
    merge_owned_rows,
    range_owner,
    read_checkpoint,
    remove_row_files,
    row_ranges,
    take_rows,
)
from odin_ns.model import GAUSSIAN_GROUPS

SHAPES = SPLATFACTO_ROWS  # group -> shape of one row, SH degree 3


def _model(n: int, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """{group: (param, exp_avg, exp_avg_sq)}, [n, ...] each, distinct random values."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: tuple(torch.randn((n, *shape), generator=gen) for _ in range(3))
        for name, shape in SHAPES.items()
    }


@pytest.mark.parametrize(("n", "world_size"), [(10, 3), (9, 3), (2, 4), (0, 2), (100_003, 7)])
def test_row_ranges_split_like_array_split(n, world_size):
    bounds = row_ranges(n, world_size)
    sizes = [part.size for part in np.array_split(np.arange(n), world_size)]
    assert np.diff(bounds).tolist() == sizes
    owner = range_owner(n, world_size)
    assert owner.size == n
    for r in range(world_size):
        assert np.array_equal(np.flatnonzero(owner == r), np.arange(bounds[r], bounds[r + 1]))


def test_take_rows_reads_one_range_of_a_mapped_checkpoint(tmp_path):
    n, lo, hi = 50, 17, 34
    model = _model(n)
    state = {
        "step": 12,
        "pipeline": {f"_model.gauss_params.{k}": p for k, (p, _, _) in model.items()}
        | {"_model.other": torch.arange(5)},
        "optimizers": {
            k: {
                "state": {0: {"step": torch.tensor(13.0), "exp_avg": m, "exp_avg_sq": v}},
                "param_groups": [{"lr": 0.1, "params": [0]}],
            }  # fmt: skip
            for k, (_, m, v) in model.items()
        },
        "odin": {"format": "x"},
    }
    path = tmp_path / "step.ckpt"
    torch.save(state, path)
    loaded = read_checkpoint(path)
    part = take_rows(loaded, lo, hi)
    for name, (param, m, v) in model.items():
        assert torch.equal(part["pipeline"][f"_model.gauss_params.{name}"], param[lo:hi])
        entry = part["optimizers"][name]["state"][0]
        assert torch.equal(entry["exp_avg"], m[lo:hi])
        assert torch.equal(entry["exp_avg_sq"], v[lo:hi])
        assert entry["step"] == 13.0
        assert part["optimizers"][name]["param_groups"] == [{"lr": 0.1, "params": [0]}]
        # the mapped checkpoint itself is unchanged
        assert loaded["pipeline"][f"_model.gauss_params.{name}"].shape[0] == n
        assert loaded["optimizers"][name]["state"][0]["exp_avg"].shape[0] == n
    assert torch.equal(part["pipeline"]["_model.other"], torch.arange(5))
    assert (part["step"], part["odin"]) == (12, {"format": "x"})


def merge_rank(rank: int, world_size: int, n: int, directory: str) -> dict | None:
    """One rank of a merge: owners dealt at random (seeded, the same on every rank), each
    rank holding its owned rows of ``_model(n)``; rank 0 returns what it merged and what its
    row files hold."""
    owner = np.random.default_rng(5).integers(0, world_size, n).astype(np.int64)
    owned = np.flatnonzero(owner == rank)
    model = _model(n)
    mine = {k: tuple(t[torch.from_numpy(owned)] for t in parts) for k, parts in model.items()}
    group = torch.distributed.new_group(backend="gloo")
    out = merge_owned_rows(mine, owned, owner, rank, world_size, group, Path(directory), 7)
    if out is None:
        return None
    files = {
        f"{k}.{i}": np.fromfile(Path(directory) / f"{k}.{part}", dtype=np.float32)
        for k in GAUSSIAN_GROUPS
        for i, part in enumerate(("param", "exp_avg", "exp_avg_sq"))
    }
    merged = {f"{k}.{i}": t.clone() for k, parts in out.items() for i, t in enumerate(parts)}
    return {"merged": merged, "files": files}


def test_merge_lands_every_rank_rows_in_rank_0_files(tmp_path):
    n = 101  # with 7-row messages: every rank sends several, the last one short
    directory = tmp_path / "step.rows"
    codes, results, errors, _ = spawn_ranks(
        merge_rank, 3, tmp_path, args=(n, str(directory)), timeout_s=120
    )
    assert codes == [0, 0, 0], errors
    assert results[1] is None and results[2] is None
    merged, files = results[0]["merged"], results[0]["files"]
    for name, parts in _model(n).items():
        for i, expected in enumerate(parts):
            key = f"{name}.{i}"
            assert torch.equal(merged[key], expected), key  # every row, in global order
            assert np.array_equal(files[key], expected.numpy().reshape(-1)), key  # in its file
    remove_row_files(directory)
    assert not directory.exists()
