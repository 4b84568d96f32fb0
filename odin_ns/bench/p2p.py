"""Point-to-point micro-benchmark: what one gloo publication costs between two processes here.

    python -m odin_ns.bench.p2p --mbytes 0.004,0.25,4,32 --out bench/p2p_gloo.json

The gloo transport (``odin_ns.runtime.transport.P2PTransport``) sends every publication
with ``torch.distributed.isend`` and receives it with ``irecv`` into a host buffer. This
module times that, one message at a time, between two processes of this machine (one
thread each, as the launcher sets CPU ranks): rank 0 reads the clock, sends, rank 1 reads
the clock when its receive completes (both read ``time.perf_counter``, the machine's
monotonic clock, shared by the two processes), then both meet at a barrier. The median
one-way time per size is fitted to ``latency + bytes / bandwidth`` (non-negative least
squares). ``bench.scale`` prices the host-staged transport with this fit: the figures a
publication over gloo gets on this machine, before the device-to-host and host-to-device
copies a GPU adds on either side.
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
class P2PSample:
    """One measured size: median (and spread) over ``repeats`` of the one-way time."""

    num_bytes: int
    seconds: float
    seconds_min: float
    seconds_max: float
    repeats: int


def _worker(rank: int, port: int, sizes: list[int], repeats: int, out) -> None:
    """Rank 0 sends each size ``2 + repeats`` times (two warm-ups), rank 1 receives."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stamps = []
    for num_bytes in sizes:
        buf = torch.zeros(num_bytes // 4)
        row = []
        for _ in range(2 + repeats):
            dist.barrier()
            if rank == 0:
                row.append(time.perf_counter())
                dist.send(buf, dst=1)
            else:
                dist.recv(buf, src=0)
                row.append(time.perf_counter())
        stamps.append(row[2:])
    gathered: list = [None, None]
    dist.all_gather_object(gathered, stamps)
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def measure(sizes: list[int], repeats: int = 20) -> list[P2PSample]:
    """One-way seconds of a gloo send of each size in ``sizes`` (bytes), two local processes."""
    import torch.multiprocessing as mp

    from odin_ns.bench.commands import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, sizes, repeats, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    if any(p.exitcode != 0 for p in procs) or out.empty():
        raise RuntimeError("point-to-point micro-benchmark failed")
    sent, received = (np.asarray(x) for x in out.get())  # [sizes, repeats] each
    one_way = received - sent
    return [
        P2PSample(
            int(b),
            float(np.median(one_way[i])),
            float(one_way[i].min()),
            float(one_way[i].max()),
            repeats,
        )
        for i, b in enumerate(sizes)
    ]


def fit_link(samples: list[P2PSample], name: str = "gloo point-to-point") -> Network:
    """``latency + bytes / bandwidth`` fitted to ``samples`` (least squares, both >= 0)."""
    from scipy.optimize import nnls

    if len(samples) < 2:
        raise ValueError("need at least two sizes to fit latency and bandwidth")
    X = np.array([[1.0, float(s.num_bytes)] for s in samples])
    y = np.array([s.seconds for s in samples])
    scale = X.max(axis=0)
    (latency, per_byte), _ = nnls(X / scale, y)
    latency, per_byte = latency / scale[0], per_byte / scale[1]
    return Network(
        name,
        float(latency),
        float(1.0 / per_byte) if per_byte > 0 else float("inf"),
        "latency + bytes / bandwidth fitted to measured one-way gloo sends between two "
        "processes of one machine (odin_ns.bench.p2p)",
    )


def p2p_record(samples: list[P2PSample], fit: Network, cpu_idle: float | None) -> dict:
    """JSON form: what was measured, how idle the machine was just before, the fit."""
    return {
        "source": "measured on this machine (odin_ns.bench.p2p): blocking "
        "torch.distributed.send / recv over gloo (TCP loopback), float32, one thread per "
        "process; one-way seconds from the send's start to the receive's end on the shared "
        "monotonic clock, median over repeats",
        "cpu_idle_before": cpu_idle,
        "cpu_count": os.cpu_count(),
        "samples": [asdict(s) for s in samples],
        "fit": asdict(fit),
    }


def load_fit(path: Path) -> Network:
    """The fitted link of a saved ``p2p_record``."""
    return Network(**json.loads(Path(path).read_text())["fit"])


def main(argv: list[str] | None = None) -> dict:
    from odin_ns.bench.allreduce import cpu_idle_fraction

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--mbytes",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.004, 0.25, 4.0, 32.0],
    )
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    sizes = sorted({max(4, int(m * 2**20) // 4 * 4) for m in args.mbytes})
    if len(sizes) < 2:
        ap.error("--mbytes needs at least two different sizes")
    idle = cpu_idle_fraction()
    samples = measure(sizes, args.repeats)
    record = p2p_record(samples, fit_link(samples), idle)
    write_json(args.out, record)
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
