"""One rank's side of a distributed training step: what the trainer calls around backward.

``OdinTrainer.train_iteration`` keeps nerfstudio's step shape and calls, per global step
(``session_api.TrainingSession``, the replicated layout: every rank holds every Gaussian)::

    reads = session.before_step(step)       # phase start if due; wait for (and apply) the
                                            # peer updates this step's read set needs
    ...zero_grad, forward, loss, backward on the planned view (reads.rows only)...
    session.after_backward(step, views, timing)  # send gradient rows, apply what
                                            # arrived, structural change at refine / reset
    session.drain()                         # before checkpoints and evaluation

Replicated training is the one engine (``runtime.engine.Engine``) over an
ownership map in which every rank owns every row (``layout.EVERY_RANK``): no cache, no
pushes, every rank's gradient rows of a step go to every peer and every rank applies every
update in the same order. The session wires the pieces, each in its own module:
``PhaseController`` (footprints and plan), the engine (gradient rows, read waits, the
update log), ``ReplicatedDensifier`` / ``MCMCDensifier`` (gsplat's strategy on summed
statistics), the optimizer binding and ``SyncTelemetry``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from nerfstudio.engine.optimizers import Optimizers

from odin_ns.distributed.densify import MCMCDensifier, make_densifier
from odin_ns.distributed.optimizer_binding import bind_param_groups, set_step_counts
from odin_ns.distributed.phase import PhaseController, geometry_keys, row_sources
from odin_ns.distributed.session_api import CheckpointState
from odin_ns.distributed.session_flow import SessionFlow
from odin_ns.model import GAUSSIAN_GROUPS
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import replicated_layout


def runtime_process_group():
    """The gloo group of the runtime's host messages: the gloo transport's gradient rows,
    or the NCCL transport's notices, and the phase-start gathers.

    gloo default group: that group. NCCL default group: a gloo group of its own (host
    messages never queue behind NCCL's in-order device operations).
    """
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


class ReplicatedSession(SessionFlow):
    """The replicated layout's distributed step of one rank: every rank holds every
    Gaussian (see the module docstring for the call order; ``SessionFlow`` for the
    arguments and what both layouts share)."""

    def __init__(
        self,
        pipeline,
        optimizers: Optimizers,
        checkpoint_every: int = 0,
        resumed_phase: dict | None = None,
        live_panels: bool = True,
    ):
        super().__init__(pipeline, optimizers, checkpoint_every, resumed_phase, live_panels)
        self.sync_config = pipeline.config.sync
        self.group = runtime_process_group()
        self.transport = self._open_transport(self._choose_transport(), self.group)
        self.step_signal = self._barrier_signal()
        self.phases = self._phase_controller(PhaseController, self.group)
        self.noise = self.model.mcmc_noise  # MCMC's lazy position noise (None: default)
        self.densifier = make_densifier(
            self.model.strategy, self.model.strategy_state, self.seed, self.noise, self.group
        )
        self.densifier.ensure_state(self.model.num_points, self.model.means.device)
        self.engine: Engine | None = None
        self.versions: torch.Tensor | None = None  # [N] int64 last applied step per row
        self._start_from_rank0()

    # ------------------------------------------------------------------ phases
    def _start_phase(self, step: int) -> None:
        """Drain, plan the phase, exchange telemetry, panel requests and the plan check,
        bind the engine."""
        tic = time.perf_counter()
        if self.engine is not None:
            self.engine.drain()
            self._catch_up_noise()
            # Every rank is here before the collectives below (rank 0 may come late from a
            # checkpoint write): a heartbeat-aware wait, not gloo's timeout.
            self.rendezvous(f"phase start at step {step}")
        drain_s = time.perf_counter() - tic
        n = self.model.num_points
        plan, record = self._plan_phase(step, n)
        bind_tic = time.perf_counter()
        if self.versions is None or self.versions.numel() != n:
            # The first phase, or densified: after the drain every row is current.
            self.versions = torch.full((n,), step - 1, dtype=torch.int64)
        self.engine = Engine(
            bind_param_groups(self.model.gauss_params, self.optimizers, GAUSSIAN_GROUPS),
            replicated_layout(n, self.rank),
            plan,
            self.rank,
            self.world_size,
            self.transport,
            None,  # nothing is pushed: no rank caches a row
            step_offset=step,
            versions=self.versions,
            timeout_s=self.sync_config.timeout_s,
            silence=self.silence,
            max_inflight_bytes=int(self.sync_config.max_inflight_bytes),
            sync=self.sync_config,
            step_signal=self.step_signal,
            ledger=self.ledger,
            hook=self.noise,  # None (default strategy): no hook
        )
        toc = time.perf_counter()
        record.drain_s, record.bind_s, record.phase_start_s = drain_s, toc - bind_tic, toc - tic
        self.telemetry.record_phase(vars(record))

    def _apply_structural_change(self, step: int) -> None:
        assert self.engine is not None
        self.engine.drain()
        before = self.model.num_points
        if not self.densifier.ends_phase(step):
            # An opacity reset alone, in place: every update up to ``step`` is applied here
            # (the drain; no rank publishes ``step + 1`` before every rank is past the
            # rendezvous, so none is applied before the reset), and the plan runs on.
            self.densifier.reset_in_place(self.model.gauss_params, self.optimizers.optimizers)
            self.rendezvous(f"opacity reset at step {step}")
            self.telemetry.record_structural(
                {"step": step, "gaussians_before": before, "gaussians_after": before}
            )
            return
        reuse = self.phases.reuse_shift_px > 0
        by_geometry = reuse and not self.densifier.returns_parents
        keys = geometry_keys(self.model) if by_geometry else None
        parents = self.densifier.apply(step, self.model.gauss_params, self.optimizers.optimizers)
        # Each row's source (its parent: itself, the original of a duplicate, the parent of
        # a split child; MCMC: the row with the same geometry) offers its footprint to the
        # next phase, which keeps it where the row moved little (the sharded session passes
        # the same parents, so both modes draw the same footprints).
        sources = None
        if reuse:
            sources = parents if not by_geometry else row_sources(keys, geometry_keys(self.model))
        self.phases.end_after(step, sources)
        change = {
            "step": step,
            "gaussians_before": before,
            "gaussians_after": self.model.num_points,
        }
        if isinstance(self.densifier, MCMCDensifier):  # (relocated, added)
            change["relocated"], change["added"] = self.densifier.last_change
        self.telemetry.record_structural(change)
        self._log_densification(step, before, self.model.num_points)

    def _catch_up_noise(self) -> None:
        """MCMC, after a drain: every row carries the noise of every finished step, so every
        replica holds the same bits (local: no communication)."""
        if self.noise is not None and self.ledger.steps:
            self.noise.catch_up_all(self.ledger.steps[-1].step)

    # ------------------------------------------------------------------ drains
    def drain(self) -> None:
        """Apply every pending update on every replica (checkpoints, evaluation, the end):
        afterwards every replica holds the barrier-synchronous parameters."""
        if self.engine is None:
            return
        self.engine.drain()
        self._catch_up_noise()
        self.rendezvous("drain")  # before the collectives that follow every drain
        applied = self.engine.offset + self.engine.done + 1  # every step so far
        set_step_counts(self.optimizers, GAUSSIAN_GROUPS, applied)

    def save_checkpoint(
        self,
        path: Path,
        build_state: Callable[[], CheckpointState],
        write: Callable[[CheckpointState, Path], None],
    ) -> None:
        """Rank 0 writes its replica, the whole model (after a drain)."""
        if self.rank != 0:
            return
        state = build_state()
        with self.busy("writing a checkpoint"):  # peers wait: slow is not dead
            write(state, path)

    def replica_hash(self) -> str:
        """sha256 of every Gaussian parameter: equal on all ranks after a drain."""
        digest = hashlib.sha256()
        for name in GAUSSIAN_GROUPS:
            digest.update(
                self.model.gauss_params[name].detach().cpu().contiguous().numpy().tobytes()
            )
        return digest.hexdigest()

    def close(self) -> None:
        """Stop the transport's and the liveness's threads (after the last drain)."""
        self.transport.close()
        self.liveness.close()
