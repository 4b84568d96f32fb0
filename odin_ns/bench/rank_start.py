"""How ranks start, forked or spawned: start-up cost and training speed, interleaved.

    python -m odin_ns.bench.rank_start --data demo_data/street --ranks 2 --steps 300 \
        --rounds 4 --out bench/rank_start.json [-- more odin-splatfacto options]

``odin-ns-train --start-method fork`` (the default for CPU ranks: ranks forked from the
launcher, which has imported nerfstudio already) against ``--start-method spawn`` (a fresh
``python -u -m`` per rank, as GPU ranks start): the same run (scene, seed, steps, sync mode)
through the real entry point. Round i runs fork then spawn when i is even, spawn then fork
when odd (ABBA ...), so the machine's drift lands on both alike. Per run: wall seconds of
the whole command, CPU seconds of the launcher and every rank (``RUSAGE_CHILDREN``), seconds
from the command's start to the first training step (``odin_run.json``), and training
views per second after the first ``--skip-steps`` steps (``bench.sync.mode_figures``). Per
method the median and spread over rounds, and the same-round ratios spawn / fork. Writes
JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from odin_ns.bench.commands import quiet_flags, run_dir, run_env, schedule_flags, train_command
from odin_ns.bench.report import put_spread, save_figure, write_json
from odin_ns.bench.sync import mode_figures

METHODS = ("fork", "spawn")
CONSOLE = Console()


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """ABBA...: fork first in even rounds, spawn first in odd ones."""
    return [METHODS if i % 2 == 0 else METHODS[::-1] for i in range(rounds)]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_run(args, method: str, name: str) -> dict:
    """Train one run with ``--start-method method``; its figures."""
    flags = [
        *quiet_flags(save_every=10 * args.steps),
        *schedule_flags(warmup=args.warmup, refine_every=args.refine_every),
        *("--pipeline.sync.mode", args.mode),
        *args.extra,
    ]
    cmd = train_command(
        args.data, args.work_dir, ranks=args.ranks, experiment="rank_start", name=name,
        steps=args.steps, flags=flags, launcher_flags=["--start-method", method],
    )  # fmt: skip
    cpu, started = _children_cpu_s(), time.time()
    with CONSOLE.status(f"training {name} ({method}) on {args.ranks} ranks"):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env(threads=None))
    wall, cpu = time.time() - started, _children_cpu_s() - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir(args.work_dir, "rank_start", name) / "odin_run.json").read_text())
    first_step = min(r["steps"][0]["start"] for r in summary["ranks"])
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "startup_s": first_step - started,
        "views_per_second": mode_figures(summary, args.skip_steps)["views_per_second"],
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("wall_s", "cpu_s", "startup_s", "views_per_second")
    fig, axes = plt.subplots(1, len(keys), figsize=(3 * len(keys), 3))
    for ax, key in zip(axes, keys, strict=True):
        for x, method in enumerate(METHODS):
            values = [r[key] for r in results["runs"][method]]
            ax.plot([x] * len(values), values, "o", alpha=0.7)
            ax.plot([x - 0.2, x + 0.2], [np.median(values)] * 2, "k-")
        ax.set_xticks(range(len(METHODS)), METHODS)
        ax.set_title(key, fontsize=9)
    fig.suptitle(f"rank start: {results['ranks']} ranks, {results['steps']} steps (measured)")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds (even: balanced)")
    parser.add_argument("--mode", default="quality-first", help="--pipeline.sync.mode")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--refine-every", type=int, default=50)
    parser.add_argument("--skip-steps", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/bench_rank_start"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("extra", nargs="*", help="more odin-splatfacto options, after --")
    args = parser.parse_args(argv)
    if not (args.data / "transforms.json").is_file():
        parser.error(f"--data {args.data}: no transforms.json (make one: make demo)")
    if args.rounds < 1 or args.ranks < 1:
        parser.error("--rounds and --ranks must be >= 1")

    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for i, order in enumerate(round_orders(args.rounds)):
        for method in order:
            runs[method].append(measure_run(args, method, f"{method}-r{i}"))
        CONSOLE.log(
            f"round {i}: "
            + ", ".join(
                f"{m} {runs[m][-1]['wall_s']:.1f} s {runs[m][-1]['cpu_s']:.1f} CPU-s"
                for m in METHODS
            )
        )
    results: dict = {
        "data": str(args.data),
        "ranks": args.ranks,
        "steps": args.steps,
        "mode": args.mode,
        "rounds": args.rounds,
        "orders": round_orders(args.rounds),
        "source": f"measured (CPU ranks on this machine, {os.cpu_count()} cores)",
        "runs": runs,
    }
    for method in METHODS:
        for key in runs[method][0]:
            put_spread(results, f"{key}_{method}", [r[key] for r in runs[method]])
    for key in runs["fork"][0]:
        ratios = [s[key] / f[key] for f, s in zip(runs["fork"], runs["spawn"], strict=True)]
        put_spread(results, f"{key}_ratio_spawn_vs_fork", ratios)
    write_json(args.out, results)
    plot(results, args.out.with_suffix(".png"))
    CONSOLE.print({k: v for k, v in results.items() if k not in ("runs", "orders")})
    return results


if __name__ == "__main__":
    main()
