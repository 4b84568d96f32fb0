"""Sharded ownership at 2 to 64 ranks on the synthetic city, counted from real plans.

    python -m odin_ns.bench.shard_scaling --out bench/shard_scaling.json

No training run: a 64-rank run cannot be measured on this machine. Each figure is counted
exactly from what the runtime would be given: the city's footprints
(``bench.schedule.make_city``, ``compute_footprints``), one epoch's plan (``build_plan``,
one view per rank per step), the owners (``ownership.assign_ownership``: locality, and the
random Grendel-style deal), the cache each rank fills (``runtime.layout.phase_read_sets``)
and the messages of every step (``simulate.Sharded.traffic``: a gradient row to the owner
of every non-owned row a rank reads and writes, the updated row pushed back;
``simulate.Replicated.traffic``: every rank's footprint rows to every peer), each row
``PUBLICATION_ROW_BYTES`` (240 B). Counting every read row as written is an upper bound
(the runs publish what the step touched); ``bench.shard`` measures bytes in real runs at
2-4 ranks.

Two series:

- **fixed scene** (strong scaling): one city (``--views`` views, 20 Gaussians per view)
  split over R ranks. Each rank's region shrinks while a view's footprint does not, so the
  remote part of a rank's reads, and its bytes, grow with R (a region's boundary against its
  area: about sqrt(R) on a 2-D city);
- **scene growing with R** (weak scaling): ``--views-per-rank`` x R views, so each rank's
  region and views stay the same size. Here sharded bytes per rank should stay flat while
  replicated bytes per rank grow with R - 1: this is what DESIGN 3.11 means by bytes that
  scale with the remote part of a rank's footprint, not with R.

Per R: owned rows (largest over N / R), resident rows (owned + cache, largest rank), their
parameter + moment bytes (177 floats per row), the remote-read fraction, and bytes per rank
per step (sent + received, mean over steps and ranks) of sharded locality, sharded random
and replicated ownership. JSON keys: ``fixed`` and ``weak`` (lists by R), and
``bytes_growth_2_to_4_<series>``, ``bytes_ratio_sharded_vs_replicated_4_<series>``,
``owned_rows_max_over_fair_max``. A PNG beside it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from odin_ns.bench.report import save_figure, write_json

ROW_PARAM_MOMENT_BYTES = 4 * 177  # 59 parameter floats + two Adam moments, SH degree 3


def ownership_figures(F, ranks: int, seed: int = 0) -> dict:
    """Plan-derived figures of R-rank sharded and replicated training over footprints ``F``
    ([V, N] CSR): one epoch, one view per rank per step."""
    from odin_ns.bench.simulate import PUBLICATION_ROW_BYTES, Replicated, Sharded
    from odin_ns.runtime.layout import phase_read_sets
    from odin_ns.schedule import build_plan
    from odin_ns.schedule.ownership import assign_ownership, ownership_report

    views, n = F.shape
    plan = build_plan(F, ranks, -(-views // ranks), seed=seed, strategy="odin")

    def bytes_per_rank_step(traffic: np.ndarray) -> float:
        per_rank = traffic.sum(axis=2) + traffic.sum(axis=1)  # [T, R] sent + received
        return float(per_rank.mean())

    out: dict = {"ranks": ranks, "views": int(views), "gaussians": int(n)}
    out["bytes_per_rank_step_replicated"] = bytes_per_rank_step(
        Replicated().traffic(plan, PUBLICATION_ROW_BYTES)
    )
    reads = phase_read_sets(plan, ranks)
    for strategy in ("locality", "random"):
        owner = assign_ownership(plan, strategy, seed)
        report = ownership_report(plan, owner, seed)
        owned = np.bincount(owner, minlength=ranks)
        resident = [int(owned[r]) + int((owner[reads[r]] != r).sum()) for r in range(ranks)]
        traffic = Sharded(owner).traffic(plan, PUBLICATION_ROW_BYTES)
        out[strategy] = {
            "owned_rows_max_over_fair": report["owned_rows_max_over_fair"],
            "resident_rows_max": max(resident),
            "resident_over_fair_max": max(resident) / (n / ranks),
            "param_moment_bytes_max": max(resident) * ROW_PARAM_MOMENT_BYTES,
            "remote_read_fraction": report["remote_read_fraction"],
            "bytes_per_rank_step": bytes_per_rank_step(traffic),
        }
    return out


def city_footprints(views: int, seed: int = 0):
    from odin_ns.bench.schedule import make_city, timed_footprints

    F, _, _ = timed_footprints(make_city(views, 20 * views, seed=seed))
    return F


def growth_keys(rows: list[dict], series: str) -> dict:
    """The issue's ratios from one series: sharded bytes per rank from 2 to 4 ranks, and
    sharded over replicated at 4 ranks."""
    by = {r["ranks"]: r for r in rows}
    if 2 not in by or 4 not in by:
        return {}
    two, four = by[2]["locality"]["bytes_per_rank_step"], by[4]["locality"]["bytes_per_rank_step"]
    return {
        f"bytes_growth_2_to_4_{series}": four / two - 1.0,
        f"bytes_ratio_sharded_vs_replicated_4_{series}": four
        / by[4]["bytes_per_rank_step_replicated"],
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, series, title in (
        (axes[0], "fixed", f"one city of {result['fixed'][0]['views']} views"),
        (axes[1], "weak", f"{result['views_per_rank']} views per rank (city grows with R)"),
    ):
        rows = result[series]
        ranks = [r["ranks"] for r in rows]
        ax.plot(ranks, [r["bytes_per_rank_step_replicated"] / 1e6 for r in rows], "o-",
                label="replicated")  # fmt: skip
        for strategy in ("locality", "random"):
            ax.plot(ranks, [r[strategy]["bytes_per_rank_step"] / 1e6 for r in rows], "o-",
                    label=f"sharded, {strategy} owners")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel("MB per rank per step (sent + received)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    ax = axes[2]
    for series, style in (("fixed", "o-"), ("weak", "s--")):
        rows = result[series]
        ranks = [r["ranks"] for r in rows]
        ax.plot(ranks, [r["locality"]["owned_rows_max_over_fair"] for r in rows], style,
                label=f"owned / (N/R), {series}")  # fmt: skip
        ax.plot(ranks, [r["locality"]["resident_over_fair_max"] for r in rows], style,
                label=f"(owned + cache) / (N/R), {series}")  # fmt: skip
    ax.axhline(1.1, color="k", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("largest rank over N / R")
    ax.set_title("rows a rank holds (locality owners)", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle("sharded ownership on the synthetic city, counted from real plans (no run)",
                 fontsize=10)  # fmt: skip
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--views", type=int, default=10_000, help="fixed scene: the city's views")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4, 8, 16, 64])
    ap.add_argument("--views-per-rank", type=int, default=1250, help="the growing scene")
    ap.add_argument("--weak-ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--out", type=Path, default=Path("bench/shard_scaling.json"))
    args = ap.parse_args(argv)
    import torch
    from nerfstudio.utils.rich_utils import CONSOLE

    torch.set_num_threads(1)
    started = time.perf_counter()
    result: dict = {"source": "counted from plans (no training run)", "fixed": [], "weak": []}
    with CONSOLE.status(f"footprints of a {args.views}-view city"):
        F = city_footprints(args.views)
    for ranks in args.ranks:
        with CONSOLE.status(f"fixed city: {ranks} ranks"):
            result["fixed"].append(ownership_figures(F, ranks))
    for ranks in args.weak_ranks:
        views = args.views_per_rank * ranks
        with CONSOLE.status(f"growing city: {ranks} ranks, {views} views"):
            F = city_footprints(views)
            result["weak"].append(ownership_figures(F, ranks))
    result["views_per_rank"] = args.views_per_rank
    result |= growth_keys(result["fixed"], "fixed") | growth_keys(result["weak"], "weak")
    result["owned_rows_max_over_fair_max"] = max(
        r["locality"]["owned_rows_max_over_fair"] for r in result["fixed"] + result["weak"]
    )
    result["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    plot(result, png)
    result["png"] = png.name
    write_json(args.out, result)
    for series in ("fixed", "weak"):
        for r in result[series]:
            loc, rnd = r["locality"], r["random"]
            CONSOLE.print(
                f"{series:>5} {r['ranks']:>3} ranks {r['views']:>6} views: bytes/rank/step "
                f"replicated {r['bytes_per_rank_step_replicated'] / 1e6:8.3f} MB, sharded "
                f"{loc['bytes_per_rank_step'] / 1e6:7.3f} MB (random "
                f"{rnd['bytes_per_rank_step'] / 1e6:7.3f}); owned/fair "
                f"{loc['owned_rows_max_over_fair']:.3f}, resident/fair "
                f"{loc['resident_over_fair_max']:.2f}, remote {loc['remote_read_fraction']:.3f}"
            )
    return result


if __name__ == "__main__":
    main()
