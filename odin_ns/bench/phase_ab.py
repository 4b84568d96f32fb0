"""Two code versions, interleaved: did a change make phase starts (or steps) cheaper?

    python -m odin_ns.bench.phase_ab --a DIR_A --b DIR_B --data demo_data/street \
        [--mode barrier] --rounds 3 --out bench/phase_start_ab.json [-- more bench.sync options]

``DIR_A`` and ``DIR_B`` are checkouts of the two versions (``git worktree add --detach DIR
COMMIT``, with links ``odin_ns/method_configs -> ../method_configs`` and ``odin_ns/viewer_ext
-> ../viewer_ext``, so that it imports its own copies rather than the installed clone's:
``make bench-phase-ab`` says how); a relative ``--data`` must resolve from each. Every run is one ``python -m odin_ns.bench.sync
--modes MODE --repeats 1 --no-eval`` from its checkout (``PYTHONPATH`` = the checkout,
its own extension folder under ``--work``), with the current interpreter. Round i runs A
then B when i is even, B then A when odd (ABBA ...), so the machine's drift lands on both
alike. Per version: the median phase-start share of the run (and min / max), its seconds,
the median of each part of the split (``PhaseRecord``), views per second; the same-round
ratios B / A of the share and of views per second (``views_ratio_b_vs_a``: a step-speed
A/B of ``--mode``), and per round whether the two final models are bitwise equal
(``gaussians_equal_b_vs_a``: a digest of each run's last checkpoint). Writes JSON and a
PNG (share per run; median split per version).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from rich.console import Console

from odin_ns.bench.report import put_spread, save_figure, write_json
from odin_ns.bench.sync import PHASE_START_SPLIT, SHORT

CONSOLE = Console()
SPLIT = (*PHASE_START_SPLIT, "other_s")  # bench.sync's split of a run's phase starts


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """ABBA...: round i runs ("a", "b") when i is even, ("b", "a") when odd."""
    return [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(rounds)]


def commit_of(checkout: Path) -> str:
    """The checkout's short commit (and "+dirty" with uncommitted changes outside
    ``bench/``, where benchmarks write their results), or "unknown"."""
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"]
            + ["--", ".", ":(exclude)bench"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def checkout_env(checkout: Path, work: Path) -> dict[str, str]:
    """The environment of a run from ``checkout``: its code first on the path, its own
    extension folder (two versions never share a library)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env["ODIN_NS_EXT_DIR"] = str(work / "ext" / checkout.name)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def build_extension(checkout: Path, work: Path) -> None:
    """Build ``checkout``'s extension before any timed run (the CPU library only on a
    machine without a GPU: CPU ranks use nothing else)."""
    import torch

    cmd = [sys.executable, "-m", "odin_ns.cuda", "build"]
    cmd += [] if torch.cuda.is_available() else ["--cpu-only"]
    env = checkout_env(checkout, work)
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench.phase_ab: building {checkout}'s extension failed: {proc.stderr}")


def run_once(checkout: Path, args: argparse.Namespace, name: str, extra: list[str]) -> dict:
    """One ``--mode`` run of ``bench.sync`` from ``checkout``; its phase-start figures."""
    # an earlier invocation's runs under the same name (another mode's checkpoints among
    # them) would be read as this run's model
    shutil.rmtree(args.work / name, ignore_errors=True)
    out = args.work / f"{name}.json"
    cmd = [sys.executable, "-m", "odin_ns.bench.sync", "--data", str(args.data)]
    cmd += ["--ranks", str(args.ranks), "--steps", str(args.steps), "--repeats", "1"]
    cmd += ["--modes", args.mode, "--no-eval", "--work-dir", str(args.work / name)]
    cmd += ["--out", str(out)]
    if args.downscale_factor:
        cmd += ["--downscale-factor", str(args.downscale_factor)]
    if extra:
        cmd += ["--", *extra]
    env = checkout_env(checkout, args.work)
    log = args.work / f"{name}.log"
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=checkout, env=env, stdout=f, stderr=subprocess.STDOUT)
    if code.returncode != 0:
        raise SystemExit(f"bench.phase_ab: run {name} failed (exit {code.returncode}), see {log}")
    result = json.loads(out.read_text())
    mode, key = result["modes"][args.mode], SHORT[args.mode]
    split = result[f"phase_start_split_{key}"]
    return {
        "phase_start_share": float(result[f"phase_start_share_{key}"]),
        "phase_start_seconds": float(mode["phase_start_seconds"]),
        "views_per_second": float(mode["views_per_second"]),
        "phase_starts": int(mode["phase_starts"]),
        "gaussians_sha256": gaussians_digest(args.work / name),
        **{key: float(split.get(key, 0.0)) for key in SPLIT},
    }


def gaussians_digest(run_dir: Path) -> str | None:
    """sha256 of the Gaussians (``gauss_params.*``, key order) in the run's last checkpoint
    under ``run_dir``, or None without one: equal digests are bitwise equal models. A folder
    holding more than one run's checkpoints is refused (which one is the run's?)."""
    import torch  # only here: the launcher needs no torch otherwise

    ckpts = sorted(run_dir.glob("**/nerfstudio_models/step-*.ckpt"))
    if not ckpts:
        return None
    runs = sorted({str(c.parent.parent.relative_to(run_dir)) for c in ckpts})
    if len(runs) > 1:
        raise ValueError(f"{run_dir} holds the checkpoints of {len(runs)} runs: {runs}")
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)["pipeline"]
    digest = hashlib.sha256()
    for key in sorted(k for k in state if "gauss_params." in k):
        digest.update(key.encode())
        digest.update(state[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def summarize(runs: list[dict], label: str) -> dict:
    """Median (and min / max) over the version's runs."""
    out: dict = {"code": label}
    for key in ("phase_start_share", "phase_start_seconds", "views_per_second", *SPLIT):
        put_spread(out, key, [r[key] for r in runs])
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    for k, key in enumerate(("a", "b")):
        shares = [100 * r["phase_start_share"] for r in result["runs"] if r["version"] == key]
        ax0.scatter(np.full(len(shares), k), shares, s=30, label=result[key]["code"])
        ax0.hlines(100 * result[key]["phase_start_share"], k - 0.2, k + 0.2, color="k")
    ax0.set_xticks([0, 1], [result["a"]["code"], result["b"]["code"]])
    ax0.set_ylabel("phase starts, % of the run")
    ax0.set_title("each run (line: median)")
    bottom = np.zeros(2)
    for key in SPLIT:
        values = np.array([result["a"][key], result["b"][key]])
        ax1.bar([0, 1], values, bottom=bottom, label=key.removesuffix("_s"))
        bottom += values
    ax1.set_xticks([0, 1], [result["a"]["code"], result["b"]["code"]])
    ax1.set_ylabel("seconds per run (median of each part)")
    ax1.set_title("where the phase starts' time goes")
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(textwrap.fill(result["what"], 140), fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout of version A (before)")
    parser.add_argument("--b", type=Path, required=True, help="checkout of version B (after)")
    parser.add_argument("--data", type=Path, required=True, help="scene, as seen from a checkout")
    parser.add_argument("--downscale-factor", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--mode", default="barrier", choices=("ddp", "barrier", "quality-first", "throughput-first")
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/odin_phase_ab"))
    parser.add_argument("--out", type=Path, default=Path("bench/phase_start_ab.json"))
    args = parser.parse_args(argv)
    checkouts = {"a": args.a.resolve(), "b": args.b.resolve()}
    for key, path in checkouts.items():
        if not (path / "odin_ns" / "bench" / "sync.py").is_file():
            raise SystemExit(f"bench.phase_ab: --{key} {path} is not an odin-ns checkout")
        if not (path / args.data).exists():  # an absolute --data is itself
            raise SystemExit(f"bench.phase_ab: --data {args.data} does not exist under {path}")
    if args.rounds < 1:
        raise SystemExit(f"bench.phase_ab: --rounds must be >= 1, got {args.rounds}")
    args.work.mkdir(parents=True, exist_ok=True)
    labels = {key: commit_of(path) for key, path in checkouts.items()}
    for path in checkouts.values():  # versions that load the extension lazily would
        build_extension(path, args.work)  # otherwise compile it inside their first run
    runs = []
    orders = round_orders(args.rounds)
    with CONSOLE.status("phase-start A/B") as status:
        for i, order in enumerate(orders):
            for key in order:
                status.update(f"round {i + 1}/{args.rounds}: {labels[key]} ({key})")
                figures = run_once(checkouts[key], args, f"{key}_{i}", extra)
                runs.append({"version": key, "round": i, **figures})
                CONSOLE.log(
                    f"round {i} {labels[key]}: phase starts "
                    f"{100 * figures['phase_start_share']:.2f}% of the run, "
                    f"{figures['views_per_second']:.1f} views/s"
                )
    share = {(r["round"], r["version"]): r["phase_start_share"] for r in runs}
    ratios = [share[i, "b"] / share[i, "a"] for i in range(args.rounds)]
    speed = {(r["round"], r["version"]): r["views_per_second"] for r in runs}
    views_ratios = [speed[i, "b"] / speed[i, "a"] for i in range(args.rounds)]
    digest = {(r["round"], r["version"]): r["gaussians_sha256"] for r in runs}
    same = [
        digest[i, "a"] is not None and digest[i, "a"] == digest[i, "b"] for i in range(args.rounds)
    ]
    result = {
        "what": (
            f"phase-start cost of a {args.steps}-step {args.mode} run on {args.ranks} ranks, "
            f"{args.data}, versions {labels['a']} (a) and {labels['b']} (b) alternated "
            "(ABBA), one bench.sync run each from its own checkout"
        ),
        "orders": ["".join(o) for o in orders],
        "a": summarize([r for r in runs if r["version"] == "a"], labels["a"]),
        "b": summarize([r for r in runs if r["version"] == "b"], labels["b"]),
        "share_ratio_b_vs_a": float(np.median(ratios)),
        "share_ratio_b_vs_a_min": float(min(ratios)),
        "share_ratio_b_vs_a_max": float(max(ratios)),
        "views_ratio_b_vs_a": float(np.median(views_ratios)),
        "views_ratio_b_vs_a_min": float(min(views_ratios)),
        "views_ratio_b_vs_a_max": float(max(views_ratios)),
        "gaussians_equal_b_vs_a": same,  # per round: the final models bitwise equal
        "runs": runs,
        "extra_options": extra,
    }
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    CONSOLE.print(
        f"phase starts: {labels['a']} {100 * result['a']['phase_start_share']:.2f}% -> "
        f"{labels['b']} {100 * result['b']['phase_start_share']:.2f}% of the run (median; "
        f"same-round ratio {result['share_ratio_b_vs_a']:.3f}); views/s "
        f"{result['a']['views_per_second']:.2f} -> {result['b']['views_per_second']:.2f} "
        f"(same-round ratio {result['views_ratio_b_vs_a']:.3f}); final Gaussians equal in "
        f"{sum(same)} of {args.rounds} rounds; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
