"""GPU check: one blind run on a lent GPU machine that checks the CUDA paths, in < 7 minutes.

``python -m odin_ns.cuda.gpu_check --out gpu_check.json``; on a bare GPU machine (no gsplat,
no network) first ``--prepare gpu_wheels`` here and then ``--wheels gpu_wheels`` there
(``odin_ns.cuda.gpu_wheels``).

Checks, in order of value (a check that does not fit in what is left of ``--budget-s``
is skipped with a note; each one records ``ok``, its figures, its error text and timing,
and the run goes on):

1. ``ops``: every op in ``odin_ns.cuda.ops.OPS`` on CUDA tensors (through the dispatcher,
   which must pick the compiled kernel) against its torch reference
   (``odin_ns.cuda.reference``, on CPU), on small random inputs from the op's input case
   (``odin_ns.cuda.cases.make_inputs``); timings of the CPU op, the CUDA op and the
   reference on the GPU.
2. ``raster``: the ``gsplat`` backend against the ``torch`` backend of
   ``odin_ns.render.rasterize`` on one small scene: image / alpha max abs diff and the
   gradients of means, scales, quats, opacities and colors (tolerances in ``RASTER_TOL``).
3. ``two_ranks_one_gpu``: ``odin-ns-train --nproc-per-node 2`` with both ranks on cuda:0
   (default group and runtime over gloo), quality-first and barrier; max abs diff of the
   final parameters per group (expected 0.0) and the wall time of each run.
4. ``single_process``: ``ns-train odin-splatfacto`` on the gsplat backend, steps/s and
   final loss from its tensorboard events, then ``ns-eval`` PSNR.
5. ``control_plane``: ``odin_ns.bench.control_plane`` on CUDA: rank 0's replicated engine
   at 1M Gaussians, R = 8 (peers injected), 30 steps: host and wall ms per step and the
   stream synchronizations per step (torch's sync debug mode).
6. ``nccl_link``: the device transport's NCCL backend (``odin_ns.runtime.nccl.NcclLink``) on
   one rank (NCCL holds one rank per device, so its two-rank channels cannot run here): the
   set-up and ddp's all-reduce, completion polled; NCCL's version.

gsplat's CUDA code is JIT-compiled on first use (minutes on a fresh machine), so its build
starts in a background process at once and overlaps check 1. Without a CUDA device the
script prints one line and exits 2. ``--device cpu`` is a dry run of the harness (CPU
kernels against the references, training on CPU with the torch rasterizer, no gsplat, the
control plane at 20k rows; ``raster`` and ``nccl_link`` skipped); ``--checks`` runs a
subset (the suite's dry run: ``ops,control_plane``).
Exit status: 0 every check passed, 1 some check failed or was skipped, 2 no CUDA device,
3 the self-deadline watchdog ended the run.

Expected op differences are ``odin_ns.cuda.cases.TOLERANCES`` (the GPU's IEEE square root
in ``apply_ready_rows``, atomics order on repeated positions); everything else is bit-exact.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from odin_ns.bench.commands import quiet_flags, schedule_flags
from odin_ns.cuda import gpu_wheels
from odin_ns.cuda.cases import (  # SPLATFACTO_ROWS: re-exported for odin_ns.bench.ops
    DUPLICATES_DEFINED,
    SPLATFACTO_ROWS,
    compare,
    copy_inputs,
    make_inputs,
    run_op,
)

# gsplat vs torch rasterizer: image/alpha absolute; gradients relative to the group's max |g|.
# (A Gaussian whose alpha sits at gsplat's 1/255 cut can flip between backends: ~4e-3.)
RASTER_TOL = {"image_abs": 5e-3, "alpha_abs": 5e-3, "grad_rel": 2e-2}
# Seconds the checks after the ops check plan for (the ops check leaves them this much).
CHECKS = ("ops", "raster", "two_ranks_one_gpu", "single_process", "control_plane", "nccl_link")
CUDA_ONLY = ("raster", "nccl_link")  # the CPU dry run skips them (gsplat, NCCL)
GPU_PLAN_S = {
    "raster": 30.0,
    "two_ranks_one_gpu": 150.0,
    "single_process": 80.0,
    "control_plane": 60.0,
    "nccl_link": 10.0,
}
CUDA_LAST = ("control_plane", "nccl_link")  # the checks after single_process (CUDA only)
EXIT_NO_CUDA, EXIT_WATCHDOG = 2, 3
__all__ = ["SPLATFACTO_ROWS", "check_case", "main"]


# ------------------------------------------------------------------------- check 1: ops
def timed(fn: Callable[[], Any], repeats: int, sync: bool) -> float:
    """Median wall seconds of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check_case(
    op: str,
    n: int,
    gen: torch.Generator,
    duplicates: bool = False,
    fraction: float = 0.2,
    repeats: int = 0,
    device: str = "cuda",
) -> dict[str, Any]:
    """The op on ``device`` against its torch reference on CPU, on one random case; with
    ``repeats`` also timings (CPU op, op on ``device``, reference on ``device``).

    ``device="cpu"`` compares the CPU kernels with the references (harness dry run).
    """
    from odin_ns.cuda import ops, reference

    sync = device != "cpu"
    fn, ref = ops.implementation(op, device), getattr(reference, op)
    inputs = make_inputs(op, n, gen, fraction=fraction, duplicates=duplicates)
    expected = run_op(ref, op, copy_inputs(inputs, "cpu"))
    actual = run_op(fn, op, copy_inputs(inputs, device))
    if sync:
        torch.cuda.synchronize()
    result = {"op": op, "n": n, "duplicates": duplicates, **compare(op, expected, actual)}
    if repeats > 0:
        cpu_in, dev_in, ref_in = (copy_inputs(inputs, d) for d in ("cpu", device, device))
        cpu_fn = ops.implementation(op, "cpu")
        result["cpu_s"] = timed(lambda: run_op(cpu_fn, op, cpu_in), repeats, sync=False)
        result["cuda_s"] = timed(lambda: run_op(fn, op, dev_in), repeats, sync=sync)
        result["cuda_reference_s"] = timed(lambda: run_op(ref, op, ref_in), repeats, sync=sync)
    return result


# ------------------------------------------------------------------------- the run
def process_age_s() -> float:
    """Seconds since this process started (the self-deadline counts interpreter start-up and
    ``import torch`` too); 0.0 where /proc is unreadable."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, since boot
        return min(max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0), 120.0)
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Run:
    """Shared state of one gpu_check run: arguments, report, deadline, work folder."""

    args: argparse.Namespace
    report: dict[str, Any]
    start: float = field(default_factory=lambda: time.perf_counter() - process_age_s())
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="odin-gpu-check-")))
    children: set[int] = field(default_factory=set)  # process groups we started
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cuda(self) -> bool:
        return self.args.device == "cuda"

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds until the checks must be done (the budget less a margin to write up)."""
        return self.args.budget_s - 15.0 - self.elapsed()

    def write(self) -> None:
        with self.lock:
            self.report["elapsed_s"] = round(self.elapsed(), 2)
            text = json.dumps(self.report, indent=2, default=str)
        self.args.out.write_text(text)


def run_subprocess(
    run: Run, cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` in its own process group; rc, wall seconds and the output's tail.

    On timeout the whole group (torchrun and its workers) is ended.
    """
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE", **(env or {}))
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    run.children.add(proc.pid)
    try:
        output, _ = proc.communicate(timeout=max(1.0, timeout_s))
        timed_out = False
    except subprocess.TimeoutExpired:
        _end_group(proc.pid)
        output, _ = proc.communicate()
        timed_out = True
    finally:
        run.children.discard(proc.pid)
    result = {
        "cmd": " ".join(cmd),
        "rc": proc.returncode,
        "wall_s": round(time.perf_counter() - start, 2),
        "timed_out": timed_out,
    }
    if proc.returncode != 0 or timed_out:
        result["output_tail"] = output[-3000:]
    result["_output"] = output
    return result


def _end_group(pgid: int, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to one process group this script started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def check_ops(run: Run) -> dict[str, Any]:
    from odin_ns.cuda import build, ops, reference

    out: dict[str, Any] = {"ops": list(ops.OPS), "cases": []}
    built = build.load_variant(run.args.device)
    out["build"] = {
        "library": built.name,
        "seconds": round(built.seconds, 2),
        "compiled": built.compiled,
        "cuda_arch_list": build.cuda_arch_list(),
    }
    # ops.implementation falls back to the reference per op: say which ops really compiled.
    out["compiled"] = {
        op: ops.implementation(op, run.args.device) is not getattr(reference, op) for op in ops.OPS
    }
    gen = torch.Generator().manual_seed(run.report["seed"])
    sizes = [int(s) for s in run.args.sizes.split(",") if s]
    # Edge cases first (small, fast), then the timed sizes. An op without an input case in
    # odin_ns.cuda.cases fails its cases (recorded), the others still run.
    cases = [(op, 1000, True, 0.5, 0) for op in ops.OPS if op in DUPLICATES_DEFINED]
    cases += [(op, 0, False, 0.2, 0) for op in ops.OPS]
    cases += [(op, 1000, False, 0.0, 0) for op in ops.OPS]
    cases += [(op, n, False, 0.2, run.args.repeats) for n in sizes for op in ops.OPS]
    # The ops check may use what the GPU checks after it do not need.
    plan = sum(GPU_PLAN_S.values()) if run.cuda else 0.0
    for op, n, dup, fraction, repeats in cases:
        if run.left() - plan < 5.0:
            out.setdefault("skipped", []).append(f"{op} n={n} (time budget)")
            continue
        tic = time.perf_counter()
        try:
            result = check_case(op, n, gen, dup, fraction, repeats, device=run.args.device)
        except Exception as error:  # noqa: BLE001 - record and go on
            result = {"op": op, "n": n, "duplicates": dup, "match": False, "error": repr(error)}
            traceback.print_exc()
        result.update(fraction=fraction, seconds=round(time.perf_counter() - tic, 3))
        out["cases"].append(result)
        _print_case(result)
    out["ok"] = (
        bool(out["cases"])
        and all(r["match"] for r in out["cases"])
        and all(out["compiled"].values())
        and "skipped" not in out
    )
    return out


def _print_case(result: dict[str, Any]) -> None:
    times = ""
    if "cuda_s" in result:
        times = (
            f" cpu {result['cpu_s'] * 1e3:9.3f} ms  dev {result['cuda_s'] * 1e3:8.3f} ms"
            f"  dev-ref {result['cuda_reference_s'] * 1e3:8.3f} ms"
        )
    state = "exact" if result.get("exact") else ("close" if result["match"] else "MISMATCH")
    label = f"{result['op']} n={result['n']}" + (" dup" if result["duplicates"] else "")
    label += f" frac={result['fraction']}" if result.get("fraction", 0.2) != 0.2 else ""
    print(f"  {label:<40} {state:<9}{times}", flush=True)


# ------------------------------------------------------------------------- gsplat build
class GsplatBuild:
    """gsplat's JIT CUDA build in a background process (it takes minutes when fresh)."""

    CODE = "from gsplat.cuda._backend import _C; assert _C is not None, 'gsplat: no CUDA build'"

    def __init__(self, run: Run):
        self.run, self.result, self.thread = run, None, None
        # TORCH_CUDA_ARCH_LIST is left as it is: every later load (this process, ns-train)
        # must see the same flags, or ninja rebuilds everything.
        self.env = {"MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 4))}
        if run.cuda:
            self.thread = threading.Thread(target=self._build, daemon=True)
            self.thread.start()

    def _build(self) -> None:
        timeout = self.run.args.budget_s - self.run.elapsed()
        self.result = run_subprocess(self.run, [sys.executable, "-c", self.CODE], timeout, self.env)
        self.result.pop("_output")

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The build's record; ``ok`` False if it failed or is still running."""
        if self.thread is None:
            return {"ok": False, "error": "no CUDA: gsplat not built"}
        self.thread.join(max(0.0, timeout_s))
        if self.result is None:
            return {"ok": False, "error": f"still building after {self.run.elapsed():.0f} s"}
        return {"ok": self.result["rc"] == 0, **self.result}


# ------------------------------------------------------------------------- check 2: raster
def small_scene(n: int, width: int, height: int, seed: int, device: str) -> dict[str, Tensor]:
    """Random raw Gaussians (log scales, logit opacities, SH degree 3) filling one view."""
    g = torch.Generator().manual_seed(seed)
    f = 0.8 * width
    z = 2.0 + 6.0 * torch.rand(n, generator=g)
    u = (torch.rand(n, generator=g) * 1.1 - 0.05) * width
    v = (torch.rand(n, generator=g) * 1.1 - 0.05) * height
    scene = {
        "means": torch.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], dim=-1),
        "quats": torch.randn(n, 4, generator=g),
        "scales": -4.0 + 2.0 * torch.rand(n, 3, generator=g),
        "opacities": torch.logit(0.05 + 0.9 * torch.rand(n, generator=g)),
        "colors": 0.3 * torch.randn(n, 16, 3, generator=g),
        "viewmats": torch.eye(4)[None],
        "Ks": torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])[None],
        "weights": torch.randn(1, height, width, 3, generator=g),
    }
    return {k: t.to(device) for k, t in scene.items()}


def render_with_grads(scene: dict[str, Tensor], width: int, height: int, backend: str) -> dict:
    """Image, alpha and the gradients of a fixed random linear loss on one backend."""
    from odin_ns.render import rasterize

    params = {
        k: scene[k].clone().requires_grad_(True)
        for k in ("means", "quats", "scales", "opacities", "colors")
    }
    colors, alphas, _ = rasterize(
        params["means"],
        params["quats"],
        torch.exp(params["scales"]),
        torch.sigmoid(params["opacities"]),
        params["colors"],
        scene["viewmats"],
        scene["Ks"],
        width,
        height,
        sh_degree=3,
        backend=backend,
    )
    ((colors * scene["weights"]).sum() + alphas.sum()).backward()
    out = {"image": colors.detach(), "alpha": alphas.detach()}
    out.update({f"grad_{k}": p.grad.detach() for k, p in params.items()})
    return out


def check_raster(run: Run, gsplat: GsplatBuild) -> dict[str, Any]:
    width, height, n = 128, 96, 2000
    out: dict[str, Any] = {"scene": {"n": n, "width": width, "height": height}}
    out["tolerances"] = RASTER_TOL
    built = gsplat.wait(run.left() - GPU_PLAN_S["raster"] - GPU_PLAN_S["two_ranks_one_gpu"])
    out["gsplat_build"] = built
    if not built["ok"]:
        out.update(ok=False, error=f"gsplat build: {built.get('error') or built.get('rc')}")
        return out
    scene = small_scene(n, width, height, run.report["seed"], "cuda")
    runs = {}
    for backend in ("gsplat", "torch"):
        tic = time.perf_counter()
        runs[backend] = render_with_grads(scene, width, height, backend)
        torch.cuda.synchronize()
        out[f"{backend}_first_call_s"] = round(time.perf_counter() - tic, 3)  # with loading
    figures: dict[str, Any] = {}
    ok = True
    for key, ref in runs["torch"].items():
        diff = (runs["gsplat"][key].double() - ref.double()).abs().max().item()
        scale = ref.abs().max().item()
        figures[key] = {"max_abs_diff": diff, "max_abs_torch": scale}
        if key.startswith("grad_"):
            figures[key]["rel_diff"] = diff / max(scale, 1e-12)
            ok &= diff <= RASTER_TOL["grad_rel"] * scale + 1e-8
        else:
            ok &= diff <= RASTER_TOL[f"{key}_abs"]
    out.update(figures=figures, ok=bool(ok))
    return out


# ------------------------------------------------------------------------- training runs
TRAINING = [*quiet_flags(save_every=100000), *schedule_flags(warmup=50, refine_every=25)]


def street_scene(run: Run) -> Path:
    """The built-in street scene (made once per run)."""
    from odin_ns.data.synthetic import make_scene

    data = run.work / "street"
    if not (data / "transforms.json").exists():
        make_scene(data, layout="street")
    return data


def _train_args(run: Run, data: Path, out: Path, name: str, steps: int, raster: str) -> list:
    device = "cuda" if run.cuda else "cpu"
    return [
        "odin-splatfacto",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--experiment-name",
        "gpu-check",
        "--timestamp",
        name,
        "--max-num-iterations",
        str(steps),
        "--machine.device-type",
        device,
        "--pipeline.model.rasterizer",
        raster,
        *TRAINING,
    ]


def final_params(run_dir: Path) -> dict[str, Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return {k.split(".")[-1]: v for k, v in state.items() if "gauss_params" in k}


def tensorboard_figures(run_dir: Path) -> dict[str, Any]:
    """Final train loss and steps/s between the first and last logged loss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    events = acc.Scalars("Train Loss")
    first, last = events[0], events[-1]
    rate = (last.step - first.step) / max(last.wall_time - first.wall_time, 1e-9)
    return {"final_loss": last.value, "final_loss_step": last.step, "steps_per_s": rate}


def _rasterizer(run: Run, gsplat: GsplatBuild, wait_s: float) -> tuple[str, dict]:
    if not run.cuda:
        return "torch", {"ok": False, "error": "CPU dry run"}
    built = gsplat.wait(wait_s)
    return ("gsplat" if built["ok"] else "torch"), built


def check_two_ranks_one_gpu(run: Run, gsplat: GsplatBuild) -> dict[str, Any]:
    steps = run.args.dist_steps
    raster, built = _rasterizer(run, gsplat, 0.0)
    out: dict[str, Any] = {"steps": steps, "rasterizer": raster, "runs": {}}
    if raster != "gsplat" and run.cuda:
        out["rasterizer_note"] = f"gsplat not ready ({built.get('error', built.get('rc'))})"
    data, dest = street_scene(run), run.work / "two_ranks"
    params = {}
    for i, mode in enumerate(("quality-first", "barrier")):
        later = GPU_PLAN_S["single_process"] if i == 0 else 0.0
        per_run = (run.left() - later - cuda_last_s(run)) / (2 - i)
        cmd = [
            _bin("odin-ns-train"),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(29500 + (os.getpid() + 17 * i) % 2000),
            *_train_args(run, data, dest, mode, steps, raster),
            "--pipeline.sync.mode",
            mode,
        ]
        result = run_subprocess(run, cmd, per_run)
        output = result.pop("_output")
        result["shares_gpu"] = "share 1 GPU(s) round-robin" in output
        out["runs"][mode] = result
        if result["rc"] != 0:
            continue
        run_dir = dest / "gpu-check" / "odin-splatfacto" / mode
        params[mode] = final_params(run_dir)
        summary = json.loads((run_dir / "odin_run.json").read_text())
        ranks = summary["ranks"]
        result["replicas_equal"] = len({r["replica_hash"] for r in ranks}) == 1
        result["wait_s_per_rank"] = [sum(s["wait_s"] for s in r["steps"]) for r in ranks]
        result["compute_s_per_rank"] = [sum(s["compute_s"] for s in r["steps"]) for r in ranks]
        result["num_gaussians"] = next(iter(params[mode].values())).shape[0]
    if len(params) < 2:
        out.update(ok=False, error="a run failed: see runs.*.output_tail")
        return out
    diffs: dict[str, Any] = {}
    for name, want in params["barrier"].items():
        got = params["quality-first"].get(name)
        if got is None or got.shape != want.shape:
            diffs[name] = f"shape {None if got is None else list(got.shape)} != {list(want.shape)}"
        else:
            diffs[name] = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
    out["max_abs_diff"] = diffs
    out["ok"] = all(d == 0.0 for d in diffs.values()) and all(
        r.get("replicas_equal") for r in out["runs"].values()
    )
    return out


def cuda_last_s(run: Run) -> float:
    """Seconds the checks after single_process plan for (they run on CUDA only)."""
    return sum(GPU_PLAN_S[name] for name in CUDA_LAST) if run.cuda else 0.0


def check_single_process(run: Run, gsplat: GsplatBuild) -> dict[str, Any]:
    steps = run.args.train_steps
    raster, built = _rasterizer(run, gsplat, run.left() - GPU_PLAN_S["single_process"])
    out: dict[str, Any] = {"steps": steps, "rasterizer": raster}
    if run.cuda and raster != "gsplat":
        out.update(ok=False, error=f"gsplat not built: {built.get('error', built.get('rc'))}")
        return out
    data, dest = street_scene(run), run.work / "single"
    cmd = [_bin("ns-train"), *_train_args(run, data, dest, "single", steps, raster)]
    train = run_subprocess(run, cmd, run.left() - 20.0 - cuda_last_s(run))
    train.pop("_output")
    out["train"] = train
    if train["rc"] != 0:
        out.update(ok=False, error="ns-train failed: see train.output_tail")
        return out
    run_dir = dest / "gpu-check" / "odin-splatfacto" / "single"
    try:
        out.update(tensorboard_figures(run_dir))
    except Exception as error:  # noqa: BLE001 - the eval still runs
        out["tensorboard_error"] = repr(error)
    eval_json = run.work / "single_eval.json"
    cmd = [_bin("ns-eval"), "--load-config", str(run_dir / "config.yml")]
    evaluation = run_subprocess(
        run, [*cmd, "--output-path", str(eval_json)], run.left() - cuda_last_s(run)
    )
    evaluation.pop("_output")
    out["eval"] = evaluation
    if evaluation["rc"] == 0:
        results = json.loads(eval_json.read_text())["results"]
        out["psnr"] = results.get("psnr")
        out["ssim"] = results.get("ssim")
    out["ok"] = evaluation["rc"] == 0 and out.get("psnr") is not None
    return out


# ------------------------------------------------------------------------- main
def check_control_plane(run: Run) -> dict[str, Any]:
    """The engine's steady-state step on the GPU (``bench.control_plane --device cuda``; the
    CPU dry run: 20k rows on the CPU)."""
    from odin_ns.bench import control_plane

    out = run.work / "control_plane.json"
    rows = "1000000" if run.cuda else "20000"
    argv = ["--rows", rows, "--ranks", "8", "--layouts", "replicated", "--steps", "30"]
    threads = str(torch.get_num_threads())
    argv += ["--warmup", "3", "--profile-steps", "3", "--device", run.args.device]
    argv += ["--threads", threads, "--out", str(out)]
    result = control_plane.main(argv)
    key = "r8_replicated"
    cuda_syncs = {
        f"cuda_syncs_per_step_{stat}": result[f"cuda_syncs_per_step_{key}_{stat}"]
        for stat in ("max", "median")
        if run.cuda
    }
    figures = {
        f"{name}_ms_per_step": result[f"{name}_ms_per_step_{key}"]
        for name in ("engine", "data", "control", "host", "cpu")
    }
    return {
        "ok": True,
        **figures,
        **cuda_syncs,
        "device_reads_per_step_max": result["syncs_per_step_max"],  # bench.device_reads
        "share_per_view": result["share_per_view"],
        "json": str(out),
    }


def check_nccl_link(run: Run) -> dict[str, Any]:
    """``NcclLink`` on one rank of a one-rank NCCL group: set-up, and an all-reduce whose
    completion is polled (``Work.is_completed()``) and whose sum equals its input."""
    import torch.distributed as dist

    from odin_ns.runtime.nccl import NcclLink

    device = torch.device("cuda:0")
    store = dist.FileStore(str(run.work / "nccl_store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        link = NcclLink(1, device)
        link.open([])
        buf = torch.arange(17_000, dtype=torch.float32, device=device).reshape(1000, 17)
        expected = buf.clone()
        tic = time.perf_counter()
        work = link.all_reduce(buf)
        polls = 0
        while not work.is_completed():
            polls += 1
        work.wait()
        seconds = time.perf_counter() - tic
        same = bool(torch.equal(buf, expected))
    finally:
        dist.destroy_process_group()
    return {
        "ok": same,
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
        "all_reduce_s": round(seconds, 6),
        "polls": polls,
    }


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        import gsplat

        info["gsplat"] = gsplat.__version__
    except Exception as error:  # noqa: BLE001
        info["gsplat"] = f"import failed: {error!r}"
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_capability"] = list(torch.cuda.get_device_capability(0))
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def run_check(run: Run, name: str, fn: Callable[[], dict], plan_s: float) -> None:
    """Run one check fail-soft, record it under report["checks"][name], write the JSON."""
    checks = run.report["checks"]
    if run.left() < plan_s:
        checks[name] = {"ok": False, "skipped": f"time budget: {run.left():.0f} s left"}
        print(f"{name}: skipped ({checks[name]['skipped']})", flush=True)
        run.write()
        return
    print(f"{name}: running ({run.elapsed():.0f} s elapsed)", flush=True)
    tic = time.perf_counter()
    try:
        result = fn()
    except Exception as error:  # noqa: BLE001 - record it, the next check still runs
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    result["seconds"] = round(time.perf_counter() - tic, 2)
    checks[name] = result
    run.write()
    print(f"{name}: {'ok' if result.get('ok') else 'FAILED'} in {result['seconds']} s", flush=True)


def start_watchdog(run: Run) -> threading.Timer:
    """Write the report and end the run (and its children) at the self-deadline; the caller
    cancels the returned timer when the run ends first."""

    def fire() -> None:
        run.report["watchdog"] = f"self-deadline {run.args.budget_s} s reached"
        for pgid in list(run.children):
            _end_group(pgid, grace_s=1.0)
        try:
            for _ in range(3):  # the main thread may be changing the report meanwhile
                try:
                    run.write()
                    break
                except RuntimeError:
                    time.sleep(0.05)
        finally:
            print(f"gpu_check: {run.report['watchdog']}; report in {run.args.out}", flush=True)
            os._exit(EXIT_WATCHDOG)

    timer = threading.Timer(max(1.0, run.args.budget_s - 5.0 - run.elapsed()), fire)
    timer.daemon = True
    timer.start()
    return timer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m odin_ns.cuda.gpu_check",
        description="Check the CUDA paths on one GPU: ops vs references, gsplat vs torch "
        "rasterizer, 2 ranks on cuda:0, single-process training; writes JSON.",
    )
    parser.add_argument("--out", type=Path, help="JSON report path (needed unless --prepare)")
    parser.add_argument(
        "--prepare", type=Path, metavar="DIR",
        help="only download, here, the wheels the bare GPU machine lacks into DIR (gpu_wheels)",
    )  # fmt: skip
    parser.add_argument(
        "--wheels", type=Path, metavar="DIR", help="install DIR's wheels (--prepare) first"
    )
    parser.add_argument("--sizes", default="1000,100000,1000000", help="op row counts (timed)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per op case")
    parser.add_argument("--budget-s", type=float, default=420.0, help="self-deadline, seconds")
    parser.add_argument("--train-steps", type=int, default=200, help="single-process steps")
    parser.add_argument("--dist-steps", type=int, default=150, help="2-rank steps per mode")
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: dry run of the harness"
    )
    parser.add_argument(
        "--checks", default=",".join(CHECKS), help=f"comma list of checks to run, of {CHECKS}"
    )
    args = parser.parse_args(argv)
    args.checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(args.checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {unknown}; checks are {', '.join(CHECKS)}")
    if args.prepare is None and args.out is None:
        parser.error("--out is required (unless --prepare)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare is not None:
        manifest = gpu_wheels.prepare(args.prepare)
        print(f"gpu_check: {len(manifest['wheels'])} wheel(s), {manifest['bytes'] / 2**20:.1f} MiB "
              f"in {args.prepare}: {', '.join(manifest['wheels'])}")  # fmt: skip
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); nothing checked")
        return EXIT_NO_CUDA
    seed = args.seed if args.seed is not None else int(torch.randint(0, 2**31 - 1, (1,)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run = Run(args, {"seed": seed, "budget_s": args.budget_s, "checks": {}})
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    watchdog = start_watchdog(run)
    if args.wheels is not None:  # before anything imports gsplat (the build, environment)
        run.report["wheels"] = gpu_wheels.install(args.wheels, run.work / "site")
    gsplat = GsplatBuild(run)  # overlaps check 1
    run.report["environment"] = environment(args.device)
    run.report["work_dir"] = str(run.work)
    print(f"gpu_check: seed={seed} {run.report['environment']}", flush=True)
    run.write()
    planned = [
        ("ops", lambda: check_ops(run), 20.0),
        ("raster", lambda: check_raster(run, gsplat), 15.0),
        ("two_ranks_one_gpu", lambda: check_two_ranks_one_gpu(run, gsplat), 60.0),
        ("single_process", lambda: check_single_process(run, gsplat), 40.0),
        ("control_plane", lambda: check_control_plane(run), GPU_PLAN_S["control_plane"]),
        ("nccl_link", lambda: check_nccl_link(run), GPU_PLAN_S["nccl_link"]),
    ]
    for name, check, plan_s in planned:
        if name in args.checks and (run.cuda or name not in CUDA_ONLY):
            run_check(run, name, check, plan_s)
    if run.cuda:
        run.report["gsplat_build"] = gsplat.wait(0.0)
    run.report["all_ok"] = all(c.get("ok") for c in run.report["checks"].values())
    run.write()
    watchdog.cancel()
    print(f"gpu_check: all_ok={run.report['all_ok']} in {run.elapsed():.0f} s -> {args.out}")
    return 0 if run.report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
