"""Checkpoint I/O of a sharded model: what writing the merged checkpoint costs rank 0, and
what resuming from it costs each rank, in memory and seconds.

    python -m odin_ns.bench.shard_io --gaussians 2000000 --ranks 2 4 --rounds 2 \\
        --out bench/shard_io.json

Two variants, interleaved in every round (the order reversed every other round):

- ``streamed`` (the project's code, ``odin_ns.distributed.sharded_checkpoint``): save =
  ``merge_owned_rows`` (every rank's owned rows to rank 0 in 65536-row messages, landed in
  file-backed tensors) then ``torch.save``; load = ``read_checkpoint`` (a memory map) and
  ``take_rows`` of the rank's contiguous range.
- ``gathered`` (what the code did before, kept here as the baseline): save = every rank
  sends rank 0 its owned rows in one message, rank 0 scatters them into ``[N, ...]`` tensors
  in its memory, then ``torch.save``; load = ``torch.load`` of the whole file on every rank
  (nerfstudio's load).

A run spawns R gloo ranks (1 torch thread each). Each rank holds its owned rows of an
N-Gaussian SH-degree-3 model (6 groups, 59 floats per row) and both Adam moments (177 floats
per row in all); owners are dealt at random (ownership changes who sends which rows, not
how many bytes). Row values are a formula of the global id, so the bench checks that the
merged file and every loaded range hold exactly the right rows.

Memory is the peak of the rank's anonymous resident memory (``RssAnon``, sampled every
2 ms by a thread in the rank) above its level just before the operation: what the
operation itself holds (the ranks run with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed and
trim the C heap before each measurement, so the level follows live memory). The page cache behind file-backed tensors and memory maps is not
anonymous memory: the kernel writes it out or drops it under pressure, as it does for any
file. Seconds: the slowest rank's wall time of the operation (save: merge + torch.save).

JSON: per R and variant the medians over rounds (with min and max) of ``save_peak_mb_rank0``,
``load_peak_mb_max`` (largest over ranks), ``save_s`` and ``load_s``; ``model_mb`` (the
model's parameters and moments); the top-level keys ``save_peak_over_model_<variant>_<R>``
and ``load_peak_over_model_<variant>_<R>``. A PNG beside it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from odin_ns.bench.report import save_figure, spread, write_json
from odin_ns.cuda.cases import SPLATFACTO_ROWS

VARIANTS = ("streamed", "gathered")
SHAPES = SPLATFACTO_ROWS  # group -> shape of one row, SH degree 3
ROW_FLOATS = 3 * sum(int(np.prod(s)) for s in SHAPES.values())  # 177: params + 2 moments


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no RssAnon in /proc/self/status")


def _release_free_memory() -> None:
    """Return the C heap's free pages to the kernel (glibc ``malloc_trim``), so that the
    level a measurement starts from holds live memory only."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakAnon:
    """Context manager: the peak of ``RssAnon`` above its level at entry (MB), sampled by a
    thread every ``every_s`` seconds."""

    def __init__(self, every_s: float = 0.002):
        self.every_s = every_s
        self.peak_mb = 0.0

    def __enter__(self) -> PeakAnon:
        _release_free_memory()
        self._base = _anon_mb()
        self._high = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._high = max(self._high, _anon_mb())
            time.sleep(self.every_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self._high, _anon_mb()) - self._base


def row_values(ids: np.ndarray):
    """{group: (param, exp_avg, exp_avg_sq)} of global rows ``ids``: each value is a formula
    of (row, group, part, column), exact in float32 for these sizes' low bits."""
    import torch

    gid = torch.from_numpy(ids).to(torch.float64)[:, None]
    out = {}
    for g, (name, shape) in enumerate(SHAPES.items()):
        width = int(np.prod(shape))
        cols = torch.arange(width, dtype=torch.float64)[None, :]
        out[name] = tuple(
            ((gid % 4096) * 0.25 + g * 64 + part * 16 + cols).float().reshape(-1, *shape)
            for part in range(3)
        )
    return out


def _checkpoint(merged: dict, step: int) -> dict:
    """A nerfstudio-layout checkpoint of ``merged`` ({group: (param, m, v)})."""
    import torch

    return {
        "step": step,
        "pipeline": {f"_model.gauss_params.{k}": p for k, (p, _, _) in merged.items()},
        "optimizers": {
            k: {
                "state": {
                    0: {"step": torch.tensor(float(step + 1)), "exp_avg": m, "exp_avg_sq": v}
                },
                "param_groups": [{"lr": 1e-3, "params": [0]}],
            }
            for k, (_, m, v) in merged.items()
        },
    }


def _gathered_merge(rows, owned, owner, rank, world_size, group):
    """The baseline: one message per rank, rank 0's [N, ...] tensors in memory."""
    import torch
    import torch.distributed as dist

    columns = [part for name in SHAPES for part in rows[name]]
    local = torch.cat([c.reshape(owned.size, -1) for c in columns], dim=1)
    if rank != 0:
        if owned.size:
            dist.send(local, dst=0, group=group)
        return None
    n = owner.size
    out = {
        name: tuple(torch.empty((n, *shape)) for _ in range(3)) for name, shape in SHAPES.items()
    }
    targets = [part for name in SHAPES for part in out[name]]

    def scatter(ids: np.ndarray, buf) -> None:
        index, off = torch.from_numpy(ids), 0
        for t in targets:
            w = int(np.prod(t.shape[1:]))
            t[index] = buf[:, off : off + w].reshape(ids.size, *t.shape[1:])
            off += w

    scatter(owned, local)
    del local
    for q in range(1, world_size):
        q_ids = np.flatnonzero(owner == q)
        if q_ids.size:
            buf = torch.empty(q_ids.size, ROW_FLOATS)
            dist.recv(buf, src=q, group=group)
            scatter(q_ids, buf)
    return out


def _worker(rank: int, world_size: int, port: int, n: int, variant: str, workdir: str, out):
    import torch
    import torch.distributed as dist

    from odin_ns.distributed import sharded_checkpoint as ckpt

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    group = dist.new_group(backend="gloo")
    owner = np.random.default_rng(7).integers(0, world_size, n).astype(np.int64)
    owned = np.flatnonzero(owner == rank)
    rows = row_values(owned)
    path = Path(workdir) / "step.ckpt"
    dist.barrier()
    tic = time.perf_counter()
    with PeakAnon() as save_peak:
        if variant == "streamed":
            merged = ckpt.merge_owned_rows(
                rows, owned, owner, rank, world_size, group, path.with_suffix(".rows")
            )
        else:
            merged = _gathered_merge(rows, owned, owner, rank, world_size, group)
        if rank == 0:
            torch.save(_checkpoint(merged, 10), path)
            del merged
            ckpt.remove_row_files(path.with_suffix(".rows"))
    save_s = time.perf_counter() - tic
    del rows
    dist.barrier()
    bounds = ckpt.row_ranges(n, world_size)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    tic = time.perf_counter()
    with PeakAnon() as load_peak:
        if variant == "streamed":
            part = ckpt.take_rows(ckpt.read_checkpoint(path), lo, hi)
        else:
            part = torch.load(path, map_location="cpu")
    load_s = time.perf_counter() - tic
    # the loaded rows are the model's: spot-check this rank's range (first, last, middle)
    expect = row_values(np.array([lo, (lo + hi) // 2, hi - 1], dtype=np.int64))
    offset = 0 if variant == "streamed" else lo
    for name in SHAPES:
        got = part["pipeline"][f"_model.gauss_params.{name}"]
        moment = part["optimizers"][name]["state"][0]["exp_avg_sq"]
        picks = torch.tensor([lo, (lo + hi) // 2, hi - 1]) - lo + offset
        if hi > lo and not (
            torch.equal(got[picks], expect[name][0]) and torch.equal(moment[picks], expect[name][2])
        ):
            raise AssertionError(f"rank {rank}: wrong rows of '{name}' loaded ({variant})")
    del part
    result = {"rank": rank, "save_s": save_s, "load_s": load_s}
    result |= {"save_peak_mb": save_peak.peak_mb, "load_peak_mb": load_peak.peak_mb}
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, result)
    if rank == 0:
        out.put(gathered)
    dist.barrier()
    dist.destroy_process_group()


def run_once(world_size: int, n: int, variant: str) -> list[dict]:
    """One run of ``variant`` on ``world_size`` spawned ranks: per-rank results."""
    import torch.multiprocessing as mp

    from odin_ns.bench.commands import free_port
    from odin_ns.launch import environment

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    workdir = tempfile.mkdtemp(prefix="odin_shard_io_")
    # large blocks always from mmap (glibc's threshold otherwise grows with what was freed),
    # so freeing them gives the pages back and RssAnon follows what is live
    env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MALLOC_MMAP_THRESHOLD_": "65536"}
    try:
        port = free_port()
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, n, variant, workdir, out))
            for r in range(world_size)
        ]
        with environment(env):  # the spawned ranks inherit it
            for p in procs:
                p.start()
        for p in procs:
            p.join(900)
        codes = [p.exitcode for p in procs]
        if any(c != 0 for c in codes):
            raise RuntimeError(f"shard_io {variant} on {world_size} ranks: exit codes {codes}")
        return out.get()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def summarize(runs: dict[int, dict[str, list[list[dict]]]], n: int) -> dict:
    """Per R and variant: medians over rounds (with min / max) of rank 0's save peak, the
    largest rank's load peak, and the slowest rank's seconds."""
    model_mb = n * ROW_FLOATS * 4 / 2**20
    result: dict = {"gaussians": n, "model_mb": model_mb, "by_ranks": {}}
    for world_size, by_variant in runs.items():
        entry = {}
        for variant, rounds in by_variant.items():
            per_round = {
                "save_peak_mb_rank0": [r[0]["save_peak_mb"] for r in rounds],
                "load_peak_mb_max": [max(x["load_peak_mb"] for x in r) for r in rounds],
                "save_s": [max(x["save_s"] for x in r) for r in rounds],
                "load_s": [max(x["load_s"] for x in r) for r in rounds],
            }
            entry[variant] = {k: spread(v) for k, v in per_round.items()} | {"rounds": rounds}
            for key, short in (("save_peak_mb_rank0", "save"), ("load_peak_mb_max", "load")):
                ratio = entry[variant][key]["median"] / model_mb
                result[f"{short}_peak_over_model_{variant}_{world_size}"] = ratio
        result["by_ranks"][str(world_size)] = entry
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(int(r) for r in result["by_ranks"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in (
        (axes[0], "save_peak_mb_rank0", "writing the merged checkpoint: rank 0"),
        (axes[1], "load_peak_mb_max", "resuming: the largest rank"),
    ):
        width = 0.35
        for i, variant in enumerate(VARIANTS):
            med = [result["by_ranks"][str(r)][variant][key]["median"] for r in ranks]
            lo = [result["by_ranks"][str(r)][variant][key]["min"] for r in ranks]
            hi = [result["by_ranks"][str(r)][variant][key]["max"] for r in ranks]
            x = np.arange(len(ranks)) + (i - 0.5) * width
            err = [np.subtract(med, lo), np.subtract(hi, med)]
            ax.bar(x, med, width, yerr=err, label=variant, capsize=3)
        ax.axhline(
            result["model_mb"], color="k", ls="--", lw=1, label="the model (params + moments)"
        )
        ax.set_xticks(np.arange(len(ranks)), [f"{r} ranks" for r in ranks])
        ax.set_ylabel("peak anonymous memory added (MB)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"sharded checkpoint I/O, {result['gaussians']:,} Gaussians "
        f"({result['model_mb']:.0f} MB), medians and min-max over {result['rounds']} rounds",
        fontsize=10,
    )
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench/shard_io.json"))
    args = ap.parse_args(argv)
    from nerfstudio.utils.rich_utils import CONSOLE

    runs: dict[int, dict[str, list]] = {r: {v: [] for v in VARIANTS} for r in args.ranks}
    started = time.perf_counter()
    with CONSOLE.status("") as status:
        for i in range(args.rounds):
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
            for world_size in args.ranks:
                for variant in order:
                    status.update(f"round {i + 1}/{args.rounds}: {variant} on {world_size} ranks")
                    runs[world_size][variant].append(run_once(world_size, args.gaussians, variant))
    result = summarize(runs, args.gaussians)
    result |= {"rounds": args.rounds, "wall_s": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    plot(result, png)
    result["png"] = png.name
    write_json(args.out, result)
    for world_size in args.ranks:
        for variant in VARIANTS:
            e = result["by_ranks"][str(world_size)][variant]
            CONSOLE.print(
                f"{world_size} ranks, {variant:>8}: save peak rank 0 "
                f"{e['save_peak_mb_rank0']['median']:7.0f} MB, load peak "
                f"{e['load_peak_mb_max']['median']:7.0f} MB (model {result['model_mb']:.0f} MB); "
                f"save {e['save_s']['median']:.2f} s, load {e['load_s']['median']:.2f} s"
            )
    return result


if __name__ == "__main__":
    main()
