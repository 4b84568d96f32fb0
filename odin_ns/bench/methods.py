"""Methods benchmark: odin-splatfacto vs odin-splatfacto-mcmc (and -big), one process each.

    python -m odin_ns.bench.methods --data DIR [--dataparser nerfstudio-data|blender-data] \
        [--downscale-factor F] --steps 300 --repeats 1 \
        --methods odin-splatfacto,odin-splatfacto-mcmc[,odin-splatfacto-big] \
        --out bench/methods_fox.json [-- more ns-train options, before the dataparser]

Every method trains the same scene for the same number of steps through nerfstudio's
``ns-train`` entry point in one process (this module runs it with a timing hook on the
trainer), then ``ns-eval`` measures PSNR / SSIM / LPIPS on the held-out views (LPIPS only
when its AlexNet weights are already cached: ``null`` otherwise). Runs are interleaved,
A B A B ..., one round per ``--repeats``; round i trains every method with seed
``--seed + i``, so the rounds' spread is the seed's and the machine's. The schedule is
compressed as in ``bench.sync`` (``--warmup``, ``--refine-every``; full resolution from the
start) and is the same for every method: MCMC relocates / samples where the default
strategy splits / prunes.

Per method: each run's metrics, final Gaussian count, ``train_s`` (first training step's
start to the last step's end, in the trainer: no start-up, data loading, final save or
evaluation) and ``process_s`` (the whole ``ns-train`` process); medians with ``_min`` /
``_max`` over rounds. Across methods: ``psnr_delta_<method>_vs_<first method>`` (median of
the same-round differences, with min / max). Writes JSON and a PNG bar chart (PSNR,
Gaussians, train seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from odin_ns.bench.commands import quiet_flags, schedule_flags
from odin_ns.bench.report import put_spread, save_figure, write_json

ENV_TIMES = "ODIN_BENCH_METHODS_TIMES"
METHODS = ("odin-splatfacto", "odin-splatfacto-mcmc", "odin-splatfacto-big")
DATAPARSERS = ("nerfstudio-data", "blender-data")
METRICS = ("psnr", "ssim", "lpips")


@dataclass(frozen=True)
class Run:
    """One training run: ``method`` in round ``round`` with ``seed``."""

    method: str
    round: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-r{self.round}"


def interleaved_runs(methods: list[str], repeats: int, seed: int) -> list[Run]:
    """A B A B ...: every round runs every method in the given order, with seed + round."""
    return [Run(m, i, seed + i) for i in range(repeats) for m in methods]


# ------------------------------------------------------------------------ the worker
def install_timing_hook(path: Path) -> None:
    """Patch ``OdinTrainer``: time its training steps and write {steps, train_s} to ``path``
    when ``train`` returns."""
    from odin_ns.trainer import OdinTrainer

    iteration, train = OdinTrainer.train_iteration, OdinTrainer.train
    times: dict[str, float] = {"steps": 0}

    def timed_iteration(self, step: int):
        times.setdefault("first_start", time.perf_counter())
        try:
            return iteration(self, step)
        finally:
            times["last_end"] = time.perf_counter()
            times["steps"] += 1

    def timed_train(self) -> None:
        train(self)
        path.write_text(
            json.dumps(
                {"steps": times["steps"], "train_s": times["last_end"] - times["first_start"]}
            )
        )

    OdinTrainer.train_iteration = timed_iteration  # type: ignore[method-assign]
    OdinTrainer.train = timed_train  # type: ignore[method-assign]


def run_worker(argv: list[str]) -> None:
    """``ns-train argv`` in this process, with the timing hook."""
    from odin_ns.method_registry import method_registry

    method_registry()  # before nerfstudio's script imports it: cheaply
    from nerfstudio.scripts.train import entrypoint

    install_timing_hook(Path(os.environ[ENV_TIMES]))
    sys.argv = ["ns-train", *argv]
    entrypoint()


# ------------------------------------------------------------------------ commands
def train_args(args, run: Run, work: Path) -> list[str]:
    """The ``ns-train`` arguments of ``run`` (method first, dataparser subcommand last)."""
    cmd = [
        run.method,
        "--data",
        str(args.data),
        "--output-dir",
        str(work),
        "--experiment-name",
        "methods",
        "--timestamp",
        run.name,
        "--max-num-iterations",
        str(args.steps),
        *quiet_flags(save_every=10 * args.steps),
        *("--machine.seed", str(run.seed)),
        *schedule_flags(warmup=args.warmup, refine_every=args.refine_every),
        *args.extra,
        args.dataparser,
    ]
    if args.downscale_factor:
        cmd += ["--downscale-factor", str(args.downscale_factor)]
    return cmd


def run_dir(work: Path, run: Run) -> Path:
    return work / "methods" / run.method / run.name


def eval_command(run_folder: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "ns-eval"),
        "--load-config",
        str(run_folder / "config.yml"),
        "--output-path",
        str(run_folder / "eval.json"),
    ]


def _check(proc: subprocess.CompletedProcess, what: str, log: Path) -> None:
    if proc.returncode != 0:
        raise SystemExit(
            f"{what} failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}"
        )


def train(args, run: Run, work: Path) -> dict:
    """Train ``run``; its timings (``train_s``, ``process_s``, ``steps``)."""
    folder = run_dir(work, run)
    times = work / f"{run.name}.times.json"
    times.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{ENV_TIMES: str(times)})
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    log = work / f"{run.name}.train.log"
    cmd = [sys.executable, "-m", "odin_ns.bench.methods", *train_args(args, run, work)]
    tic = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    process_s = time.perf_counter() - tic
    _check(proc, f"ns-train {run.name}", log)
    return {**json.loads(times.read_text()), "process_s": process_s, "run_dir": str(folder)}


def evaluate(run_folder: Path) -> dict:
    """``ns-eval`` of a finished run: PSNR, SSIM, LPIPS (None when not measured)."""
    log = run_folder / "eval.log"
    with open(log, "w") as f:
        proc = subprocess.run(eval_command(run_folder), stdout=f, stderr=subprocess.STDOUT)
    _check(proc, f"ns-eval {run_folder.name}", log)
    results = json.loads((run_folder / "eval.json").read_text())["results"]
    return {k: (float(results[k]) if k in results else None) for k in METRICS}


def final_gaussians(run_folder: Path) -> int:
    """Gaussians in the run's last checkpoint."""
    import torch

    ckpt = sorted((run_folder / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return next(int(v.shape[0]) for k, v in state.items() if k.endswith("gauss_params.means"))


# ------------------------------------------------------------------------ summary
FIGURES = (*METRICS, "num_gaussians", "train_s", "process_s")


def summarize(runs: list[Run], records: list[dict]) -> dict:
    """Per method: the runs and each figure's median / min / max over rounds; across
    methods: the same-round PSNR (and SSIM) differences against the first method."""
    methods = list(dict.fromkeys(r.method for r in runs))
    by_method: dict[str, dict] = {}
    for method in methods:
        mine = [rec for run, rec in zip(runs, records, strict=True) if run.method == method]
        out: dict = {"runs": mine}
        for key in FIGURES:
            put_spread(out, key, [rec[key] for rec in mine])
        by_method[method] = out
    summary: dict = {"methods": by_method}
    base = methods[0]
    rounds = sorted({r.round for r in runs})
    for method in methods[1:]:
        for key in ("psnr", "ssim"):
            diffs = [
                _record(runs, records, method, i)[key] - _record(runs, records, base, i)[key]
                for i in rounds
            ]
            put_spread(summary, f"{key}_delta_{short(method)}_vs_{short(base)}", diffs)
    return summary


def _record(runs: list[Run], records: list[dict], method: str, round_: int) -> dict:
    return next(
        rec
        for run, rec in zip(runs, records, strict=True)
        if (run.method, run.round) == (method, round_)
    )


def short(method: str) -> str:
    """``odin-splatfacto-mcmc`` -> ``mcmc``; ``odin-splatfacto`` -> ``default``."""
    rest = method.removeprefix("odin-splatfacto").lstrip("-")
    return rest or "default"


def plot(summary: dict, path: Path, title: str) -> None:
    """Bars of PSNR, final Gaussians and train seconds per method (median, min-max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary["methods"])
    panels = (
        ("psnr", "held-out PSNR (dB)"),
        ("num_gaussians", "Gaussians"),
        ("train_s", "train seconds"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (key, label) in zip(axes, panels, strict=True):
        med = [summary["methods"][m][key] for m in methods]
        lo = [v - summary["methods"][m][f"{key}_min"] for v, m in zip(med, methods, strict=True)]
        hi = [summary["methods"][m][f"{key}_max"] - v for v, m in zip(med, methods, strict=True)]
        ax.bar(range(len(methods)), med, yerr=[lo, hi], capsize=6, color="tab:blue", alpha=0.8)
        for i, m in enumerate(methods):
            values = [r[key] for r in summary["methods"][m]["runs"]]
            ax.scatter([i] * len(values), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(methods)), [short(m) for m in methods])
        ax.set_ylabel(label)
        if key == "psnr":
            ax.set_ylim(min(min(med) - 2.0, 0.9 * min(med)), max(med) + 1.0)
    fig.suptitle(title)
    save_figure(fig, path)


# ------------------------------------------------------------------------ main
def parse_args(argv: list[str]) -> argparse.Namespace:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dataparser", choices=DATAPARSERS, default="nerfstudio-data")
    parser.add_argument("--downscale-factor", type=int, default=0, help="nerfstudio-data only")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--methods", default="odin-splatfacto,odin-splatfacto-mcmc")
    parser.add_argument("--repeats", type=int, default=1, help="rounds, A B A B ...")
    parser.add_argument("--seed", type=int, default=42, help="round i uses seed + i")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--refine-every", type=int, default=50)
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="default: outputs/bench_methods/<data name>"
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON path (PNG next to it)")
    args = parser.parse_args(argv)
    args.extra = extra
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.method_list if m not in METHODS]
    if unknown or not args.method_list:
        parser.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    if not args.data.exists():
        parser.error(f"--data {args.data} does not exist")
    if args.downscale_factor and args.dataparser != "nerfstudio-data":
        parser.error("--downscale-factor is a nerfstudio-data option")
    if args.repeats < 1 or args.steps < 1:
        parser.error("--repeats and --steps must be >= 1")
    if args.work_dir is None:
        args.work_dir = Path("outputs/bench_methods") / args.data.name
    return args


def run_benchmark(args) -> dict:
    from nerfstudio.utils.rich_utils import CONSOLE
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    runs = interleaved_runs(args.method_list, args.repeats, args.seed)
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} stages"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=CONSOLE) as progress:
        task = progress.add_task("methods benchmark", total=2 * len(runs))
        for run in runs:
            progress.update(task, description=f"ns-train {run.name} ({args.steps} steps)")
            record = {"method": run.method, "round": run.round, "seed": run.seed}
            record.update(train(args, run, work))
            progress.advance(task)
            progress.update(task, description=f"ns-eval {run.name}")
            folder = Path(record["run_dir"])
            record.update(evaluate(folder))
            record["num_gaussians"] = final_gaussians(folder)
            records.append(record)
            progress.advance(task)
            CONSOLE.log(
                f"{run.name}: PSNR {record['psnr']:.2f} dB, {record['num_gaussians']} Gaussians,"
                f" train {record['train_s']:.1f} s"
            )
    summary = summarize(runs, records)
    results = {
        "data": str(args.data),
        "dataparser": args.dataparser,
        "downscale_factor": args.downscale_factor or None,
        "steps": args.steps,
        "repeats": args.repeats,
        "seeds": sorted({r.seed for r in runs}),
        "order": [r.name for r in runs],
        "warmup": args.warmup,
        "refine_every": args.refine_every,
        "extra_ns_train_args": args.extra,
        "cpu_count": os.cpu_count(),
        "source": "measured (one process per run on this machine)",
        **summary,
    }
    write_json(args.out, results)
    plot(
        summary,
        args.out.with_suffix(".png"),
        f"{args.data.name}: {args.steps} steps, {args.repeats} round(s) (median, min-max)",
    )

    table = Table(
        title=f"methods: {args.data} ({args.steps} steps, {args.repeats} rounds; medians)"
    )
    for col in ("method", "PSNR", "SSIM", "LPIPS", "Gaussians", "train s"):
        table.add_column(col, justify="right")
    for method, f in summary["methods"].items():
        table.add_row(
            method,
            f"{f['psnr']:.2f}",
            f"{f['ssim']:.4f}",
            "-" if f["lpips"] is None else f"{f['lpips']:.4f}",
            f"{f['num_gaussians']:.0f}",
            f"{f['train_s']:.1f}",
        )
    CONSOLE.print(table)
    CONSOLE.print({k: v for k, v in results.items() if "delta" in k})
    return results


def main(argv: list[str] | None = None) -> dict | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(ENV_TIMES):  # one training run of this benchmark
        run_worker(argv)
        return None
    return run_benchmark(parse_args(argv))


if __name__ == "__main__":
    main()
