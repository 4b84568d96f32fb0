"""The command line and environment of one ``odin-ns-train`` run, for benchmarks and tests.

Every harness that trains through the real entry point (``odin_ns.bench.*``, the GPU
check, ``tests/``) builds its command here, so the shape of a run (which launcher, which
method, where it writes, how quiet it is) is written once:

    cmd = train_command(data, out, ranks=2, experiment="dist", name="qf", steps=60,
                        flags=quiet_flags(save_every=30) + schedule_flags(20, 15))
    subprocess.run(cmd, env=run_env(threads=1), ...)
    run_dir(out, "dist", "qf")  # out/dist/odin-splatfacto/qf

The launcher is ``odin-ns-train`` by default; a wrapper worker (``odin_ns.bench.jitter``,
``odin_ns.bench.fault_worker``, ``odin_ns.bench.convergence``) passes its own
``[python, -m, module]``. Data-parser options must come last on nerfstudio's command line,
so they have their own argument.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

BIN = Path(sys.executable).parent
METHOD = "odin-splatfacto"


def free_port() -> int:
    """A TCP port nobody listens on now (other jobs on the machine pick ports too)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def quiet_flags(save_every: int, keep_checkpoints: bool = False) -> list[str]:
    """No viewer, no evaluation during training, a checkpoint every ``save_every`` steps
    (all of them kept when ``keep_checkpoints``)."""
    flags = [
        "--vis", "tensorboard",
        "--steps-per-eval-batch", "0",
        "--steps-per-eval-image", "0",
        "--steps-per-eval-all-images", "0",
        "--steps-per-save", str(save_every),
    ]  # fmt: skip
    if keep_checkpoints:
        flags += ["--save-only-latest-checkpoint", "False"]
    return flags


def schedule_flags(
    warmup: int, refine_every: int, densify_grad_thresh: float | None = None
) -> list[str]:
    """splatfacto's densification schedule compressed for short runs, full resolution from
    the first step (``num_downscales 0``)."""
    flags = [
        "--pipeline.model.num-downscales", "0",
        "--pipeline.model.warmup-length", str(warmup),
        "--pipeline.model.refine-every", str(refine_every),
    ]  # fmt: skip
    if densify_grad_thresh is not None:
        flags += ["--pipeline.model.densify-grad-thresh", str(densify_grad_thresh)]
    return flags


def train_command(
    data: Path | str,
    out: Path | str,
    *,
    ranks: int,
    experiment: str,
    name: str,
    steps: int | None = None,
    flags: Sequence[str] = (),
    method: str = METHOD,
    launcher: Sequence[str] | None = None,
    launcher_flags: Sequence[str] = (),
    port: int | None = None,
    dataparser: Sequence[str] = (),
) -> list[str]:
    """``odin-ns-train --nproc-per-node R --master-port P <method> --data ... <flags>
    [dataparser ...]``; the run writes to :func:`run_dir` ``(out, experiment, name)``."""
    cmd = list(launcher) if launcher is not None else [str(BIN / "odin-ns-train")]
    cmd += ["--nproc-per-node", str(ranks), "--master-port", str(port or free_port())]
    run = method_command(data, out, experiment=experiment, name=name, steps=steps, flags=flags,
                         method=method, dataparser=dataparser)  # fmt: skip
    return [*cmd, *launcher_flags, *run]


def method_command(
    data: Path | str,
    out: Path | str,
    *,
    experiment: str,
    name: str,
    steps: int | None = None,
    flags: Sequence[str] = (),
    method: str = METHOD,
    dataparser: Sequence[str] = (),
) -> list[str]:
    """``<method> --data ... --output-dir ... --experiment-name E --timestamp N
    [--max-num-iterations S] <flags> [dataparser ...]``: what follows the launcher, and
    ``ns-train``'s arguments; the run writes to :func:`run_dir` ``(out, experiment, name)``."""
    cmd = [method, "--data", str(data), "--output-dir", str(out)]
    cmd += ["--experiment-name", experiment, "--timestamp", name]
    if steps is not None:
        cmd += ["--max-num-iterations", str(steps)]
    return [*cmd, *flags, *dataparser]


def module_launcher(module: str) -> list[str]:
    """A wrapper worker as the launcher: ``[python, -m, module]``."""
    return [sys.executable, "-m", module]


def run_dir(out: Path | str, experiment: str, name: str, method: str = METHOD) -> Path:
    """Where nerfstudio writes a run: ``out/experiment/method/name``."""
    return Path(out) / experiment / method / name


def run_env(threads: int | None = 1, **extra: str) -> dict[str, str]:
    """The environment of a run: unbuffered output, passive OpenMP waits (ranks share few
    cores), ``threads`` per rank (None: inherit), plus ``extra``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra)
    return env


__all__ = [
    "BIN",
    "METHOD",
    "free_port",
    "method_command",
    "module_launcher",
    "quiet_flags",
    "run_dir",
    "run_env",
    "schedule_flags",
    "train_command",
]
