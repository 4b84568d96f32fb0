"""What ``OdinTrainer`` asks of a distributed session, and the data a step passes to it.

Both layouts implement ``TrainingSession``: replicated (``session.ReplicatedSession``:
every rank holds every Gaussian) and sharded (``sharded_session.ShardedSession``: each
Gaussian lives on one owner rank). The trainer calls, per step::

    reads = session.before_step(step)             # phase start if due; wait for the reads
    views = [model.render_training_view(camera, reads.rows) ... backward ...]
    session.after_backward(step, views, timing)   # publish, apply, refine / reset

and, where someone reads the whole model: ``drain``, then ``evaluation`` or
``save_checkpoint``; at the end ``finish`` and ``close``. The step's data travels as these
arguments and return values; nothing is read back off the model's attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from torch import Tensor

from odin_ns.model import RenderedView


@dataclass(frozen=True)
class StepReads:
    """What a step may read, once ``before_step`` returns.

    Attributes:
        rows: [K] int64 rows of the model's table the step draws (the plan's footprint of
            the step's views, every one current for this step).
        wait_s: seconds spent waiting for peers before the step reads: at a phase start
            (its drain and rendezvous), then for the updates those rows needed.
    """

    rows: Tensor
    wait_s: float


@dataclass(frozen=True)
class StepTiming:
    """Wall-clock facts of one step, for the step log (``SyncTelemetry``).

    Attributes:
        started: ``time.time()`` when the step began (before its wait).
        wait_s: seconds the step waited for peers (``StepReads.wait_s``).
        compute_started: ``time.perf_counter()`` when the step's forward began (after its
            wait): the session ends the step's compute time where it sees the device
            finish the backward (on a GPU the host returns from ``backward()`` with the
            kernels only queued).
    """

    started: float
    wait_s: float
    compute_started: float


CheckpointState = dict  # nerfstudio's checkpoint: step, pipeline, optimizers, ..., "odin"


class TrainingSession(Protocol):
    """One rank's side of distributed training, as the trainer calls it."""

    def before_step(self, step: int) -> StepReads:
        """Start a phase if one is due (drain, plan, bind), then wait until the rows the
        step reads are current."""
        ...

    def after_backward(self, step: int, views: Sequence[RenderedView], timing: StepTiming) -> float:
        """Publish the gradients of the step's rows, apply what arrived, accumulate the
        densification statistics of each view, make a structural change at refine / reset
        steps, log the step. Each view carries its loss's finite flag
        (``RenderedView.loss_finite``); a step whose loss or gradient rows are not finite is
        refused before anything is published. Returns the step's compute seconds: from its
        forward until the device had finished the backward."""
        ...

    def drain(self) -> None:
        """Apply every pending update (collective): afterwards the model is the
        barrier-synchronous one. Before evaluation, checkpoints and the end."""
        ...

    def evaluation(self, step: int) -> AbstractContextManager[bool]:
        """After a drain: a context in which this rank evaluates the whole model if it
        yields True (peers wait for it without timing out)."""
        ...

    def gather_to_first(self, obj: object) -> list | None:
        """``obj`` of every rank, in rank order, on rank 0; None on the others (collective)."""
        ...

    def resume_state(self, step: int) -> dict:
        """The phase state a checkpoint taken after ``step`` needs (after a drain)."""
        ...

    def save_checkpoint(
        self,
        path: Path,
        build_state: Callable[[], CheckpointState],
        write: Callable[[CheckpointState, Path], None],
    ) -> None:
        """One checkpoint of the whole model at ``path``, written by rank 0 with ``write``
        (collective; after a drain). ``build_state`` gives nerfstudio's checkpoint of this
        rank's model; the layout puts the whole model's Gaussians and moments in it."""
        ...

    def busy(self, what: str) -> AbstractContextManager[None]:
        """This rank is busy with work of its own; peers keep waiting while it lasts."""
        ...

    def set_paused(self, paused: bool) -> None:
        """The viewer paused (or resumed) this rank."""
        ...

    def finish(self, run_summary_path: Path) -> None:
        """End of training: drain, gather every rank's logs, rank 0 writes the summary."""
        ...

    def close(self) -> None:
        """Stop the transports (after the last drain)."""
        ...
