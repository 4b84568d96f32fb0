"""One nerfstudio checkpoint of a sharded model, written and read without the whole model
in any rank's memory.

**Writing** (``merge_owned_rows``): after a drain every rank sends rank 0 its owned rows
(parameters and both Adam moments) in messages of at most ``chunk_rows`` rows; rank 0
scatters each message by global id into ``[N, ...]`` tensors that are backed by files
beside the checkpoint (``torch.from_file``, shared mappings), so the kernel writes the
merged model out as it fills and rank 0's own memory holds one message at a time. Then
``torch.save`` writes the usual nerfstudio file from those tensors (reading the pages back)
and the row files are removed: for the length of a save the disk holds the model twice.

**Reading** (``read_checkpoint``, ``take_rows``): the checkpoint is opened as a memory map
(``torch.load(mmap=True)``), and each rank of a sharded run copies only its contiguous
range of every Gaussian group and moment (``row_ranges``, np.array_split's split: rank r
of R holds rows ``[lo_r, hi_r)``). The first phase start then plans from those ranges and
migrates every row to its owner (``ShardedSession``), so no rank ever holds more than its
range plus what it comes to own.

Single-process tools (ns-eval, ns-viewer, ns-export) read the same file as one model.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from odin_ns.model import GAUSSIAN_GROUPS

CHUNK_ROWS = 1 << 16  # rows per merge message: 46 MB at SH degree 3 (177 floats per row)
MERGE_TAG = 9
MOMENTS = ("exp_avg", "exp_avg_sq")


def row_ranges(num_rows: int, world_size: int) -> np.ndarray:
    """[R + 1] int64 boundaries: rank r's contiguous range is ``[b[r], b[r + 1])``
    (np.array_split's sizes: the first ``N % R`` ranks hold one row more)."""
    sizes = np.full(world_size, num_rows // world_size, dtype=np.int64)
    sizes[: num_rows % world_size] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def range_owner(num_rows: int, world_size: int) -> np.ndarray:
    """[N] int64: the rank whose contiguous range (``row_ranges``) holds each row."""
    return np.repeat(
        np.arange(world_size, dtype=np.int64), np.diff(row_ranges(num_rows, world_size))
    )


def read_checkpoint(path: Path | str) -> dict:
    """The checkpoint as a memory map: tensors are read from disk when (and as far as) they
    are touched. A file in torch's legacy (non-zip) format cannot be mapped and is read
    whole."""
    try:
        return torch.load(path, map_location="cpu", mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        return torch.load(path, map_location="cpu")


def _param_key(pipeline: Mapping[str, Any], name: str) -> str:
    """The pipeline state's key of group ``name`` (splatfacto's older checkpoints lack the
    ``gauss_params.`` level; its ``load_state_dict`` remaps them)."""
    key = f"_model.gauss_params.{name}"
    return key if key in pipeline else f"_model.{name}"


def take_rows(loaded: Mapping[str, Any], lo: int, hi: int) -> dict:
    """``loaded`` with every Gaussian group's parameters and Adam moments cut to rows
    ``[lo, hi)`` (copied out of the map: only those rows are read); every other entry is
    shared with ``loaded``. nerfstudio's ``load_pipeline`` / ``load_optimizers`` then build
    a model of ``hi - lo`` Gaussians."""
    pipeline = dict(loaded["pipeline"])
    for name in GAUSSIAN_GROUPS:
        key = _param_key(pipeline, name)
        pipeline[key] = pipeline[key][lo:hi].clone()
    optimizers = dict(loaded.get("optimizers") or {})
    for name in GAUSSIAN_GROUPS:
        if name not in optimizers:
            continue
        opt = dict(optimizers[name])
        state = {k: dict(v) for k, v in (opt.get("state") or {}).items()}
        for entry in state.values():
            for moment in MOMENTS:
                if moment in entry:
                    entry[moment] = entry[moment][lo:hi].clone()
        opt["state"] = state
        optimizers[name] = opt
    return {**loaded, "pipeline": pipeline, "optimizers": optimizers}


def file_backed_empty(path: Path, shape: tuple[int, ...]) -> Tensor:
    """An uninitialised float32 tensor of ``shape`` whose storage is the file ``path``
    (created; a shared mapping, so writes go to the file and the kernel may page them out)."""
    numel = int(np.prod(shape))
    if numel == 0:
        return torch.empty(shape)
    return torch.from_file(str(path), shared=True, size=numel, dtype=torch.float32).view(shape)


def _columns(rows: Mapping[str, tuple[Tensor, Tensor, Tensor]]) -> list[Tensor]:
    """Per-row tensors in message order: for each group, its parameters, exp_avg and
    exp_avg_sq ([O, ...] each)."""
    return [part for name in GAUSSIAN_GROUPS for part in rows[name]]


def _pack(columns: list[Tensor], lo: int, hi: int) -> Tensor:
    """[hi - lo, W] float32 CPU: rows ``[lo, hi)`` of every column, flattened."""
    return torch.cat([c[lo:hi].reshape(hi - lo, -1).float().cpu() for c in columns], dim=1)


def merge_owned_rows(
    rows: Mapping[str, tuple[Tensor, Tensor, Tensor]],
    owned: np.ndarray,
    owner: np.ndarray,
    rank: int,
    world_size: int,
    group,
    directory: Path,
    chunk_rows: int = CHUNK_ROWS,
) -> dict[str, tuple[Tensor, Tensor, Tensor]] | None:
    """Every rank's owned rows merged on rank 0 in global order (collective; after a drain).

    Args:
        rows: {group: (param, exp_avg, exp_avg_sq)}, each [O, ...]: this rank's owned rows.
        owned: [O] int64 sorted global ids of those rows.
        owner: [N] int64 owner of every row (identical on every rank).
        group: the process group of the messages (point to point, rank q -> rank 0).
        directory: where rank 0 puts the row files (created; the caller removes it with
            ``remove_row_files`` once the checkpoint is written).
        chunk_rows: rows per message.

    Returns:
        on rank 0, {group: (param, exp_avg, exp_avg_sq)} of the whole model, [N, ...] each,
        file-backed; None on other ranks.
    """
    columns = _columns(rows)
    if rank != 0:
        for lo in range(0, int(owned.size), chunk_rows):  # gloo sends no empty messages
            buf = _pack(columns, lo, min(lo + chunk_rows, owned.size))
            dist.send(buf, dst=0, group=group, tag=MERGE_TAG)
        return None
    directory.mkdir(parents=True, exist_ok=True)
    n = int(owner.size)
    out = {
        name: tuple(
            file_backed_empty(directory / f"{name}.{part}", (n, *rows[name][0].shape[1:]))
            for part in ("param", *MOMENTS)
        )
        for name in GAUSSIAN_GROUPS
    }
    targets = _columns(out)
    widths = [int(np.prod(t.shape[1:])) for t in targets]

    def scatter(gids: np.ndarray, buf: Tensor) -> None:
        index, off = torch.from_numpy(gids), 0
        for target, width in zip(targets, widths, strict=True):
            target[index] = buf[:, off : off + width].reshape(gids.size, *target.shape[1:])
            off += width

    for lo in range(0, int(owned.size), chunk_rows):  # rank 0's own rows, a chunk at a time
        hi = min(lo + chunk_rows, owned.size)
        scatter(owned[lo:hi], _pack(columns, lo, hi))
    buf = torch.empty(0)
    for q in range(1, world_size):
        q_ids = np.flatnonzero(owner == q)
        for lo in range(0, int(q_ids.size), chunk_rows):
            hi = min(lo + chunk_rows, q_ids.size)
            if buf.shape[0] != hi - lo:
                buf = torch.empty(hi - lo, sum(widths))
            dist.recv(buf, src=q, group=group, tag=MERGE_TAG)
            scatter(q_ids[lo:hi], buf)
    return out


def remove_row_files(directory: Path) -> None:
    """Remove rank 0's row files (``merge_owned_rows``) once the checkpoint is written."""
    shutil.rmtree(directory, ignore_errors=True)
