"""Stragglers: how much of barrier's wait each mode hides as per-step delays grow.

    python -m odin_ns.bench.stragglers --data DIR [--downscale-factor F] --ranks 2 \
        --shares 0,0.25,0.5 --steps 200 --repeats 4 --out bench/stragglers_street.json \
        [-- more ns-train options]

For each share J of a step, one ``odin_ns.bench.sync`` invocation trains ``--modes``
(default barrier, quality-first, throughput-first; ``throughput-first-impact`` and
``throughput-first-overlap`` name its admission rule), plus barrier again as the A/A
control, in rotated rounds, with exponential per-step delays of mean J x (one step's
compute) on every rank
(``odin_ns.bench.jitter``: the same delays at the same steps in every mode, so the
comparison is paired). The step's compute comes from the first share, which must be 0:
barrier's busy seconds per step without delays (``ranks / ideal_views_per_second``).

Per share, from that invocation's same-round figures (median and min-max over rounds):
barrier's critical-path wait (how much later the run ended than it would have if no rank
had waited: what a barrier pays over the no-wait ideal, ``trace.critical_path_wait``), and
the share of it each mode hides, ``1 - wait(mode) / wait(barrier)``;
``wait_hidden_<mode>_max_rank`` the same share of the most any rank waited (what earlier
runs reported: it also counts, as its peers' wait, the work of a rank that is busier every
step, which no order of the same steps hides). The A/A control's "hidden" share is what
the machine's noise alone produces: a mode hides wait only beyond that spread. This is the
CPU-measurable version of the Odin paper's "82% of critical-path wait hidden". Writes the JSON, a PNG of
wait hidden and throughput against the share, and each share's ``bench.sync`` JSON (and
its PNGs) under ``<out stem>/``. ``--psnr`` adds each mode's same-round PSNR delta to
barrier (``ns-eval`` of every run whose parameters differ from barrier's), and
``--seed-control K`` barrier's own spread over K other seeds at the first share
(``psnr_seed_spread``). The top level repeats each share's headline figures under names
with the share in them (``headline_keys``: ``wait_hidden_qf_jitter50``,
``throughput_ratio_tf_vs_qf_jitter50``, ...), and beside each measured share hidden the
simulated ones ``bench.sync`` replays from the same runs (``wait_hidden_qf_replay_jitter50``:
the runs' own compute through their plans, which checks the replay against the
measurement; ``wait_hidden_qf_balanced_jitter50``: the same without a rank-to-rank
imbalance of compute).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from odin_ns.bench import sync  # noqa: E402
from odin_ns.bench.report import save_figure, write_json

CONSOLE = Console()
MODES = ("barrier", "quality-first", "throughput-first")  # the default --modes


def hiders(modes: list[str]) -> list[str]:
    """Short names of the modes whose hidden share is reported, and the A/A control's."""
    return [sync.SHORT[m] for m in modes if m != "barrier"] + [sync.SHORT[sync.CONTROL]]


def parse_shares(text: str) -> list[float]:
    """``"0,0.25,0.5"`` -> [0.0, 0.25, 0.5]: ascending, starting at 0 (the calibration)."""
    shares = [float(s) for s in text.split(",") if s.strip()]
    if (
        not shares
        or shares[0] != 0.0
        or sorted(shares) != shares
        or len(set(shares)) != len(shares)
    ):
        raise ValueError(f"--shares must start at 0 and increase, got '{text}'")
    return shares


def step_seconds(sync_results: dict, ranks: int) -> float:
    """One rank's busy seconds per step under barrier (no delays): the unit of the shares."""
    return ranks / float(sync_results["modes"]["barrier"]["ideal_views_per_second"])


def share_figures(share: float, jitter_ms: float, sync_results: dict, keys: list[str]) -> dict:
    """The straggler figures of one share from its ``bench.sync`` results (``keys``: the
    modes' short names, ``hiders``)."""
    barrier = sync_results["modes"]["barrier"]
    out = {
        "share": share,
        "jitter_ms": jitter_ms,
        "barrier_wait_s": barrier["critical_path_wait_s"],
        "barrier_wait_s_min": barrier["critical_path_wait_s_min"],
        "barrier_wait_s_max": barrier["critical_path_wait_s_max"],
        "barrier_ideal_share": barrier["ideal_share"],
    }
    copied = [f"psnr_delta_{key}_vs_barrier" for key in keys]  # --psnr: runs that differ
    copied += [  # throughput-first modes against quality-first, by round
        f"{what}_{key}_vs_qf"
        for key in keys
        for what in ("wait_hidden", "throughput_ratio", "psnr_delta")
    ]
    for name in copied:
        if name in sync_results:
            for suffix in ("", "_min", "_max"):
                out[f"{name}{suffix}"] = sync_results[f"{name}{suffix}"]
    for key in keys:
        for suffix in ("", "_min", "_max"):
            out[f"wait_hidden_{key}{suffix}"] = sync_results[
                f"wait_hidden_{key}_vs_barrier{suffix}"
            ]
            for what in sync.WAIT_VARIANTS:
                name = f"wait_hidden_{key}_vs_barrier_{what}{suffix}"
                if name in sync_results:
                    out[f"wait_hidden_{key}_{what}{suffix}"] = sync_results[name]
            out[f"throughput_ratio_{key}{suffix}"] = sync_results[
                f"throughput_ratio_{key}_vs_barrier{suffix}"
            ]
    return out


def headline_keys(rows: list[dict], keys: list[str]) -> dict:
    """The run's figures under the issue's names, per share J (in percent of a step's
    compute): ``wait_hidden_<mode>_jitter<J>`` (of barrier's critical-path wait; the A/A
    control's too), and for every throughput-first mode ``throughput_ratio_<mode>_vs_qf_jitter<J>``
    and, with ``--psnr``, ``psnr_delta_<mode>_vs_qf_jitter<J>`` (medians over same-round
    pairs)."""
    out = {}
    for row in rows:
        tail = f"_jitter{round(100 * row['share'])}"
        for key in keys:
            out[f"wait_hidden_{key}{tail}"] = row[f"wait_hidden_{key}"]
            for what in sync.WAIT_VARIANTS:
                if f"wait_hidden_{key}_{what}" in row:
                    out[f"wait_hidden_{key}_{what}{tail}"] = row[f"wait_hidden_{key}_{what}"]
            for name in (f"throughput_ratio_{key}_vs_qf", f"psnr_delta_{key}_vs_qf"):
                if name in row:
                    out[f"{name}{tail}"] = row[name]
    return out


def plot(rows: list[dict], keys: list[str], title: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = [r["share"] for r in rows]
    for key in keys:
        label = "A/A" if key == sync.SHORT[sync.CONTROL] else key
        for ax, what in zip(axes, ("wait_hidden", "throughput_ratio"), strict=True):
            mid = [r[f"{what}_{key}"] for r in rows]
            low = [m - r[f"{what}_{key}_min"] for m, r in zip(mid, rows, strict=True)]
            high = [r[f"{what}_{key}_max"] - m for m, r in zip(mid, rows, strict=True)]
            ax.errorbar(x, mid, yerr=[low, high], marker="o", capsize=3, label=label)
    axes[0].set_ylabel("share of barrier's critical-path wait hidden")
    axes[1].set_ylabel("throughput / barrier (same round)")
    for ax in axes:
        ax.set_xlabel("mean per-step delay / step compute")
        ax.axhline(0.0 if ax is axes[0] else 1.0, color="gray", lw=0.8)
        ax.legend()
    fig.suptitle(f"{title} (median, min-max over rounds)")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--downscale-factor", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--shares", default="0,0.25,0.5", help="delays, in steps of compute")
    parser.add_argument("--modes", default=",".join(MODES), help="bench.sync modes, barrier first")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4, help="rounds per share")
    parser.add_argument("--skip-steps", type=int, default=20)
    parser.add_argument(
        "--psnr", action="store_true", help="ns-eval every run whose parameters differ"
    )
    parser.add_argument(
        "--seed-control", type=int, default=0, metavar="K",
        help="with --psnr, at the first share: barrier with K other seeds (the PSNR yardstick)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("extra", nargs="*", help="more ns-train options, after --")
    args = parser.parse_args(argv)
    if not args.data.exists():
        parser.error(f"--data {args.data} does not exist")
    try:
        shares = parse_shares(args.shares)
    except ValueError as err:
        parser.error(str(err))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or modes[0] != "barrier" or any(m not in sync.SHORT for m in modes):
        parser.error(f"--modes must start with barrier and name bench.sync modes: {args.modes}")
    keys = hiders(modes)
    if args.seed_control and not args.psnr:
        parser.error("--seed-control needs --psnr")
    parts = args.out.with_suffix("")  # each share's bench.sync JSON and PNGs
    # the runs, one folder per --out (two invocations on one scene keep each other's runs)
    work = Path("outputs/bench_stragglers") / args.out.stem
    rows: list[dict] = []
    unit_s = None
    seeds: dict = {}
    for share in shares:
        jitter_ms = 0.0 if unit_s is None else share * unit_s * 1000.0
        seed_control = args.seed_control if unit_s is None else 0
        CONSOLE.rule(f"{args.data.name}, {args.ranks} ranks: delays {share:.0%} of a step")
        results = sync.main(
            [
                *("--data", str(args.data), "--downscale-factor", str(args.downscale_factor)),
                *("--ranks", str(args.ranks), "--steps", str(args.steps)),
                *("--modes", ",".join(modes), "--repeats", str(args.repeats), "--control"),
                *("--jitter-ms", f"{jitter_ms:.3f}", "--skip-steps", str(args.skip_steps)),
                *(() if args.psnr else ("--no-eval",)),
                *(("--seed-control", str(args.seed_control)) if seed_control else ()),
                *("--work-dir", str(work / f"share{share:g}")),
                *("--out", str(parts / f"share{share:g}.json")),
                *(["--", *args.extra] if args.extra else []),
            ]
        )
        if unit_s is None:
            unit_s = step_seconds(results, args.ranks)
            seeds = {k: v for k, v in results.items() if k.startswith("psnr_seed")}
        rows.append(share_figures(share, jitter_ms, results, keys))
    out = {
        "data": str(args.data),
        "ranks": args.ranks,
        "steps": args.steps,
        "repeats": args.repeats,
        "source": "measured (CPU ranks on this machine); wait_hidden_*_replay and *_balanced "
        "simulated from the same runs' records (bench.sync, trace.replay_run)",
        "modes": modes,
        "ns_train_options": list(args.extra),  # what came after --
        "step_compute_s": unit_s,
        **seeds,
        **headline_keys(rows, keys),
        "shares": rows,
    }
    write_json(args.out, out)
    plot(
        rows,
        keys,
        f"{args.data.name}: {args.ranks} ranks, {args.steps} steps",
        args.out.with_suffix(".png"),
    )
    table = Table(title=f"stragglers: {args.data.name}, {args.ranks} ranks (medians, min-max)")
    replayed = [k for k in keys if all(f"wait_hidden_{k}_replay" in r for r in rows)]
    columns = [f"{k} hides" for k in keys] + [f"{k}: replay / balanced" for k in replayed]
    for col in ("delay", "ms", "barrier wait s", *columns):
        table.add_column(col, justify="right")
    for r in rows:
        hidden = [
            f"{r[f'wait_hidden_{k}']:.0%} "
            f"({r[f'wait_hidden_{k}_min']:.0%}..{r[f'wait_hidden_{k}_max']:.0%})"
            for k in keys
        ]
        hidden += [
            f"{r[f'wait_hidden_{k}_replay']:.0%} / {r[f'wait_hidden_{k}_balanced']:.0%}"
            for k in replayed
        ]
        table.add_row(
            f"{r['share']:.0%}", f"{r['jitter_ms']:.0f}", f"{r['barrier_wait_s']:.2f}", *hidden
        )
    CONSOLE.print(table)
    return out


if __name__ == "__main__":
    main()
