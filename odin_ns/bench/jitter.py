"""``odin-ns-train`` with emulated per-step compute jitter, injected by the benchmark.

    python -m odin_ns.bench.jitter --jitter-ms 20 [--jitter-seed 42] \
        --nproc-per-node 2 odin-splatfacto --data DIR ...

Every rank's ``OdinSplatfactoModel.get_loss_dict`` sleeps an exponentially distributed
delay (mean ``--jitter-ms``) before computing the loss, drawn from a numpy generator seeded
by ``(seed, rank, model step)``: every synchronization mode sees exactly the same delays at
the same steps, so mode comparisons stay paired. The sleep lies inside the pipeline's
measured ``compute_s``. The jitter settings travel to the torchrun workers in the
environment (``ODIN_BENCH_JITTER_MS``, ``ODIN_BENCH_JITTER_SEED``); this module is itself
the worker (``odin_ns.launch.main(worker_module=...)``), so nothing in the pipeline's
configuration knows about it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ENV_MS = "ODIN_BENCH_JITTER_MS"
ENV_SEED = "ODIN_BENCH_JITTER_SEED"


def jitter_seconds(mean_ms: float, seed: int, rank: int, step: int) -> float:
    """The delay of (rank, step): exponential with mean ``mean_ms``, deterministic."""
    if mean_ms <= 0:
        return 0.0
    return float(np.random.default_rng([seed, rank, step]).exponential(mean_ms)) / 1000.0


def install(mean_ms: float, seed: int, rank: int) -> None:
    """Patch ``OdinSplatfactoModel.get_loss_dict`` to sleep the (rank, step) delay first."""
    from odin_ns.model import OdinSplatfactoModel

    original = OdinSplatfactoModel.get_loss_dict
    if getattr(original, "_odin_jitter", False):
        return

    def get_loss_dict(self, outputs, batch, metrics_dict=None):
        if self.training:
            time.sleep(jitter_seconds(mean_ms, seed, rank, int(self.step)))
        return original(self, outputs, batch, metrics_dict)

    get_loss_dict._odin_jitter = True  # type: ignore[attr-defined]
    OdinSplatfactoModel.get_loss_dict = get_loss_dict  # type: ignore[method-assign]


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--jitter-ms", type=float, default=None)
    parser.add_argument("--jitter-seed", type=int, default=None)
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    from odin_ns import launch

    args, rest = split_args(list(sys.argv[1:] if argv is None else argv))
    if args.jitter_ms is not None:
        if args.jitter_ms < 0:
            raise SystemExit("--jitter-ms must be >= 0")
        os.environ[ENV_MS] = str(args.jitter_ms)
    if args.jitter_seed is not None:
        os.environ[ENV_SEED] = str(args.jitter_seed)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        mean_ms = float(os.environ.get(ENV_MS, "0"))
        if mean_ms > 0:
            install(mean_ms, int(os.environ.get(ENV_SEED, "0")), int(os.environ["RANK"]))
    launch.main(rest, worker_module="odin_ns.bench.jitter")


if __name__ == "__main__":
    main()
