"""Scheduler benchmark: odin plan vs random plan on a city-like scene or a real scene.

    python -m odin_ns.bench.schedule --views 5000 --primitives 200000 --ranks 8 --out s.json
    python -m odin_ns.bench.schedule --data ../shared/data/fox --primitives 100000 --ranks 8 \
        --out fox.json
    python -m odin_ns.bench.schedule --scaling --out scaling.json

Footprints come from ``compute_footprints`` on the scene's geometry (timed separately,
``footprint_seconds``). ``plan_seconds`` is ``build_plan`` alone (locality graph, partition,
epochs, dependency table). Conflict is ``plan_conflict`` (window 4) averaged over steps.
Predicted waits come from ``simulate`` with a cost model: per view
``1 ms + 2 us * footprint rows``, times a seeded log-normal jitter (sigma 0.2) per
(step, rank) for run-to-run noise, plus 0.2 ms publication latency; both plans are
replayed under both sync modes (``predicted``), and the headline pair is the random plan
under a barrier (today's data parallel) vs the odin plan under Odin sync.
A PNG of conflict per step (odin vs random) is written next to the JSON.
Times are wall seconds and process CPU seconds (``*_cpu_seconds``; robust to other jobs
sharing the machine). Torch runs on ``--threads`` threads (default 1: on a shared 2-core
box, torch's thread pool under contention is several times slower than one thread).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from odin_ns.bench.report import save_figure, write_json
from odin_ns.bench.simulate import simulate
from odin_ns.schedule import (
    Plan,
    build_plan,
    compute_footprints,
    load_imbalance,
    plan_conflict,
    previous_step_reads,
)


@dataclass
class Scene:
    means: torch.Tensor  # [N, 3]
    scales: torch.Tensor  # [N, 3]
    quats: torch.Tensor  # [N, 4]
    opacities: torch.Tensor  # [N]
    viewmats: torch.Tensor  # [V, 4, 4] world-to-camera, OpenCV
    Ks: torch.Tensor  # [V, 3, 3]
    width: int
    height: int


def look_at(eye: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """[4, 4] OpenCV world-to-camera matrix (x right, y down, z forward), world z up."""
    f = forward / np.linalg.norm(forward)
    r = np.cross(f, [0.0, 0.0, 1.0])
    r = r / np.linalg.norm(r)
    d = np.cross(f, r)
    m = np.eye(4)
    m[:3, :3] = np.stack([r, d, f])
    m[:3, 3] = -m[:3, :3] @ eye
    return m


def make_city(
    num_views: int,
    num_primitives: int,
    seed: int = 0,
    block: float = 60.0,
    street: float = 20.0,
    cam_height: float = 6.0,
    pitch_deg: float = 35.0,
    width: int = 320,
    height: int = 240,
) -> Scene:
    """City blocks on a G x G grid; cameras along the street centre lines every few metres
    (looking left, right and forward, pitched down); primitives on facades and streets.

    G grows with the number of views (about 240 G (G + 1) views at 2 m spacing).
    """
    rng = np.random.default_rng(seed)
    g = max(2, round(math.sqrt(num_views / 240.0)))
    pitch = block + street
    size = g * pitch
    # Street centre lines: x = i * pitch (vertical) and y = i * pitch (horizontal).
    seg_len = size
    num_lines = 2 * (g + 1)
    positions = -(-num_views // 3)
    s = (np.arange(positions) + 0.5) * (num_lines * seg_len / positions)
    line, off = np.divmod(s, seg_len)
    line = line.astype(np.int64)
    vertical = line < g + 1
    idx = np.where(vertical, line, line - (g + 1))
    x = np.where(vertical, idx * pitch, off)
    y = np.where(vertical, off, idx * pitch)
    heading = np.where(vertical, 0.5 * np.pi, 0.0) + np.where(rng.random(positions) < 0.5, 0, np.pi)
    phi = np.deg2rad(pitch_deg)
    mats = []
    for k in range(num_views):
        p, turn = divmod(k, 3)
        th = heading[p] + (0.5 * np.pi, -0.5 * np.pi, 0.0)[turn]
        fwd = np.array([np.cos(phi) * np.cos(th), np.cos(phi) * np.sin(th), -np.sin(phi)])
        mats.append(look_at(np.array([x[p], y[p], cam_height]), fwd))
    viewmats = torch.tensor(np.stack(mats), dtype=torch.float32)
    f = 0.8 * width
    K = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=torch.float32)
    Ks = K.expand(num_views, 3, 3).clone()

    # Primitives: 60% on facades (block walls, 0..25 m), 40% on the street ground.
    n_wall = int(0.6 * num_primitives)
    n_ground = num_primitives - n_wall
    bi, bj = rng.integers(0, g, n_wall), rng.integers(0, g, n_wall)
    side = rng.integers(0, 4, n_wall)
    t = rng.random(n_wall) * block
    x0, y0 = bi * pitch + street / 2, bj * pitch + street / 2
    wx = np.select([side == 0, side == 1, side == 2], [x0 + t, x0 + t, x0], x0 + block)
    wy = np.select([side == 0, side == 1, side == 2], [y0, y0 + block, y0 + t], y0 + t)
    wz = rng.random(n_wall) * 25.0
    gx, gy = rng.random(n_ground) * size, rng.random(n_ground) * size
    on_street = (np.mod(gx + street / 2, pitch) < street) | (
        np.mod(gy + street / 2, pitch) < street
    )
    gx, gy = np.where(on_street, gx, np.round(gx / pitch) * pitch), gy
    means = np.concatenate(
        [np.stack([wx, wy, wz], 1), np.stack([gx, gy, np.zeros(n_ground)], 1)], axis=0
    )
    scales = np.exp(rng.uniform(np.log(0.05), np.log(0.5), (num_primitives, 3)))
    quats = rng.normal(size=(num_primitives, 4))
    opac = rng.uniform(0.05, 1.0, num_primitives)
    return Scene(
        means=torch.tensor(means, dtype=torch.float32),
        scales=torch.tensor(scales, dtype=torch.float32),
        quats=torch.tensor(quats, dtype=torch.float32),
        opacities=torch.tensor(opac, dtype=torch.float32),
        viewmats=viewmats,
        Ks=Ks,
        width=width,
        height=height,
    )


def make_layout_scene(
    layout: str, num_views: int, points_per_view: int = 100, seed: int = 0
) -> Scene:
    """A synthetic layout (``odin_ns.data.synthetic``: "street", "drive", "object") with
    ``num_views`` cameras at 320 x 192 and Gaussians at its point cloud (street-scale sizes,
    2 to 20 cm), without rendering: "drive" looks down the street, so far facades and the
    end wall are in every frame (dense overlap)."""
    from odin_ns.data.synthetic import layout_geometry

    width, height = 320, 192
    cams, xyz = layout_geometry(layout, num_views, points_per_view * num_views, width, height, seed)
    rng = np.random.default_rng(seed)
    n = xyz.shape[0]
    flip = np.diag([1.0, -1.0, -1.0, 1.0])  # OpenGL camera axes -> OpenCV
    viewmats = torch.tensor(
        np.stack([np.linalg.inv(c.c2w @ flip) for c in cams]), dtype=torch.float32
    )
    Ks = torch.tensor(
        [[[c.fx, 0.0, c.cx], [0.0, c.fy, c.cy], [0.0, 0.0, 1.0]] for c in cams], dtype=torch.float32
    )
    return Scene(
        means=torch.from_numpy(xyz.astype(np.float32)),
        scales=torch.tensor(
            np.exp(rng.uniform(np.log(0.02), np.log(0.2), (n, 3))), dtype=torch.float32
        ),
        quats=torch.tensor(rng.normal(size=(n, 4)), dtype=torch.float32),
        opacities=torch.tensor(rng.uniform(0.05, 1.0, n), dtype=torch.float32),
        viewmats=viewmats,
        Ks=Ks,
        width=width,
        height=height,
    )


def load_transforms_scene(
    data_dir: Path, num_primitives: int, seed: int = 0, downscale: int = 4
) -> Scene:
    """Cameras from a nerfstudio ``transforms.json`` (OpenGL c2w -> OpenCV w2c), and
    ``num_primitives`` random Gaussians in the bounding box of the camera centres."""
    meta = json.loads((data_dir / "transforms.json").read_text())
    frames = meta["frames"]
    if not frames:
        raise ValueError(f"{data_dir}/transforms.json has no frames")
    mats, Ks = [], []
    w = h = None
    for fr in frames:
        get = lambda k, fr=fr: fr.get(k, meta.get(k))  # noqa: E731
        c2w = np.asarray(fr["transform_matrix"], dtype=np.float64)
        c2w = c2w @ np.diag([1.0, -1.0, -1.0, 1.0])  # OpenGL (y up, -z fwd) -> OpenCV
        mats.append(np.linalg.inv(c2w))
        w, h = int(get("w")) // downscale, int(get("h")) // downscale
        Ks.append(
            [
                [get("fl_x") / downscale, 0, get("cx") / downscale],
                [0, get("fl_y") / downscale, get("cy") / downscale],
                [0, 0, 1],
            ]
        )
    viewmats = torch.tensor(np.stack(mats), dtype=torch.float32)
    centers = np.stack([np.linalg.inv(m)[:3, 3] for m in mats])
    lo, hi = centers.min(0), centers.max(0)
    rng = np.random.default_rng(seed)
    means = lo + rng.random((num_primitives, 3)) * (hi - lo)
    diag = float(np.linalg.norm(hi - lo))
    scales = np.exp(rng.uniform(np.log(diag / 2000), np.log(diag / 200), (num_primitives, 3)))
    return Scene(
        means=torch.tensor(means, dtype=torch.float32),
        scales=torch.tensor(scales, dtype=torch.float32),
        quats=torch.tensor(rng.normal(size=(num_primitives, 4)), dtype=torch.float32),
        opacities=torch.tensor(rng.uniform(0.05, 1.0, num_primitives), dtype=torch.float32),
        viewmats=viewmats,
        Ks=torch.tensor(Ks, dtype=torch.float32),
        width=w,
        height=h,
    )


def view_costs(footprints) -> np.ndarray:
    """Cost model: seconds per view, 1 ms + 2 us per footprint row."""
    return 1e-3 + 2e-6 * np.diff(footprints.indptr)


def predicted_wait(plans: dict[str, Plan], costs: np.ndarray, seed: int = 0) -> dict:
    """Replay each plan under barrier and Odin sync with the same jittered costs.

    Summary: ``predicted_wait_barrier`` = mean wait per rank of the random plan under a
    barrier (today's data-parallel baseline), ``predicted_wait_odin`` = the odin plan under
    Odin sync; ``*_critical_path_*`` = makespan minus the busiest rank's compute.
    """
    shape = next(iter(plans.values())).views.shape[:2]
    jitter = np.random.default_rng([seed, 7]).lognormal(0.0, 0.2, shape)
    table: dict = {}
    for name, plan in plans.items():
        step = costs[plan.views].sum(axis=2) * jitter
        table[name] = {}
        for mode in ("barrier", "odin"):
            res = simulate(plan, step, mode=mode, comm_latency=2e-4)
            table[name][mode] = {
                "total_time": res.total_time,
                "mean_wait_per_rank": float(res.wait_per_rank.mean()),
                "critical_path_wait": res.critical_path_wait,
            }
    base, odin = table["random"]["barrier"], table["odin"]["odin"]
    return {
        "predicted_wait_barrier": base["mean_wait_per_rank"],
        "predicted_wait_odin": odin["mean_wait_per_rank"],
        "predicted_critical_path_wait_barrier": base["critical_path_wait"],
        "predicted_critical_path_wait_odin": odin["critical_path_wait"],
        "wait_hidden_fraction": 1.0 - odin["mean_wait_per_rank"] / base["mean_wait_per_rank"]
        if base["mean_wait_per_rank"] > 0
        else 0.0,
        "predicted_speedup": base["total_time"] / max(odin["total_time"], 1e-12),
        "predicted": table,
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed_footprints(scene: Scene):
    """The scene's footprints with the wall and CPU seconds they took."""
    t0, c0 = time.perf_counter(), time.process_time()
    F = compute_footprints(
        scene.means,
        scene.scales,
        scene.quats,
        scene.opacities,
        scene.viewmats,
        scene.Ks,
        scene.width,
        scene.height,
    )
    return F, time.perf_counter() - t0, time.process_time() - c0


def run_one(scene: Scene, ranks: int, steps: int | None, seed: int, window: int, console) -> dict:
    F, footprint_s, footprint_cpu = timed_footprints(scene)
    num_views = F.shape[0]
    if steps is None:
        steps = -(-num_views // ranks)  # one epoch
    console.log(f"footprints {F.shape} nnz={F.nnz:,} in {footprint_s:.2f}s; planning {steps} steps")
    plans, seconds = {}, {}
    cpu = {}
    for strategy in ("odin", "random"):
        t0, c0 = time.perf_counter(), time.process_time()
        plans[strategy] = build_plan(F, ranks, steps, seed=seed, strategy=strategy)
        seconds[strategy] = time.perf_counter() - t0
        cpu[strategy] = time.process_time() - c0
    costs = view_costs(F)
    conflict = {s: plan_conflict(p, window) for s, p in plans.items()}
    wait = predicted_wait(plans, costs, seed)
    imbalance = {s: load_imbalance(p, costs) for s, p in plans.items()}
    rows = np.diff(F.indptr)
    return {
        "views": num_views,
        "primitives": F.shape[1],
        "ranks": ranks,
        "steps": steps,
        "footprint_nnz": int(F.nnz),
        "footprint_rows_mean": float(rows.mean()),
        "footprint_rows_max": int(rows.max()),
        "footprint_seconds": footprint_s,
        "footprint_cpu_seconds": footprint_cpu,
        "plan_seconds": seconds["odin"],
        "plan_cpu_seconds": cpu["odin"],
        "plan_seconds_random": seconds["random"],
        "conflict_odin": float(conflict["odin"].mean()),
        "conflict_random": float(conflict["random"].mean()),
        "conflict_ratio": float(conflict["odin"].mean() / max(conflict["random"].mean(), 1e-12)),
        # share of (step, rank) pairs that read a primitive a peer wrote one step before
        **{
            f"previous_step_reads_{s}": float(previous_step_reads(p)[1:].mean())
            if steps > 1
            else 0.0
            for s, p in plans.items()
        },
        "imbalance_odin_max": float(imbalance["odin"].max()),
        "imbalance_odin_mean": float(imbalance["odin"].mean()),
        "imbalance_random_mean": float(imbalance["random"].mean()),
        # odin plan under barrier sync vs odin plan under Odin sync (same plan, same costs)
        "assignment": plans["odin"].assignment,
        **wait,
        "peak_rss_mb": peak_rss_mb(),
        "_conflict_series": {s: c.tolist() for s, c in conflict.items()},
    }


def plot_conflict(series: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for (name, ys), color in zip(series.items(), ("tab:blue", "tab:red"), strict=False):
        ys = np.asarray(ys)
        ax.plot(ys, lw=0.6, alpha=0.35, color=color, label=f"{name} (mean {ys.mean():.4f})")
        k = max(1, len(ys) // 100)
        if k > 1:
            sm = np.convolve(ys, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(len(sm)) + k // 2, sm, lw=1.5, color=color)
    ax.set_xlabel("step")
    ax.set_ylabel("conflict (rows a peer wrote, last 4 steps)")
    ax.set_title(title)
    ax.legend()
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--views", type=int, default=2000)
    ap.add_argument("--primitives", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="default: one epoch")
    ap.add_argument("--data", type=Path, default=None, help="scene folder with transforms.json")
    ap.add_argument("--downscale", type=int, default=4, help="image downscale for --data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--scaling", action="store_true", help="1k/10k/50k views, 2/8/64 ranks")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from rich.console import Console

    console = Console(stderr=True)
    torch.manual_seed(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    if args.scaling:
        result = run_scaling(args, console)
        plot_conflict(result.pop("_conflict_series"), png, "city, 50k views, 8 ranks")
    else:
        if args.data is not None:
            scene = load_transforms_scene(args.data, args.primitives, args.seed, args.downscale)
            name = f"{args.data.name} ({scene.viewmats.shape[0]} views)"
        else:
            scene = make_city(args.views, args.primitives, args.seed)
            name = f"city ({args.views} views)"
        with console.status(f"benchmarking {name}"):
            result = run_one(scene, args.ranks, args.steps, args.seed, args.window, console)
        result["scene"] = name
        plot_conflict(result.pop("_conflict_series"), png, f"{name}, {args.ranks} ranks")
    result["png"] = str(png)
    write_json(args.out, result)
    console.print_json(json.dumps(result))
    return result


def run_scaling(args, console) -> dict:
    """Planning time and predicted wait at 1k / 10k / 50k views (20 primitives per view)."""
    from rich.progress import Progress

    sizes = [(1_000, 20_000), (10_000, 200_000), (50_000, 1_000_000)]
    ranks = [2, 8, 64]
    rows = []
    series = None
    with Progress(console=console) as progress:
        task = progress.add_task("scaling", total=len(sizes) * len(ranks))
        for views, prims in sizes:
            scene = make_city(views, prims, args.seed)
            F, fp_s, fp_cpu = timed_footprints(scene)
            del scene
            costs = view_costs(F)
            for r in ranks:
                steps = -(-views // r)
                t0, c0 = time.perf_counter(), time.process_time()
                plan = build_plan(F, r, steps, seed=args.seed, strategy="odin")
                plan_s, plan_cpu = time.perf_counter() - t0, time.process_time() - c0
                t0 = time.perf_counter()
                rnd = build_plan(F, r, steps, seed=args.seed, strategy="random")
                rnd_s = time.perf_counter() - t0
                c_o, c_r = plan_conflict(plan, args.window), plan_conflict(rnd, args.window)
                w = predicted_wait({"odin": plan, "random": rnd}, costs, args.seed)
                row = {
                    "views": views,
                    "primitives": prims,
                    "ranks": r,
                    "steps": steps,
                    "footprint_nnz": int(F.nnz),
                    "footprint_seconds": fp_s,
                    "footprint_cpu_seconds": fp_cpu,
                    "plan_seconds": plan_s,
                    "plan_cpu_seconds": plan_cpu,
                    "plan_seconds_random": rnd_s,
                    "conflict_odin": float(c_o.mean()),
                    "conflict_random": float(c_r.mean()),
                    "assignment": plan.assignment,
                    **{k: v for k, v in w.items() if k != "predicted"},
                    "peak_rss_mb": peak_rss_mb(),
                }
                rows.append(row)
                console.log(row)
                if views == 50_000 and r == 8:
                    series = {"odin": c_o.tolist(), "random": c_r.tolist()}
                progress.advance(task)
            del F
    last = [r for r in rows if r["views"] == 50_000 and r["ranks"] == 8][0]
    return {
        "scaling": rows,
        **{
            k: last[k]
            for k in ("plan_seconds", "plan_cpu_seconds", "footprint_seconds", "conflict_odin")
        },
        "conflict_random": last["conflict_random"],
        "predicted_wait_barrier": last["predicted_wait_barrier"],
        "predicted_wait_odin": last["predicted_wait_odin"],
        "peak_rss_mb": peak_rss_mb(),
        "_conflict_series": series,
    }


if __name__ == "__main__":
    main()
