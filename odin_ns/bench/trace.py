"""Traces of measured runs: per-step records, a per-view cost model and its jitter.

    python -m odin_ns.bench.trace --run-json RUN/odin_run.json --out bench/trace_street.json

Reads the run log ``odin_run.json`` (per rank: ``steps`` with ``step, view, compute_s,
wait_s, start, end`` and, when the telemetry writes them, ``footprint_rows,
visible_rows, pixels, bytes_sent, bytes_recv, drain_wait_s``; ``phases`` with
``start_step, num_steps, num_gaussians`` and ``phase_start_s`` or, in older logs,
``plan_seconds``). Per-view fields
the log lacks are computed from the run directory: footprints of the final checkpoint's
Gaussians over the saved config's training cameras (``footprint_rows``, scaled per phase to
the phase's recorded ``mean_footprint_rows``), pixels from the cameras.

The cost model is least squares ``compute_s = a + b * rows + c * pixels`` (``rows``:
visible rows when recorded, else footprint rows; a regressor that does not vary is
dropped), fitted on the steps after ``--skip-steps``. The jitter is the distribution of the
relative residuals ``compute_s / predicted`` (quantiles, mean, std, log-normal sigma). Fit
quality: R^2 and the median / mean relative error. Writes JSON and a PNG (fit and residuals).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from odin_ns.bench.report import save_figure, write_json

STEP_FIELDS = ("step", "view", "compute_s", "wait_s", "start", "end")
OPTIONAL_FIELDS = (
    "footprint_rows",
    "visible_rows",
    "pixels",
    "bytes_sent",
    "bytes_recv",
    "drain_wait_s",
)


@dataclass
class CostModel:
    """``seconds = intercept + per_row * rows + per_pixel * pixels``, with its fit quality."""

    intercept: float
    per_row: float
    per_pixel: float
    rows_field: str  # "visible_rows" or "footprint_rows"
    r2: float
    median_rel_error: float
    mean_rel_error: float
    samples: int

    def predict(self, rows: np.ndarray, pixels: np.ndarray | float) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.float64)
        return self.intercept + self.per_row * rows + self.per_pixel * np.asarray(pixels)


@dataclass
class Jitter:
    """Relative residuals ``measured / predicted`` of the cost model."""

    mean: float
    std: float
    lognormal_sigma: float
    quantiles: dict[str, float]
    ratios: list[float]  # the samples, for resampling

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.choice(np.asarray(self.ratios), size=shape, replace=True)


def fit_cost_model(
    rows: np.ndarray, pixels: np.ndarray, seconds: np.ndarray, rows_field: str = "visible_rows"
) -> CostModel:
    """Least squares of ``seconds`` on [1, rows, pixels]; constant regressors are dropped."""
    rows, pixels, y = (np.asarray(a, dtype=np.float64) for a in (rows, pixels, seconds))
    if y.size < 2:
        raise ValueError("need at least two samples to fit a cost model")
    cols, names = [np.ones_like(y)], ["intercept"]
    for name, x in (("per_row", rows), ("per_pixel", pixels)):
        if np.ptp(x) > 1e-9 * max(1.0, float(np.abs(x).max())):
            cols.append(x)
            names.append(name)
    X = np.stack(cols, axis=1)
    scale = np.abs(X).max(axis=0)
    coef, *_ = np.linalg.lstsq(X / scale, y, rcond=None)
    coef = coef / scale
    c = dict.fromkeys(("intercept", "per_row", "per_pixel"), 0.0)
    c.update(zip(names, (float(v) for v in coef), strict=True))
    pred = X @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    rel = np.abs(y - pred) / np.maximum(np.abs(pred), 1e-12)
    return CostModel(
        intercept=c["intercept"],
        per_row=c["per_row"],
        per_pixel=c["per_pixel"],
        rows_field=rows_field,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        median_rel_error=float(np.median(rel)),
        mean_rel_error=float(rel.mean()),
        samples=int(y.size),
    )


def fit_jitter(
    model: CostModel, rows: np.ndarray, pixels: np.ndarray, seconds: np.ndarray
) -> Jitter:
    ratio = np.asarray(seconds, dtype=np.float64) / np.maximum(model.predict(rows, pixels), 1e-12)
    ratio = ratio[ratio > 0]
    q = {f"p{p}": float(np.percentile(ratio, p)) for p in (1, 5, 25, 50, 75, 95, 99)}
    return Jitter(
        mean=float(ratio.mean()),
        std=float(ratio.std()),
        lognormal_sigma=float(np.log(ratio).std()),
        quantiles=q,
        ratios=[float(r) for r in ratio],
    )


# ------------------------------------------------------------------------ reading runs


def run_footprints(run_dir: Path) -> tuple[sp.csr_matrix, int]:
    """Footprints [V, N] of the run's final Gaussians over its training cameras, and the
    pixels per view (same conventions as the pipeline's phase-start footprints)."""
    import torch
    from nerfstudio.engine.trainer import TrainerConfig
    from nerfstudio.utils.eval_utils import eval_setup

    from odin_ns.model import get_viewmat
    from odin_ns.schedule import compute_footprints

    def checkpoints_here(config: TrainerConfig) -> TrainerConfig:
        # the saved paths are relative to the directory the run trained from
        config.relative_model_dir = (run_dir / "nerfstudio_models").resolve()
        return config

    _, pipeline, _, _ = eval_setup(
        run_dir / "config.yml", test_mode="test", update_config_callback=checkpoints_here
    )
    cameras = pipeline.datamanager.train_dataset.cameras
    model = pipeline.model
    margin = float(getattr(pipeline.config, "footprint_margin_px", 16.0))
    with torch.no_grad():
        F = compute_footprints(
            means=model.means.detach().cpu(),
            scales=torch.exp(model.scales.detach().cpu()),
            quats=model.quats.detach().cpu(),
            opacities=torch.sigmoid(model.opacities.detach().cpu()).squeeze(-1),
            viewmats=get_viewmat(cameras.camera_to_worlds.cpu()),
            Ks=cameras.get_intrinsics_matrices().cpu(),
            width=int(cameras.width[0].item()),
            height=int(cameras.height[0].item()),
            margin_px=margin,
        )
    return F, int(cameras.width[0].item()) * int(cameras.height[0].item())


def phase_of(phases: list[dict], step: int) -> dict:
    for p in reversed(phases):
        if p["start_step"] <= step:
            return p
    return phases[0]


def run_admissions(summary: dict) -> np.ndarray:
    """[K, 4] int64 every delayed read a throughput-first run admitted: (global step,
    reading rank, peer, global step of the publication read around), from each rank's
    ``admitted_reads`` in ``odin_run.json`` (K = 0 for the other modes)."""
    rows = [
        (a["step"], r, a["peer"], a["pub_step"])
        for r, rank in enumerate(summary["ranks"])
        for a in rank.get("admitted_reads", [])
    ]
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def critical_path_wait(
    last_end: np.ndarray,  # [R] each rank's last counted step's end, seconds
    waited: np.ndarray,  # [R] seconds each rank waited in its counted steps
) -> float:
    """How much later the run ended than it would have if no rank had waited: the latest
    end minus the latest of each rank's end moved earlier by its own waits (the wait that
    lengthens the run, ``simulate.SimResult.critical_path_wait``). Peers' idle time beside
    a rank that is busier every step does not count: no order of the same steps hides
    that, it is work, not wait; the most any rank waited counts it."""
    return float(last_end.max() - (last_end - waited).max())


def replay_run(summary: dict, skip_steps: int, balanced: bool = False) -> float | None:
    """The critical-path wait (``critical_path_wait`` over the steps from ``skip_steps``
    on, seconds) that a replay of the run's own steps predicts: each step
    takes its measured ``compute_s``; under quality-first it starts once the rank's
    previous step is done and every peer's step its reads depend on (the records'
    ``depends_on``) is done, under barrier once every rank's previous step is done; a
    phase start's rendezvous is a barrier. Simulated (``bench.simulate.simulate``: no
    publication latency, no engine time; in a sharded run the owner's apply and push
    between a write and a read are left out too), calibrated on nothing but the run
    itself: it says how much of the measured wait the plan and the measured compute
    explain.
    ``balanced``: the same with each rank's compute moved to the mean over ranks (a
    rank's steps keep their spread; a systematically slower rank no longer is): the wait
    the plan would cost without a rank-to-rank imbalance. None for other modes and for
    logs without ``depends_on``."""
    from odin_ns.bench.simulate import StepPlan, simulate

    mode = summary.get("sync")
    if mode not in ("barrier", "quality-first"):
        return None
    ranks = sorted(summary["ranks"], key=lambda r: r["rank"])
    records = [sorted(r["steps"], key=lambda x: x["step"]) for r in ranks]
    T, R = min(len(rec) for rec in records), len(ranks)
    if any("depends_on" not in rec[0] for rec in records):
        return None
    first = records[0][0]["step"]
    k = max(1, skip_steps - first)  # the first step index counted
    if T <= k:
        return None
    compute = np.array([[records[r][t]["compute_s"] for r in range(R)] for t in range(T)])
    dependency = np.array([[records[r][t]["depends_on"] for r in range(R)] for t in range(T)])
    dependency = np.where(dependency >= first, dependency - first, -1)
    for phase in ranks[0]["phases"][1:]:  # a phase start: every rank's previous step
        t = phase["start_step"] - first
        if 0 < t < T:
            dependency[t] = t - 1
    if balanced:
        rank_mean = compute[k:].mean(axis=0)
        compute = np.maximum(compute - rank_mean + rank_mean.mean(), 0.0)
    # the plan as simulate reads it: views only for their shape, no publication rows (a
    # publication arrives as its step ends)
    none = np.zeros((T, R), np.int64)
    plan = StepPlan(np.zeros((T, R, 1), np.int64), None, dependency, none, np.zeros((T, R, R)))
    sim = simulate(plan, compute, mode="barrier" if mode == "barrier" else "odin")
    waits = sim.start[k:] - sim.finish[k - 1 : -1]  # [T - k, R]: before each counted step
    return critical_path_wait(sim.finish[-1], waits.sum(axis=0))


def step_table(summary: dict, run_dir: Path | None = None, footprints: tuple | None = None) -> dict:
    """Per-step records of every rank as arrays, with the per-view fields filled in.

    Returns a dict of ``[T, R]`` arrays (``step, view, compute_s, wait_s, start, end,
    footprint_rows, visible_rows, pixels``), ``phases`` (rank 0's), ``num_rows`` per step,
    ``footprints`` (when computed from the checkpoint), ``admitted`` (``run_admissions``)
    and ``sources`` (field -> where it came from: "run log" or "checkpoint footprints").
    ``footprints``: a precomputed ``run_footprints`` result to reuse (runs with identical
    final Gaussians).
    """
    ranks = summary["ranks"]
    R = len(ranks)
    steps = [{s["step"]: s for s in r["steps"]} for r in ranks]
    common = sorted(set.intersection(*(set(s) for s in steps)))
    T = len(common)
    out: dict = {"world_size": R, "sources": {}}
    for field in STEP_FIELDS:
        out[field] = np.array([[steps[r][t][field] for r in range(R)] for t in common], np.float64)
    out["view"] = out["view"].astype(np.int64)
    out["step"] = out["step"].astype(np.int64)
    phases = ranks[0]["phases"]
    out["phases"] = phases
    out["num_rows"] = np.array([phase_of(phases, t)["num_gaussians"] for t in common], np.int64)
    first = ranks[0]["steps"][0] if ranks[0]["steps"] else {}
    missing = [f for f in OPTIONAL_FIELDS if f not in first]
    for field in OPTIONAL_FIELDS:
        if field not in missing:
            out[field] = np.array(
                [[steps[r][t][field] for r in range(R)] for t in common], np.float64
            )
            out["sources"][field] = "run log"
    have_run = run_dir is not None and (run_dir / "config.yml").exists()
    if footprints is not None or have_run:  # the replay needs F itself, not only its rows
        F, pixels = footprints if footprints is not None else run_footprints(run_dir)
        rows_final = np.diff(F.indptr).astype(np.float64)
        rows = rows_final[out["view"]]
        for p in phases:  # scale each phase to its recorded mean footprint rows
            sel = (out["step"] >= p["start_step"]) & (
                out["step"] < p["start_step"] + p["num_steps"]
            )
            if sel.any() and "mean_footprint_rows" in p and rows[sel].mean() > 0:
                rows[sel] *= p["mean_footprint_rows"] / rows[sel].mean()
        if "footprint_rows" in missing:
            out["footprint_rows"] = rows
            out["sources"]["footprint_rows"] = "checkpoint footprints, scaled per phase"
        if "pixels" in missing:
            out["pixels"] = np.full((T, R), float(pixels))
            out["sources"]["pixels"] = "cameras of the saved config"
        out["footprints"] = F
    out["admitted"] = run_admissions(summary)
    if "visible_rows" not in out and "footprint_rows" in out:
        out["visible_rows"] = out["footprint_rows"]
        out["sources"]["visible_rows"] = "footprint_rows (visible rows not in the run log)"
    return out


def fit_trace(table: dict, skip_steps: int = 5) -> tuple[CostModel, Jitter]:
    sel = table["step"][:, 0] >= skip_steps
    rows = table["visible_rows"][sel].ravel()
    pixels = table["pixels"][sel].ravel()
    y = table["compute_s"][sel].ravel()
    field = (
        "visible_rows" if table["sources"].get("visible_rows") == "run log" else "footprint_rows"
    )
    model = fit_cost_model(rows, pixels, y, rows_field=field)
    return model, fit_jitter(model, rows, pixels, y)


def plot_fit(table: dict, model: CostModel, jitter: Jitter, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, pixels = table["visible_rows"].ravel(), table["pixels"].ravel()
    y = table["compute_s"].ravel()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.scatter(rows, y * 1e3, s=6, alpha=0.5, label="measured steps")
    xs = np.linspace(rows.min(), rows.max(), 50)
    a.plot(xs, model.predict(xs, float(np.median(pixels))) * 1e3, "r-", label="cost model")
    a.set_xlabel(model.rows_field)
    a.set_ylabel("compute ms")
    a.set_title(f"R^2 {model.r2:.2f}, median rel. error {model.median_rel_error:.1%}")
    a.legend()
    b.hist(jitter.ratios, bins=40, color="tab:gray")
    b.set_xlabel("measured / predicted (jitter)")
    b.set_title(f"sigma(log) {jitter.lognormal_sigma:.3f}")
    fig.suptitle(title)
    save_figure(fig, path)


def trace_report(run_json: Path, skip_steps: int = 5) -> tuple[dict, dict, CostModel, Jitter]:
    summary = json.loads(run_json.read_text())
    table = step_table(summary, run_json.parent)
    model, jitter = fit_trace(table, skip_steps)
    report = {
        "run_json": str(run_json),
        "source": "measured (fit of one run's per-step compute)",
        "sync": summary.get("sync"),
        "world_size": table["world_size"],
        "steps": int(table["step"].shape[0]),
        "field_sources": table["sources"],
        "cost_model": asdict(model),
        "jitter": {k: v for k, v in asdict(jitter).items() if k != "ratios"},
        "mean_compute_s": float(table["compute_s"].mean()),
        "mean_wait_s": float(table["wait_s"].mean()),
    }
    return report, table, model, jitter


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run-json", type=Path, required=True)
    ap.add_argument("--skip-steps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    report, table, model, jitter = trace_report(args.run_json, args.skip_steps)
    write_json(args.out, report)
    plot_fit(
        table,
        model,
        jitter,
        args.out.with_suffix(".png"),
        f"trace fit: {args.run_json.parent.name}",
    )
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
