"""Measured traces kept in the repository, so that ``bench.scale`` rebuilds from them alone.

    python -m odin_ns.bench.trace_store --sync-json RESULT.json --out-dir bench/traces/street

A ``bench.sync`` result names run directories (``outputs/...``) that are not committed.
This exports what the simulator's validation and fit read from them into one folder per
case:

- ``case.json``: the measured figures of the result (data, ranks, steps, rounds, the
  median throughput ratios ``throughput_ratio_<a>_vs_<b>``) and, per mode, its traces;
- ``<mode>-r<i>.npz``: round i's per-step table (``bench.trace.step_table``: ``[T, R]``
  arrays of step, view, compute, wait, start, end, footprint / visible rows, pixels) with
  its phases, and the delayed reads a throughput-first run admitted (``[K, 4]``), which the
  validation replays;
- ``footprints.npz``: the footprints ``[V, N]`` of the final Gaussians over the training
  cameras (every mode trains the same Gaussians bit for bit, or close: barrier's round 0).

Exporting reads the checkpoints (nerfstudio); loading needs numpy and scipy only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from odin_ns.bench.report import write_json

CASE_FILE = "case.json"
FOOTPRINTS_FILE = "footprints.npz"
TABLE_ARRAYS = (
    "step",
    "view",
    "compute_s",
    "wait_s",
    "start",
    "end",
    "footprint_rows",
    "visible_rows",
    "pixels",
    "num_rows",
    "admitted",
    "drain_wait_s",
)


def save_table(table: dict, path: Path) -> None:
    """One run's ``step_table`` (without its footprints) as a compressed npz."""
    arrays = {k: np.asarray(table[k]) for k in TABLE_ARRAYS if k in table}
    meta = {
        "world_size": table["world_size"],
        "phases": table["phases"],
        "sources": table["sources"],
    }
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)


def load_table(path: Path, footprints: sp.csr_matrix) -> dict:
    """A saved table, with the case's ``footprints``, in ``step_table``'s layout."""
    with np.load(path) as z:
        table = {k: z[k] for k in z.files if k != "meta"}
        meta = json.loads(str(z["meta"]))
    table.update(meta)
    table["footprints"] = footprints
    return table


def export_case(sync_json: Path, out_dir: Path, modes: tuple[str, ...]) -> Path:
    """Write ``sync_json``'s traces (``modes`` that it ran) into ``out_dir``."""
    from odin_ns.bench.trace import run_footprints, step_table

    res = json.loads(Path(sync_json).read_text())
    runs = {m: res["modes"][m]["run_dirs"] for m in modes if m in res["modes"]}
    if "barrier" not in runs:
        raise ValueError(f"{sync_json} has no barrier runs: the validation calibrates on them")
    missing = [
        d for dirs in runs.values() for d in dirs if not (Path(d) / "odin_run.json").exists()
    ]
    if missing:
        raise FileNotFoundError(f"run directories of {sync_json} are gone: {missing[0]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    F, pixels = run_footprints(Path(runs["barrier"][0]))
    sp.save_npz(out_dir / FOOTPRINTS_FILE, F.astype(bool), compressed=True)
    files: dict[str, list[str]] = {}
    for mode, dirs in runs.items():
        for i, run_dir in enumerate(dirs):
            summary = json.loads((Path(run_dir) / "odin_run.json").read_text())
            table = step_table(summary, Path(run_dir), (F, pixels))
            name = f"{mode}-r{i}.npz"
            save_table(table, out_dir / name)
            files.setdefault(mode, []).append(name)
    case = {
        "source": f"measured: bench.sync result {Path(sync_json).name}, traces exported by "
        "odin_ns.bench.trace_store",
        "data": res["data"],
        "ranks": res["ranks"],
        "steps": res["steps"],
        "repeats": len(runs["barrier"]),
        "jitter_ms": res.get("jitter_ms", 0.0),
        "method": res.get("method"),
        "measured": {k: v for k, v in res.items() if k.startswith("throughput_ratio_")},
        "dependency_share": {m: res["modes"][m].get("dependency_share") for m in runs},
        "traces": files,
    }
    write_json(out_dir / CASE_FILE, case)
    return out_dir


def load_case(case_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    """(``case.json``, per mode its rounds' tables) of an exported case."""
    case_dir = Path(case_dir)
    if not (case_dir / CASE_FILE).exists():
        raise FileNotFoundError(f"{case_dir} holds no {CASE_FILE} (export one with trace_store)")
    case = json.loads((case_dir / CASE_FILE).read_text())
    F = sp.load_npz(case_dir / FOOTPRINTS_FILE).tocsr()
    tables = {
        mode: [load_table(case_dir / name, F) for name in names]
        for mode, names in case["traces"].items()
    }
    return case, tables


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sync-json", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--modes", default="ddp,barrier,quality-first,throughput-first")
    args = ap.parse_args(argv)
    if not args.sync_json.exists():
        ap.error(f"--sync-json {args.sync_json} does not exist")
    out = export_case(args.sync_json, args.out_dir, tuple(args.modes.split(",")))
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({size / 2**20:.2f} MiB)")
    return out


if __name__ == "__main__":
    main()
