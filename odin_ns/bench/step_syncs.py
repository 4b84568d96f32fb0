"""Stream synchronizations per training step of ``ns-train odin-splatfacto``, on a GPU.

    python -m odin_ns.bench.step_syncs [--data SCENE] --out step_syncs.json \
        [--steps 40] [--warmup 10] [-- NS_TRAIN_FLAGS...]

One process trains in this one as ``ns-train`` would (nerfstudio's ``train_loop``: the
config's trainer set up, then ``train()``), and each step after ``--warmup`` runs under
torch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``), from before the
trainer's first callback before the step to after its last one after it: the step's
``train_iteration`` (render, loss, backward, optimizer) and the training callbacks around
it (in one process, the densification strategy's; with several ranks, the session works
inside ``train_iteration``). Every operation that makes the host wait for the device's
stream warns, and the warnings are counted per step by the line of Python that made them
(the innermost frame torch names; a backward's land on autograd's ``run_backward`` line).
Each such wait holds the host until the device has run everything queued, so the host
cannot prepare the next launches meanwhile: the figure that ``tests/test_sync_count.py``
bounds for the engine's step on the ``meta`` device, here for the whole step on a real
one. nerfstudio's logging between steps is not in it.

Writes the JSON (``syncs_per_step`` median / min / max, ``syncs_by_line``: mean per step,
``seconds_per_step``: each step synchronized at both ends and run under the debug mode, so
not a throughput figure) and a PNG of the lines. On the CPU nothing synchronizes a stream:
the run reports ``syncs_per_step`` None and only times the steps (a dry run of the
harness). The GPU check runs it (``odin_ns.cuda.gpu_check``, ``step_syncs``).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from odin_ns.bench.commands import method_command, quiet_flags
from odin_ns.bench.report import put_spread, save_figure, write_json

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug warning (c10)


class StepSyncs:
    """Counts what each step after the first ``warmup`` synchronizes: ``begin(step)`` before
    the trainer's first callback of the step, ``end(step)`` after its last one
    (``callbacks()``), torch's sync debug mode on in between; per step its synchronizations
    by line and its wall seconds. Other warnings of a counted step are shown as usual.

    Args:
        warmup: steps not counted (compilation, caches, the first refine's set-up).
        cuda: whether the device is CUDA (else the steps are only timed).
    """

    def __init__(self, warmup: int, cuda: bool):
        self._warmup = warmup
        self._cuda = cuda
        self.steps = 0
        self.per_step: list[Counter] = []  # per counted step: "folder/file.py:line" -> count
        self.seconds: list[float] = []
        self._catching: warnings.catch_warnings | None = None
        self._caught: list = []
        self._tic = 0.0

    def callbacks(self) -> tuple:
        """(first, last): the trainer's callbacks that begin and end a counted step."""
        from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation

        before = [TrainingCallbackLocation.BEFORE_TRAIN_ITERATION]
        after = [TrainingCallbackLocation.AFTER_TRAIN_ITERATION]
        return TrainingCallback(before, self.begin), TrainingCallback(after, self.end)

    def begin(self, step: int) -> None:
        self.steps += 1
        if self.steps <= self._warmup:
            return
        if self._cuda:
            torch.cuda.synchronize()  # (the step's own waits only)
        self._catching = warnings.catch_warnings(record=True)
        self._caught = self._catching.__enter__()
        warnings.simplefilter("always")
        if self._cuda:
            torch.cuda.set_sync_debug_mode("warn")
        self._tic = time.perf_counter()

    def end(self, step: int) -> None:
        if self._catching is None:
            return
        self.close()
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - self._tic)
        lines: Counter = Counter()
        for w in self._caught:
            if SYNC_WARNING in str(w.message):
                path = Path(w.filename)
                lines[f"{path.parent.name}/{path.name}:{w.lineno}"] += 1
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        self.per_step.append(lines)

    def close(self) -> None:
        """The debug mode off and the warnings' filters restored (a step cut short too)."""
        if self._catching is None:
            return
        if self._cuda:
            torch.cuda.set_sync_debug_mode(0)
        self._catching.__exit__(None, None, None)
        self._catching = None


def train_counting(argv: Sequence[str], warmup: int, cuda: bool) -> StepSyncs:
    """``ns-train ARGV`` in this process, its steps counted (``StepSyncs``)."""
    import tyro

    from odin_ns.method_registry import method_registry

    config = tyro.cli(method_registry().AnnotatedBaseConfigUnion, args=list(argv))
    if config.data:  # ns-train's --data alias (nerfstudio.scripts.train.main)
        config.pipeline.datamanager.data = config.data
    config.set_timestamp()
    random.seed(config.machine.seed)  # as nerfstudio's train_loop seeds a process
    np.random.seed(config.machine.seed)
    torch.manual_seed(config.machine.seed)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    counted = StepSyncs(warmup, cuda)
    first, last = counted.callbacks()
    trainer.callbacks = [first, *trainer.callbacks, last]
    try:
        trainer.train()
    finally:
        counted.close()
    return counted


def measure(args: argparse.Namespace) -> dict:
    cuda = args.device == "cuda"
    with tempfile.TemporaryDirectory(prefix="odin-step-syncs-") as out:
        flags = ["--machine.device-type", args.device, *quiet_flags(save_every=10**9)]
        argv = method_command(
            args.data, out, experiment="step-syncs", name="run",
            steps=args.warmup + args.steps, flags=[*flags, *args.ns_train],
        )  # fmt: skip
        counted = train_counting(argv, args.warmup, cuda)
    result: dict = {
        "source": f"measured on {args.device} (ns-train odin-splatfacto in one process)",
        "data": str(args.data),
        "device": args.device,
        "warmup": args.warmup,
        "steps": len(counted.per_step),
        "ns_train_flags": list(args.ns_train),
    }
    put_spread(result, "seconds_per_step", counted.seconds)
    if not cuda:
        result.update(syncs_per_step=None, syncs_by_line={}, note="CPU: no stream to wait on")
        return result
    put_spread(result, "syncs_per_step", [sum(c.values()) for c in counted.per_step])
    total = sum(counted.per_step, Counter())
    n = max(1, len(counted.per_step))
    result["syncs_by_line"] = {line: k / n for line, k in total.most_common()}
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = list(result["syncs_by_line"].items())[:15]
    fig, ax = plt.subplots(figsize=(8, 0.4 * max(3, len(lines)) + 1.2))
    if lines:
        ax.barh([name for name, _ in lines][::-1], [k for _, k in lines][::-1])
        ax.set_xlabel("stream synchronizations per step (mean)")
    else:
        ax.text(0.5, 0.5, result.get("note", "no synchronization"), ha="center", va="center")
        ax.set_axis_off()
    median = result.get("syncs_per_step")
    ax.set_title(
        f"ns-train odin-splatfacto on {result['device']}: "
        f"{'-' if median is None else f'{median:g}'} synchronizations a step "
        f"(median of {result['steps']}), {1e3 * result['seconds_per_step']:.1f} ms a step"
    )
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=None, help="a nerfstudio scene (default: the built-in street)"
    )
    parser.add_argument("--steps", type=int, default=40, help="counted steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps run before counting")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("bench/step_syncs.json"))
    parser.add_argument("ns_train", nargs="*", help="more ns-train flags (after --)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("step_syncs: no CUDA device (--device cpu times a dry run)")
    if args.data is None:
        from odin_ns.bench.ops import default_street_scene

        args.data = default_street_scene()
    result = measure(args)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(
        f"step_syncs: {result['syncs_per_step']} synchronizations a step (median), "
        f"{1e3 * result['seconds_per_step']:.1f} ms a step -> {args.out}"
    )
    return result


if __name__ == "__main__":
    main()
