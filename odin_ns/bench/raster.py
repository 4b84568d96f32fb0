"""Rasterizer speed: forward and forward+backward time of ``odin_ns.render.rasterize``.

    python -m odin_ns.bench.raster --out raster.json [--quick] [--threads 2,1]

For every image size (``--sizes``, width x height; the fox scene's downscales by default)
and Gaussian count (``--counts``): a realistic random scene (Gaussians spread through the
view frustum at depths 2..8, log-scales uniform in -4..-2, so each covers a few 16x16
tiles; opacities 0.05..0.95; SH degree 3; fox intrinsics) rendered "RGB" with absgrad, loss
= mean squared color, backward to the raw parameters (activations included, as in
splatfacto). Variants run alternately in one process so load changes hit all alike:
the torch backend at each thread count of ``--threads``, and with CUDA, gsplat and the
torch backend on the GPU. Best of ``--repeats`` (medians kept too). On a shared machine run it with
``OMP_WAIT_POLICY=PASSIVE`` (recorded in the JSON): spinning OpenMP threads make the
two-thread variant several times slower whenever the other core is busy.

JSON: ``cases`` (one record per size, count and variant), ``fwdbwd_s_<variant>_<WxH>_<N>``
headline keys (e.g. ``fwdbwd_s_torch_2t_68x120_20k``) and ``ratio_<variant>_<WxH>_<N>``
(time / time of the first variant). A PNG next to the JSON plots forward+backward seconds
against the Gaussian count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from odin_ns.bench.report import save_figure, write_json
from odin_ns.render import rasterize

FOX_FOCAL_PER_WIDTH = 1375.52 / 1080.0  # fox transforms.json: fl_x / w
TARGET_S = 0.2  # splatfacto on CPU wants >= 4 steps/s including loss and Adam


def size_label(n: int) -> str:
    """20000 -> "20k"."""
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def make_scene(
    n: int, width: int, height: int, seed: int = 0, sh_degree: int = 3
) -> dict[str, Tensor]:
    """Random Gaussians filling the view frustum of one camera at the origin (raw params)."""
    g = torch.Generator().manual_seed(seed)
    f = FOX_FOCAL_PER_WIDTH * width
    z = 2.0 + 6.0 * torch.rand(n, generator=g)
    u = (torch.rand(n, generator=g) * 1.1 - 0.05) * width
    v = (torch.rand(n, generator=g) * 1.1 - 0.05) * height
    means = torch.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], dim=-1)
    opac = 0.05 + 0.9 * torch.rand(n, generator=g)
    return {
        "means": means,
        "quats": torch.randn(n, 4, generator=g),
        "scales": -4.0 + 2.0 * torch.rand(n, 3, generator=g),  # log scales
        "opacities": torch.logit(opac),
        "sh": 0.3 * torch.randn(n, (sh_degree + 1) ** 2, 3, generator=g),
        "viewmats": torch.eye(4)[None],
        "Ks": torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])[None],
    }


def step_fn(
    scene: dict[str, Tensor], width: int, height: int, backend: str, device: str, backward: bool
) -> Callable[[], dict]:
    """One rasterization (and backward) of ``scene`` on ``device``; returns info."""
    params = {
        k: scene[k].to(device).requires_grad_(True)
        for k in ("means", "quats", "scales", "opacities", "sh")
    }
    viewmats, Ks = scene["viewmats"].to(device), scene["Ks"].to(device)

    def run() -> dict:
        for p in params.values():
            p.grad = None
        with torch.set_grad_enabled(backward):
            colors, alphas, info = rasterize(
                params["means"],
                params["quats"],
                torch.exp(params["scales"]),
                torch.sigmoid(params["opacities"]),
                params["sh"],
                viewmats,
                Ks,
                width,
                height,
                sh_degree=3,
                absgrad=True,
                backend=backend,
            )
            if backward:
                info["means2d"].retain_grad()
                colors.square().mean().add(alphas.mean()).backward()
        return info

    return run


def interleaved_seconds(
    fns: dict[str, tuple[Callable[[], Any], int | None, bool]], repeats: int
) -> dict[str, list[float]]:
    """Wall seconds of each function, run alternately. ``fns``: name -> (fn, threads, sync)."""
    times: dict[str, list[float]] = {name: [] for name in fns}

    def timed(fn: Callable[[], Any], threads: int | None, sync: bool) -> float:
        if threads is not None:
            torch.set_num_threads(threads)
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for fn, threads, sync in fns.values():
        timed(fn, threads, sync)  # warm-up
    for _ in range(repeats):
        for name, (fn, threads, sync) in fns.items():
            times[name].append(timed(fn, threads, sync))
    return times


def variants(threads: list[int], cuda: bool) -> list[tuple[str, str, str, int | None]]:
    """(name, backend, device, threads) of every variant timed."""
    out = [(f"torch_{t}t", "torch", "cpu", t) for t in threads]
    if cuda:
        out += [("gsplat_cuda", "gsplat", "cuda", None), ("torch_cuda", "torch", "cuda", None)]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.0 * len(sizes), 4.2), squeeze=False)
    for ax, (w, h) in zip(axes[0], sizes, strict=True):
        for name in result["variants"]:
            recs = [
                r
                for r in result["cases"]
                if r["variant"] == name and (r["width"], r["height"]) == (w, h)
            ]
            if recs:
                ax.plot(
                    [r["n"] for r in recs], [r["fwdbwd_s"] for r in recs], marker="o", label=name
                )
        ax.axhline(TARGET_S, color="gray", lw=0.8, ls="--", label=f"{TARGET_S} s target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Gaussians")
        ax.set_ylabel("forward + backward seconds")
        ax.set_title(f"{w}x{h}, SH degree 3")
        ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def print_table(result: dict[str, Any]) -> None:
    from nerfstudio.utils.rich_utils import CONSOLE
    from rich.table import Table

    table = Table(title="rasterize: forward / forward+backward seconds (best of repeats)")
    for col in ("image", "Gaussians", "visible", "variant", "forward", "fwd+bwd", "ratio"):
        table.add_column(col, justify="right")
    for r in result["cases"]:
        table.add_row(
            f"{r['width']}x{r['height']}",
            size_label(r["n"]),
            str(r["visible"]),
            r["variant"],
            f"{r['fwd_s']:.4f}",
            f"{r['fwdbwd_s']:.4f}",
            f"{r['ratio']:.2f}",
        )
    CONSOLE.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON path (PNG next to it)")
    parser.add_argument("--sizes", default="68x120,135x240,270x480", help="WxH list")
    parser.add_argument("--counts", default="5000,20000,100000", help="Gaussian counts")
    parser.add_argument("--threads", default="2,1", help="torch CPU thread counts to compare")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant")
    parser.add_argument("--quick", action="store_true", help="68x120 only, 5k and 20k, 3 runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from rich.progress import Progress

    if args.quick:
        args.sizes, args.counts, args.repeats = "68x120", "5000,20000", 3
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    counts = [int(c) for c in args.counts.split(",") if c]
    threads = [int(t) for t in args.threads.split(",") if t]
    cuda = torch.cuda.is_available()
    runs = variants(threads, cuda)
    initial_threads = torch.get_num_threads()
    result: dict[str, Any] = {
        "sizes": sizes,
        "counts": counts,
        "threads": threads,
        "repeats": args.repeats,
        "seed": args.seed,
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if cuda else None,
        # OpenMP threads spin while they wait: on a busy machine, two torch threads can
        # be far slower than one unless OMP_WAIT_POLICY=PASSIVE is set before start.
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "variants": [name for name, *_ in runs],
        "cases": [],
    }
    with Progress() as progress:
        task = progress.add_task("raster", total=len(sizes) * len(counts))
        for w, h in sizes:
            for n in counts:
                progress.update(task, description=f"{w}x{h} N={size_label(n)}")
                scene = make_scene(n, w, h, seed=args.seed)
                fwd, fwdbwd, visible = {}, {}, {}
                for name, backend, device, t in runs:
                    sync = device == "cuda"
                    fwd[name] = (step_fn(scene, w, h, backend, device, False), t, sync)
                    fwdbwd[name] = (step_fn(scene, w, h, backend, device, True), t, sync)
                    visible[name] = int((fwd[name][0]()["radii"] > 0).sum())
                t_fwd = interleaved_seconds(fwd, args.repeats)
                t_all = interleaved_seconds(fwdbwd, args.repeats)
                first = runs[0][0]
                for name, *_ in runs:
                    rec = {
                        "width": w,
                        "height": h,
                        "n": n,
                        "variant": name,
                        "visible": visible[name],
                        "fwd_s": min(t_fwd[name]),
                        "fwd_median_s": statistics.median(t_fwd[name]),
                        "fwdbwd_s": min(t_all[name]),
                        "fwdbwd_median_s": statistics.median(t_all[name]),
                    }
                    rec["ratio"] = rec["fwdbwd_s"] / min(t_all[first])
                    result["cases"].append(rec)
                    tag = f"{name}_{w}x{h}_{size_label(n)}"
                    result[f"fwdbwd_s_{tag}"] = round(rec["fwdbwd_s"], 5)
                    result[f"ratio_{tag}"] = round(rec["ratio"], 3)
                del scene, fwd, fwdbwd
                progress.advance(task)
    torch.set_num_threads(initial_threads)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print_table(result)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
