"""Scale evidence: a trace-driven simulator, validated on measured runs, replayed to 64 ranks.

    python -m odin_ns.bench.scale --sync-json bench/sync_street.json [--sync-json ...] \
        [--allreduce-json SAVED] --out bench/scale.json

1. **Validation** (measured vs simulated). Two calibrations, neither from the run being
   predicted. (a) For every ``bench.sync`` result and round, its ``barrier`` run: per-step
   measured compute, the per-step overhead around it (publish, apply, loop), phase-start
   costs, the recorded views, and footprints of the run's final Gaussians
   (``bench.trace``); one constant per-message delay is fitted so the simulated barrier
   run takes the measured time. (b) ddp's dense all-reduce: a gloo all-reduce
   micro-benchmark on this machine (``odin_ns.bench.allreduce``, run at the start, ~10-20
   s, or read with ``--allreduce-json``) at each world size, fitted to the ring model; the
   fitted per-message delay of (a) is the point-to-point publications' cost and is not
   charged to the all-reduce. The simulator then *predicts* the other modes, from the
   barrier trace (``cross_mode``) and from each mode's own trace (its compute and overhead,
   waits re-simulated: ``errors_points``), and each predicted throughput ratio is compared
   with the measured median ratio (error in percentage points).
2. **Scaling** (simulated). Real footprints (the street scene's and fox's trained
   Gaussians when their runs are given, else fox's cameras over random Gaussians, and the
   synthetic city of ``bench.schedule``), real plans and dependency tables from
   ``odin_ns.schedule.build_plan`` at 2-64 ranks, the fitted per-view cost model scaled to
   a GPU (stated assumption below, ``gpu_assumption``), the fitted jitter, network presets
   (``odin_ns.bench.simulate.NETWORKS``; ddp's all-reduce: the ring model on the preset's
   latency and bandwidth, as NCCL's ring moves it); modes ddp, barrier, quality-first,
   throughput-first; replicated ownership. Sharded ownership is another issue: it plugs in
   as an ``Ownership`` (traffic = remote part of the footprint); until then its key is null.

Every simulated figure is labelled ``simulated`` (keys ``sim_*``, ``source`` fields, plot
titles). Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from odin_ns.bench.report import save_figure, write_json
from odin_ns.bench.simulate import (
    NETWORKS,
    PUBLICATION_ROW_BYTES,
    Network,
    Phase,
    Replay,
    Sharded,
    StepPlan,
    replay,
)
from odin_ns.bench.trace import CostModel, Jitter, fit_trace, step_table

SIM_SHORT = {"ddp": "ddp", "barrier": "barrier", "quality-first": "qf", "throughput-first": "tf"}
# Published per-iteration time of gsplat (stated assumption; no GPU lent to this task).
GPU_ASSUMPTION = {
    "seconds_per_iteration": 19.39 * 60 / 30000,
    "num_gaussians": 3_240_000,
    "source": "gsplat paper (Ye et al., arXiv 2409.06765), Table 1: gsplat-30k, Mip-NeRF 360 "
    "7-scene average 19.39 min for 30k steps on one A100 (= 38.8 ms/iteration, ~1 MP "
    "images); Table 2: 3.24M Gaussians (default strategy)",
    "rule": "a view's GPU time = 38.8 ms x (fitted CPU cost of the view / mean fitted cost over "
    "the scene's views) x a jitter ratio resampled from the fitted CPU residuals; publication "
    "rows and the ddp all-reduce scaled to 3.24M Gaussians (footprint fractions kept)",
}


# ------------------------------------------------------------------------ validation


def _phases_from_trace(table: dict, skip_steps: int = 5) -> tuple[list[Phase], float]:
    """The run's phases as simulator input (measured compute/overhead, recorded views),
    from step ``skip_steps`` on (as ``bench.sync`` measures), and the measured wall time."""
    F = table["footprints"]
    keep = table["step"][:, 0] >= skip_steps
    table = {
        k: (v[keep] if isinstance(v, np.ndarray) and v.shape[:1] == keep.shape else v)
        for k, v in table.items()
    }
    steps = table["step"][:, 0]
    overhead = table["end"] - table["start"] - table["wait_s"] - table["compute_s"]
    gap = np.zeros_like(overhead)
    gap[:-1] = table["start"][1:] - table["end"][:-1]
    phases_out = []
    starts = {p["start_step"] for p in table["phases"]}
    for p in table["phases"]:
        sel = np.flatnonzero(
            (steps >= p["start_step"]) & (steps < p["start_step"] + p["num_steps"])
        )
        if sel.size == 0:
            continue
        loop = gap[sel].copy()
        last_is_boundary = sel[-1] + 1 < len(steps) and int(steps[sel[-1] + 1]) in starts
        if last_is_boundary or sel[-1] + 1 == len(steps):
            loop[-1] = 0.0  # the phase start is modelled separately
        views = table["view"][sel][:, :, None]
        plan = StepPlan.from_views(F, views)
        start_s = float(gap[sel[0] - 1].max()) if sel[0] > 0 else 0.0
        phases_out.append(
            Phase(
                plan=plan,
                compute=table["compute_s"][sel],
                overhead=np.maximum(overhead[sel], 0.0) + np.maximum(loop, 0.0),
                num_rows=int(p["num_gaussians"]),
                phase_start_s=start_s,
            )
        )
    measured_total = float(table["end"].max() - table["start"].min())
    return phases_out, measured_total


def _scaled_row_bytes(table: dict) -> float:
    """Bytes per published row of the final footprints, scaled to the run's mean rows."""
    rows = table["footprint_rows"].mean()
    F = table["footprints"]
    return PUBLICATION_ROW_BYTES * rows / max(1.0, np.diff(F.indptr).mean())


def calibrate_delay(phases: list[Phase], measured_total: float, row_bytes: float) -> Network:
    """The per-message delay (latency) that makes the simulated barrier run last as long
    as the measured one (bisection; loopback bandwidth 2 GB/s assumed)."""
    lo, hi = 0.0, 0.05
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        net = Network("calibrated loopback", mid, 2e9)
        if replay(phases, "barrier", net, row_bytes=row_bytes).total_time < measured_total:
            lo = mid
        else:
            hi = mid
    return Network(
        "calibrated loopback (gloo, one machine)",
        0.5 * (lo + hi),
        2e9,
        "per-message delay fitted to the barrier calibration run; 2 GB/s assumed",
    )


def replay_modes(
    table: dict, net: Network, collective: Network, modes: tuple[str, ...] = tuple(SIM_SHORT)
) -> dict[str, Replay]:
    """``modes`` simulated from one measured run's trace: ``net`` carries the
    point-to-point publications, ``collective`` ddp's dense all-reduce."""
    phases, _ = _phases_from_trace(table)
    row_bytes = _scaled_row_bytes(table)
    return {m: replay(phases, m, net, row_bytes=row_bytes, collective=collective) for m in modes}


def calibrate_on_barrier(table: dict) -> Network:
    """The per-message delay fitted on a barrier run's trace (``calibrate_delay``)."""
    phases, measured_total = _phases_from_trace(table)
    return calibrate_delay(phases, measured_total, _scaled_row_bytes(table))


def predict_round(tables: dict[str, dict], collective: Network) -> tuple[dict, dict, Network]:
    """Simulated throughput ratios of one round of a ``bench.sync`` result.

    ``tables``: per mode the round's ``step_table`` (``barrier`` required). Calibration
    inputs only: the per-message delay is fitted on the barrier trace; ``collective`` (the
    all-reduce micro-benchmark's fit) prices ddp's all-reduce. Of the measured waits and
    wall times, only the barrier run's enter (through the fitted delay). Returns (``cross_mode``: every mode simulated from the
    barrier trace; ``trace_replay``: each mode from its own trace's compute, overhead and
    phase starts, waits re-simulated; the calibrated network). Keys ``<a>_vs_<b>``
    (throughput of a over b, = time of b over time of a).
    """
    net = calibrate_on_barrier(tables["barrier"])
    cross_sims = replay_modes(tables["barrier"], net, collective)
    cross = {m: s.total_time for m, s in cross_sims.items()}
    own = {
        m: replay_modes(t, net, collective, (m,))[m].total_time if m != "barrier" else cross[m]
        for m, t in tables.items()
    }
    pairs = [(a, "barrier") for a in ("quality-first", "throughput-first", "ddp")]
    pairs.append(("quality-first", "ddp"))

    def ratios(total: dict[str, float]) -> dict[str, float]:
        return {
            f"{SIM_SHORT[a]}_vs_{SIM_SHORT[b]}": total[b] / total[a]
            for a, b in pairs
            if a in total and b in total
        }

    return ratios(cross), ratios(own), net


def allreduce_calibration(
    ranks: list[int], mbytes: list[float], saved: Path | None = None
) -> tuple[dict, dict[int, Network]]:
    """The gloo all-reduce micro-benchmark (``odin_ns.bench.allreduce``) for these world
    sizes: measured now, or read from ``saved``; returns its record and the ring fit per
    world size (what prices ddp's all-reduce in the validation)."""
    from odin_ns.bench.allreduce import (
        AllReduceSample,
        calibrate,
        calibration_record,
        cpu_idle_fraction,
        fit_ring,
    )

    if saved is None:
        idle = cpu_idle_fraction()
        samples, _ = calibrate(ranks, mbytes)
    else:
        record = json.loads(saved.read_text())
        record = record.get("allreduce_calibration", record)
        idle = record.get("cpu_idle_before")
        samples = [AllReduceSample(**s) for s in record["samples"]]
    fits = {}
    for r in ranks:
        mine = [s for s in samples if s.ranks == r]
        if not mine:
            raise ValueError(f"the all-reduce calibration has no sample on {r} ranks")
        fits[r] = fit_ring(mine)
    record = calibration_record(samples, fits, idle)
    if saved is not None:
        record["source"] += f" (read from {saved})"
    if idle is not None and idle < 0.8:
        print(
            f"WARNING: the CPUs were only {idle:.0%} idle before the all-reduce calibration; "
            "a loaded machine slows the all-reduce and the ddp predictions with it (measure "
            "on a quiet machine, or pass --allreduce-json)",
            flush=True,
        )
    return record, fits


def validate_case(sync_json: Path, collectives: dict[int, Network]) -> dict:
    """Predict a ``bench.sync`` result's throughput ratios from its measured traces.

    Per round i, ``predict_round`` on round i's traces (the delay calibrated on round i's
    barrier run; ddp's all-reduce priced by ``collectives[ranks]``, the micro-benchmark's
    ring fit for the case's world size). A predicted ratio is the median over rounds, like
    the measured one; the error is in percentage points. ``errors_points``: each mode's own
    trace replayed (``trace_replay``); ``errors_points_cross_mode``: every mode from the
    barrier trace alone.
    """
    from odin_ns.bench.trace import run_footprints

    res = json.loads(sync_json.read_text())
    modes = res["modes"]
    rounds = len(modes["barrier"]["run_dirs"])
    collective = collectives[int(res["ranks"])]
    fp = run_footprints(Path(modes["barrier"]["run_dirs"][0]))  # identical final Gaussians
    cross: dict[str, list[float]] = {}
    own: dict[str, list[float]] = {}
    delays, r2 = [], []
    for i in range(rounds):
        tables = {}
        for mode in (m for m in modes if m in SIM_SHORT):  # not bench.sync's A/A control
            run_dir = Path(modes[mode]["run_dirs"][i])
            summary = json.loads((run_dir / "odin_run.json").read_text())
            tables[mode] = step_table(summary, run_dir, fp)
        c, o, net = predict_round(tables, collective)
        delays.append(net.latency_s)
        r2.append(fit_trace(tables["barrier"])[0].r2)
        for key, v in c.items():
            cross.setdefault(key, []).append(v)
        for key, v in o.items():
            own.setdefault(key, []).append(v)
    case: dict = {
        "source": "measured ratios (bench.sync medians) vs simulated from their traces",
        "sync_json": str(sync_json),
        "data": res["data"],
        "ranks": res["ranks"],
        "steps": res["steps"],
        "repeats": rounds,
        "jitter_ms": res.get("jitter_ms", 0.0),
        "calibration_traces": modes["barrier"]["run_dirs"],
        "calibrated_delay_s": delays,
        "allreduce_network": vars(collective),
        "cost_model_r2": r2,
        "errors_points": {},
        "errors_points_cross_mode": {},
    }
    for key in cross:
        measured = res.get(f"throughput_ratio_{key}")
        case[f"measured_ratio_{key}"] = measured
        case[f"sim_ratio_{key}_cross_mode"] = float(np.median(cross[key]))
        if key in own:
            case[f"sim_ratio_{key}"] = float(np.median(own[key]))
        if measured is None:
            continue
        case["errors_points_cross_mode"][key] = (
            abs(case[f"sim_ratio_{key}_cross_mode"] - measured) * 100
        )
        if key in own:
            case["errors_points"][key] = abs(case[f"sim_ratio_{key}"] - measured) * 100
    return case


# ------------------------------------------------------------------------ scaling


def scene_footprints(name: str, args, traces: dict) -> tuple:
    """(footprints [V, N], pixels per view, label) of a scaling scene."""
    if name in traces:
        t = traces[name]
        return t["footprints"], float(t["pixels"].mean()), f"{name} (trained Gaussians)"
    import torch

    from odin_ns.bench.schedule import load_transforms_scene, make_city, timed_footprints

    torch.set_num_threads(1)
    if name == "fox":
        scene = load_transforms_scene(args.fox, 100_000, seed=0, downscale=16)
        label = "fox (67 real cameras, 100k random Gaussians)"
    else:
        scene = make_city(args.city_views, 20 * args.city_views, seed=0)
        label = f"city ({args.city_views} views, {20 * args.city_views} Gaussians)"
    F, _, _ = timed_footprints(scene)
    return F, float(scene.width * scene.height), label


def gpu_phase(F, ranks: int, model: CostModel, jitter: Jitter, steps: int, seed: int) -> Phase:
    from odin_ns.schedule import build_plan

    plan = build_plan(F, ranks, steps, seed=seed, strategy="odin")
    rows = np.diff(F.indptr).astype(np.float64)
    rel = model.predict(rows, 0.0) + model.per_pixel * 0.0
    rel = np.maximum(rel, 1e-12) / np.maximum(rel.mean(), 1e-12)
    base = GPU_ASSUMPTION["seconds_per_iteration"] * rel[plan.views].sum(axis=2)
    rng = np.random.default_rng([seed, ranks])
    compute = base * jitter.sample(rng, base.shape)
    return Phase(plan, compute, np.zeros_like(compute), GPU_ASSUMPTION["num_gaussians"])


def sharded_replays(ph: Phase, net, row_bytes: float, seed: int) -> dict:
    """Quality-first with sharded ownership (odin_ns.schedule.ownership): locality (each rank
    owns what its stream reads) vs random (Grendel-style), simulated."""
    from odin_ns.schedule.ownership import assign_ownership

    return {
        kind: replay(
            [ph],
            "quality-first",
            net,
            ownership=Sharded(assign_ownership(ph.plan, kind, seed=seed)),
            row_bytes=row_bytes,
        )
        for kind in ("locality", "random")
    }


def run_scaling(scenes: dict, model: CostModel, jitter: Jitter, args) -> list[dict]:
    rows_out = []
    for name, (F, _pixels, label) in scenes.items():
        V = F.shape[0]
        gpu_row_bytes = PUBLICATION_ROW_BYTES * GPU_ASSUMPTION["num_gaussians"] / F.shape[1]
        for R in args.ranks:
            if V < R:
                continue
            steps = min(args.max_steps, max(1, V // R))
            t0 = time.perf_counter()
            ph = gpu_phase(F, R, model, jitter, steps, args.seed)
            for net_name in args.networks:
                net = NETWORKS[net_name]
                sims = {m: replay([ph], m, net, row_bytes=gpu_row_bytes) for m in SIM_SHORT}
                bar, qf, ddp = sims["barrier"], sims["quality-first"], sims["ddp"]
                sharded = sharded_replays(ph, net, gpu_row_bytes, args.seed)
                rows_out.append(
                    {
                        "source": "simulated",
                        "scene": label,
                        "scene_key": name,
                        "ranks": R,
                        "steps": steps,
                        "network": net_name,
                        "views_per_second": {m: s.views_per_second for m, s in sims.items()},
                        "speedup_qf_vs_barrier": bar.total_time / qf.total_time,
                        "speedup_qf_vs_ddp": ddp.total_time / qf.total_time,
                        "speedup_tf_vs_barrier": bar.total_time
                        / sims["throughput-first"].total_time,
                        "wait_hidden_qf": 1.0
                        - qf.critical_path_wait / max(bar.critical_path_wait, 1e-12),
                        "barrier_wait_share": bar.critical_path_wait / bar.total_time,
                        "tf_admitted_reads": sims["throughput-first"].admitted_reads,
                        "bytes_per_rank_per_step": {
                            m: s.bytes_per_rank_per_step for m, s in sims.items()
                        },
                        "sharded_qf_views_per_second": {
                            k: v.views_per_second for k, v in sharded.items()
                        },
                        "sharded_bytes_per_rank_per_step": {
                            k: v.bytes_per_rank_per_step for k, v in sharded.items()
                        },
                        "speedup_sharded_locality_vs_random": sharded["random"].total_time
                        / sharded["locality"].total_time,
                        "seconds": time.perf_counter() - t0,
                    }
                )
            print(f"simulated {label} R={R}: {time.perf_counter() - t0:.1f}s", flush=True)
    return rows_out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for case in result["validation"]:
        keys = list(case["errors_points_cross_mode"])
        x = np.arange(len(keys))
        name = Path(case["data"]).name
        a.scatter(
            x - 0.1,
            [case[f"measured_ratio_{k}"] for k in keys],
            marker="o",
            label=f"{name} measured",
        )
        a.scatter(
            x + 0.1, [case[f"sim_ratio_{k}"] for k in keys], marker="x", label=f"{name} simulated"
        )
        a.set_xticks(x, keys)
    a.axhline(1.0, color="gray", lw=0.8)
    a.set_title(f"validation: max error {result['validation_error_max']} points")
    a.set_ylabel("throughput ratio")
    a.legend(fontsize=7)
    for scene in sorted({r["scene_key"] for r in result["scaling"]}):
        for metric, style in (("speedup_qf_vs_barrier", "-o"), ("speedup_qf_vs_ddp", "--x")):
            pts = [
                (r["ranks"], r[metric])
                for r in result["scaling"]
                if r["scene_key"] == scene and r["network"] == result["headline_network"]
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                b.plot(xs, ys, style, label=f"{scene} {metric[8:]}")
    b.set_xscale("log", base=2)
    b.axhline(1.0, color="gray", lw=0.8)
    b.set_xlabel("ranks")
    b.set_ylabel("speed-up (simulated)")
    b.set_title(f"SIMULATED, {result['headline_network']}, GPU cost per published gsplat times")
    b.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sync-json", type=Path, action="append", default=[])
    ap.add_argument("--fox", type=Path, default=Path("../shared/data/fox"))
    ap.add_argument("--city-views", type=int, default=10_000)
    ap.add_argument(
        "--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8, 16, 64]
    )
    ap.add_argument("--networks", type=lambda s: s.split(","), default=list(NETWORKS))
    ap.add_argument("--headline-network", default="nvlink")
    ap.add_argument("--max-steps", type=int, default=300, help="steps replayed per plan")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--allreduce-mbytes",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[2.0, 8.0, 32.0],
        help="buffer sizes (MiB) of the all-reduce micro-benchmark run at the start",
    )
    ap.add_argument(
        "--allreduce-json",
        type=Path,
        default=None,
        help="reuse a saved all-reduce calibration (bench.allreduce output, or a bench.scale "
        "output's allreduce_calibration) instead of measuring",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if not args.sync_json:
        ap.error("give at least one --sync-json (a bench.sync result with run_dirs)")

    ranks = sorted({int(json.loads(p.read_text())["ranks"]) for p in args.sync_json})
    ar_record, collectives = allreduce_calibration(
        ranks, args.allreduce_mbytes, args.allreduce_json
    )
    validation = [validate_case(p, collectives) for p in args.sync_json]
    errors = [e for c in validation for e in c["errors_points"].values()]
    errors_cross = [e for c in validation for e in c["errors_points_cross_mode"].values()]
    # Calibration of the GPU cost shape and jitter: the first case's barrier trace.
    calib = Path(validation[0]["calibration_traces"][0]) / "odin_run.json"
    table = step_table(json.loads(calib.read_text()), calib.parent)
    model, jitter = fit_trace(table)
    traces = {}
    for case in validation:
        name = "fox" if "fox" in case["data"] else "street"
        if name not in traces:
            p = Path(case["calibration_traces"][0]) / "odin_run.json"
            traces[name] = step_table(json.loads(p.read_text()), p.parent)
    scenes = {
        n: scene_footprints(n, args, traces)
        for n in ("street", "fox", "city")
        if n in traces or n != "street"
    }
    scaling = run_scaling(scenes, model, jitter, args)

    def pick(scene: str, ranks: int, key: str):
        for r in scaling:
            if (
                r["scene_key"] == scene
                and r["ranks"] == ranks
                and r["network"] == args.headline_network
            ):
                return r[key]
        return None

    result = {
        "source": "validation: measured CPU runs vs simulated; sim_*: simulated",
        "validation_error_max": max(errors) if errors else None,
        "validation_error_max_cross_mode": max(errors_cross) if errors_cross else None,
        "validation": validation,
        "allreduce_calibration": ar_record,
        "sim_speedup_qf_vs_barrier_8": pick("city", 8, "speedup_qf_vs_barrier"),
        "sim_speedup_qf_vs_ddp_8": pick("city", 8, "speedup_qf_vs_ddp"),
        "sim_wait_hidden_qf_8": pick("city", 8, "wait_hidden_qf"),
        "sim_speedup_sharded_locality_vs_random_64": pick(
            "city", 64, "speedup_sharded_locality_vs_random"
        ),
        "sim_sharded_note": "quality-first over sharded ownership (odin_ns.bench.simulate."
        "Sharded): gradient rows of non-owned rows go to their owners and updated rows come "
        "back (two hops, and a rank waits for its own previous step's round trip); locality "
        "ownership from odin_ns.schedule.ownership vs random ownership (Grendel-style)",
        "headline_scene": "city (street-like layout)",
        "headline_network": args.headline_network,
        "gpu_assumption": GPU_ASSUMPTION,
        "networks": {k: vars(v) for k, v in NETWORKS.items()},
        "allreduce_model": "ddp's dense [N, 60] float32 all-reduce as a ring (reduce-scatter "
        "+ all-gather): 2 (R - 1) x (latency + bytes / R / bandwidth). Validation: latency and "
        "bandwidth fitted to the gloo micro-benchmark (allreduce_calibration; gloo's default "
        "CPU all-reduce is a ring, gloo/allreduce.cc). Scaling: the network preset's latency "
        "and bandwidth (NCCL ring; bus bandwidth 2 (R - 1) / R x bytes / time, nccl-tests "
        "PERFORMANCE.md), no overlap with backward or the step's overhead",
        "cost_model_calibration": {"trace": str(calib), "r2": model.r2, "per_row": model.per_row},
        "jitter_lognormal_sigma": jitter.lognormal_sigma,
        "tf_evidence_assumption": "E = 0 (gradient evidence is not known from footprints): "
        "throughput-first admits every read the overlap/staleness rule allows (upper bound)",
        "scaling": scaling,
        "seconds": time.perf_counter() - t_start,
    }
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(
        json.dumps(
            {k: v for k, v in result.items() if k not in ("scaling", "validation")}, indent=1
        )
    )
    return result


if __name__ == "__main__":
    main()
