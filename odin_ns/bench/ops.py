"""Compiled primitive-sync ops vs their torch references, side by side.

    python -m odin_ns.bench.ops --out ops.json [--sizes 10000,100000,1000000] [--threads 2]

For every op of ``odin_ns.cuda`` and every primitive count N: the wall time of the compiled
CPU kernel and of the pure-torch reference on the same inputs, run alternately in one
process with ``--threads`` torch threads (best of ``--repeats``; medians kept too). Inputs have splatfacto's shapes: rows of 59 floats
(means 3, scales 3, quats 4, features_dc 3, features_rest 45, opacities 1); id lists
(footprint, publication, read set) hold ``--fraction`` of the primitives; footprint_cull
culls 4 views; selective_adam_apply runs once per parameter group (the six groups, timed
together). With a GPU, the CUDA kernels are timed against the references on the GPU too.

JSON keys: ``speedup_<op>_<size>`` (reference seconds / compiled seconds, e.g.
``speedup_pack_rows_1m``; ``speedup_cuda_<op>_<size>`` on a GPU) and the raw times under
``times``. A PNG next to the JSON plots speedup against N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from odin_ns.cuda import build, reference
from odin_ns.cuda.gpu_check import SPLATFACTO_ROWS, copy_inputs, make_inputs
from odin_ns.cuda.ops import OPS


def size_label(n: int) -> str:
    """10000 -> "10k", 1000000 -> "1m"."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def interleaved_seconds(
    fns: dict[str, Callable[[], Any]], repeats: int, sync: bool
) -> dict[str, list[float]]:
    """Wall seconds of each function, run alternately (so load changes hit all alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in fns.items():
            if sync:
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if sync:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def op_cases(op: str, n: int, fraction: float, gen: torch.Generator) -> list[dict[str, Any]]:
    """Input sets timed together for one measurement of ``op`` (several for Adam groups)."""
    if op == "selective_adam_apply":
        return [
            make_inputs(op, n, gen, fraction=fraction, param_shape=shape)
            for shape in SPLATFACTO_ROWS.values()
        ]
    return [make_inputs(op, n, gen, fraction=fraction)]


def time_op(op: str, cases: list[dict[str, Any]], device: str, repeats: int) -> dict[str, float]:
    """Best and median seconds of the compiled op and of the reference on ``device``.

    The speedup uses the best times: on a shared machine they are the least disturbed.
    """
    fns = {}
    for impl, lib in (("compiled", torch.ops.odin), ("reference", reference)):
        fn = getattr(lib, op)
        runs = [copy_inputs(c, device) for c in cases]  # in-place ops keep updating these

        def call(fn=fn, runs=runs) -> None:
            for kwargs in runs:
                fn(**kwargs)

        fns[impl] = call
    times = interleaved_seconds(fns, repeats, sync=device != "cpu")
    out = {}
    for impl, ts in times.items():
        out[f"{impl}_s"] = min(ts)
        out[f"{impl}_median_s"] = statistics.median(ts)
    out["speedup"] = out["reference_s"] / out["compiled_s"]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("times", "CPU kernels vs torch reference")]
    if result.get("cuda_times"):
        panels.append(("cuda_times", "CUDA kernels vs torch reference (GPU)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        for op, by_size in result[key].items():
            sizes = sorted(int(n) for n in by_size)
            ax.plot(sizes, [by_size[str(n)]["speedup"] for n in sizes], marker="o", label=op)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("primitives N")
        ax.set_ylabel("speedup (reference time / compiled time)")
        ax.set_title(f"{title}, {result['threads']} threads")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON path (PNG next to it)")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="primitive counts")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per variant")
    parser.add_argument("--fraction", type=float, default=0.2, help="id list size / N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from rich.progress import Progress

    sizes = [int(s) for s in args.sizes.split(",") if s]
    torch.set_num_threads(args.threads)
    cpu_build = build.load_cpu()
    cuda = torch.cuda.is_available()
    cuda_note = "no GPU"
    if cuda:
        try:
            build.load_cuda()
            cuda_note = "compiled"
        except Exception as error:  # noqa: BLE001 - time the CPU kernels regardless
            cuda, cuda_note = False, build.summarize_error(error)
    result: dict[str, Any] = {
        "threads": args.threads,
        "sizes": sizes,
        "fraction": args.fraction,
        "repeats": args.repeats,
        "seed": args.seed,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_build_s": round(cpu_build.seconds, 2),
        "cuda": cuda_note,
        "times": {op: {} for op in OPS},
        "cuda_times": {op: {} for op in OPS} if cuda else {},
    }
    gen = torch.Generator().manual_seed(args.seed)
    devices = ["cpu", "cuda"] if cuda else ["cpu"]
    with Progress() as progress:
        task = progress.add_task("ops", total=len(sizes) * len(OPS) * len(devices))
        for n in sizes:
            for op in OPS:
                cases = op_cases(op, n, args.fraction, gen)
                for device in devices:
                    progress.update(task, description=f"{op} N={size_label(n)} {device}")
                    times = time_op(op, cases, device, args.repeats)
                    key = "times" if device == "cpu" else "cuda_times"
                    prefix = "speedup" if device == "cpu" else "speedup_cuda"
                    result[key][op][str(n)] = times
                    result[f"{prefix}_{op}_{size_label(n)}"] = round(times["speedup"], 3)
                    progress.advance(task)
                del cases
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(result, args.out.with_suffix(".png"))
    largest = size_label(max(sizes))
    for op in OPS:
        line = f"{op:<22} speedup at {largest}: {result[f'speedup_{op}_{largest}']:6.2f}x"
        if cuda:
            line += f"   cuda: {result[f'speedup_cuda_{op}_{largest}']:6.2f}x"
        print(line)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
