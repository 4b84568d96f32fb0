"""Time to quality: PSNR on the held-out views against training wall time, 1 vs 2 ranks.

    python -m odin_ns.bench.convergence --data DIR --views 600 --eval-every 60 \
        --settings 1x1,2x1:sqrt,2x2:sqrt,2x1:none,2x1:linear --out bench/convergence_street.json \
        [--downscale-factor 8] [-- more odin-splatfacto options]

Every setting ``RxB[:rule]`` (R ranks, B views per rank, ``--pipeline.batch-scaling``
rule) trains the same scene, seed and budget of training *views* through the real entry
point (``odin-ns-train``; one process is ``--nproc-per-node 1``), with the schedule read in
views (``--pipeline.schedule-in-views``, the default): the same command line on 1 or R
ranks. Each run saves a checkpoint every ``--eval-every`` views; evaluation happens after
all runs, in this process, from those checkpoints (nerfstudio's ``eval_setup`` once per run,
then ``get_average_eval_image_metrics`` per checkpoint), so it never pollutes training wall
time; its time is reported separately (``eval_s``).

Training wall time comes from this module acting as each run's worker
(``odin_ns.launch.main(worker_module=...)``): rank 0 records when the first training step
starts and when each checkpoint write starts and ends; a checkpoint's ``wall_s`` is its
start minus the first step's start minus earlier checkpoint writes (``checkpoint_s``, also
reported). Process start-up (imports, data loading, first plan) is not in ``wall_s``.

Reported per setting: the PSNR / SSIM curve (views, optimizer step, wall_s), the time to each
PSNR target (linear between checkpoints; null if never reached; by default the one-process
best PSNR minus 3, 2, 1, 0.5 and 0 dB), the final PSNR at the equal views budget and the best
PSNR with the views it came at. Across settings: ``time_ratio_to_final_psnr_2ranks_vs_1``
(time the best 2-rank setting takes to reach the one-process final PSNR over the one-process
wall time; null if none reaches it), ``psnr_gap_equal_views_2ranks_vs_1`` (one-process final
PSNR minus that setting's, dB), and the same two against the one-process *best* PSNR
(``time_ratio_to_best_psnr_2ranks_vs_1``: over the one-process time to its best;
``psnr_gap_best_2ranks_vs_1``). When the one-process curve falls more than
``OVERFIT_DROP_DB`` after its best (the budget overfits the scene), ``peaked_early`` says so
and the final-PSNR figures compare runs past their useful length. Writes JSON and a PNG (PSNR
vs wall time and vs views). ``--from-json`` recomputes the summary and the PNG of an earlier
run's JSON without training.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from odin_ns.bench.commands import (
    module_launcher,
    run_dir,
    run_env,
    schedule_flags,
    train_command,
)
from odin_ns.bench.report import save_figure, write_json

ENV_TIMES = "ODIN_BENCH_TIMES"
DEFAULT_SETTINGS = "1x1,2x1:sqrt,2x2:sqrt,2x1:none,2x1:linear"
# splatfacto's schedule compressed so that a small budget densifies (refines at views 300,
# 400, 500 of 600), in views (converted per run); full resolution from the start.
DEFAULT_TRAINING = schedule_flags(warmup=200, refine_every=100)
# A held-out PSNR this far below its best at the end of the budget is a curve past its peak:
# more than the +-0.4 dB swing between checkpoints that refines cause.
OVERFIT_DROP_DB = 0.5


@dataclass(frozen=True)
class Setting:
    """One run: R ranks x B views per rank, batch-scaling rule."""

    ranks: int
    views_per_rank: int
    scaling: str = "sqrt"

    @property
    def name(self) -> str:
        if self.ranks * self.views_per_rank == 1:
            return "1x1"
        return f"{self.ranks}x{self.views_per_rank}:{self.scaling}"

    @property
    def batch(self) -> int:
        return self.ranks * self.views_per_rank


def parse_settings(text: str) -> list[Setting]:
    """``"1x1,2x1:sqrt,2x2"`` -> settings (rule default: sqrt)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        shape, _, rule = item.partition(":")
        ranks, _, views = shape.partition("x")
        out.append(Setting(int(ranks), int(views or 1), rule or "sqrt"))
    return out


# ------------------------------------------------------------------------ the worker
def _record(event: dict) -> None:
    path = os.environ.get(ENV_TIMES)
    if path and int(os.environ.get("RANK", "0")) == 0:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


def install_timing_hooks() -> None:
    """Patch ``OdinTrainer``: record the first step's start and every checkpoint write."""
    from odin_ns.trainer import OdinTrainer

    iteration, save = OdinTrainer.train_iteration, OdinTrainer.save_checkpoint
    started = []

    def train_iteration(self, step: int):
        if not started:
            started.append(time.time())
            _record({"event": "start", "t": started[0], "step": step})
        return iteration(self, step)

    def save_checkpoint(self, step: int) -> None:
        t0 = time.time()
        save(self, step)
        _record({"event": "save", "step": step, "t0": t0, "t1": time.time()})

    OdinTrainer.train_iteration = train_iteration  # type: ignore[method-assign]
    OdinTrainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]


def read_times(path: Path) -> dict[int, tuple[float, float]]:
    """{step: (wall_s, checkpoint_s so far)} of every checkpoint, from the worker's log."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = next(e["t"] for e in events if e["event"] == "start")
    out, spent = {}, 0.0
    for e in sorted((e for e in events if e["event"] == "save"), key=lambda e: e["t0"]):
        out[int(e["step"])] = (e["t0"] - start - spent, spent)
        spent += e["t1"] - e["t0"]
    return out


# ------------------------------------------------------------------------ training
def train(setting: Setting, args, work: Path, port: int) -> Path:
    """One run through ``odin-ns-train`` (this module as the worker); its run folder."""
    name = setting.name.replace(":", "-")
    times = work / f"{name}.times.jsonl"
    times.unlink(missing_ok=True)
    flags = [
        *("--vis", "tensorboard", "--machine.seed", str(args.seed)),
        *("--steps-per-save", str(args.eval_every), "--save-only-latest-checkpoint", "False"),
        *("--steps-per-eval-batch", "0", "--steps-per-eval-image", "0"),
        *("--steps-per-eval-all-images", "0"),
        *("--pipeline.views-per-rank", str(setting.views_per_rank)),
        *("--pipeline.batch-scaling", setting.scaling),
        *DEFAULT_TRAINING,
        *args.training,
    ]
    downscale = args.downscale_factor
    cmd = train_command(
        args.data,
        work,
        ranks=setting.ranks,
        experiment="convergence",
        name=name,
        steps=args.views,
        flags=flags,
        launcher=module_launcher("odin_ns.bench.convergence"),
        port=port,
        # data-parser options come last on nerfstudio's command line
        dataparser=()
        if downscale is None
        else ("nerfstudio-data", "--downscale-factor", str(downscale)),
    )
    env = run_env(threads=None, ODIN_BENCH_TRAIN="1")
    env[ENV_TIMES] = str(times)
    log = work / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{setting.name} failed; see {log}:\n{log.read_text()[-3000:]}")
    return run_dir(work, "convergence", name)


# ------------------------------------------------------------------------ evaluation
def evaluate(run: Path, setting: Setting, times: dict[int, tuple[float, float]]) -> dict:
    """PSNR / SSIM of every checkpoint of ``run`` on the held-out views."""
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    _, pipeline, _, _ = eval_setup(run / "config.yml", test_mode="test")
    curve, eval_s = [], 0.0
    for ckpt in sorted((run / "nerfstudio_models").glob("step-*.ckpt")):
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        step = int(state["step"])
        pipeline.load_pipeline(state["pipeline"], step)
        tic = time.perf_counter()
        metrics = pipeline.get_average_eval_image_metrics(step=step)
        eval_s += time.perf_counter() - tic
        wall, spent = times[step]
        curve.append(
            {
                "step": step,
                "views": (step + 1) * setting.batch,
                "wall_s": wall,
                "checkpoint_s": spent,
                "psnr": float(metrics["psnr"]),
                "ssim": float(metrics["ssim"]),
                "num_gaussians": next(
                    int(v.shape[0])
                    for k, v in state["pipeline"].items()
                    if k.endswith("gauss_params.means")
                ),
            }
        )
    return {"curve": curve, "eval_s": eval_s}


def time_to(curve: list[dict], target: float, key: str = "wall_s") -> float | None:
    """``key`` (wall seconds, or views) at which the PSNR curve first reaches ``target``
    (linear between checkpoints; the first checkpoint's if it is already there), else None."""
    prev = None
    for point in curve:
        if point["psnr"] >= target:
            if prev is None:
                return float(point[key])
            frac = (target - prev["psnr"]) / (point["psnr"] - prev["psnr"])
            return prev[key] + frac * (point[key] - prev[key])
        prev = point
    return None


def best_point(curve: list[dict]) -> dict:
    """The checkpoint of ``curve`` with the highest held-out PSNR (the first if tied)."""
    return max(curve, key=lambda p: p["psnr"])


def summarize(results: dict[str, dict], targets: list[float]) -> dict:
    """Per-setting times to targets, final and best PSNR; the 2-rank vs 1-process keys."""
    single = results["1x1"]
    final = single["curve"][-1]
    peak = best_point(single["curve"])
    for res in results.values():
        res["final_psnr"] = res["curve"][-1]["psnr"]
        res["final_views"] = res["curve"][-1]["views"]
        res["train_wall_s"] = res["curve"][-1]["wall_s"]
        res["time_to_psnr"] = {f"{t:.2f}": time_to(res["curve"], t) for t in targets}
        # views to a target: what the batch rule changes, free of the machine's load
        res["views_to_psnr"] = {f"{t:.2f}": time_to(res["curve"], t, "views") for t in targets}
        top = best_point(res["curve"])
        res["best_psnr"], res["best_views"] = top["psnr"], top["views"]
        reach = time_to(res["curve"], final["psnr"])
        res["time_to_final_psnr_1x1_s"] = reach
        res["time_ratio_to_final_psnr_vs_1"] = None if reach is None else reach / final["wall_s"]
        res["psnr_gap_equal_views_vs_1"] = final["psnr"] - res["final_psnr"]
        reach = time_to(res["curve"], peak["psnr"])
        res["time_to_best_psnr_1x1_s"] = reach
        res["time_ratio_to_best_psnr_vs_1"] = None if reach is None else reach / peak["wall_s"]
        res["psnr_gap_best_vs_1"] = peak["psnr"] - res["best_psnr"]
    two = {k: v for k, v in results.items() if v["ranks"] == 2}
    reached = {k: v for k, v in two.items() if v["time_ratio_to_final_psnr_vs_1"] is not None}
    if reached:
        best = min(reached, key=lambda k: reached[k]["time_ratio_to_final_psnr_vs_1"])
    else:
        best = max(two, key=lambda k: two[k]["final_psnr"]) if two else None
    out = {
        "best_2rank_setting": best,
        "time_ratio_to_final_psnr_2ranks_vs_1": (
            two[best]["time_ratio_to_final_psnr_vs_1"] if best else None
        ),
        "psnr_gap_equal_views_2ranks_vs_1": two[best]["psnr_gap_equal_views_vs_1"]
        if best
        else None,
        "time_ratio_to_best_psnr_2ranks_vs_1": (
            two[best]["time_ratio_to_best_psnr_vs_1"] if best else None
        ),
        "psnr_gap_best_2ranks_vs_1": two[best]["psnr_gap_best_vs_1"] if best else None,
        "single_final_psnr": final["psnr"],
        "single_train_wall_s": final["wall_s"],
        "single_best_psnr": peak["psnr"],
        "single_best_views": peak["views"],
        "peaked_early": peak["psnr"] - final["psnr"] > OVERFIT_DROP_DB,
    }
    by_rule = {k: v for k, v in two.items() if v["views_per_rank"] == 1}
    if by_rule:
        out["best_rule_2x1_by_final_psnr"] = max(by_rule, key=lambda k: by_rule[k]["final_psnr"])
    return out


def default_targets(results: dict[str, dict]) -> list[float]:
    """The one-process best held-out PSNR minus 3, 2, 1, 0.5 and 0 dB."""
    best = best_point(results["1x1"]["curve"])["psnr"]
    return [round(best - d, 2) for d in (3.0, 2.0, 1.0, 0.5, 0.0)]


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4))
    single = results["1x1"]["final_psnr"]
    for name, res in results.items():
        wall = [p["wall_s"] for p in res["curve"]]
        views = [p["views"] for p in res["curve"]]
        psnr = [p["psnr"] for p in res["curve"]]
        style = "-" if res["ranks"] == 1 else ("--" if res["views_per_rank"] == 1 else ":")
        ax_t.plot(wall, psnr, style, marker="o", ms=3, label=name)
        ax_v.plot(views, psnr, style, marker="o", ms=3, label=name)
    for ax in (ax_t, ax_v):
        ax.axhline(single, color="grey", lw=0.8)
        ax.set_ylabel("held-out PSNR (dB)")
        ax.grid(alpha=0.3)
    ax_t.set_xlabel("training wall time (s, evaluation excluded)")
    ax_v.set_xlabel("training views")
    ax_t.legend(title="ranks x views/rank : scaling", fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path, dpi=120)


def run_benchmark(args) -> dict:
    settings = parse_settings(args.settings)
    if "1x1" not in [s.name for s in settings]:
        raise SystemExit("--settings must include the one-process run 1x1")
    work = Path(args.work or tempfile.mkdtemp(prefix="odin-convergence-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for i, setting in enumerate(settings):
        print(f"[convergence] training {setting.name} ({args.views} views)", flush=True)
        run = train(setting, args, work, args.port + i)
        times = read_times(work / f"{setting.name.replace(':', '-')}.times.jsonl")
        results[setting.name] = {
            "ranks": setting.ranks,
            "views_per_rank": setting.views_per_rank,
            "batch_scaling": setting.scaling,
            "run": str(run),
            "times": times,
        }
    for setting in settings:
        res = results[setting.name]
        print(f"[convergence] evaluating {setting.name}", flush=True)
        res.update(evaluate(Path(res["run"]), setting, res.pop("times")))
    run = {
        "scene": str(args.data),
        "views": args.views,
        "eval_every_views": args.eval_every,
        "seed": args.seed,
        "downscale_factor": args.downscale_factor,
        "training_args": DEFAULT_TRAINING + list(args.training),
        "cpu_count": os.cpu_count(),
        "note": args.note,
    }
    return report(run, results, args.targets, args.out)


# What a saved JSON holds that --from-json carries over: the keys of ``run_benchmark``'s
# ``run`` record, and per setting what training and evaluation measured (the rest of a
# setting's keys are ``summarize``'s, computed again).
RUN_KEYS = (
    "scene",
    "views",
    "eval_every_views",
    "seed",
    "downscale_factor",
    "training_args",
    "cpu_count",
    "note",
)
MEASURED_KEYS = ("ranks", "views_per_rank", "batch_scaling", "run", "curve", "eval_s")


def load_saved(path: Path) -> tuple[dict, dict[str, dict]]:
    """(run record, per-setting measurements) of a JSON this benchmark wrote."""
    saved = json.loads(path.read_text())
    results = {name: {k: res[k] for k in MEASURED_KEYS} for name, res in saved["settings"].items()}
    return {k: v for k, v in saved.items() if k in RUN_KEYS}, results


def report(run: dict, results: dict[str, dict], targets: list[float] | None, out_path: Path):
    """Summarize ``results`` (per-setting curves), write the JSON and the PNG, print."""
    targets = targets or default_targets(results)
    headline = summarize(results, targets)
    out = {**run, "targets_psnr": targets, **headline, "settings": results}
    write_json(out_path, out)
    plot(results, out_path.with_suffix(".png"), f"{Path(run['scene']).name}: {run['views']} views")
    if headline["peaked_early"]:
        print(
            f"[convergence] one process's held-out PSNR peaked at {headline['single_best_views']}"
            f" views ({headline['single_best_psnr']:.2f} dB) and ended "
            f"{headline['single_best_psnr'] - headline['single_final_psnr']:.2f} dB lower: "
            "the budget overfits this scene; compare best PSNRs, not final ones"
        )
    for name, res in results.items():
        print(
            f"{name:>10}: final PSNR {res['final_psnr']:.2f} dB at {res['final_views']} views, "
            f"train {res['train_wall_s']:.1f} s, eval {res['eval_s']:.1f} s, time to 1x1 final "
            f"{res['time_to_final_psnr_1x1_s']}"
        )
    print({k: v for k, v in headline.items()})
    return out


def main(argv: list[str] | None = None) -> None:
    worker = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if worker or os.environ.get("ODIN_BENCH_TRAIN"):
        # A run of this benchmark: the launcher (no RANK) or a torchrun worker.
        from odin_ns import launch

        if worker:
            install_timing_hooks()
        launch.main(argv, worker_module="odin_ns.bench.convergence")
        return
    argv = list(sys.argv[1:] if argv is None else argv)
    training: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, training = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=None, help="scene (not with --from-json)")
    parser.add_argument("--out", type=Path, required=True, help="JSON path (PNG next to it)")
    parser.add_argument("--views", type=int, default=600, help="training views per run")
    parser.add_argument("--eval-every", type=int, default=60, help="views between checkpoints")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS)
    parser.add_argument("--targets", type=lambda s: [float(x) for x in s.split(",")], default=None)
    parser.add_argument("--downscale-factor", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--port", type=int, default=29650)
    parser.add_argument("--work", default=None, help="run folders (default: a temp dir)")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="recompute the summary and PNG of this earlier run's JSON (no training); "
        "--out names the new JSON",
    )
    parser.add_argument("--note", default=None, help="a line stored in the JSON (e.g. the load)")
    args = parser.parse_args(argv)
    args.training = training
    if (args.data is None) == (args.from_json is None):
        parser.error("give either --data (train and evaluate) or --from-json (summarize again)")
    if args.from_json is not None:
        run, results = load_saved(args.from_json)
        run["note"] = args.note or run.get("note")
        report(run, results, args.targets, args.out)
        return
    run_benchmark(args)


if __name__ == "__main__":
    main()
