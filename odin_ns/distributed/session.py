"""One rank's side of a distributed training step: what the trainer calls around backward.

``OdinTrainer.train_iteration`` keeps nerfstudio's step shape and calls, per global step::

    wait_s = session.before_step(step)      # phase start if due; wait for (and apply) the
                                            # peer updates this step's read set needs
    ...zero_grad, forward, loss, backward on the planned view (footprint rows only)...
    session.after_backward(step, ...)       # publish gradient rows, apply what arrived,
                                            # structural change at refine / reset steps
    session.drain()                         # before checkpoints and evaluation

The session wires the pieces, each in its own module: ``PhaseController`` (footprints and
plan), ``PrimitiveSyncEngine`` (publications, read gates, the update log),
``ReplicatedDensifier`` (gsplat's strategy on summed statistics), the optimizer binding and
``SyncTelemetry``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

import torch
import torch.distributed as dist
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.utils.rich_utils import CONSOLE

from odin_ns.distributed.densify import make_densifier
from odin_ns.distributed.optimizer_binding import bind_param_groups, set_step_counts
from odin_ns.distributed.phase import PhaseController, geometry_keys, row_sources
from odin_ns.distributed.telemetry import SyncTelemetry
from odin_ns.model import GAUSSIAN_GROUPS
from odin_ns.runtime import PrimitiveSyncEngine
from odin_ns.runtime.liveness import switch_held_section


def runtime_process_group():
    """The group the runtime's point-to-point transport and phase gathers use.

    gloo: the default group. NCCL runs a communicator's operations in order, so a receive
    waiting on a slow peer would block later sends: the runtime gets its own gloo group
    (publications cross the host once; docs/architecture.md).
    """
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


class DistributedSession:
    """The distributed step of one rank (see the module docstring for the call order).

    Args:
        pipeline: the ``OdinPipeline`` (model, data manager, sync config, telemetry, panels).
        optimizers: nerfstudio's optimizers; the runtime applies the Gaussian groups' Adam
            updates with their moments.
        checkpoint_every: the trainer's ``steps_per_save``; a checkpoint step ends a phase,
            so a resumed run re-plans exactly where the uninterrupted run does.
        resumed_phase: a checkpoint's ``PhaseController.resume_state`` (same world size).
        live_panels: the run shows rank 0's live viewer panels (the viewer is on), so every
            phase start ships the peers' recent steps to rank 0; without them the steps
            travel only at the end (``finish``), for the run's final snapshot.
    """

    def __init__(
        self,
        pipeline,
        optimizers: Optimizers,
        checkpoint_every: int = 0,
        resumed_phase: dict | None = None,
        live_panels: bool = True,
    ):
        config = pipeline.config
        self.pipeline = pipeline
        self.model = pipeline.model
        self.datamanager = pipeline.datamanager
        self.optimizers = optimizers
        self.sync_config = config.sync
        # The phase-start exchange compares every rank's plan hash; the engine need not.
        self.sync_config.verify_plan = False
        self.rank = pipeline.rank
        self.world_size = pipeline.world_size
        self.snapshot_every = config.snapshot_every
        self.live_panels = bool(live_panels)
        self.telemetry: SyncTelemetry = pipeline.telemetry
        self.group = runtime_process_group()
        seed = int(self.datamanager.config.train_cameras_sampling_seed)
        self.phases = PhaseController(
            self.rank,
            self.world_size,
            seed=seed,
            strategy=config.plan_strategy,
            max_phase_steps=config.max_phase_steps,
            margin_px=config.footprint_margin_px,
            reuse_shift_px=config.footprint_reuse_shift_px,
            group=self.group,
            views_per_rank=config.views_per_rank,
        )
        self.noise = getattr(self.model, "mcmc_noise", None)  # MCMC's lazy position noise
        self.densifier = make_densifier(
            self.model.strategy, self.model.strategy_state, seed, self.noise
        )
        self.densifier.ensure_state(self.model.num_points, self.model.means.device)
        self.checkpoint_every = int(checkpoint_every)
        self._resumed_phase = resumed_phase
        self.engine: PrimitiveSyncEngine | None = None
        self._paused = None  # the viewer pause's busy section, while paused
        self._rows: torch.Tensor | None = None
        self._start_replicas_from_rank0()

    @torch.no_grad()
    def _start_replicas_from_rank0(self) -> None:
        """Ranks are seeded differently (nerfstudio seeds seed + rank), so random parts of
        the initialisation (quaternions) differ: every replica starts from rank 0's
        parameters, as DDP does when it wraps a model."""
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            dist.broadcast(tensor.data, src=0)

    # ------------------------------------------------------------------ the step
    def before_step(self, step: int) -> float:
        """Start a phase if one is due, then wait until this step's read set is current
        (applying peer updates as they arrive). Returns the seconds spent waiting."""
        if self.phases.due(step):
            self._start_phase(step)
        assert self.engine is not None
        wait_s = self.engine.apply_until_readable(step)
        self._rows = self.phases.step_rows(step, self.model.means.device)
        self.model.active_rows = self._rows
        if self.noise is not None:  # MCMC: the read set carries every earlier step's noise
            self.noise.catch_up(self.engine.current_reads(step), step - 1)
        return wait_s

    def after_backward(
        self,
        step: int,
        compute_s: float,
        wait_s: float,
        started: float,
        infos: list | None = None,
    ) -> None:
        """Publish this rank's gradient rows, apply what has arrived, make the structural
        change at refine / reset steps, and log the step. ``infos``: the rasterizer info of
        each of the step's B views (default: the model's last), statistics per view."""
        assert self.engine is not None and self._rows is not None
        rows = self._rows
        grads = {name: self.model.gauss_params[name].grad for name in GAUSSIAN_GROUPS}
        for name, grad in grads.items():
            if grad is not None and not torch.isfinite(grad[rows]).all():
                raise FloatingPointError(
                    f"rank {self.rank}: non-finite gradient of '{name}' at step {step}; "
                    "refusing to publish it"
                )
        self.engine.publish(step, grads, self.model.visible_rows)
        infos = infos if infos is not None else [self.model.info]
        for info in infos:
            self.densifier.accumulate(step, info, rows, self.model.num_points)
        self.engine.apply_arrived()
        dependency_rows = self._dependency_rows(step)  # this step's plan, before a re-plan
        if self.densifier.is_structural(step):
            self._apply_structural_change(step)
        metrics = self.engine.metrics[-1]
        height, width = self.model.last_size
        self.telemetry.record_step(
            {
                "step": step,
                "view": self.datamanager.plan_view(step),
                "compute_s": compute_s,
                "wait_s": wait_s,
                "start": started,
                "end": time.time(),
                "footprint_rows": int(rows.numel()),
                "dependency_rows": dependency_rows,
                "visible_rows": self.model.visible_rows.sum(),
                "pixels": int(height * width) * len(infos),
                "bytes_sent": metrics.bytes_sent,
                "bytes_recv": metrics.bytes_recv,
            }
        )
        if self.telemetry.snapshot_due(step, self.pipeline.panels, self.snapshot_every):
            self.telemetry.refresh_snapshot(step, self._engine_counters())

    # ------------------------------------------------------------------ phases
    def _start_phase(self, step: int) -> None:
        """Drain, plan the phase, exchange telemetry, panel requests and the plan check,
        bind the runtime."""
        tic = time.perf_counter()
        if self.engine is not None:
            self.engine.drain_and_apply_all()
            self._catch_up_noise()
            # Every rank is here before the collectives below (rank 0 may come late from a
            # checkpoint write): a heartbeat-aware wait, not gloo's timeout.
            self.engine.rendezvous(f"phase start at step {step}")
        drain_s = time.perf_counter() - tic
        if self.checkpoint_every > 0 and step > 1 and (step - 1) % self.checkpoint_every == 0:
            self.phases.forget_footprints()  # as a run resumed from that checkpoint does
        plan, record = self.phases.start(
            step,
            self.model,
            self.datamanager.train_dataset.cameras,
            self.phases.boundary(step, self.densifier, self.checkpoint_every),
            resumed=self._resumed_phase,
        )
        self._resumed_phase = None
        exchange_tic = time.perf_counter()
        request = self.telemetry.start_phase(
            self.pipeline.panels,
            self._engine_counters(),
            plan_check=(str(plan.plan_hash), self.model.num_points),
            step=step,
            with_steps=self.live_panels,
        )
        self.sync_config.apply_panel_request(request)  # on every rank at once
        bind_tic = time.perf_counter()
        record.exchange_s = bind_tic - exchange_tic
        self.datamanager.set_plan_views(plan.views[:, self.rank, :], start_step=step)
        groups = bind_param_groups(self.model.gauss_params, self.optimizers, GAUSSIAN_GROUPS)
        if self.engine is None:
            self.engine = PrimitiveSyncEngine(
                groups,
                plan,
                self.rank,
                self.world_size,
                config=self.sync_config,
                process_group=self.group,
                step_offset=step,
            )
            self.engine.apply_hook = self.noise  # None (default strategy): no hook
        else:
            versions = None
            if self.model.num_points != self.engine.num_rows:
                # Densified: after the drain every primitive is current up to the last step.
                versions = torch.full((self.model.num_points,), step - 1, dtype=torch.int64)
            self.engine.rebind(groups, plan, step_offset=step, versions=versions)
        toc = time.perf_counter()
        record.drain_s, record.bind_s, record.phase_start_s = drain_s, toc - bind_tic, toc - tic
        self.telemetry.record_phase(vars(record))

    def _dependency_rows(self, step: int) -> int:
        """Rows of this rank's read set at ``step`` that the plan says it waits for: the
        plan's ``dependency_rows[t, rank]`` summed over peers."""
        plan = self.phases.plan
        assert plan is not None
        return int(plan.dependency_rows[self.phases.local_step(step), self.rank].sum())

    def _apply_structural_change(self, step: int) -> None:
        assert self.engine is not None
        self.engine.drain_and_apply_all()
        before = self.model.num_points
        if not self.densifier.ends_phase(step):
            # An opacity reset alone, in place: every update up to ``step`` is applied here
            # (the drain; no rank publishes ``step + 1`` before every rank is past the
            # rendezvous, so none is applied before the reset), and the plan runs on.
            self.densifier.reset_in_place(self.model.gauss_params, self.optimizers.optimizers)
            self.engine.rendezvous(f"opacity reset at step {step}")
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
        if hasattr(self.densifier, "last_change"):  # MCMC: (relocated, added)
            change["relocated"], change["added"] = self.densifier.last_change
        self.telemetry.record_structural(change)
        if self.rank == 0 and self.model.num_points != before:
            CONSOLE.log(f"step {step}: densification {before} -> {self.model.num_points} Gaussians")

    def _catch_up_noise(self) -> None:
        """MCMC, after a drain: every row carries the noise of every finished step, so every
        replica holds the same bits (local: no communication)."""
        if self.noise is not None and self.engine is not None and self.engine.metrics:
            self.noise.catch_up_all(self.engine.metrics[-1].step)

    def _engine_counters(self) -> dict:
        return self.engine.live_counters() if self.engine is not None else {}

    # ------------------------------------------------------------------ drains
    def drain(self) -> None:
        """Apply every pending update on every replica (checkpoints, evaluation, the end):
        afterwards every replica holds the barrier-synchronous parameters."""
        if self.engine is None:
            return
        self.engine.drain_and_apply_all()
        self._catch_up_noise()
        self.engine.rendezvous("drain")  # before the collectives that follow every drain
        applied = int(self.engine.versions.max().item()) + 1
        set_step_counts(self.optimizers, GAUSSIAN_GROUPS, applied)

    def busy(self, reason: str):
        """Context manager: this rank is busy with work of its own; peers keep waiting."""
        return self.engine.busy(reason) if self.engine is not None else contextlib.nullcontext()

    def set_paused(self, paused: bool) -> None:
        """The viewer paused (or resumed) this rank: a busy section while it lasts."""
        self._paused = switch_held_section(self._paused, paused, lambda: self.busy("viewer paused"))

    def resume_state(self, step: int) -> dict:
        """The phase state a checkpoint taken after ``step`` needs (call after ``drain``)."""
        return self.phases.resume_state(step + 1)

    def gather(self, obj) -> list:
        """``obj`` of every rank, in rank order (an all-gather; call on every rank)."""
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts

    def replica_hash(self) -> str:
        """sha256 of every Gaussian parameter: equal on all ranks after a drain."""
        digest = hashlib.sha256()
        for name in GAUSSIAN_GROUPS:
            digest.update(
                self.model.gauss_params[name].detach().cpu().contiguous().numpy().tobytes()
            )
        return digest.hexdigest()

    def finish(self, run_summary_path: Path) -> None:
        """End of training: drain, gather every rank's logs, write ``odin_run.json``."""
        self.drain()
        engine = self.engine.summary() if self.engine is not None else {}
        self.telemetry.finish(
            self._engine_counters(), engine, self.replica_hash(), Path(run_summary_path)
        )
        if self.rank == 0:
            CONSOLE.log(f"Odin run summary written to {run_summary_path}")

    def close(self) -> None:
        """Stop the runtime's transport threads (after the last drain)."""
        if self.engine is not None:
            self.engine.close()
