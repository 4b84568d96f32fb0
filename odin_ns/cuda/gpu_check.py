"""GPU check: one blind run on a lent GPU machine that checks the CUDA paths, in < 8 minutes.

``python -m odin_ns.cuda.gpu_check --out gpu_check.json`` writes the JSON and a PNG beside it.
On a bare GPU machine (Python and torch only, no network): ``--prepare gpu_wheels`` here
fetches the 22 wheels of what training and ``ns-eval`` import that the machine lacks
(nerfstudio, gsplat, tyro, viser, ...; 22.6 MiB), and ``--wheels gpu_wheels`` there installs
them and this checkout into one folder first (``odin_ns.cuda.gpu_wheels``).

Checks, in the order they run (a check that does not fit in what is left of ``--budget-s``
is skipped with a note; each one records ``ok``, its figures, its error text and timing,
whether a build was running beside it, and the run goes on):

1. ``ops``: every op in ``odin_ns.cuda.ops.OPS`` on CUDA tensors (through the dispatcher,
   which must pick the compiled kernel) against its torch reference
   (``odin_ns.cuda.reference``, on CPU), on small random inputs from the op's input case
   (``odin_ns.cuda.cases.make_inputs``); timings of the CPU op, the CUDA op and the
   reference on the GPU.
2. ``copy_bandwidth``: host<->device copies, pinned and pageable, 16 and 256 MiB, and a
   device copy (GB/s): the gloo transport's staging cost.
3. ``nccl_link``: the device transport's NCCL backend (``odin_ns.runtime.nccl.NcclLink``) on
   one rank (NCCL holds one rank per device, so its two-rank channels cannot run here): the
   set-up and ddp's all-reduce, completion polled; NCCL's version.
4. ``two_ranks_one_gpu``: ``odin-ns-train --nproc-per-node 2`` with both ranks on cuda:0
   (default group and runtime over gloo), torch rasterizer: quality-first, barrier, and
   barrier again (the A/A control), each under torch's deterministic algorithms
   (``--deterministic``: CUDA's atomic scatter-adds otherwise sum in a different order every
   run, and on the H200 two runs ended with 48,617 and 48,459 Gaussians); max abs diff of
   the final parameters per group against barrier's, for quality-first (expected 0.0) and
   for the A/A control (which says whether a bitwise comparison can decide anything on this
   machine), and the wall time of each run.
5. ``raster``: the ``gsplat`` backend against the ``torch`` backend of
   ``odin_ns.render.rasterize`` on one small scene: image / alpha max abs diff and the
   gradients of means, scales, quats, opacities and colors (tolerances in ``RASTER_TOL``).
6. ``gsplat_speed``: gsplat forward and forward + backward at 0.1M, 1M and 3M Gaussians on
   one 1280x720 view (median of 5, CUDA events).
7. ``control_plane``: ``odin_ns.bench.control_plane`` on CUDA, after the builds: rank 0's
   engine in the replicated and the sharded layout at 1M Gaussians, R = 8 (peers injected),
   10 warm-up and 30 measured steps: host and wall ms per step, the stream synchronizations
   per step (torch's sync debug mode) and the device operations a step dispatches; and the
   same rank with its data plane on the meta device, on this machine's CPU, less its
   data-plane operations (``meta_host_ms``, back to back and paced: the target's figure on
   a GPU host's CPU).
8. ``single_process``: ``ns-train odin-splatfacto`` on the gsplat backend, steps/s and
   final loss from its tensorboard events, then ``ns-eval`` PSNR.
9. ``step_syncs``: ``odin_ns.bench.step_syncs``: ``ns-train odin-splatfacto`` in a process
   of its own on the gsplat backend, 10 warm-up and 30 counted steps under torch's sync
   debug mode: the stream synchronizations of a whole training step (render, loss,
   backward, optimizer, the training callbacks around them) and the lines that make them.
10. ``control_plane_late``: check 7 in throughput-first with the peers one step behind
   (``--late-peers``: it decides at every step, as where views overlap densely), with
   whatever time is left (no check before it keeps time for it).
11. ``control_plane_r64``: check 7 at R = 64, the sharded layout (the R = 64 target of the
   device data plane issue), with whatever time is left after that.

gsplat's CUDA code is JIT-compiled on first use (minutes on a fresh machine), so its build
(and that of the installed odin-ns copy's extension) starts at once in a background process
at the lowest CPU priority and overlaps checks 1-4 (gsplat's checks wait for it); every
build and load sees one ``TORCH_CUDA_ARCH_LIST`` (the device's). Without a CUDA device the
script prints one line and exits 2. ``--device cpu`` is a dry run of the harness (CPU
kernels against the references, training on CPU with the torch rasterizer, the control plane
at 20k rows; checks 2, 3, 5 and 6 skipped); ``--checks`` runs a subset (the suite's dry run:
``ops,control_plane``).
Exit status: 0 every check passed, 1 some check failed or was skipped, 2 no CUDA device,
3 the self-deadline watchdog ended the run.

Expected op differences are ``odin_ns.cuda.cases.TOLERANCES`` (the GPU's IEEE square root
in ``apply_ready_rows``, atomics order on repeated positions); everything else is bit-exact.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
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

from odin_ns.bench.commands import method_command, quiet_flags, schedule_flags
from odin_ns.bench.report import save_figure
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
# The checks in the order they run: those that need no gsplat first, while gsplat's JIT
# build runs beside them at the lowest CPU priority (on the H200 machine it took 264 s beside
# the checks, over 195 s alone), then gsplat's once it is built; the control plane's host
# times after every build has ended (beside the build, 2026-12-04, its steps read 8-156 ms),
# then the single-process training run and its synchronizations, then the control plane's
# two variants with whatever time is left.
CHECKS = (
    "ops", "copy_bandwidth", "nccl_link", "two_ranks_one_gpu", "raster", "gsplat_speed",
    "control_plane", "single_process", "step_syncs", "control_plane_late", "control_plane_r64",
)  # fmt: skip
CUDA_ONLY = ("copy_bandwidth", "nccl_link", "raster", "gsplat_speed")  # not in the dry run
PLANE_LAYOUTS = ("replicated", "sharded")  # the control plane check's, R = 8 each
# The control-plane checks: name -> (its bars' label in the figure, check_control_plane's
# arguments, the fewest seconds worth starting it with: the two that run with what is left
# need what control_plane plans for, or they would end in the watchdog, the figure unwritten)
PLANE_CHECKS = {
    "control_plane": ("qf", {}, 40.0),
    "control_plane_late": ("tf, late peers", {"late": True}, 80.0),
    "control_plane_r64": ("qf, R=64", {"ranks": 64, "layouts": ("sharded",)}, 80.0),
}
# Seconds each check after ``ops`` plans for on a GPU (``ops`` leaves them this much).
GPU_PLAN_S = {  # from the H200 run of 2026-12-04 (bench/gpu_check_h200), rounded up
    "copy_bandwidth": 10.0,
    "nccl_link": 10.0,
    "two_ranks_one_gpu": 150.0,
    "raster": 20.0,
    "gsplat_speed": 40.0,
    "control_plane": 90.0,  # (one layout took 31 s then; two now, and a second meta twin each)
    "single_process": 70.0,
    "step_syncs": 40.0,  # (not run on a GPU yet: set-up and 40 steps of single_process's)
    # (these two run with what is left: the checks before them do not keep time for them)
    "control_plane_late": 0.0,
    "control_plane_r64": 0.0,
}
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


def plan_after(run: Run, name: str) -> float:
    """Seconds the selected checks after ``name`` plan for (``GPU_PLAN_S``; 0 in the dry run,
    where every check simply runs)."""
    if not run.cuda:
        return 0.0
    later = CHECKS[CHECKS.index(name) + 1 :]
    return sum(GPU_PLAN_S[c] for c in later if c in run.args.checks)


def run_subprocess(
    run: Run,
    cmd: list[str],
    timeout_s: float,
    env: dict[str, str] | None = None,
    background: bool = False,
) -> dict[str, Any]:
    """Run ``cmd`` in its own process group; rc, wall seconds and the output's tail.
    ``background``: at the lowest CPU priority (``nice -n 19``).

    On timeout the whole group (torchrun and its workers) is ended.
    """
    if background and shutil.which("nice"):
        cmd = ["nice", "-n", "19", *cmd]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE", **(env or {}))
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        cwd=run.work,  # not the checkout: children import the installed odin-ns (--wheels)
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


def _bin(run: Run, name: str) -> str:
    """The console script ``name``: from the folder ``--wheels`` installed into, else from
    this interpreter's environment."""
    installed = Path(run.report.get("wheels", {}).get("bin", "")) / name
    return str(installed) if installed.is_file() else str(Path(sys.executable).parent / name)


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
    plan = plan_after(run, "ops")
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


# ------------------------------------------------------------------------- background builds
GSPLAT_BUILD = "from gsplat.cuda._backend import _C; assert _C is not None, 'gsplat: no CUDA build'"
# The odin-ns copy that --wheels installed (what ns-train imports) builds its own extension
# folder (``build.ext_dir`` is per checkout): built here, beside gsplat, not in rank 0.
ODIN_BUILD = "from odin_ns.cuda import build; build.load_variant('cuda')"


class BackgroundBuild:
    """One JIT CUDA build (``code`` run in a child process) that overlaps the first checks:
    gsplat's takes minutes on a fresh machine."""

    def __init__(self, run: Run, name: str, code: str, jobs: int):
        self.run, self.name, self.code, self.result, self.thread = run, name, code, None, None
        self.env = {"MAX_JOBS": str(jobs)}
        if run.cuda:
            self.thread = threading.Thread(target=self._build, daemon=True)
            self.thread.start()

    def _build(self) -> None:
        timeout = self.run.args.budget_s - self.run.elapsed()
        cmd = [sys.executable, "-c", self.code]
        self.result = run_subprocess(self.run, cmd, timeout, self.env, background=True)
        self.result.pop("_output")

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The build's record; ``ok`` False if it failed or is still running."""
        if self.thread is None:
            return {"ok": False, "error": f"no CUDA: {self.name} not built"}
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


def trainable(scene: dict[str, Tensor]) -> dict[str, Tensor]:
    """Leaf copies of the scene's raw Gaussian parameters that take gradients."""
    return {
        k: scene[k].clone().requires_grad_(True)
        for k in ("means", "quats", "scales", "opacities", "colors")
    }


def render_loss(
    params: dict[str, Tensor], scene: dict[str, Tensor], width: int, height: int, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(a fixed random linear loss, image [1, H, W, 3], alpha [1, H, W, 1]) of ``params``
    rendered on one backend (SH degree 3)."""
    from odin_ns.render import rasterize

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
    return (colors * scene["weights"]).sum() + alphas.sum(), colors, alphas


def render_with_grads(scene: dict[str, Tensor], width: int, height: int, backend: str) -> dict:
    """Image, alpha and the gradients of a fixed random linear loss on one backend."""
    params = trainable(scene)
    loss, colors, alphas = render_loss(params, scene, width, height, backend)
    loss.backward()
    out = {"image": colors.detach(), "alpha": alphas.detach()}
    out.update({f"grad_{k}": p.grad.detach() for k, p in params.items()})
    return out


def check_raster(run: Run, gsplat: BackgroundBuild) -> dict[str, Any]:
    width, height, n = 128, 96, 2000
    out: dict[str, Any] = {"scene": {"n": n, "width": width, "height": height}}
    out["tolerances"] = RASTER_TOL
    built = gsplat.wait(run.left() - GPU_PLAN_S["raster"] - plan_after(run, "raster"))
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


def cuda_median_s(fn: Callable[[], Any], repeats: int) -> tuple[float, float, float]:
    """Median, min and max seconds of ``fn`` on the current stream (CUDA events; one warm-up
    call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def check_gsplat_speed(run: Run, gsplat: BackgroundBuild) -> dict[str, Any]:
    """gsplat forward + backward (``odin_ns.render.rasterize``, SH degree 3, one 1280x720
    view) at 0.1M, 1M and 3M Gaussians: median of 5 after a warm-up, CUDA events."""
    width, height = 1280, 720
    built = gsplat.wait(run.left() - GPU_PLAN_S["gsplat_speed"] - plan_after(run, "gsplat_speed"))
    if not built["ok"]:
        return {"ok": False, "error": f"gsplat build: {built.get('error') or built.get('rc')}"}
    out: dict[str, Any] = {"width": width, "height": height, "sh_degree": 3, "sizes": []}
    for n in (100_000, 1_000_000, 3_000_000):
        if run.left() - plan_after(run, "gsplat_speed") < GPU_PLAN_S["gsplat_speed"] / 3:
            out.setdefault("skipped", []).append(n)
            continue
        scene = small_scene(n, width, height, run.report["seed"], "cuda")
        params = trainable(scene)

        def forward(p=params, scene=scene) -> Tensor:
            return render_loss(p, scene, width, height, "gsplat")[0]

        def step(forward=forward, p=params) -> None:
            for t in p.values():
                t.grad = None
            forward().backward()

        fwd = cuda_median_s(forward, 5)
        both = cuda_median_s(step, 5)
        out["sizes"].append({
            "n": n,
            "forward_ms": round(fwd[0] * 1e3, 3),
            "forward_backward_ms": round(both[0] * 1e3, 3),
            "forward_backward_ms_min_max": [round(both[1] * 1e3, 3), round(both[2] * 1e3, 3)],
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        })  # fmt: skip
        print(f"  gsplat n={n:>9,}  fwd {fwd[0] * 1e3:8.2f} ms  fwd+bwd {both[0] * 1e3:8.2f} ms")
        del scene, params
        torch.cuda.empty_cache()
    out["ok"] = bool(out["sizes"]) and "skipped" not in out
    return out


def check_copy_bandwidth(run: Run) -> dict[str, Any]:
    """Host<->device copy bandwidth, pinned and pageable, 16 and 256 MiB (GB/s, median of
    5, CUDA events): what the gloo transport's staging through the host costs per byte."""
    out: dict[str, Any] = {"rows": []}
    for mib in (16, 256):
        numel = (mib << 20) // 4
        device = torch.empty(numel, device="cuda")
        for pinned in (True, False):
            host = torch.empty(numel, pin_memory=pinned)
            host.uniform_()
            for direction in ("h2d", "d2h"):
                if direction == "h2d":
                    copy = lambda d=device, h=host: d.copy_(h, non_blocking=True)  # noqa: E731
                else:
                    copy = lambda d=device, h=host: h.copy_(d, non_blocking=True)  # noqa: E731
                median, low, high = cuda_median_s(copy, 5)
                out["rows"].append({
                    "mib": mib, "pinned": pinned, "direction": direction,
                    "gb_per_s": round((mib << 20) / median / 1e9, 2),
                    "gb_per_s_min_max": [round((mib << 20) / high / 1e9, 2),
                                         round((mib << 20) / low / 1e9, 2)],
                })  # fmt: skip
        other = torch.empty_like(device)
        median, _, _ = cuda_median_s(lambda o=other, d=device: o.copy_(d), 5)
        out["rows"].append({
            "mib": mib, "pinned": None, "direction": "d2d",
            "gb_per_s": round(2 * (mib << 20) / median / 1e9, 2),  # bytes read + written
        })  # fmt: skip
    for row in out["rows"]:
        kind = {True: "pinned", False: "pageable", None: "device"}[row["pinned"]]
        print(
            f"  copy {row['direction']} {kind:<8} {row['mib']:>4} MiB {row['gb_per_s']:8.2f} GB/s"
        )
    out["ok"] = True
    return out


# ------------------------------------------------------------------------- training runs
TRAINING = [*quiet_flags(save_every=100000), *schedule_flags(warmup=50, refine_every=25)]


def street_scene(run: Run) -> Path:
    """The built-in street scene (made once per run). nerfstudio reads its point cloud with
    open3d, which cannot travel to a bare GPU machine (hundreds of MB): without open3d the
    scene lists no point cloud and splatfacto starts from random Gaussians (recorded)."""
    from odin_ns.data.synthetic import make_scene

    data = run.work / "street"
    if not (data / "transforms.json").exists():
        make_scene(data, layout="street")
        if importlib.util.find_spec("open3d") is None:
            transforms = json.loads((data / "transforms.json").read_text())
            transforms.pop("ply_file_path", None)
            (data / "transforms.json").write_text(json.dumps(transforms, indent=1))
            run.report["street_init"] = "random Gaussians (no open3d to read sparse_pc.ply)"
        else:
            run.report["street_init"] = "sparse_pc.ply"
    return data


def _train_args(run: Run, data: Path, out: Path, name: str, steps: int, raster: str) -> list:
    device = "cuda" if run.cuda else "cpu"
    flags = ["--machine.device-type", device, "--pipeline.model.rasterizer", raster, *TRAINING]
    return method_command(data, out, experiment="gpu-check", name=name, steps=steps, flags=flags)


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


def _rasterizer(run: Run, gsplat: BackgroundBuild, wait_s: float) -> tuple[str, dict]:
    if not run.cuda:
        return "torch", {"ok": False, "error": "CPU dry run"}
    built = gsplat.wait(wait_s)
    return ("gsplat" if built["ok"] else "torch"), built


NONDETERMINISTIC = "does not have a deterministic implementation"  # torch's warning
# The two-rank runs: name -> sync mode. "barrier-again" is the A/A control: were it to differ
# from "barrier", no bitwise comparison could decide anything on this machine.
TWO_RANK_RUNS = {"quality-first": "quality-first", "barrier": "barrier", "barrier-again": "barrier"}


def check_two_ranks_one_gpu(run: Run) -> dict[str, Any]:
    steps = run.args.dist_steps
    # The torch rasterizer: gsplat's backward adds with atomics that torch's deterministic
    # mode does not reach, so two gsplat runs never compare bitwise.
    raster = "torch"
    out: dict[str, Any] = {"steps": steps, "rasterizer": raster, "runs": {}}
    data, dest = street_scene(run), run.work / "two_ranks"
    params = {}
    for i, (name, mode) in enumerate(TWO_RANK_RUNS.items()):
        per_run = (run.left() - plan_after(run, "two_ranks_one_gpu")) / (len(TWO_RANK_RUNS) - i)
        cmd = [
            _bin(run, "odin-ns-train"),
            *("--nproc-per-node", "2", "--deterministic"),
            *("--master-port", str(29500 + (os.getpid() + 17 * i) % 2000)),
            *_train_args(run, data, dest, name, steps, raster),
            *("--pipeline.sync.mode", mode),
        ]
        # (two ranks on one GPU take gloo: lazy kernel loading, which the launcher turns off
        # for ranks that may use NCCL, costs them nothing here)
        result = run_subprocess(run, cmd, per_run, env={"CUDA_MODULE_LOADING": "LAZY"})
        output = result.pop("_output")
        result["shares_gpu"] = "share 1 GPU(s) round-robin" in output
        result["nondeterministic_ops"] = sorted(
            {line.strip()[:200] for line in output.splitlines() if NONDETERMINISTIC in line}
        )
        out["runs"][name] = result
        if result["rc"] != 0:
            continue
        run_dir = dest / "gpu-check" / "odin-splatfacto" / name
        params[name] = final_params(run_dir)
        summary = json.loads((run_dir / "odin_run.json").read_text())
        ranks = summary["ranks"]
        result["replicas_equal"] = len({r["replica_hash"] for r in ranks}) == 1
        result["wait_s_per_rank"] = [sum(s["wait_s"] for s in r["steps"]) for r in ranks]
        result["compute_s_per_rank"] = [sum(s["compute_s"] for s in r["steps"]) for r in ranks]
        result["num_gaussians"] = next(iter(params[name].values())).shape[0]
    if len(params) < len(TWO_RANK_RUNS):
        out.update(ok=False, error="a run failed: see runs.*.output_tail")
        return out
    out["max_abs_diff"] = param_diffs(params["quality-first"], params["barrier"])
    out["max_abs_diff_a_a"] = param_diffs(params["barrier-again"], params["barrier"])
    exact = all(d == 0.0 for d in out["max_abs_diff"].values())
    control_exact = all(d == 0.0 for d in out["max_abs_diff_a_a"].values())
    replicas = all(r.get("replicas_equal") for r in out["runs"].values())
    out["verdict"] = (
        "a replica differs between the ranks of one run" if not replicas
        else "quality-first = barrier, bitwise" if exact and control_exact
        else "undecided: two barrier runs differ (nondeterministic kernels)" if not control_exact
        else "quality-first differs from barrier while two barrier runs agree"
    )  # fmt: skip
    out["ok"] = replicas and exact and control_exact
    return out


def param_diffs(got: dict[str, Tensor], want: dict[str, Tensor]) -> dict[str, float | str]:
    """Max abs difference per parameter group (a string where the shapes differ)."""
    diffs: dict[str, float | str] = {}
    for name, ref in want.items():
        other = got.get(name)
        if other is None or other.shape != ref.shape:
            shape = None if other is None else list(other.shape)
            diffs[name] = f"shape {shape} != {list(ref.shape)}"
        else:
            diffs[name] = (other.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
    return diffs


def check_single_process(run: Run, gsplat: BackgroundBuild) -> dict[str, Any]:
    steps = run.args.train_steps
    raster, built = _rasterizer(run, gsplat, run.left() - GPU_PLAN_S["single_process"])
    out: dict[str, Any] = {"steps": steps, "rasterizer": raster}
    if run.cuda and raster != "gsplat":
        out.update(ok=False, error=f"gsplat not built: {built.get('error', built.get('rc'))}")
        return out
    data, dest = street_scene(run), run.work / "single"
    cmd = [_bin(run, "ns-train"), *_train_args(run, data, dest, "single", steps, raster)]
    later = plan_after(run, "single_process")  # (what the checks after it plan for)
    train = run_subprocess(run, cmd, run.left() - 20.0 - later)
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
    cmd = [_bin(run, "ns-eval"), "--load-config", str(run_dir / "config.yml")]
    evaluation = run_subprocess(run, [*cmd, "--output-path", str(eval_json)], run.left() - later)
    evaluation.pop("_output")
    out["eval"] = evaluation
    if evaluation["rc"] == 0:
        results = json.loads(eval_json.read_text())["results"]
        out["psnr"] = results.get("psnr")
        out["ssim"] = results.get("ssim")
    out["ok"] = evaluation["rc"] == 0 and out.get("psnr") is not None
    return out


def check_step_syncs(run: Run, gsplat: BackgroundBuild) -> dict[str, Any]:
    """The stream synchronizations of a training step (``bench.step_syncs``, in a process
    of its own that imports the installed copy, as ``ns-train`` would; the CPU dry run: 3
    steps, timed only)."""
    raster, built = _rasterizer(run, gsplat, run.left() - GPU_PLAN_S["step_syncs"])
    if run.cuda and raster != "gsplat":
        return {"ok": False, "error": f"gsplat not built: {built.get('error', built.get('rc'))}"}
    out = run.work / "step_syncs.json"
    steps, warmup = ("30", "10") if run.cuda else ("3", "1")
    cmd = [sys.executable, "-m", "odin_ns.bench.step_syncs", "--data", str(street_scene(run))]
    cmd += ["--device", run.args.device, "--steps", steps, "--warmup", warmup, "--out", str(out)]
    cmd += ["--", "--pipeline.model.rasterizer", raster]
    cmd += schedule_flags(warmup=50, refine_every=25)
    proc = run_subprocess(run, cmd, run.left() - plan_after(run, "step_syncs"))
    proc.pop("_output")
    if proc["rc"] != 0:
        return {"ok": False, "error": "step_syncs failed: see process.output_tail", "process": proc}
    result = json.loads(out.read_text())
    return {
        "ok": (result["syncs_per_step"] is not None) == run.cuda,
        "rasterizer": raster,
        "steps": result["steps"],
        **{k: result[k] for k in result if k.startswith(("syncs_per_step", "seconds_per_step"))},
        "syncs_by_line": dict(list(result["syncs_by_line"].items())[:10]),
        "json": str(out),
        "wall_s": proc["wall_s"],
    }


# ------------------------------------------------------------------------- main
def check_control_plane(
    run: Run, name: str, late: bool = False, ranks: int = 8, layouts: tuple = PLANE_LAYOUTS
) -> dict[str, Any]:
    """The engine's steady-state step on the GPU (``bench.control_plane --device cuda``; the
    CPU dry run: 20k rows on the CPU), R ``ranks``, per layout of ``layouts`` its figures.
    ``late``: throughput-first with the peers one step behind, so that it decides at every
    step (the densely overlapping scenes' case), instead of quality-first with peers that
    keep up."""
    from odin_ns.bench import control_plane

    out = run.work / f"{name}.json"
    rows = "1000000" if run.cuda else "20000"
    argv = ["--rows", rows, "--ranks", str(ranks), "--layouts", ",".join(layouts)]
    if late:
        argv += ["--mode", "throughput-first", "--late-peers"]
    threads = str(torch.get_num_threads())
    argv += ["--steps", "30", "--warmup", "10", "--profile-steps", "3", "--no-twin"]
    argv += ["--device", run.args.device, "--threads", threads, "--out", str(out)]
    result = control_plane.main(argv)
    return {
        "ok": True,
        "mode": result["mode"],
        "late_peers": result["late_peers"],
        "ranks": ranks,
        **{layout: _plane_figures(result, f"r{ranks}_{layout}", run.cuda) for layout in layouts},
        "device_reads_per_step_max": result["syncs_per_step_max"],  # bench.device_reads
        "share_per_view": result["share_per_view"],
        "json": str(out),
    }


def _plane_figures(result: dict[str, Any], key: str, cuda: bool) -> dict[str, Any]:
    """One variant's figures of a ``bench.control_plane`` result (``key``: r8_replicated)."""
    # (meta, meta_host, meta_paced_host: the same rank with its data plane on the meta
    # device, on this host's CPU: its step, and its step less the meta device's kernels, the
    # host's time outside the data-plane kernels, the target's figure, back to back and
    # after the paced gap)
    names = ("engine", "data", "control", "host", "cpu", "meta", "meta_host", "meta_paced_host")
    figures = {f"{name}_ms_per_step": result[f"{name}_ms_per_step_{key}"] for name in names}
    if cuda:  # torch's sync debug mode, over the profiled steps
        for stat in ("max", "median"):
            figures[f"cuda_syncs_per_step_{stat}"] = result[f"cuda_syncs_per_step_{key}_{stat}"]
    return {
        **figures,
        # the step thread's host-to-device copies a quality-first step, and their bytes
        "uploads_per_step": result[f"uploads_per_step_{key}_quality"],
        "upload_mb_per_step": result[f"upload_mb_per_step_{key}_quality"],
        # the device operations (not views) it dispatches: the launches the host pays for
        "device_ops_per_step": result[f"device_ops_per_step_{key}_quality"],
        "device_ops_per_step_throughput_first": result[f"device_ops_per_step_{key}_throughput"],
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
        link = NcclLink(1, device, timeout_s=60.0)
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
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            smi = subprocess.run(query, capture_output=True, text=True, timeout=20)
            info["driver"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as error:
            info["driver"] = f"nvidia-smi: {error!r}"
    return info


def write_figure(report: dict[str, Any], path: Path) -> None:
    """One PNG of what the run measured: op speed-ups over the CPU kernels, gsplat forward +
    backward against Gaussians, copy bandwidth, and the engine's host time per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    checks = report["checks"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    env = report.get("environment", {})
    fig.suptitle(
        f"odin-ns gpu_check on {env.get('gpu', env.get('device'))}: torch {env.get('torch')}, "
        f"CUDA {env.get('torch_cuda')}, gsplat {env.get('gsplat')}; all_ok={report.get('all_ok')}"
    )
    timed = [c for c in checks.get("ops", {}).get("cases", []) if "cuda_s" in c]
    largest = max((c["n"] for c in timed), default=0)
    rows = [c for c in timed if c["n"] == largest]
    ax = axes[0]
    if rows:
        speedups = [c["cpu_s"] / max(c["cuda_s"], 1e-9) for c in rows]
        ax.barh([c["op"] for c in rows], speedups, color="tab:green")
        ax.set_xscale("log")
        ax.axvline(1.0, color="k", lw=0.8)
    ax.set_title(f"ops: CPU kernel time / {env.get('device')} kernel time, n={largest:,}")
    ax = axes[1]
    sizes = checks.get("gsplat_speed", {}).get("sizes", [])
    if sizes:
        ns = [s["n"] for s in sizes]
        ax.plot(ns, [s["forward_backward_ms"] for s in sizes], "o-", label="forward+backward")
        ax.plot(ns, [s["forward_ms"] for s in sizes], "s--", label="forward")
        ax.set_xscale("log")
        ax.legend()
    ax.set(title="gsplat, one 1280x720 view, SH 3", xlabel="Gaussians", ylabel="ms")
    ax = axes[2]
    copies = checks.get("copy_bandwidth", {}).get("rows", [])
    if copies:
        memory = {True: "pinned", False: "pageable", None: "device"}
        labels = [f"{c['direction']} {memory[c['pinned']]} {c['mib']}M" for c in copies]
        ax.barh(labels, [c["gb_per_s"] for c in copies], color="tab:blue")
    ax.set(title="copy bandwidth", xlabel="GB/s", xscale="log")
    ax = axes[3]
    names = ("meta_host", "host", "control", "data", "engine")
    bars = [
        (label, checks[check][layout], checks[check])
        for check, (mode, _, _) in PLANE_CHECKS.items()
        for layout in PLANE_LAYOUTS
        if layout in checks.get(check, {})
        for label in [f"{layout} {mode}"]
    ]
    width = 0.8 / max(len(bars), 1)
    for i, (label, figures, plane) in enumerate(bars):
        x = [j + width * i for j in range(len(names))]
        syncs = figures.get("cuda_syncs_per_step_max", plane.get("device_reads_per_step_max"))
        label = f"{label} (syncs a step, max: {syncs})"
        ax.bar(x, [figures[f"{k}_ms_per_step"] for k in names], width, label=label)
    if bars:
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
        ax.legend(loc="upper left", fontsize="small")
    ax.set(title="engine step, R=8 unless named (median ms)", ylabel="ms")
    save_figure(fig, path, dpi=90)


def write_figure_beside(run: Run) -> None:
    """The report's figure, a PNG beside its JSON; the JSON is the record, so a figure that
    cannot be drawn only says why."""
    try:
        write_figure(run.report, run.args.out.with_suffix(".png"))
    except Exception as error:  # noqa: BLE001 - say why no picture
        print(f"gpu_check: no figure ({type(error).__name__}: {error})", flush=True)


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
            write_figure_beside(run)  # the picture of what finished
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
    parser.add_argument("--budget-s", type=float, default=540.0, help="self-deadline, seconds")
    parser.add_argument("--train-steps", type=int, default=200, help="single-process steps")
    parser.add_argument("--dist-steps", type=int, default=100, help="2-rank steps per run")
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
    if run.cuda:  # one arch list for every build and load (a different one rebuilds)
        major, minor = torch.cuda.get_device_capability(0)
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    if args.wheels is not None:  # before anything imports gsplat (the build, environment)
        project = gpu_wheels.project_root()
        run.report["wheels"] = gpu_wheels.install(args.wheels, run.work / "site", project)
    cpus = os.cpu_count() or 4
    builds = [BackgroundBuild(run, "gsplat", GSPLAT_BUILD, jobs=max(1, cpus - 4))]
    if args.wheels is not None:
        builds.append(BackgroundBuild(run, "odin_ns (installed copy)", ODIN_BUILD, jobs=4))
    gsplat = builds[0]
    run.report["environment"] = environment(args.device)
    run.report["work_dir"] = str(run.work)
    print(f"gpu_check: seed={seed} {run.report['environment']}", flush=True)
    run.write()
    checks = {  # name: (the check, the fewest seconds worth starting it with)
        "ops": (lambda: check_ops(run), 20.0),
        "copy_bandwidth": (lambda: check_copy_bandwidth(run), 5.0),
        "nccl_link": (lambda: check_nccl_link(run), 5.0),
        "raster": (lambda: check_raster(run, gsplat), 15.0),
        "gsplat_speed": (lambda: check_gsplat_speed(run, gsplat), 20.0),
        "two_ranks_one_gpu": (lambda: check_two_ranks_one_gpu(run), 60.0),
        "single_process": (lambda: check_single_process(run, gsplat), 40.0),
        "step_syncs": (lambda: check_step_syncs(run, gsplat), 25.0),
        **{
            name: (lambda name=name, args=args: check_control_plane(run, name, **args), least)
            for name, (_, args, least) in PLANE_CHECKS.items()
        },
    }
    for name in CHECKS:
        if name in args.checks and (run.cuda or name not in CUDA_ONLY):
            if name in PLANE_CHECKS:  # host times with the CPUs to themselves, if there is time
                keep = max(GPU_PLAN_S[name], PLANE_CHECKS[name][2]) + plan_after(run, name)
                for build in builds:
                    build.wait(run.left() - keep)
            busy = [build.name for build in builds if build.running()]
            run_check(run, name, *checks[name])
            run.report["checks"][name]["builds_running_at_start"] = busy  # CPUs shared
    if run.cuda:
        run.report["builds"] = {build.name: build.wait(0.0) for build in builds}
    run.report["all_ok"] = all(c.get("ok") for c in run.report["checks"].values())
    run.write()
    watchdog.cancel()
    write_figure_beside(run)
    print(f"gpu_check: all_ok={run.report['all_ok']} in {run.elapsed():.0f} s -> {args.out}")
    return 0 if run.report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
