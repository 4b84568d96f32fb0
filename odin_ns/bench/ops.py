"""The primitive-sync ops as the engine calls them: compiled kernels vs torch references.

    python -m odin_ns.bench.ops --out bench/ops.json [--data DIR] [--threads 2]

Sizes come from the engine's real workload on the built-in street scene, the one ``make
demo`` makes (``python -m odin_ns.data.synthetic --out demo_data/street --layout street``;
without ``--data`` it is made once, in seconds, in ``<temp folder>/odin-ns/street``, so a
fresh clone needs no set-up):
~20k Gaussians in the scene's bounding box (``odin_ns.bench.schedule.load_transforms_scene``),
footprints with ``compute_footprints`` and a 2-rank odin plan of one epoch with
``build_plan``. The step with the median union size gives U (union rows), M_r (rank r's
footprint rows) and the positions of each rank's rows in the union; N is the number of
Gaussians, W = 60 (splatfacto sh_degree 3: 59 gradient columns + the visible flag). Per
step the engine calls:

- ``pack_rows(footprint_r, columns)`` once (the six gradient groups and the visible column);
- ``accumulate_ready_rows(acc, ready, positions, contribs)`` once, every rank's part in rank
  order;
- ``apply_ready_rows(...)`` once over the union (six splatfacto groups);
- ``validate_reads(footprint_r, versions, required)`` once;
- ``record_row_norms(norms, active, union, acc, ready)`` once per apply in throughput-first
  (the apply's gradient evidence);
- ``footprint_cull``: the calls ``compute_footprints`` makes on the scene (recorded).

The "1m" case scales the same layout to 1M rows (U = 1M union rows, N = 2M Gaussians; M
and the cull's candidate pairs keep the street ratios, 1M pairs). Compiled (``odin_ns.cuda.ops``, the dispatcher
the engine uses) and reference (``odin_ns.cuda.reference``) runs alternate A B A B ... in
one process with ``--threads`` torch threads. JSON: per op and size the median, min and
max seconds of each, ``speedup`` = reference median / compiled median and the min-max of
the per-pair ratios; ``speedup_<op>_<size>`` keys at the top level. A PNG beside it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from odin_ns.bench.report import save_figure, write_json
from odin_ns.cuda import build, cases, ops, reference

OPS = ops.OPS
RANKS = 2


def default_street_scene() -> Path:
    """The built-in street scene (``make_scene``'s defaults, the scene ``make demo`` makes),
    made once in ``<temp folder>/odin-ns/street`` (``make_scene`` writes ``transforms.json``
    last, so a folder that has it holds the whole scene)."""
    from odin_ns.data.synthetic import make_scene

    scene = Path(tempfile.gettempdir()) / "odin-ns" / "street"
    if not (scene / "transforms.json").exists():
        make_scene(scene, layout="street")
    return scene


def street_workload(data: Path, num_gaussians: int, seed: int) -> dict[str, Any]:
    """Engine sizes of the median step, and the footprint_cull calls, on the street scene."""
    from odin_ns.bench.schedule import load_transforms_scene
    from odin_ns.schedule import build_plan, compute_footprints
    from odin_ns.schedule import footprint as fp_module

    scene = load_transforms_scene(data, num_gaussians, seed=seed, downscale=1)
    calls: list[tuple] = []
    real = fp_module.ext_ops.footprint_cull

    def record(*args: Any) -> tuple[Tensor, Tensor]:
        calls.append(args)
        return real(*args)

    fp_module.ext_ops.footprint_cull = record
    try:
        F = compute_footprints(
            scene.means, scene.scales, scene.quats, scene.opacities, scene.viewmats, scene.Ks,
            scene.width, scene.height,
        )  # fmt: skip
    finally:
        fp_module.ext_ops.footprint_cull = real
    steps = -(-F.shape[0] // RANKS)
    plan = build_plan(F, RANKS, steps, seed=seed)
    unions = []
    for t in range(steps):
        fps = [plan.step_footprint(t, r) for r in range(RANKS)]
        unions.append((np.union1d(*fps).size, t, fps))
    unions.sort(key=lambda u: u[0])
    _, t, fps = unions[len(unions) // 2]
    union = np.union1d(*fps)
    return {
        "num_gaussians": num_gaussians,
        "num_views": int(F.shape[0]),
        "footprint_nnz": int(F.nnz),
        "step": int(t),
        "N": num_gaussians,
        "U": int(union.size),
        "M": [int(f.size) for f in fps],
        "union": torch.from_numpy(union.astype(np.int64)),
        "footprints": [torch.from_numpy(f.astype(np.int64)) for f in fps],
        "cull_calls": calls,
    }


def scaled_workload(street: dict[str, Any], rows: int, gen: torch.Generator) -> dict[str, Any]:
    """The street layout at ``rows`` union rows: M / U kept; N / U kept but at most 2
    (the street's N / U of ~8 would need ~6 GB of parameters and moments at 1M rows)."""
    U = rows
    N = int(round(U * min(street["N"] / street["U"], 2.0)))
    union = cases.subset_ids(N, U, gen)
    fps = []
    for m in street["M"]:
        k = int(round(U * m / street["U"]))
        fps.append(union[cases.subset_ids(U, k, gen)])
    pairs = sum(c[0].shape[1] for c in street["cull_calls"])
    calls = []
    for c in street["cull_calls"]:  # resample each call's candidate pairs to the new total
        p = c[0].shape[1]
        k = max(1, int(round(rows * p / pairs)))
        pick = torch.randint(0, p, (k,), generator=gen)
        calls.append((c[0][:, pick], c[1][:, pick], c[2][:, pick], c[3][pick], *c[4:]))
    return {"N": N, "U": U, "M": [int(f.numel()) for f in fps], "union": union,
            "footprints": fps, "cull_calls": calls}  # fmt: skip


def engine_calls(w: dict[str, Any], gen: torch.Generator) -> dict[str, Callable[[Any], None]]:
    """Per op, a function running the engine's calls of one step with a given op library."""
    N, U, union, fps = w["N"], w["U"], w["union"], w["footprints"]
    state = cases.splatfacto_state(N, gen)
    dims = [math.prod(s) for s in cases.SPLATFACTO_ROWS.values()]
    visible = torch.rand(N, generator=gen) < 0.9
    columns = [torch.randn(N, d, generator=gen) * 1e-2 for d in dims]
    columns.append(visible.float().unsqueeze(1))
    positions = [torch.searchsorted(union, f) for f in fps]
    contribs = [cases.publication(f.numel(), gen) for f in fps]
    acc = torch.zeros(U, cases.WIDTH)
    ready = torch.rand(U, generator=gen) < 0.95
    summed = cases.publication(U, gen, writers=RANKS)
    versions = torch.randint(0, 50, (N,), generator=gen)
    required = torch.randint(0, 50, (fps[0].numel(),), generator=gen)
    norms, active = torch.full((N,), math.nan), torch.zeros(N, dtype=torch.bool)
    hyper = dict(
        lrs=list(cases.SPLATFACTO_LRS),
        betas=[(0.9, 0.999)] * len(dims),
        eps=[1e-15] * len(dims),
    )

    def accumulate(lib: Any) -> None:
        acc.zero_()
        lib.accumulate_ready_rows(acc, ready, positions, contribs)  # every rank's, in order

    def cull(lib: Any) -> None:
        for c in w["cull_calls"]:
            lib.footprint_cull(*c)

    return {
        "footprint_cull": cull,
        "pack_rows": lambda lib: lib.pack_rows(fps[0], columns),
        "accumulate_ready_rows": accumulate,
        "apply_ready_rows": lambda lib: lib.apply_ready_rows(
            **state, ids=union, acc=summed, ready=ready, **hyper, step=1000, versions=versions
        ),
        "record_row_norms": lambda lib: lib.record_row_norms(norms, active, union, summed, ready),
        "validate_reads": lambda lib: lib.validate_reads(fps[0], versions, required),
    }


def interleaved(fn: Callable[[Any], None], repeats: int) -> dict[str, Any]:
    """Alternate reference (A) and compiled (B) runs; medians, min-max, speed-up."""
    libs = {"reference": reference, "compiled": ops}
    for lib in libs.values():
        fn(lib)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in libs}
    for _ in range(repeats):
        for name, lib in libs.items():
            start = time.perf_counter()
            fn(lib)
            times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {}
    for name, ts in times.items():
        out[name] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts)}
    ratios = [a / b for a, b in zip(times["reference"], times["compiled"], strict=True)]
    out["speedup"] = out["reference"]["median_s"] / out["compiled"]["median_s"]
    out["speedup_min"], out["speedup_max"] = min(ratios), max(ratios)
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(result["cases"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(sizes)
    for k, size in enumerate(sizes):
        sp = [result["cases"][size]["ops"][op] for op in OPS]
        med = np.array([s["speedup"] for s in sp])
        err = np.array(
            [[m - s["speedup_min"], s["speedup_max"] - m] for m, s in zip(med, sp, strict=True)]
        ).T
        ax.bar(np.arange(len(OPS)) + k * width, med, width, yerr=err, capsize=3, label=size)
    ax.axhline(1.5, color="red", lw=0.8, ls="--", label="1.5x target")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(OPS)) + width * (len(sizes) - 1) / 2, OPS, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("speed-up (reference median / compiled median)")
    ax.set_title(f"odin ops as the engine calls them, CPU, {result['threads']} threads")
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON path (PNG next to it)")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="street scene folder (default: the built-in street scene, made if missing)",
    )
    parser.add_argument("--gaussians", type=int, default=20_000)
    parser.add_argument("--rows", type=int, default=1_000_000, help="union rows of the big case")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=21, help="timed pairs at street size")
    parser.add_argument("--repeats-big", type=int, default=7, help="timed pairs at --rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    cpu_build = build.load_cpu()
    assert ops.status("cpu").compiled, ops.status("cpu").reason
    data = default_street_scene() if args.data is None else args.data
    street = street_workload(data, args.gaussians, args.seed)
    big = scaled_workload(street, args.rows, gen)
    result: dict[str, Any] = {
        "threads": args.threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "build_s": round(cpu_build.seconds, 2),
        "scene": {k: street[k] for k in ("num_gaussians", "num_views", "footprint_nnz", "step")},
        "width": cases.WIDTH,
        "cases": {},
    }
    for label, w, repeats in (("street", street, args.repeats), ("1m", big, args.repeats_big)):
        pairs = sum(c[0].shape[1] for c in w["cull_calls"])
        sizes = {"N": w["N"], "U": w["U"], "M": w["M"], "cull_pairs": pairs,
                 "cull_calls": len(w["cull_calls"])}  # fmt: skip
        calls = engine_calls(w, gen)
        timed = {}
        for op in OPS:
            timed[op] = interleaved(calls[op], repeats)
            r = timed[op]
            print(
                f"{label:<7} {op:<22} ref {r['reference']['median_s'] * 1e3:9.3f} ms  "
                f"ext {r['compiled']['median_s'] * 1e3:9.3f} ms  {r['speedup']:6.2f}x "
                f"[{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]",
                flush=True,
            )
            result[f"speedup_{op}_{label}"] = round(r["speedup"], 3)
        result["cases"][label] = {"sizes": sizes, "repeats": repeats, "ops": timed}
        del calls
    result["below_1_5x"] = [k for k, v in result.items() if k.startswith("speedup_") and v < 1.5]
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
