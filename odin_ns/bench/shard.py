"""Sharded vs replicated training: ``python -m odin_ns.bench.shard [--data DIR]``.

The scene: the built-in synthetic street (generated, default) or ``--data DIR`` (a
nerfstudio-data folder, e.g. ``../shared/data/fox``, with ``--downscale-factor F``).

Modes (all through ``odin-ns-train`` on CPU gloo ranks, same scene, seed and views budget):
``replicated`` (barrier: every rank holds every Gaussian and receives every peer's rows),
``sharded`` (quality-first, locality ownership from the plan) and ``sharded-random``
(random ownership, the Grendel-GS-style deal); with ``--modes``, also ``sharded-tf``
(throughput-first, locality ownership: its admitted fraction is reported). For each rank
count the modes run interleaved, the order reversed every round (A B C, C B A, ...), so
machine drift cancels. The issue's keys need ``replicated``, ``sharded`` and
``sharded-random``.

Per run, from its ``odin_run.json`` (steps after the first ``--skip`` are timed): views/s,
wait per step, bytes per rank per step (sent + received, mean and max over ranks), resident
rows per rank (owned + cache; N for replicated), owned rows; from its merged checkpoint:
the largest parameter difference to the replicated run of the same rank count, and (once
per mode and rank count) PSNR from single-process ``ns-eval``. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from odin_ns.bench.commands import BIN, quiet_flags, run_dir, run_env, schedule_flags, train_command
from odin_ns.bench.report import save_figure, write_json
from odin_ns.schedule.ownership import ROW_FLOATS
from odin_ns.viewer_ext.snapshot import step_wait

MODES = {
    "replicated": ["--pipeline.sync.mode", "barrier"],
    "sharded": ["--pipeline.sync.mode", "quality-first", "--pipeline.parallel", "sharded"],
    "sharded-random": [
        "--pipeline.sync.mode",
        "quality-first",
        "--pipeline.parallel",
        "sharded",
        "--pipeline.ownership",
        "random",
    ],
    "sharded-tf": ["--pipeline.sync.mode", "throughput-first", "--pipeline.parallel", "sharded"],
}
DEFAULT_MODES = ("replicated", "sharded", "sharded-random")
TRAINING = [
    *quiet_flags(save_every=100000),
    *schedule_flags(warmup=20, refine_every=15, densify_grad_thresh=0.0002),
]


def train(
    data: Path, out: Path, ranks: int, mode: str, name: str, views: int, downscale: int = 0
) -> Path:
    """One run; returns its output folder."""
    flags = [*TRAINING, *MODES[mode]]
    dataparser = ("nerfstudio-data", "--downscale-factor", str(downscale)) if downscale else ()
    cmd = train_command(
        data,
        out,
        ranks=ranks,
        experiment="bench",
        name=name,
        steps=views,
        flags=flags,
        dataparser=dataparser,
    )
    env = run_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return run_dir(out, "bench", name)


def checkpoint(run: Path) -> dict:
    import torch

    path = sorted((run / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    return torch.load(path, map_location="cpu", weights_only=False)


def param_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over the Gaussian parameters (inf when shapes differ)."""
    worst = 0.0
    for key, value in a["pipeline"].items():
        if "gauss_params" in key:
            other = b["pipeline"][key]
            if other.shape != value.shape:
                return float("inf")
            worst = max(worst, float((value - other).abs().max()))
    return worst


def run_figures(run: Path, skip: int) -> dict:
    """Per-run figures from ``odin_run.json`` (see the module docstring)."""
    summary = json.loads((run / "odin_run.json").read_text())
    ranks = summary["ranks"]
    steps = [r["steps"][skip:] for r in ranks]
    n_steps = len(steps[0])
    start = min(s[0]["start"] for s in steps)
    end = max(s[-1]["end"] for s in steps)
    per_rank = [float(np.mean([x["bytes_sent"] + x["bytes_recv"] for x in s])) for s in steps]
    sharded = "owned_rows" in ranks[0] and ranks[0]["owned_rows"] is not None
    n = int(checkpoint(run)["pipeline"]["_model.gauss_params.means"].shape[0])
    out = {
        "steps_timed": n_steps,
        "views_per_s": len(ranks) * n_steps / max(end - start, 1e-9),
        "wait_s_per_step": float(np.mean([step_wait(x) for s in steps for x in s])),
        "bytes_per_rank_step_mean": float(np.mean(per_rank)),
        "bytes_per_rank_step_max": float(np.max(per_rank)),
        "num_gaussians": n,
        "resident_rows_max": max(r["resident_rows"] for r in ranks) if sharded else n,
        "owned_rows": [r["owned_rows"] for r in ranks] if sharded else [n] * len(ranks),
    }
    out["owned_rows_max_over_fair"] = max(out["owned_rows"]) / (n / len(ranks))
    engines = [r.get("engine", {}) for r in ranks]
    if all("admitted" in e for e in engines):  # throughput-first: its admission counts
        decisions = sum(e["decisions"] for e in engines)
        out["admitted"] = sum(e["admitted"] for e in engines)
        out["admitted_fraction"] = out["admitted"] / decisions if decisions else 0.0
        out["max_staleness"] = max(e["max_staleness"] for e in engines)
    # float32: parameters (59 per row) for resident rows, Adam moments (2 x 59) for owned
    resident = [r["resident_rows"] for r in ranks] if sharded else [n] * len(ranks)
    out["param_moment_bytes_max"] = max(
        4 * ROW_FLOATS * (res + 2 * own)
        for res, own in zip(resident, out["owned_rows"], strict=True)
    )
    if sharded:
        reports = ranks[0]["ownership"]
        out["remote_read_fraction"] = [round(r["remote_read_fraction"], 4) for r in reports]
        out["random_remote_read_fraction"] = [
            round(r["random_remote_read_fraction"], 4) for r in reports
        ]
    return out


def evaluate(run: Path) -> float:
    out = run / "eval.json"
    cmd = [
        str(BIN / "ns-eval"),
        "--load-config",
        str(run / "config.yml"),
        "--output-path",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"ns-eval of {run} failed:\n{proc.stderr[-2000:]}")
    return float(json.loads(out.read_text())["results"]["psnr"])


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({int(k) for k in results["by_ranks"]})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for mode in results["modes"]:
        rows = [results["by_ranks"][str(r)][mode] for r in ranks]
        axes[0].plot(ranks, [x["bytes_per_rank_step_mean"] / 1e3 for x in rows], "o-", label=mode)
        axes[1].plot(ranks, [x["views_per_s"] for x in rows], "o-", label=mode)
        axes[2].plot(ranks, [x["resident_rows_max"] for x in rows], "o-", label=mode)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("kB per rank per step (sent + received)")
    axes[1].set_ylabel("views / s (all ranks)")
    axes[2].set_ylabel("resident rows, largest rank")
    for ax in axes:
        ax.set_xlabel("CPU ranks (gloo)")
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{results['scene']}: replicated vs sharded (locality / random ownership)")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/shard.json"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/odin_shard_bench"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--views", type=int, default=60, help="training views per run")
    parser.add_argument("--skip", type=int, default=3, help="first steps not timed")
    parser.add_argument("--no-eval", action="store_true")
    parser.add_argument("--data", type=Path, default=None, help="default: synthetic street")
    parser.add_argument("--downscale-factor", type=int, default=0)
    parser.add_argument(
        "--modes", nargs="+", choices=list(MODES), default=list(DEFAULT_MODES),
        help="modes to run (replicated first: the others' parameter differences are to it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.modes[0] != "replicated":
        parser.error("--modes must start with replicated (the reference of the differences)")
    modes = list(dict.fromkeys(args.modes))

    if args.data is None:
        from odin_ns.data.synthetic import make_scene

        scene = args.work / "street"
        label = "street (16 train views, 160x96), synthetic"
        if not (scene / "transforms.json").exists():
            make_scene(scene, layout="street", num_views=16, num_eval_views=3, seed=0)
    else:
        if not (args.data / "transforms.json").exists():
            parser.error(f"--data {args.data}: no transforms.json there")
        scene, label = args.data, f"{args.data.name} ({args.data})"
    tic = time.time()
    by_ranks: dict[str, dict] = {}
    for ranks in args.ranks:
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        ckpts: dict[str, list[dict]] = {m: [] for m in modes}
        psnr: dict[str, float] = {}
        for k in range(args.rounds):
            order = modes if k % 2 == 0 else modes[::-1]
            for mode in order:
                name = f"{mode}-r{ranks}-k{k}"
                run = train(
                    scene, args.work / "runs", ranks, mode, name, args.views, args.downscale_factor
                )
                runs[mode].append(run_figures(run, args.skip))
                ckpts[mode].append(checkpoint(run))
                if k == 0 and not args.no_eval:
                    psnr[mode] = evaluate(run)
                print(f"{name}: {runs[mode][-1]['views_per_s']:.2f} views/s", flush=True)
        table = {}
        for mode in modes:
            rows = runs[mode]
            pairs = zip(ckpts[mode], ckpts["replicated"], strict=True)
            diffs = [param_diff(c, r) for c, r in pairs]
            table[mode] = {
                "views_per_s": float(np.median([x["views_per_s"] for x in rows])),
                "wait_s_per_step": float(np.median([x["wait_s_per_step"] for x in rows])),
                "bytes_per_rank_step_mean": float(
                    np.median([x["bytes_per_rank_step_mean"] for x in rows])
                ),
                "bytes_per_rank_step_max": float(
                    np.median([x["bytes_per_rank_step_max"] for x in rows])
                ),
                "resident_rows_max": int(max(x["resident_rows_max"] for x in rows)),
                "param_moment_bytes_max": int(max(x["param_moment_bytes_max"] for x in rows)),
                "num_gaussians": rows[0]["num_gaussians"],
                "owned_rows_max_over_fair": float(max(x["owned_rows_max_over_fair"] for x in rows)),
                "max_param_diff_vs_replicated": float(max(diffs)),
                "psnr": psnr.get(mode),
                "rounds": rows,
            }
            if "admitted_fraction" in rows[0]:
                table[mode]["admitted_fraction"] = float(
                    np.median([x["admitted_fraction"] for x in rows])
                )
                table[mode]["max_staleness"] = int(max(x["max_staleness"] for x in rows))
        by_ranks[str(ranks)] = table
    lo, hi = str(min(args.ranks)), str(max(args.ranks))
    result = {
        "scene": label,
        "views_per_run": args.views,
        "rounds": args.rounds,
        "modes": modes,
        "order": "modes interleaved per rank count, reversed every round",
        "by_ranks": by_ranks,
        "wall_s": time.time() - tic,
    }
    if set(DEFAULT_MODES) <= set(modes):  # the keys
        sharded = [by_ranks[r][m] for r in by_ranks for m in ("sharded", "sharded-random")]
        result["max_param_diff_sharded_vs_replicated"] = max(
            x["max_param_diff_vs_replicated"] for x in sharded
        )
        result["owned_rows_max_over_fair"] = max(x["owned_rows_max_over_fair"] for x in sharded)
        bytes_of = {r: {m: t["bytes_per_rank_step_mean"] for m, t in by_ranks[r].items()}
                    for r in by_ranks}  # fmt: skip
        result["bytes_per_rank_growth_2_to_4"] = (
            bytes_of[hi]["sharded"] / bytes_of[lo]["sharded"] - 1.0
        )
        result["bytes_ratio_sharded_vs_replicated_4"] = (
            bytes_of[hi]["sharded"] / bytes_of[hi]["replicated"]
        )
        result["bytes_ratio_random_vs_replicated_4"] = (
            bytes_of[hi]["sharded-random"] / bytes_of[hi]["replicated"]
        )
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "by_ranks"}, indent=2))
    return result


if __name__ == "__main__":
    main()
