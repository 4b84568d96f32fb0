"""Sync benchmark: the same training under each synchronization mode, side by side.

    python -m odin_ns.bench.sync --data DIR [--downscale-factor F] --ranks 2 --steps N \
        --modes barrier,quality-first --out bench/sync_street.json

Every mode trains the same scene with the same seed, plan strategy, step count and world
size through the real entry point (``odin-ns-train``), then ``ns-eval`` measures PSNR on
the held-out views. Figures come from each run's ``odin_run.json`` (per-rank, per-step
timestamps, compute and wait seconds; the engine's bytes). Ratios compare modes measured in
the same invocation, so the machine's noise mostly cancels. Writes JSON and a PNG timeline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

BIN = Path(sys.executable).parent
SHORT = {"barrier": "barrier", "quality-first": "qf", "throughput-first": "tf"}
CONSOLE = Console()


def _train(args, mode: str, out: Path, port: int) -> Path:
    cmd = [
        str(BIN / "odin-ns-train"),
        "--nproc-per-node",
        str(args.ranks),
        "--master-port",
        str(port),
        "odin-splatfacto",
        "--data",
        str(args.data),
        "--output-dir",
        str(out),
        "--experiment-name",
        "bench",
        "--timestamp",
        mode,
        "--max-num-iterations",
        str(args.steps),
        "--vis",
        "tensorboard",
        "--steps-per-eval-all-images",
        "0",
        "--steps-per-eval-image",
        "0",
        "--steps-per-save",
        str(10 * args.steps),
        "--machine.seed",
        str(args.seed),
        "--pipeline.model.num-downscales",
        "0",
        "--pipeline.model.warmup-length",
        str(args.warmup),
        "--pipeline.model.refine-every",
        str(args.refine_every),
        "--pipeline.sync.mode",
        mode,
        *args.extra,
    ]
    if args.downscale_factor:
        cmd += ["nerfstudio-data", "--downscale-factor", str(args.downscale_factor)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with CONSOLE.status(f"training {mode} on {args.ranks} ranks for {args.steps} steps"):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out / "bench" / "odin-splatfacto" / mode


def _psnr(run_dir: Path) -> float:
    out = run_dir / "eval.json"
    with CONSOLE.status(f"ns-eval {run_dir.name}"):
        proc = subprocess.run(
            [
                str(BIN / "ns-eval"),
                "--load-config",
                str(run_dir / "config.yml"),
                "--output-path",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"ns-eval failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(out.read_text())["results"]["psnr"])


def _final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return {k: v for k, v in state.items() if "gauss_params" in k}


def mode_figures(summary: dict, skip_steps: int) -> dict:
    """Throughput, wait, bytes and the no-wait ideal of one run (first steps skipped)."""
    ranks = summary["ranks"]
    steps = [[s for s in r["steps"] if s["step"] >= skip_steps] for r in ranks]
    n_steps = len(steps[0])
    start = min(s[0]["start"] for s in steps)
    end = max(s[-1]["end"] for s in steps)
    views = sum(len(s) for s in steps)
    busy = [sum(x["end"] - x["start"] - x["wait_s"] for x in s) for s in steps]
    waits = [sum(x["wait_s"] for x in s) for s in steps]
    num_gaussians = np.mean([p["num_gaussians"] for p in ranks[0]["phases"]])
    row_floats = 59  # splatfacto (SH degree 3): 3+3+4+3+45+1 gradient floats per Gaussian
    world = len(ranks)
    dense_allreduce = 2.0 * (world - 1) / world * num_gaussians * row_floats * 4
    bytes_per_step = np.mean([r["engine"]["bytes_sent"] for r in ranks]) / max(
        1, len(ranks[0]["steps"])
    )
    return {
        "views_per_second": views / (end - start),
        "ideal_views_per_second": views / max(busy),
        "wait_seconds_per_step": float(np.mean(waits)) / n_steps,
        "critical_path_wait_s": float(max(waits)),
        "bytes_per_step": float(bytes_per_step),
        "dense_allreduce_bytes_per_step": float(dense_allreduce),
        "visibility_violations": int(sum(r["engine"]["visibility_violations"] for r in ranks)),
        "replicas_identical": len({r["replica_hash"] for r in ranks}) == 1,
        "mean_gaussians": float(num_gaussians),
    }


def plot_timeline(summaries: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(summaries), 1, figsize=(10, 2.2 * len(summaries)), squeeze=False)
    for ax, (mode, summary) in zip(axes[:, 0], summaries.items(), strict=True):
        t0 = min(r["steps"][0]["start"] for r in summary["ranks"])
        for r in summary["ranks"]:
            for s in r["steps"]:
                wait_end = s["start"] - t0 + s["wait_s"]
                ax.barh(r["rank"], s["wait_s"], left=s["start"] - t0, color="tab:red", height=0.6)
                ax.barh(
                    r["rank"],
                    s["end"] - s["start"] - s["wait_s"],
                    left=wait_end,
                    color="tab:blue",
                    height=0.6,
                )
        ax.set_title(f"{mode}: compute (blue) and wait (red) per rank")
        ax.set_ylabel("rank")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--downscale-factor", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", default="barrier,quality-first,throughput-first")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--refine-every", type=int, default=50)
    parser.add_argument(
        "--skip-steps", type=int, default=5, help="warm-up steps left out of timings"
    )
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/bench_sync"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("extra", nargs="*", help="more ns-train options, after --")
    args = parser.parse_args(argv)
    if not args.data.exists():
        parser.error(f"--data {args.data} does not exist")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(SHORT)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {sorted(SHORT)}")

    summaries, results = (
        {},
        {"data": str(args.data), "ranks": args.ranks, "steps": args.steps, "modes": {}},
    )
    for i, mode in enumerate(modes):
        run = _train(args, mode, args.work_dir, port=29400 + (os.getpid() + i) % 500)
        summaries[mode] = json.loads((run / "odin_run.json").read_text())
        figures = mode_figures(summaries[mode], args.skip_steps)
        figures["psnr"] = _psnr(run)
        figures["run_dir"] = str(run)
        results["modes"][mode] = figures

    base = results["modes"].get("barrier")
    for mode, figures in results["modes"].items():
        key = SHORT[mode]
        figures["ideal_share"] = figures["views_per_second"] / figures["ideal_views_per_second"]
        results[f"ideal_share_{key}"] = figures["ideal_share"]
        results[f"bytes_ratio_{key}_vs_dense_allreduce"] = (
            figures["bytes_per_step"] / figures["dense_allreduce_bytes_per_step"]
        )
        if base is not None and mode != "barrier":
            results[f"throughput_ratio_{key}_vs_barrier"] = (
                figures["views_per_second"] / base["views_per_second"]
            )
            results[f"wait_hidden_{key}"] = 1.0 - figures["critical_path_wait_s"] / max(
                1e-9, base["critical_path_wait_s"]
            )
            params_m, params_b = (
                _final_params(Path(figures["run_dir"])),
                _final_params(Path(base["run_dir"])),
            )
            same_shapes = all(params_m[k].shape == params_b[k].shape for k in params_b)
            results[f"max_param_diff_{key}_vs_barrier"] = (
                max(float((params_m[k] - params_b[k]).abs().max()) for k in params_b)
                if same_shapes
                else float("inf")
            )
            results[f"psnr_delta_{key}_vs_barrier"] = figures["psnr"] - base["psnr"]
    if "quality-first" in results["modes"]:
        qf = results["modes"]["quality-first"]
        results["ideal_views_per_second"] = qf["ideal_views_per_second"]
    if "throughput-first" in results["modes"]:
        engines = [r["engine"] for r in summaries["throughput-first"]["ranks"]]
        decisions = sum(e["decisions"] for e in engines)
        results["max_staleness_tf"] = max(e["max_staleness"] for e in engines)
        results["admitted_fraction_tf"] = sum(e["admitted"] for e in engines) / max(1, decisions)
        results["delayed_primitive_reads_tf"] = sum(e["delayed_primitive_reads"] for e in engines)
        results["fallbacks_tf"] = {
            reason: sum(e["fallbacks"][reason] for e in engines)
            for reason in engines[0]["fallbacks"]
        }
        hist: dict[str, int] = {}
        for e in engines:
            for k, v in e["staleness_hist"].items():
                hist[k] = hist.get(k, 0) + v
        results["staleness_hist_tf"] = hist
        if "quality-first" in results["modes"]:
            results["psnr_delta_tf_vs_qf"] = (
                results["modes"]["throughput-first"]["psnr"]
                - results["modes"]["quality-first"]["psnr"]
            )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot_timeline(summaries, args.out.with_suffix(".png"))

    table = Table(title=f"sync benchmark: {args.data} ({args.ranks} ranks, {args.steps} steps)")
    for col in ("mode", "views/s", "ideal views/s", "wait s/step", "bytes/step", "PSNR"):
        table.add_column(col, justify="right")
    for mode, f in results["modes"].items():
        table.add_row(
            mode,
            f"{f['views_per_second']:.2f}",
            f"{f['ideal_views_per_second']:.2f}",
            f"{f['wait_seconds_per_step']:.4f}",
            f"{f['bytes_per_step']:.3g}",
            f"{f['psnr']:.2f}",
        )
    CONSOLE.print(table)
    CONSOLE.print({k: v for k, v in results.items() if k != "modes"})
    return results


if __name__ == "__main__":
    main()
