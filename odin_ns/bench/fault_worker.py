"""Fault injection for the fault matrix and the reliability tests (not used in training).

``python -m odin_ns.bench.fault_worker <odin-ns-train arguments>`` is ``odin-ns-train``
whose ranks run this module: each rank reads the fault from ``ODIN_NS_FAULT`` (JSON), wraps
the one method where it strikes, then trains as usual. Faults (``kind``; ``rank`` and
``step`` say where; ``seconds`` how long):

- ``kill_step``: SIGKILL after backward, before publishing ``step``;
- ``kill_drain``: SIGKILL inside the first engine drain after ``step`` (peers are draining);
- ``kill_structural``: SIGKILL inside the first structural change after ``step`` (after its
  drain, before its collectives);
- ``kill_checkpoint``: rank 0 writes half of its ``write``-th checkpoint (1-based; default
  1), then SIGKILL;
- ``slow_checkpoint``: rank 0 sleeps ``seconds`` inside its ``write``-th checkpoint write
  (a slow disk);
- ``stall``: a silent sleep of ``seconds`` before publishing ``step`` (a stuck rank);
- ``nan_grad``: a NaN in the gradient of ``means`` at ``step``.

A rank with ``ODIN_NS_FAULT_REPORT`` set writes whether its replica is finite to
``<that folder>/rank<R>.finite`` before it exits: when training returns or raises, and on
SIGTERM (torchrun ending the survivors).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

FAULT_ENV = "ODIN_NS_FAULT"
REPORT_ENV = "ODIN_NS_FAULT_REPORT"


def _mark() -> None:
    """Note when the fault struck (``<ODIN_NS_FAULT_REPORT>/fault.time``), for the matrix."""
    folder = os.environ.get(REPORT_ENV)
    if folder:
        Path(folder, "fault.time").write_text(f"{time.time():.6f}")


def _kill() -> None:
    _mark()
    os.kill(os.getpid(), signal.SIGKILL)


def _install(fault: dict, rank: int) -> None:
    from odin_ns.distributed.session import ReplicatedSession
    from odin_ns.runtime.engine import Engine
    from odin_ns.trainer import OdinTrainer

    kind, at = fault["kind"], int(fault.get("step", 0))
    mine = rank == int(fault.get("rank", 0))
    seconds = float(fault.get("seconds", 0.0))

    if kind in ("kill_step", "stall", "nan_grad") and mine:
        after_backward = ReplicatedSession.after_backward

        def hooked(self, step, *args, **kwargs):
            if step == at:
                if kind == "kill_step":
                    _kill()
                elif kind == "stall":
                    _mark()
                    time.sleep(seconds)
                else:
                    _mark()
                    self.model.gauss_params["means"].grad[self._rows[:1]] = float("nan")
            return after_backward(self, step, *args, **kwargs)

        ReplicatedSession.after_backward = hooked

    if kind == "kill_drain" and mine:
        drain = Engine.drain

        def hooked_drain(self):
            if self.offset + self.done >= at:
                _kill()
            return drain(self)

        Engine.drain = hooked_drain

    if kind == "kill_structural" and mine:
        change = ReplicatedSession._apply_structural_change

        def hooked_change(self, step):
            if step >= at:
                self.engine.drain()
                _kill()
            return change(self, step)

        ReplicatedSession._apply_structural_change = hooked_change

    if kind in ("kill_checkpoint", "slow_checkpoint") and rank == 0:
        write = OdinTrainer._write_checkpoint
        writes = [0]

        def hooked_write(self, state, path):
            writes[0] += 1
            if writes[0] == int(fault.get("write", 1)):
                if kind == "slow_checkpoint":
                    _mark()
                    time.sleep(seconds)
                else:
                    import torch

                    partial = path.with_suffix(".ckpt.partial")
                    torch.save(state, partial)
                    data = partial.read_bytes()
                    partial.write_bytes(data[: len(data) // 2])  # killed mid-write
                    _kill()
            return write(self, state, path)

        OdinTrainer._write_checkpoint = hooked_write


def _report(folder: Path, rank: int) -> None:
    """Write whether this rank's replica is finite (at exit or when torchrun ends it)."""
    import torch

    finite = None
    trainer = _TRAINER.get("trainer")
    if trainer is not None:
        params = trainer.pipeline.model.gauss_params
        finite = all(bool(torch.isfinite(p).all()) for p in params.values())
    (folder / f"rank{rank}.finite").write_text(json.dumps({"finite": finite}))


def _report_on_sigterm(folder: Path, rank: int) -> None:
    def handler(signum, frame):
        _report(folder, rank)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


_TRAINER: dict = {}


def _remember_trainer() -> None:
    from odin_ns.trainer import OdinTrainer

    setup = OdinTrainer.setup

    def hooked(self, *args, **kwargs):
        _TRAINER["trainer"] = self
        return setup(self, *args, **kwargs)

    OdinTrainer.setup = hooked


def main() -> None:
    from odin_ns import launch

    if "RANK" not in os.environ:  # the launcher
        launch.main(worker_module="odin_ns.bench.fault_worker")
        return
    rank = int(os.environ["RANK"])
    fault = json.loads(os.environ.get(FAULT_ENV) or "{}")
    if fault:
        _install(fault, rank)
    report = os.environ.get(REPORT_ENV)
    if report:
        _remember_trainer()
        _report_on_sigterm(Path(report), rank)
    try:
        launch.main(worker_module="odin_ns.bench.fault_worker")
    finally:  # a forked rank ends with os._exit: no atexit, so not one
        if report:
            _report(Path(report), rank)


if __name__ == "__main__":
    main()
