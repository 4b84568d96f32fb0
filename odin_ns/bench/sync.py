"""Sync benchmark: the same training under each synchronization mode, interleaved.

    python -m odin_ns.bench.sync --data DIR [--downscale-factor F] --ranks 2 --steps N \
        --modes ddp,barrier,quality-first,throughput-first --repeats 3 [--control] \
        [--seed-control K] [--jitter-ms 20] --out bench/sync_street.json \
        [-- more ns-train options]

Every mode trains the same scene with the same seed, plan strategy, step count and world
size through the real entry point (``odin-ns-train``, or ``odin_ns.bench.jitter`` around it
with ``--jitter-ms``: exponential per-step delays seeded by (seed, rank, step), identical
in every mode). ``--repeats N`` runs N rounds with the modes in rotated order (ABCD, BCDA,
CDAB, ...), so the machine's drift lands on every mode alike. Per mode, each figure is the
median over rounds, with ``<key>_min`` / ``<key>_max``; a ratio between two modes is the
median of the same-round ratios (``_min`` / ``_max`` their spread). ``ns-eval`` measures
PSNR on the held-out views: barrier's run once (barrier is deterministic), and in every
round each run whose parameters differ from that round's barrier run (the others have
barrier's PSNR: bitwise its parameters); per mode the median over rounds, and
``psnr_delta_<mode>_vs_barrier`` the median of same-round deltas. ``--seed-control K``
trains barrier K more times with seeds ``seed + 1 .. seed + K`` (``--machine.seed`` and the
view order's ``train-cameras-sampling-seed``) after the rounds and evaluates them: the
spread of those PSNRs around barrier's (``psnr_seed_deltas``) is what a different
trajectory alone costs on the scene, the yardstick for a mode's PSNR delta.
``--paired-seeds`` trains round i with seed ``seed + i`` in every mode instead: rounds are
then independent trajectories (with one seed, every round's throughput-first run departs
from the same barrier run, so its rounds are not independent draws of what a departure
costs), barrier is evaluated in every round, ``psnr_delta_<mode>_vs_barrier`` is paired
within each round, and barrier's PSNRs over the rounds are the seed control
(``psnr_seed_deltas``: rounds 1.. against round 0). Figures come
from each run's ``odin_run.json``
(per-rank, per-step timestamps, compute and wait seconds; the engine's bytes; per-phase
start seconds). Per mode, ``mean_dependency_rows_per_step`` is the run's plan density: the
rows of the dependency table ``dependency_rows[t]`` [R, R] a step waits for, summed over
ranks, averaged over steps (``odin_run.json``); ``--method odin-splatfacto-mcmc`` shows the
noise adds none. ``--control`` adds an A/A control: barrier trained a second time in every
round (``barrier-again``, rotated like the modes); its same-round ratio to barrier,
``throughput_ratio_again_vs_barrier``, is the spread this machine puts on the ratio of two
runs that do bitwise the same work (``max_param_diff_again_vs_barrier``: 0). Writes JSON,
a PNG of round 0's timelines, ``<out>_ratios.png`` and ``<out>_psnr.png``. Modes beyond
the engine's, each with its flags whatever the defaults are: ``throughput-first-impact``
(the impact rule, stale gradients dropped), ``throughput-first-impact-apply`` (the impact
rule, stale gradients applied: the defaults), ``throughput-first-overlap`` (the overlap rule
at tau 0.2, stale gradients dropped: the defaults before) and
``quality-first-shuffled`` (quality-first on a plan whose epochs' steps are shuffled, not
ordered low-conflict: what the step order buys).

A rank's wait is what its steps waited for peers: at each step's read gate and in the drains
and rendezvous after a step (``drain_wait_s``: a refine's or reset's structural change, where
a rank that ran ahead, as throughput-first's do, waits for the others; before 2026-12-07 it
counted as work: throughput-first's most-waited rank read 0.04 s on street where it waited
0.54 s; the critical-path wait, which that rank is not on, read the same).
``critical_path_wait_s`` is how much later a run ended than it would have if no rank had
waited (``trace.critical_path_wait``), ``max_rank_wait_s`` the most any rank waited;
``wait_hidden_<mode>_vs_<base>`` and ``..._max_rank`` are the shares of the base's that a
mode hides.

Simulated beside the measured, from each run's own records: ``replay_wait_s`` is the
critical-path wait that replaying the run's measured per-step compute through its plan's
dependencies predicts (``trace.replay_run``: no latency, no engine time), and
``replay_wait_s_balanced`` the same with each rank's compute moved to the mean over ranks
(no systematically slower rank); ``wait_hidden_<mode>_vs_barrier_replay`` / ``_balanced``
are the shares hidden they give, same-round pairs like the measured one. The replay's
share against the measured one says how well the plan and the compute explain the wait;
the balanced one, what a rank-to-rank imbalance of compute costs on top.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from odin_ns.bench.commands import (
    BIN,
    module_launcher,
    quiet_flags,
    run_env,
    schedule_flags,
    train_command,
)
from odin_ns.bench.report import put_spread, save_figure, spread, write_json
from odin_ns.bench.trace import critical_path_wait, replay_run
from odin_ns.runtime.ledger import merge_admission_summaries
from odin_ns.viewer_ext.snapshot import step_wait

SHORT = {"ddp": "ddp", "barrier": "barrier", "quality-first": "qf", "throughput-first": "tf"}
CONTROL = "barrier-again"  # --control: barrier once more per round (the A/A control)
SHORT[CONTROL] = "again"
IMPACT = "throughput-first-impact"  # throughput-first with the impact admission rule
SHORT[IMPACT] = "tfi"
OVERLAP = "throughput-first-overlap"  # throughput-first with the overlap admission rule
SHORT[OVERLAP] = "tfo"
IMPACT_APPLY = "throughput-first-impact-apply"  # the impact rule, stale gradients applied
SHORT[IMPACT_APPLY] = "tfia"
SHUFFLED = "quality-first-shuffled"  # quality-first on a plan whose steps are shuffled
SHORT[SHUFFLED] = "qfs"
TRAIN_MODE = {
    CONTROL: "barrier",
    IMPACT: "throughput-first",
    OVERLAP: "throughput-first",
    IMPACT_APPLY: "throughput-first",
    SHUFFLED: "quality-first",
}
MODE_FLAGS = {  # the engine mode trained (above) and its other flags, whatever the defaults
    IMPACT: ("--pipeline.sync.admission", "impact", "--pipeline.sync.stale-gradients", "drop"),
    OVERLAP: (  # the default before the impact rule with stale gradients applied
        *("--pipeline.sync.admission", "overlap", "--pipeline.sync.tau", "0.2"),
        *("--pipeline.sync.stale-gradients", "drop"),
    ),
    IMPACT_APPLY: (
        "--pipeline.sync.admission",
        "impact",
        "--pipeline.sync.stale-gradients",
        "apply",
    ),
    SHUFFLED: ("--pipeline.plan-step-order", "shuffled"),
}
BASES = ("barrier", "ddp")  # ratios are reported against these
WAIT_FIGURES = {  # suffix of a ``wait_hidden`` share -> the run figure it is the share of
    "": "critical_path_wait_s",
    "max_rank": "max_rank_wait_s",
    "replay": "replay_wait_s",  # simulated (``trace.replay_run``)
    "balanced": "replay_wait_s_balanced",  # simulated
}
WAIT_VARIANTS = tuple(k for k in WAIT_FIGURES if k)  # reported beside the critical path
CONSOLE = Console()


def available_modes() -> tuple[str, ...]:
    """The engine's sync modes (``ddp`` appears once the engine implements it)."""
    from odin_ns.runtime.config import MODES

    return tuple(m for m in SHORT if m != CONTROL and TRAIN_MODE.get(m, m) in MODES)


def rotated_orders(modes: list[str], repeats: int) -> list[list[str]]:
    """Round i runs the modes rotated left by i: ABCD, BCDA, CDAB, ..."""
    n = len(modes)
    return [modes[i % n :] + modes[: i % n] for i in range(repeats)]


def seed_flags(seed: int) -> list[str]:
    """A run's seeds: nerfstudio's (initial draws) and the view order's (the plan)."""
    return [
        *("--machine.seed", str(seed)),
        *("--pipeline.datamanager.train-cameras-sampling-seed", str(seed)),
    ]


def _train(args, mode: str, out: Path, name: str, port: int, seed: int | None = None) -> Path:
    """Train ``mode`` (``seed``: default ``--seed``; jitter keeps ``--seed``)."""
    launcher = None  # odin-ns-train
    if args.jitter_ms > 0:
        launcher = module_launcher("odin_ns.bench.jitter")
        launcher += ["--jitter-ms", str(args.jitter_ms), "--jitter-seed", str(args.seed)]
    flags = [
        *quiet_flags(save_every=10 * args.steps),
        *seed_flags(args.seed if seed is None else seed),
        *schedule_flags(warmup=args.warmup, refine_every=args.refine_every),
        *("--pipeline.sync.mode", TRAIN_MODE.get(mode, mode)),
        *MODE_FLAGS.get(mode, ()),
        *args.extra,
    ]
    downscale = args.downscale_factor
    cmd = train_command(
        args.data,
        out,
        ranks=args.ranks,
        experiment="bench",
        name=name,
        steps=args.steps,
        flags=flags,
        method=args.method,
        launcher=launcher,
        port=port,
        dataparser=("nerfstudio-data", "--downscale-factor", str(downscale)) if downscale else (),
    )
    env = run_env(threads=None)
    with CONSOLE.status(f"training {name} on {args.ranks} ranks for {args.steps} steps"):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out / "bench" / args.method / name


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


def max_param_diff(run_a: Path, run_b: Path) -> float:
    """Largest absolute difference of the final Gaussian parameters (inf if shapes differ)."""
    pa, pb = _final_params(run_a), _final_params(run_b)
    if any(pa[k].shape != pb[k].shape for k in pb):
        return float("inf")
    return max(float((pa[k] - pb[k]).abs().max()) for k in pb)


def phase_start_seconds(phase: dict) -> float:
    """A phase's start cost: ``phase_start_s`` when the run log has it, else ``plan_seconds``
    (footprints + plan + rebind after the drain: what older run logs recorded)."""
    return float(phase.get("phase_start_s", phase.get("plan_seconds", 0.0)))


PHASE_START_SPLIT = (
    "drain_s",
    "footprint_compute_s",
    "gather_s",
    "reference_s",
    "plan_seconds",
    "stats_s",
    "exchange_s",
    "bind_s",
)  # the parts of a phase start's ``phase_start_s`` (``PhaseRecord``)


def phase_start_split(ranks: list[dict]) -> dict:
    """Seconds of each part of the phase starts (``PHASE_START_SPLIT``, plus ``other_s``:
    the rest, e.g. carrying footprints), per run: each part summed over the phases of the
    rank whose phase starts took longest; {} for run logs without the split."""
    phases = max((r["phases"] for r in ranks), key=lambda ps: sum(map(phase_start_seconds, ps)))
    if not phases or "drain_s" not in phases[0]:
        return {}
    split = {f"phase_split_{k}": float(sum(p[k] for p in phases)) for k in PHASE_START_SPLIT}
    total = sum(phase_start_seconds(p) for p in phases)
    split["phase_split_other_s"] = total - sum(split.values())
    split["phase_starts"] = len(phases)
    return split


def plan_density(summary: dict) -> dict:
    """Mean dependency and footprint rows per step (summed over ranks, every step) of one
    run, as its ``odin_run.json`` reports them (None in logs older than these keys)."""
    dep = summary.get("mean_dependency_rows_per_step")
    foot = summary.get("mean_footprint_rows_per_step")
    return {
        "mean_dependency_rows_per_step": dep,
        "mean_footprint_rows_per_step": foot,
        "dependency_share": dep / foot if dep is not None and foot else None,
    }


def waits_and_busy(steps: list[list[dict]]) -> tuple[list[float], list[float]]:
    """Per rank of ``steps`` (each rank's step records): the seconds its steps waited for
    peers, at their read gates and in the drains and rendezvous after them (``step_wait``:
    a rank that ran ahead waits at the next structural change's drain), and the rest of
    their wall time, busy."""
    waits = [sum(step_wait(x) for x in s) for s in steps]
    busy = [sum(x["end"] - x["start"] for x in s) - w for s, w in zip(steps, waits, strict=True)]
    return waits, busy


def mode_figures(summary: dict, skip_steps: int) -> dict:
    """Throughput, wait, bytes and the no-wait ideal of one run (first steps skipped), and
    its plan density (every step)."""
    ranks = summary["ranks"]
    sharded = summary.get("parallel") == "sharded"
    steps = [[s for s in r["steps"] if s["step"] >= skip_steps] for r in ranks]
    n_steps = len(steps[0])
    start = min(s[0]["start"] for s in steps)
    end = max(s[-1]["end"] for s in steps)
    views = sum(len(s) for s in steps)
    waits, busy = waits_and_busy(steps)
    num_gaussians = np.mean([p["num_gaussians"] for p in ranks[0]["phases"]])
    row_floats = 59  # splatfacto (SH degree 3): 3+3+4+3+45+1 gradient floats per Gaussian
    world = len(ranks)
    dense_allreduce = 2.0 * (world - 1) / world * num_gaussians * row_floats * 4
    bytes_per_step = np.mean([r["engine"]["bytes_sent"] for r in ranks]) / max(
        1, len(ranks[0]["steps"])
    )
    # Phase starts: share of the whole run's wall time (first phase start to last step end).
    all_start = min(r["steps"][0]["start"] for r in ranks)
    all_end = max(r["steps"][-1]["end"] for r in ranks)
    phase_s = [sum(phase_start_seconds(p) for p in r["phases"]) for r in ranks]
    first = max(phase_start_seconds(r["phases"][0]) for r in ranks) if ranks[0]["phases"] else 0.0
    return {
        "views_per_second": views / (end - start),
        "ideal_views_per_second": views / max(busy),
        "wait_seconds_per_step": float(np.mean(waits)) / n_steps,
        # the wait that lengthens the run (over its no-wait ideal); and the most any rank
        # waited, which also counts a slower rank's extra work as its peers' wait
        "critical_path_wait_s": critical_path_wait(
            np.array([s[-1]["end"] for s in steps]), np.array(waits)
        ),
        "max_rank_wait_s": float(max(waits)),
        # simulated: the run's own compute replayed through its plan (``trace.replay_run``)
        "replay_wait_s": replay_run(summary, skip_steps),
        "replay_wait_s_balanced": replay_run(summary, skip_steps, balanced=True),
        "bytes_per_step": float(bytes_per_step),
        "dense_allreduce_bytes_per_step": float(dense_allreduce),
        # replicated runs only (None in a sharded run: each rank hashes the rows it owns)
        "replicas_identical": None if sharded else len({r["replica_hash"] for r in ranks}) == 1,
        "mean_gaussians": float(num_gaussians),
        "phase_start_share": float(max(phase_s) / (all_end - all_start + first)),
        "phase_start_seconds": float(max(phase_s)),
        **phase_start_split(ranks),
        **plan_density(summary),
    }


def runs_to_evaluate(
    rounds: list[dict[str, dict]], modes: list[str], paired_seeds: bool = False
) -> list[tuple[str, int]]:
    """(mode, round) of the runs ns-eval measures: barrier's round 0 (barrier is
    deterministic, the same parameters every round; every round's with ``paired_seeds``)
    and every other run whose parameters differ from its round's barrier run; without
    barrier, every run. The A/A control is barrier again: never."""
    evaluated = []
    for i, figures in enumerate(rounds):
        for mode in modes:
            if mode == CONTROL or (mode == "barrier" and i > 0 and not paired_seeds):
                continue
            if mode != "barrier" and figures[mode].get("max_param_diff_vs_barrier") == 0.0:
                continue  # bitwise barrier's parameters: barrier's PSNR
            evaluated.append((mode, i))
    return evaluated


def round_psnrs(
    rounds: list[dict[str, dict]],
    modes: list[str],
    measured: dict[tuple[str, int], float],
    paired_seeds: bool = False,
) -> dict[str, list[float]]:
    """Per mode (not the control), the PSNR of each round's run: measured, or barrier's
    (round 0's; that round's with ``paired_seeds``) where the run's parameters are bitwise
    barrier's."""
    out: dict[str, list[float]] = {}
    for mode in modes:
        if mode == CONTROL:
            continue
        out[mode] = [
            measured.get((mode, i), measured.get(("barrier", i if paired_seeds else 0)))
            for i in range(len(rounds))
        ]
    return out


def seed_control_figures(barrier_psnr: float, control_psnrs: list[float]) -> dict:
    """What a different trajectory costs: the K seed controls' PSNR deltas to barrier's,
    and their range with barrier's own run (delta 0) in it (``psnr_seed_spread``: its width)."""
    deltas = [p - barrier_psnr for p in control_psnrs]
    low, high = min([0.0, *deltas]), max([0.0, *deltas])
    return {
        "psnr_seed_control": control_psnrs,
        "psnr_seed_deltas": deltas,
        "psnr_seed_delta_min": low,
        "psnr_seed_delta_max": high,
        "psnr_seed_spread": high - low,
    }


def aggregate_rounds(rounds: list[dict]) -> dict:
    """Per-mode figures over rounds: numbers become medians, with ``_min`` / ``_max``."""
    out: dict = {}
    for key, first in rounds[0].items():
        values = [r[key] for r in rounds]
        if isinstance(first, bool):
            out[key] = all(values)
        elif isinstance(first, int | float):
            s = spread(values)
            out[key], out[f"{key}_min"], out[f"{key}_max"] = s["median"], s["min"], s["max"]
        else:
            out[key] = first
    return out


def plot_timeline(summaries: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(summaries), 1, figsize=(10, 2.2 * len(summaries)), squeeze=False)
    for ax, (mode, summary) in zip(axes[:, 0], summaries.items(), strict=True):
        t0 = min(r["steps"][0]["start"] for r in summary["ranks"])
        for r in summary["ranks"]:
            for s in r["steps"]:
                # the read gate's wait first, a drain's (a structural change) last
                drain = s.get("drain_wait_s", 0.0)
                wait_end = s["start"] - t0 + s["wait_s"]
                ax.barh(r["rank"], s["wait_s"], left=s["start"] - t0, color="tab:red", height=0.6)
                ax.barh(
                    r["rank"],
                    s["end"] - s["start"] - s["wait_s"] - drain,
                    left=wait_end,
                    color="tab:blue",
                    height=0.6,
                )
                if drain > 0:
                    left = s["end"] - t0 - drain
                    ax.barh(r["rank"], drain, left=left, color="tab:red", height=0.6)
        ax.set_title(f"{mode}: compute (blue) and wait (red) per rank")
        ax.set_ylabel("rank")
    axes[-1, 0].set_xlabel("seconds")
    save_figure(fig, path)


def plot_ratios(ratios: dict[str, list[float]], path: Path, title: str) -> None:
    """Median of same-round ratios with min-max bars, one bar per pair (measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(ratios)
    med = [float(np.median(ratios[n])) for n in names]
    lo = [m - min(ratios[n]) for m, n in zip(med, names, strict=True)]
    hi = [max(ratios[n]) - m for m, n in zip(med, names, strict=True)]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(names)), 3.5))
    ax.bar(range(len(names)), med, yerr=[lo, hi], capsize=6, color="tab:blue", alpha=0.8)
    for i, n in enumerate(names):
        ax.scatter([i] * len(ratios[n]), ratios[n], color="k", s=10, zorder=3)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("throughput ratio (measured)")
    ax.set_ylim(min(0.9, min(min(v) for v in ratios.values()) - 0.02), None)
    ax.set_title(title)
    save_figure(fig, path)


def plot_psnr(psnrs: dict[str, list[float]], results: dict, path: Path) -> None:
    """Each mode's PSNR per round (measured), over the band of barrier's seed controls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    base = psnrs["barrier"][0] if "barrier" in psnrs else None
    if base is not None and "psnr_seed_deltas" in results:
        low, high = results["psnr_seed_delta_min"], results["psnr_seed_delta_max"]
        ax.axhspan(base + low, base + high, color="0.85", label="barrier, other seeds")
    paired = len(set(results.get("seeds", []))) > 1  # --paired-seeds: a seed per round
    if paired:  # one line per round (seed) through its modes: the pairs the deltas take
        for i, seed in enumerate(results["seeds"]):
            ax.plot(range(len(psnrs)), [v[i] for v in psnrs.values()], "-", color="0.6", lw=0.8)
            last = len(psnrs) - 1
            ax.annotate(f"seed {seed}", (last, list(psnrs.values())[-1][i]), fontsize=6,
                        xytext=(6, 0), textcoords="offset points", va="center")  # fmt: skip
    for x, (mode, values) in enumerate(psnrs.items()):
        ax.plot([x] * len(values), values, "o", alpha=0.7, label=f"{SHORT[mode]} (rounds)")
    ax.set_xticks(range(len(psnrs)), [SHORT[m] for m in psnrs])
    ax.set_ylabel("held-out PSNR (dB)")
    ax.set_title(
        "PSNR per round, one seed per round (measured)" if paired else "PSNR per round (measured)"
    )
    ax.legend(fontsize=7, loc="best")
    save_figure(fig, path)


def pair_ratios(rounds: list[dict[str, dict]], modes: list[str]) -> dict[str, dict]:
    """Same-round throughput ratios and wait hidden of every mode against each base, and of
    every throughput-first mode against quality-first (what admitting delayed reads buys
    over waiting for them)."""
    pairs = [(mode, base) for base in BASES if base in modes for mode in modes if mode != base]
    if "quality-first" in modes:
        pairs += [
            (mode, "quality-first")
            for mode in modes
            if TRAIN_MODE.get(mode, mode) == "throughput-first"
        ]
    out = {}
    for mode, base in pairs:
        ratios = {
            "throughput": [
                r[mode]["views_per_second"] / r[base]["views_per_second"] for r in rounds
            ],
        }
        for suffix, key in WAIT_FIGURES.items():
            if all(r[m].get(key) is not None for r in rounds for m in (mode, base)):
                what = f"wait_hidden_{suffix}" if suffix else "wait_hidden"
                ratios[what] = [1.0 - r[mode][key] / max(1e-9, r[base][key]) for r in rounds]
        out[f"{SHORT[mode]}_vs_{SHORT[base]}"] = ratios
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--downscale-factor", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", default="ddp,barrier,quality-first,throughput-first")
    parser.add_argument("--repeats", type=int, default=1, help="rounds, modes rotated")
    parser.add_argument("--method", default="odin-splatfacto")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="mean emulated jitter")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--refine-every", type=int, default=50)
    parser.add_argument(
        "--skip-steps", type=int, default=5, help="warm-up steps left out of timings"
    )
    parser.add_argument("--no-eval", action="store_true", help="skip ns-eval (no PSNR)")
    parser.add_argument(
        "--control",
        action="store_true",
        help=f"A/A control: barrier again in every round, as mode '{CONTROL}'",
    )
    parser.add_argument(
        "--seed-control",
        type=int,
        default=0,
        metavar="K",
        help="train barrier K more times with other seeds (the PSNR of another trajectory)",
    )
    parser.add_argument(
        "--paired-seeds",
        action="store_true",
        help="round i trains every mode with seed + i (independent trajectories, paired)",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="default: outputs/bench_sync/<data name>"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("extra", nargs="*", help="more ns-train options, after --")
    args = parser.parse_args(argv)
    if not args.data.exists():
        parser.error(f"--data {args.data} does not exist")
    if args.work_dir is None:
        args.work_dir = Path("outputs/bench_sync") / args.data.name
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.seed_control < 0:
        parser.error("--seed-control must be >= 0")
    requested = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = available_modes()
    unknown = [m for m in requested if m not in SHORT or m == CONTROL]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {sorted(set(SHORT) - {CONTROL})}")
    missing = [m for m in requested if m not in known]
    modes = [m for m in requested if m in known]
    if missing:
        CONSOLE.print(
            f"[yellow]modes {missing} are not in this engine's MODES {known} yet: skipped"
        )
    if not modes:
        parser.error(f"none of {requested} exists in this engine (MODES = {known})")
    if args.control and "barrier" not in modes:
        parser.error("--control trains barrier again: --modes must include barrier")
    if (args.seed_control or args.paired_seeds) and ("barrier" not in modes or args.no_eval):
        parser.error("--seed-control compares PSNR with barrier's: needs barrier and ns-eval")
    if args.seed_control and args.paired_seeds:
        parser.error("--paired-seeds is its own seed control: leave out --seed-control")
    if args.control:
        modes.append(CONTROL)

    orders = rotated_orders(modes, args.repeats)
    seeds = [args.seed + i if args.paired_seeds else args.seed for i in range(args.repeats)]
    if args.repeats > 1 and args.repeats % len(modes):
        # A run's position in its round can cost it (seen: the first run of a round slower
        # on a drifting machine); only whole rotations give every mode every position.
        CONSOLE.print(
            f"[yellow]--repeats {args.repeats} is not a multiple of {len(modes)} modes: "
            "positions in the round are not balanced across modes"
        )
    rounds: list[dict[str, dict]] = []
    run_dirs: dict[str, list[str]] = {m: [] for m in modes}
    summaries0: dict[str, dict] = {}
    for i, order in enumerate(orders):
        figures_i: dict[str, dict] = {}
        for j, mode in enumerate(order):
            port = 29400 + (os.getpid() + 7 * i + j) % 500
            run = _train(args, mode, args.work_dir, f"{mode}-r{i}", port, seeds[i])
            summary = json.loads((run / "odin_run.json").read_text())
            figures_i[mode] = mode_figures(summary, args.skip_steps)
            run_dirs[mode].append(str(run.resolve()))
            if i == 0:
                summaries0[mode] = summary
        for mode in modes:
            if mode != "barrier" and "barrier" in modes:
                figures_i[mode]["max_param_diff_vs_barrier"] = max_param_diff(
                    Path(run_dirs[mode][i]), Path(run_dirs["barrier"][i])
                )
        rounds.append(figures_i)
        CONSOLE.log(
            f"round {i} ({','.join(SHORT[m] for m in order)}): "
            + ", ".join(f"{SHORT[m]} {figures_i[m]['views_per_second']:.2f} v/s" for m in modes)
        )

    results: dict = {
        "data": str(args.data),
        "method": args.method,
        "ranks": args.ranks,
        "steps": args.steps,
        "repeats": args.repeats,
        "jitter_ms": args.jitter_ms,
        "seeds": seeds,
        "source": "measured (CPU ranks on this machine); replay_wait_s* and "
        "wait_hidden_*_replay / _balanced simulated from the same runs' records "
        "(trace.replay_run, calibrated on nothing but each run)",
        "modes_requested": requested,
        "modes_missing": missing,
        "orders": orders,
        "modes": {},
    }
    psnrs: dict[str, list[float]] = {}
    if not args.no_eval:
        measured = {
            (mode, i): _psnr(Path(run_dirs[mode][i]))
            for mode, i in runs_to_evaluate(rounds, modes, args.paired_seeds)
        }
        psnrs = round_psnrs(rounds, modes, measured, args.paired_seeds)
        results["psnr_runs_evaluated"] = len(measured)
    if args.seed_control:
        controls = []
        for k in range(1, args.seed_control + 1):
            port = 29400 + (os.getpid() + 97 * k) % 500
            run = _train(args, "barrier", args.work_dir, f"barrier-seed{k}", port, args.seed + k)
            controls.append(_psnr(run))
        results.update(seed_control_figures(psnrs["barrier"][0], controls))
        results["seed_control_seeds"] = [args.seed + k for k in range(1, args.seed_control + 1)]
    if args.paired_seeds and args.repeats > 1:
        results.update(seed_control_figures(psnrs["barrier"][0], psnrs["barrier"][1:]))
        results["seed_control_seeds"] = results["seeds"][1:]
    for mode in modes:
        figures = aggregate_rounds([r[mode] for r in rounds])
        figures["run_dirs"] = run_dirs[mode]
        figures["run_dir"] = run_dirs[mode][0]
        if mode in psnrs:  # the control's PSNR is barrier's
            put_spread(figures, "psnr", psnrs[mode])
            figures["psnr_rounds"] = psnrs[mode]
        figures["ideal_share"] = figures["views_per_second"] / figures["ideal_views_per_second"]
        results["modes"][mode] = figures
        results.setdefault("mean_dependency_rows_per_step", {})[mode] = figures[
            "mean_dependency_rows_per_step"
        ]
        key = SHORT[mode]
        results[f"ideal_share_{key}"] = figures["ideal_share"]
        results[f"bytes_ratio_{key}_vs_dense_allreduce"] = (
            figures["bytes_per_step"] / figures["dense_allreduce_bytes_per_step"]
        )
        put_spread(
            results, f"phase_start_share_{key}", [r[mode]["phase_start_share"] for r in rounds]
        )
        split = [k for k in rounds[0][mode] if k.startswith("phase_split_")]
        results[f"phase_start_split_{key}"] = {k[len("phase_split_") :]: figures[k] for k in split}
    pairs = pair_ratios(rounds, modes)
    for key, vals in pairs.items():
        put_spread(results, f"throughput_ratio_{key}", vals["throughput"])
        put_spread(results, f"wait_hidden_{key}", vals["wait_hidden"])
        for what in WAIT_VARIANTS:
            if f"wait_hidden_{what}" in vals:
                put_spread(results, f"wait_hidden_{key}_{what}", vals[f"wait_hidden_{what}"])
    for mode in modes:  # the old keys: wait hidden against barrier
        if mode != "barrier" and f"{SHORT[mode]}_vs_barrier" in pairs:
            results[f"wait_hidden_{SHORT[mode]}"] = results[f"wait_hidden_{SHORT[mode]}_vs_barrier"]
    for mode in results["modes"]:
        if "barrier" not in results["modes"] or mode == "barrier":
            continue
        key = SHORT[mode]
        results[f"max_param_diff_{key}_vs_barrier"] = max(
            r[mode]["max_param_diff_vs_barrier"] for r in rounds
        )
        if mode in psnrs:  # same-round deltas
            deltas = [p - b for p, b in zip(psnrs[mode], psnrs["barrier"], strict=True)]
            put_spread(results, f"psnr_delta_{key}_vs_barrier", deltas)
    if "quality-first" in results["modes"]:
        results["ideal_views_per_second"] = results["modes"]["quality-first"][
            "ideal_views_per_second"
        ]
    for mode in (m for m in summaries0 if TRAIN_MODE.get(m, m) == "throughput-first"):
        key = SHORT[mode]
        # round 0's admission totals over the ranks (every key of a run summary's engine)
        totals = merge_admission_summaries([r["engine"] for r in summaries0[mode]["ranks"]])
        for name in (
            "max_staleness", "admitted_fraction", "delayed_primitive_reads", "fallbacks",
            "impact_decisions", "impact_within_tau", "staleness_hist",
        ):  # fmt: skip
            results[f"{name}_{key}"] = totals[name]  # impact_*: what tfi admits at other taus
    if "quality-first" in psnrs:  # every throughput-first mode, as pair_ratios pairs them
        for mode in (m for m in psnrs if TRAIN_MODE.get(m, m) == "throughput-first"):
            deltas = [p - q for p, q in zip(psnrs[mode], psnrs["quality-first"], strict=True)]
            put_spread(results, f"psnr_delta_{SHORT[mode]}_vs_qf", deltas)

    write_json(args.out, results)
    plot_timeline(summaries0, args.out.with_suffix(".png"))
    if psnrs:
        plot_psnr(psnrs, results, args.out.with_name(args.out.stem + "_psnr.png"))
    if pairs:
        plot_ratios(
            {k: v["throughput"] for k, v in pairs.items()},
            args.out.with_name(args.out.stem + "_ratios.png"),
            f"{args.data.name}: {args.ranks} ranks, {args.repeats} rotated rounds (median, min-max)",
        )

    table = Table(
        title=f"sync benchmark: {args.data} ({args.ranks} ranks, {args.steps} steps, "
        f"{args.repeats} rounds; medians)"
    )
    columns = ("mode", "views/s", "min-max", "wait s/step", "phase starts", "dep rows/step")
    for col in (*columns, "PSNR"):
        table.add_column(col, justify="right")
    for mode, f in results["modes"].items():
        dep = f["mean_dependency_rows_per_step"]
        table.add_row(
            mode,
            f"{f['views_per_second']:.2f}",
            f"{f['views_per_second_min']:.2f}-{f['views_per_second_max']:.2f}",
            f"{f['wait_seconds_per_step']:.4f}",
            f"{f['phase_start_share']:.1%}",
            "-" if dep is None else f"{dep:.1f}",
            f"{f['psnr']:.2f}" if "psnr" in f else "-",
        )
    CONSOLE.print(table)
    CONSOLE.print({k: v for k, v in results.items() if k != "modes"})
    return results


if __name__ == "__main__":
    main()
