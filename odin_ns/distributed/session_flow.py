"""The step flow both layouts share: ``SessionFlow``, the base of the two sessions.

``ReplicatedSession`` (``session``) and ``ShardedSession`` (``sharded_session``) differ in
where a Gaussian lives and so in how a phase binds its rows (the ownership map the engine
runs over), how a structural change runs and how the whole model reaches a checkpoint or an
evaluation. What they share lives here, once: the step, the start from rank 0's model, the
refusal to publish a step whose loss or gradient is not finite, the phase plan and its
exchange (footprints, plan, telemetry, panel requests, the plan check, the rank's view
stream), the step log, the viewer pause, the resume state, the gathers and the end of the
run.
Both train on one engine (``runtime.engine.Engine``, over an ownership map: every
rank owns every row in the replicated layout) and share its liveness: busy notices, the
peers' silence and the rendezvous before every collective. The step itself (``before_step``,
``after_backward``) is written once, here. A layout supplies ``_start_phase``,
``_apply_structural_change``, ``_summary_extra``, ``drain`` and ``replica_hash``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.utils.rich_utils import CONSOLE

from odin_ns.distributed.mcmc_noise import MCMCNoise
from odin_ns.distributed.phase import PhaseController, PhaseRecord
from odin_ns.distributed.session_api import StepReads, StepTiming
from odin_ns.distributed.telemetry import SyncTelemetry, gather_to_first
from odin_ns.errors import non_finite_gradient, non_finite_loss
from odin_ns.model import GAUSSIAN_GROUPS, RenderedView, union_visible
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import ShardLayout
from odin_ns.runtime.ledger import RunLedger, StepMetrics
from odin_ns.runtime.liveness import PeerSilence, Rendezvous, StoreLiveness, switch_held_section
from odin_ns.runtime.step_signal import StepSignal
from odin_ns.runtime.transport import Transport
from odin_ns.runtime.transport_choice import TransportChoice, choose_transport, open_transport
from odin_ns.schedule import PlanOptions


class SessionFlow:
    """What both layouts' sessions do the same way (see the module docstring).

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

    phases: PhaseController  # the layout's, built in its __init__
    group: dist.ProcessGroup | None  # the phase-start collectives' group
    engine: Engine | None  # the phase's, bound by the layout's ``_start_phase``
    noise: MCMCNoise | None = None  # MCMC's lazy position noise (replicated layout only)

    def __init__(
        self,
        pipeline,
        optimizers: Optimizers,
        checkpoint_every: int,
        resumed_phase: dict | None,
        live_panels: bool,
    ):
        config = pipeline.config
        self.pipeline = pipeline
        self.model = pipeline.model
        self.datamanager = pipeline.datamanager
        self.optimizers = optimizers
        self.rank = pipeline.rank
        self.world_size = pipeline.world_size
        self.telemetry: SyncTelemetry = pipeline.telemetry  # steps, phases, panels, summary
        self.snapshot_every = int(config.snapshot_every)
        self.checkpoint_every = int(checkpoint_every)
        self.live_panels = bool(live_panels)
        self.seed = int(self.datamanager.config.train_cameras_sampling_seed)
        self._resumed_phase = resumed_phase
        self._paused = None  # the viewer pause's busy section, while paused
        self.ledger = RunLedger()  # every engine's steps and decisions, over the run
        self._rows: torch.Tensor | None = None  # the step's reads (local ids), from before_step
        self._global_rows: torch.Tensor | None = None  # the same rows' global ids
        # Slow is not dead: a rank evaluating, writing a checkpoint or paused in the viewer
        # beats (``busy``); peers' waits and rendezvous last while it does.
        sync = config.sync
        self.liveness = StoreLiveness(self.rank, self.world_size, sync.beat_s)
        self.silence = PeerSilence(
            self.liveness, self.rank, self.world_size, sync.beat_s, sync.timeout_s
        )
        self._meeting = Rendezvous(
            self.liveness, self.silence, self.rank, self.world_size, sync.timeout_s
        )

    def _barrier_signal(self) -> StepSignal | None:
        """Barrier mode's global step signal on a gloo group of its own
        (``runtime.step_signal``); None in every other mode. Every rank calls it once."""
        if self.pipeline.config.sync.mode != "barrier":
            return None
        return StepSignal(dist.new_group(backend="gloo"))

    @torch.no_grad()
    def _start_from_rank0(self, held: frozenset[int] = frozenset()) -> None:
        """Ranks are seeded differently (nerfstudio seeds seed + rank), so random parts of
        the initialisation (quaternions) differ: every rank starts from rank 0's
        parameters and buffers, as DDP does when it wraps a model, except the tensors in
        ``held`` (ids: a resumed run's rows, read from the checkpoint already)."""
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            if id(tensor) not in held:
                dist.broadcast(tensor.data, src=0)

    def _choose_transport(self, transports: int = 1) -> TransportChoice:
        """Pick what carries publications (every rank, over ``self.group``) and say it once;
        ``transports``: how many the layout opens."""
        choice = choose_transport(
            self.pipeline.config.sync.transport, self.model.means.device, self.group, transports
        )
        if self.rank == 0:
            CONSOLE.print(f"odin-ns: publications travel over {choice.kind} ({choice.reason})")
        return choice

    def _open_transport(self, choice: TransportChoice, group) -> Transport:
        """A transport of ``choice`` whose host messages use ``group`` (gloo)."""
        return open_transport(
            choice, self.rank, self.world_size, group, self.model.means.device,
            self.pipeline.config.sync.idle_timeout_s,
        )  # fmt: skip

    def _phase_controller(self, cls: type[PhaseController], group) -> PhaseController:
        """The layout's phase controller (``cls``), configured from the pipeline config."""
        config = self.pipeline.config
        return cls(
            self.rank,
            self.world_size,
            seed=self.seed,
            strategy=config.plan_strategy,
            max_phase_steps=config.max_phase_steps,
            margin_px=config.footprint_margin_px,
            reuse_shift_px=config.footprint_reuse_shift_px,
            group=group,
            views_per_rank=int(config.views_per_rank),
            options=PlanOptions(step_order=config.plan_step_order),
        )

    # ------------------------------------------------------------------ the step
    def before_step(self, step: int) -> StepReads:
        """Start a phase if one is due, then wait until this step's reads (owned or cached
        rows of the local table) are current, applying peers' updates as they arrive.
        Returns the rows the step draws and the seconds spent waiting for peers: in a phase
        start's drain and rendezvous (where a rank that ran ahead waits for the others;
        the ledger counts them in the last step's ``drain_wait_s``), then at the read gate."""
        phase_wait_s = 0.0
        if self.phases.due(step):
            last = self.ledger.current  # (the last step's record)
            waited = last.drain_wait_s
            self._start_phase(step)
            phase_wait_s = last.drain_wait_s - waited
        assert self.engine is not None
        t = step - self.engine.offset
        wait_s = phase_wait_s + self.engine.before_step(t)
        # the rows the model draws (local ids), and the densifier's statistics' (global ids)
        self._rows, self._global_rows = self.engine.step_reads(t)
        if self.noise is not None:  # MCMC: the read set carries every earlier step's noise
            self.noise.catch_up(self.engine.current_reads(t), step - 1)
        return StepReads(self._rows, wait_s)

    def after_backward(self, step: int, views: Sequence[RenderedView], timing: StepTiming) -> float:
        """Publish this rank's gradient rows (the layout's engine applies what arrived),
        accumulate each view's densification statistics, make the structural change at
        refine / reset steps, and log the step. ``views``: each of the step's B views.
        Returns the step's compute seconds (``StepTiming.compute_started`` until the
        gradients' finite check has read the device: the backward finished there)."""
        assert self.engine is not None and self._rows is not None
        visible = union_visible(views)
        metrics = self.engine.metrics[-1]  # this step's; a refine may replace the engine
        layout = self.engine.layout  # the table the step ran on
        grads = self._gradients(step, views)  # (refused if not finite: nothing is sent)
        compute_s = time.perf_counter() - timing.compute_started
        self.engine.after_backward(step - self.engine.offset, list(grads.values()), visible)
        for view in views:
            self.densifier.accumulate(step, view.info, self._global_rows, self.num_rows)
        depends = self._plan_dependencies(step)  # this step's plan, before a re-plan
        if self.densifier.is_structural(step):
            self._apply_structural_change(step)
        self._record_step(step, views, timing, compute_s, visible, depends, metrics, layout)
        return compute_s

    def _gradients(
        self, step: int, views: Sequence[RenderedView]
    ) -> dict[str, torch.Tensor | None]:
        """The Gaussian groups' gradients, refused (``FloatingPointError``) if a view's loss
        (``RenderedView.loss_finite``) or any of the step's rows' gradient is not finite:
        nothing of the step is published, so every rank still holds the last finite state."""
        assert self._rows is not None
        grads = {name: self.model.gauss_params[name].grad for name in GAUSSIAN_GROUPS}
        names = [name for name, grad in grads.items() if grad is not None]
        losses = [view.loss_finite for view in views]
        if any(flag is None for flag in losses):
            raise ValueError("after_backward: every view needs its loss's finite flag")
        if not names and not losses:
            return grads
        # one flag per view's loss and per group on the device, read in one copy (on a GPU:
        # the step's one synchronization, after its backward)
        flags = [*losses, *(torch.isfinite(grads[n][self._rows]).all() for n in names)]
        finite = torch.stack(flags).cpu().tolist()
        if not all(finite[: len(losses)]):
            raise non_finite_loss(self.rank, step)
        for name, ok in zip(names, finite[len(losses) :], strict=True):
            if not ok:
                raise non_finite_gradient(self.rank, step, name)
        return grads

    def _record_step(
        self,
        step: int,
        views: Sequence[RenderedView],
        timing: StepTiming,
        compute_s: float,
        visible: torch.Tensor,
        depends: tuple[int, list[int]],
        metrics: StepMetrics,
        layout: ShardLayout,
    ) -> None:
        """Log the step (``SyncTelemetry``; ``depends``: ``_plan_dependencies``,
        ``metrics``: the engine's record of it, ``layout``: the table it ran on) and refresh
        rank 0's live panels when their snapshot is due."""
        assert self._rows is not None
        self.telemetry.record_step(
            {
                "step": step,
                "view": self.datamanager.plan_view(step),
                "compute_s": compute_s,
                "wait_s": timing.wait_s,
                # its structural change's waits (a phase start's are in its step's wait_s)
                "drain_wait_s": metrics.drain_wait_s,
                "start": timing.started,
                "end": time.time(),
                "footprint_rows": int(self._rows.numel()),
                "dependency_rows": depends[0],
                "depends_on": depends[1],
                "visible_rows": visible.sum(),
                "pixels": sum(view.pixels for view in views),
                "bytes_sent": metrics.bytes_sent,
                "bytes_recv": metrics.bytes_recv,
                "credit_wait_s": metrics.credit_wait_s,
                "pushes_deferred": metrics.pushes_deferred,
                "deferred_bytes_max": metrics.deferred_bytes_max,
                "inflight_bytes_max": metrics.inflight_bytes_max,
                "resident_rows": layout.num_local,
                "owned_rows": layout.num_owned,
            }
        )
        if self.telemetry.snapshot_due(step, self.pipeline.panels, self.snapshot_every):
            self.telemetry.refresh_snapshot(step, self._engine_counters())

    def _plan_dependencies(self, step: int) -> tuple[int, list[int]]:
        """What the plan says this rank waits for at ``step``: the rows of its read set the
        peers wrote (``dependency_rows[t, rank]`` summed over peers) and, per rank, the
        global step of that rank's latest write the read set holds (``dependency[t,
        rank]``; -1: none in the phase, and for this rank), which a replay of the run needs
        (``bench.trace.replay_run``)."""
        plan = self.phases.plan
        assert plan is not None
        t = self.phases.local_step(step)
        latest = plan.dependency[t, self.rank]
        steps = np.where(latest >= 0, latest + (step - t), -1)
        return int(plan.dependency_rows[t, self.rank].sum()), steps.tolist()

    # ------------------------------------------------------------------ phases
    def _plan_phase(self, step: int, num_rows: int) -> tuple[object, PhaseRecord]:
        """Plan the phase starting at ``step`` (every rank, after the drain and the
        rendezvous): footprints and plan (``PhaseController.start``), the exchange of
        telemetry, panel requests and the plan check over ``num_rows`` Gaussians, and the
        rank's view stream. Returns (plan, its ``PhaseRecord``)."""
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
        tic = time.perf_counter()
        request = self.telemetry.start_phase(
            self.pipeline.panels,
            self._engine_counters(),
            plan_check=(str(plan.plan_hash), num_rows),
            step=step,
            with_steps=self.live_panels,
            group=self.group,
        )
        self.pipeline.config.sync.apply_panel_request(request)  # on every rank at once
        record.exchange_s = time.perf_counter() - tic
        self.datamanager.set_plan_views(plan.views[:, self.rank, :], start_step=step)
        return plan, record

    def _log_densification(self, step: int, before: int, after: int) -> None:
        if self.rank == 0 and after != before:
            CONSOLE.log(f"step {step}: densification {before} -> {after} Gaussians")

    # ------------------------------------------------------------------ whole-model points
    @contextlib.contextmanager
    def evaluation(self, step: int) -> Iterator[bool]:
        """Every rank holds the whole model (after a drain) and evaluates it; peers wait
        for a slow one without timing out."""
        with self.busy("evaluating"):
            yield True

    def set_paused(self, paused: bool) -> None:
        """The viewer paused (or resumed) this rank: a busy section while it lasts."""
        self._paused = switch_held_section(self._paused, paused, lambda: self.busy("viewer paused"))

    def resume_state(self, step: int) -> dict:
        """The phase state a checkpoint taken after ``step`` needs (call after ``drain``)."""
        return self.phases.resume_state(step + 1)

    def gather_to_first(self, obj) -> list | None:
        """``obj`` of every rank, in rank order, on rank 0 (None on the others; a gather
        over the session's gloo group: call on every rank). Only rank 0 writes what it is
        gathered for: an all-gather would give each of R ranks R copies (a checkpoint's
        statistics, 12 bytes a row each: 200 MB a rank at R = 8, 1M rows)."""
        return gather_to_first(obj, self.rank, self.world_size, self.group)

    def finish(self, run_summary_path: Path) -> None:
        """End of training: drain, gather every rank's logs (with the layout's entries),
        rank 0 writes ``odin_run.json``."""
        self.drain()
        rank_extra, run_extra = self._summary_extra()
        admitted = self.ledger.admission_log()  # throughput-first's delayed reads, if any
        if admitted:
            rank_extra = {**(rank_extra or {}), "admitted_reads": admitted}
        self.telemetry.finish(
            self._engine_counters(),
            self._engine_summary(),
            self.replica_hash(),
            Path(run_summary_path),
            rank_extra=rank_extra,
            group=self.group,
            **run_extra,
        )
        if self.rank == 0:
            CONSOLE.log(f"Odin run summary written to {run_summary_path}")

    # ------------------------------------------------------------------ the layout's part
    @property
    def num_rows(self) -> int:
        """N, the Gaussians of the whole model (the sharded layout: every rank's)."""
        return self.model.num_points

    def _start_phase(self, step: int) -> None:
        """Drain, plan the phase starting at ``step`` (``_plan_phase``), bind its engine."""
        raise NotImplementedError

    def _apply_structural_change(self, step: int) -> None:
        """A refine's (or reset's) change of the model at ``step``, after a drain."""
        raise NotImplementedError

    def _engine_counters(self) -> dict:
        """The run's counters so far, for the panels (``RunLedger.live_counters``)."""
        return self.ledger.live_counters(self.pipeline.config.sync)

    def _engine_summary(self) -> dict:
        """The engine's summary for ``odin_run.json`` (after the last drain): the run
        totals of every phase's engine."""
        return self.ledger.summary(self.pipeline.config.sync)

    def _summary_extra(self) -> tuple[dict | None, dict]:
        """(per-rank entries, top-level keys) the layout adds to ``odin_run.json``."""
        return None, {}

    def drain(self) -> None:
        raise NotImplementedError

    def busy(self, what: str) -> contextlib.AbstractContextManager:
        """Context manager: this rank is busy with work of its own (``what``); peers keep
        waiting while it beats."""
        return self.liveness.busy(what)

    def rendezvous(self, what: str) -> None:
        """Wait until every rank has reached the same rendezvous (``liveness.Rendezvous``:
        a peer busy evaluating or writing a checkpoint is waited for). After a drain,
        before the collectives that follow it."""
        begun = time.perf_counter()
        spent = self._meeting.meet(what)
        self.ledger.drain_waited(spent)
        if self.silence.heard_since(begun):  # a busy peer was waited for
            self.ledger.busy_s += spent

    def replica_hash(self) -> str:
        raise NotImplementedError
