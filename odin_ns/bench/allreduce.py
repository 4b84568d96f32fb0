"""All-reduce micro-benchmark: what one gloo all-reduce of a dense buffer costs here.

    python -m odin_ns.bench.allreduce --ranks 2,3 --mbytes 2,8,32 --out /tmp/allreduce.json

The ddp mode sums one dense ``[N, 60]`` float32 buffer per step with
``torch.distributed.all_reduce`` over gloo. The simulator (``odin_ns.bench.simulate``)
models it as a ring all-reduce, ``2 (R - 1) (latency + bytes / R / bandwidth)``; this
module measures that cost on this machine (R processes on one host, one thread each, as
the training launcher sets them: ``odin_ns.launch``) and fits the ring's latency and
bandwidth to it by non-negative least squares. ``bench.scale`` runs it at its start (a
few seconds, mostly process start-up): a calibration point that is not the run being
predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from odin_ns.bench.report import write_json
from odin_ns.bench.simulate import Network


@dataclass(frozen=True)
class AllReduceSample:
    """One measured size: median over ``repeats`` of the slowest rank's all-reduce time."""

    ranks: int
    num_bytes: int
    seconds: float
    repeats: int


def _worker(rank: int, ranks: int, port: int, sizes: list[int], repeats: int, out) -> None:
    """One rank: time ``repeats`` blocking all-reduces of each size (after a warm-up)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    times = []
    for num_bytes in sizes:
        row = []
        for i in range(2 + repeats):  # two warm-ups
            buf = torch.zeros(num_bytes // 4)  # a fresh buffer each step, as ddp's pack makes
            dist.barrier()
            tic = time.perf_counter()
            dist.all_reduce(buf)
            if i >= 2:
                row.append(time.perf_counter() - tic)
        times.append(row)
    gathered: list = [None] * ranks
    dist.all_gather_object(gathered, times)
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def measure(ranks: int, sizes: list[int], repeats: int = 10) -> list[AllReduceSample]:
    """All-reduce seconds of each size in ``sizes`` (bytes) on ``ranks`` local processes."""
    import torch.multiprocessing as mp

    from odin_ns.bench.commands import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, ranks, port, sizes, repeats, out))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    if any(p.exitcode != 0 for p in procs) or out.empty():
        raise RuntimeError(f"all-reduce micro-benchmark on {ranks} ranks failed")
    per_rank = np.asarray(out.get())  # [ranks, sizes, repeats]
    slowest = per_rank.max(axis=0)  # an all-reduce ends when its last rank has the sum
    return [
        AllReduceSample(ranks, int(b), float(np.median(slowest[i])), repeats)
        for i, b in enumerate(sizes)
    ]


def fit_ring(samples: list[AllReduceSample], name: str = "gloo all-reduce") -> Network:
    """Latency and bandwidth of the ring model ``2 (R - 1) (latency + bytes / R / bw)``
    that fit ``samples`` best (least squares, both >= 0)."""
    from scipy.optimize import nnls

    if not samples:
        raise ValueError("need at least one all-reduce sample to fit")
    X = np.array(
        [[2.0 * (s.ranks - 1), 2.0 * (s.ranks - 1) / s.ranks * s.num_bytes] for s in samples]
    )
    y = np.array([s.seconds for s in samples])
    scale = X.max(axis=0)
    (latency, per_byte), _ = nnls(X / scale, y)
    latency, per_byte = latency / scale[0], per_byte / scale[1]
    ranks = sorted({s.ranks for s in samples})
    return Network(
        name,
        float(latency),
        float(1.0 / per_byte) if per_byte > 0 else float("inf"),
        f"ring model fitted to a measured gloo all-reduce (ranks {ranks}, one host, "
        "odin_ns.bench.allreduce)",
    )


def calibrate(
    ranks: list[int], mbytes: list[float], repeats: int = 20
) -> tuple[list[AllReduceSample], dict[int, Network]]:
    """Measured samples and the ring fit per world size."""
    sizes = [int(m * 2**20) // 4 * 4 for m in mbytes]
    samples = [s for r in ranks for s in measure(r, sizes, repeats)]
    fits = {r: fit_ring([s for s in samples if s.ranks == r]) for r in ranks}
    return samples, fits


def cpu_idle_fraction(seconds: float = 2.0) -> float | None:
    """Share of the machine's CPU time that was idle over the next ``seconds`` (Linux
    ``/proc/stat``; None elsewhere). Unlike the load average it does not lag."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(1, total1 - total0)


def calibration_record(
    samples: list[AllReduceSample], fits: dict[int, Network], cpu_idle: float | None = None
) -> dict:
    """JSON form: what was measured, how idle the machine was just before, the fit."""
    return {
        "source": "measured on this machine (odin_ns.bench.allreduce): blocking "
        "torch.distributed.all_reduce over gloo, float32, one thread per rank; seconds are "
        "the median over repeats of the slowest rank",
        "cpu_idle_before": cpu_idle,
        "cpu_count": os.cpu_count(),
        "note": "a loaded machine slows the all-reduce: calibrate on a machine as quiet as "
        "the one the traces ran on",
        "samples": [asdict(s) for s in samples],
        "ring_fit": {str(r): asdict(n) for r, n in fits.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    ap.add_argument(
        "--mbytes", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 8.0, 32.0]
    )
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    idle = cpu_idle_fraction()
    samples, fits = calibrate(args.ranks, args.mbytes, args.repeats)
    record = calibration_record(samples, fits, idle)
    write_json(args.out, record)
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
