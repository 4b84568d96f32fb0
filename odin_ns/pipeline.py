"""OdinPipeline: VanillaPipeline without the DDP wrap; the Odin runtime synchronizes instead.

One process: nerfstudio's VanillaPipeline (the model's SelectiveAdam steps locally).

Several processes, per global step ``s`` on rank ``r`` (DESIGN 3.4):

1. at a phase start: footprints of every training view (views split across ranks, then
   gathered), the AOT plan for the phase, and the runtime rebound to the current tensors;
2. ``validate``: wait only for the peer publications this step's read set depends on;
3. render the planned view restricted to its planned footprint, backward;
4. ``publish`` the footprint's gradient rows; accumulate densification statistics locally;
5. at a structural step (refine / opacity reset): drain, sum the statistics across ranks,
   apply the same structural change on every replica with the same random stream, and end
   the phase.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from nerfstudio.utils import writer
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor

from odin_ns.datamanager import OdinDataManagerConfig
from odin_ns.errors import OdinInputError
from odin_ns.model import (
    GAUSSIAN_GROUPS,
    OdinSplatfactoModel,
    OdinSplatfactoModelConfig,
    get_viewmat,
)
from odin_ns.runtime import ParamGroupState, PrimitiveSyncEngine, SyncConfig
from odin_ns.schedule import build_plan, compute_footprints, plan_conflict
from odin_ns.viewer_ext import OdinPanelsElement


@dataclass
class OdinPipelineConfig(VanillaPipelineConfig):
    """Pipeline for odin-splatfacto: the runtime replaces DDP when world size > 1."""

    _target: type = field(default_factory=lambda: OdinPipeline)
    datamanager: OdinDataManagerConfig = field(default_factory=OdinDataManagerConfig)
    model: OdinSplatfactoModelConfig = field(default_factory=OdinSplatfactoModelConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    """How ranks synchronize: barrier (synchronous baseline), quality-first, throughput-first."""
    plan_strategy: Literal["odin", "random"] = "odin"
    """AOT plan: low-conflict spatial streams (odin) or a random deal (baseline)."""
    footprint_margin_px: float = 16.0
    """Pixels added around each projected 3-sigma footprint when planning."""
    max_phase_steps: int = 100
    """Re-plan (fresh footprints) at least this often, even without a structural change."""
    emulate_jitter_ms: float = 0.0
    """Benchmarks only: add an exponentially distributed delay with this mean to every step
    (seeded by rank and step, so every mode sees the same delays) to emulate uneven per-view
    costs and stragglers, which a 2-core CPU machine does not have."""
    run_summary_path: Path | None = None
    """Where the run's odin_run.json goes (set when the config is saved); ns-viewer reads it."""
    snapshot_every: int = 5
    """Rank 0 refreshes the viewer panels' snapshot every this many steps."""


class OdinPipeline(VanillaPipeline):
    """VanillaPipeline whose multi-process step is Odin's primitive-level synchronization."""

    config: OdinPipelineConfig
    _model: OdinSplatfactoModel

    def __init__(
        self,
        config: OdinPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler=None,
    ):
        # world_size=1 keeps VanillaPipeline from wrapping the model in DDP.
        super().__init__(config, device, test_mode, 1, local_rank, grad_scaler)
        self.world_size = world_size
        self.rank = dist.get_rank() if world_size > 1 else 0
        self.engine: PrimitiveSyncEngine | None = None
        self._gloo_group = None
        self.plan = None
        self._phase_start = 0
        self._phase_end = 0
        self._phase_index = 0
        self._step_log: list[dict] = []
        self._phase_log: list[dict] = []
        self._peer_steps: dict[int, list[dict]] = {}  # rank 0: other ranks' steps, per phase
        self._gathered_upto = 0
        self.sync_snapshot: dict = {}  # replaced wholesale, read by the viewer panels' thread
        # nerfstudio's ViewerState installs ViewerElements found on the pipeline: live panels on
        # rank 0 of a distributed run, saved ones when ns-viewer opens a finished run.
        self.panels: OdinPanelsElement | None = None
        summary = config.run_summary_path
        if world_size > 1 and self.rank == 0:
            self.panels = OdinPanelsElement(lambda: self.sync_snapshot)
        elif world_size == 1 and summary is not None and Path(summary).exists():
            self.panels = OdinPanelsElement.from_run_json(Path(summary))
        if self.distributed:
            self._check_distributed_setup()
            self.model.external_densification = True
            # Ranks are seeded differently (nerfstudio seeds seed + rank), so random parts of
            # the initialisation (quaternions) differ: start every replica from rank 0's, as DDP
            # does when it wraps a model.
            with torch.no_grad():
                for tensor in list(self.model.parameters()) + list(self.model.buffers()):
                    dist.broadcast(tensor.data, src=0)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _check_distributed_setup(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise OdinInputError(
                f"world size {self.world_size} but torch.distributed is not initialised; "
                "launch with `odin-ns-train --nproc-per-node N` or `ns-train --machine.num-devices N`"
            )
        if dist.get_world_size() != self.world_size:
            raise OdinInputError(
                f"world size {self.world_size} does not match the process group's "
                f"{dist.get_world_size()} ranks"
            )
        num_views = len(self.datamanager.train_dataset)
        if num_views < self.world_size:
            raise OdinInputError(
                f"{self.world_size} ranks but only {num_views} training views: "
                "every rank needs at least one view per step"
            )
        model_cfg = self.model.config
        if model_cfg.camera_optimizer.mode != "off" or model_cfg.use_bilateral_grid:
            raise OdinInputError(
                "the camera optimizer and bilateral grid are dense parameters that Odin does not "
                "synchronize; run with --pipeline.model.camera-optimizer.mode off and "
                "--pipeline.model.use-bilateral-grid False"
            )

    # ------------------------------------------------------------------ the step

    def distributed_train_iteration(self, step: int, optimizers: Optimizers):
        """One global step on this rank; returns (loss, loss_dict, metrics_dict)."""
        if self.engine is None or step >= self._phase_end:
            self._start_phase(step, optimizers)
        assert self.engine is not None and self.plan is not None
        started = time.time()
        t = step - self._phase_start
        wait_s = self.engine.validate(step)

        tic = time.perf_counter()
        rows = torch.from_numpy(self.plan.step_footprint(t, self.rank)).to(self.device)
        self.model.active_rows = rows
        optimizers.zero_grad_all()
        _, loss_dict, metrics_dict = self.get_train_loss_dict(step=step)
        loss = sum(loss_dict.values())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"rank {self.rank}: non-finite loss at step {step}; nothing from this step was "
                "published, so every replica still holds the last finite state"
            )
        loss.backward()
        grads = {name: self.model.gauss_params[name].grad for name in GAUSSIAN_GROUPS}
        for name, grad in grads.items():
            if grad is not None and not torch.isfinite(grad[rows]).all():
                raise FloatingPointError(
                    f"rank {self.rank}: non-finite gradient of '{name}' at step {step}; "
                    "refusing to publish it"
                )
        if self.config.emulate_jitter_ms > 0:
            rng = np.random.default_rng([self._plan_seed(), self.rank, step])
            time.sleep(rng.exponential(self.config.emulate_jitter_ms) / 1000.0)
        compute_s = time.perf_counter() - tic
        self.engine.publish(step, grads, self.model.visible_rows)
        self._accumulate_densification_stats(step, rows)
        self.engine.progress()

        if self._is_structural_step(step):
            self._structural_change(step, optimizers)
            self._phase_end = step + 1
        optimizers.scheduler_step_all(step)

        record = {
            "step": step,
            "view": self.datamanager.plan_view(step),
            "compute_s": compute_s,
            "wait_s": wait_s,
            "start": started,
            "end": time.time(),
        }
        self._step_log.append(record)
        shown = self.panels is not None and self.panels.panels is not None
        if shown and step % self.config.snapshot_every == 0:
            self.sync_snapshot = self._build_snapshot(step)
        metrics_dict["odin_wait_s"] = wait_s
        metrics_dict["odin_compute_s"] = compute_s
        return loss, loss_dict, metrics_dict

    # ------------------------------------------------------------------ phases

    def _is_structural_step(self, step: int) -> bool:
        s = self.model.strategy
        if step >= s.refine_stop_iter:
            return False
        refine = (
            step > s.refine_start_iter
            and step % s.refine_every == 0
            and step % s.reset_every >= s.pause_refine_after_reset
        )
        return refine or step % s.reset_every == 0

    def _next_structural_step(self, step: int) -> int | None:
        s = self.model.strategy
        for candidate in range(step, min(step + self.config.max_phase_steps, s.refine_stop_iter)):
            if self._is_structural_step(candidate):
                return candidate
        return None

    def _start_phase(self, step: int, optimizers: Optimizers) -> None:
        """Drain, recompute footprints, build this phase's plan, rebind the runtime."""
        if self.engine is not None:
            self.engine.drain()
        tic = time.perf_counter()
        self._exchange_at_phase_start()
        footprints = self._gather_footprints()
        structural = self._next_structural_step(step)
        end = structural + 1 if structural is not None else step + self.config.max_phase_steps
        num_steps = max(1, end - step)
        # Continue the previous phase's epoch, so every view is still trained once per epoch.
        resume = self.plan.resume(step - self._phase_start) if self.plan is not None else {}
        plan = build_plan(
            footprints,
            num_ranks=self.world_size,
            num_steps=num_steps,
            views_per_rank=1,
            seed=self._plan_seed(),
            strategy=self.config.plan_strategy,
            **resume,
        )
        self._check_same_plan(plan.plan_hash)
        self.plan = plan
        self._phase_start, self._phase_end = step, step + num_steps
        self.datamanager.set_plan_views(plan.views[:, self.rank, 0], start_step=step)
        groups = self._param_group_states(optimizers)
        if self.engine is None:
            self.engine = PrimitiveSyncEngine(
                groups,
                plan,
                self.rank,
                self.world_size,
                config=self.config.sync,
                process_group=self._sync_group(),
                step_offset=step,
            )
        else:
            versions = None
            if self.model.num_points != self.engine.num_rows:
                # Densified: after the drain every primitive is current up to the last step.
                versions = torch.full((self.model.num_points,), step - 1, dtype=torch.int64)
            self.engine.rebind(groups, plan, step_offset=step, versions=versions)
        self._phase_log.append(
            {
                "phase": self._phase_index,
                "start_step": step,
                "num_steps": num_steps,
                "num_gaussians": self.model.num_points,
                "plan_seconds": time.perf_counter() - tic,
                "mean_footprint_rows": float(np.mean(plan.message_rows)),
                "views_per_rank": plan.views_per_rank,
                "predicted_conflict": float(np.mean(plan_conflict(plan))) if num_steps > 1 else 0.0,
            }
        )
        self._phase_index += 1

    def _sync_group(self):
        """The runtime's point-to-point transport runs on gloo (see docs/architecture.md)."""
        if dist.get_backend() == "gloo":
            return None
        if self._gloo_group is None:
            self._gloo_group = dist.new_group(backend="gloo")
        return self._gloo_group

    def _exchange_at_phase_start(self) -> None:
        """At a drain point: rank 0 collects peers' step logs; every rank adopts the panels'
        requested tau / K (a request only ever takes effect here, identically on all ranks)."""
        request = self.panels.requested_settings() if self.panels is not None else {}
        mine = (self._step_log[self._gathered_upto :], request)
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, mine)
        self._gathered_upto = len(self._step_log)
        if self.rank == 0:
            for rank, (steps, _) in enumerate(parts):
                self._peer_steps.setdefault(rank, []).extend(steps)
        request = parts[0][1]
        if request:
            self.config.sync.tau = float(request.get("tau", self.config.sync.tau))
            self.config.sync.staleness_window = int(
                request.get("K", self.config.sync.staleness_window)
            )
            if self.engine is not None:
                self.engine.config.tau = self.config.sync.tau
                self.engine.config.staleness_window = self.config.sync.staleness_window

    def _build_snapshot(self, step: int, window: int = 200) -> dict:
        """What the viewer panels show: this rank live, peers as of the last phase start."""
        assert self.engine is not None
        bytes_by_step = {m.step: m.bytes_sent for m in self.engine.metrics[-window:]}
        ranks = []
        for rank in range(self.world_size):
            steps = self._step_log if rank == 0 else self._peer_steps.get(rank, [])
            steps = steps[-window:]
            ranks.append(
                {
                    "rank": rank,
                    "steps": [s["step"] for s in steps],
                    "compute_s": [s["compute_s"] for s in steps],
                    "wait_s": [s["wait_s"] for s in steps],
                    "bytes_sent": [bytes_by_step.get(s["step"], 0) for s in steps]
                    if rank == 0
                    else [],
                }
            )
        # Barrier estimate: every step waits for the slowest rank's compute.
        by_step: dict[int, list[float]] = {}
        for rank in range(self.world_size):
            source = self._step_log if rank == 0 else self._peer_steps.get(rank, [])
            for s in source:
                by_step.setdefault(s["step"], []).append(s["compute_s"])
        full = [v for v in by_step.values() if len(v) == self.world_size]
        barrier = sum(max(v) - min(v) for v in full) if full else None
        complete = {k for k, v in by_step.items() if len(v) == self.world_size}
        odin_wait = sum(s["wait_s"] for s in self._step_log if s["step"] in complete)
        summary = self.engine.summary()
        phase = self._phase_log[-1] if self._phase_log else {}
        return {
            "step": step,
            "mode": self.config.sync.mode,
            "world_size": self.world_size,
            "ranks": ranks,
            "barrier_wait_estimate_s": barrier,
            "odin_wait_s": odin_wait,
            "wait_hidden": (1.0 - odin_wait / barrier) if barrier else None,
            "staleness_hist": summary.get("staleness_hist", {}),
            "admitted": summary.get("admitted", 0),
            "fallbacks": summary.get("fallbacks", {}),
            "plan": {
                "phase": phase.get("phase"),
                "start_step": phase.get("start_step"),
                "num_steps": phase.get("num_steps"),
                "views_per_rank": phase.get("views_per_rank"),
                "predicted_conflict": phase.get("predicted_conflict"),
                "rebuilt_at_step": phase.get("start_step"),
            },
            "tau": self.config.sync.tau,
            "staleness_window": self.config.sync.staleness_window,
        }

    def _plan_seed(self) -> int:
        return int(self.datamanager.config.train_cameras_sampling_seed)

    @torch.no_grad()
    def _gather_footprints(self):
        """Footprints of all training views; each rank computes every R-th view."""
        import scipy.sparse as sp

        cameras = self.datamanager.train_dataset.cameras
        views = np.arange(self.rank, len(cameras), self.world_size)
        model = self.model
        viewmats = get_viewmat(cameras.camera_to_worlds[views].to(self.device))
        Ks = cameras.get_intrinsics_matrices()[views].to(self.device)
        local = compute_footprints(
            means=model.means.detach(),
            scales=torch.exp(model.scales.detach()),
            quats=model.quats.detach(),
            opacities=torch.sigmoid(model.opacities.detach()).squeeze(-1),
            viewmats=viewmats,
            Ks=Ks,
            width=int(cameras.width[0].item()),
            height=int(cameras.height[0].item()),
            margin_px=self.config.footprint_margin_px,
        )
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, (views, local))
        num_views, num_prims = len(cameras), model.num_points
        rows = np.concatenate([v for v, _ in parts])
        stacked = sp.vstack([f for _, f in parts]).tocsr()
        order = np.argsort(rows)
        footprints = stacked[order]
        assert footprints.shape == (num_views, num_prims)
        return footprints

    def _check_same_plan(self, plan_hash: str) -> None:
        hashes: list = [None] * self.world_size
        dist.all_gather_object(hashes, plan_hash)
        if len(set(hashes)) != 1:
            raise RuntimeError(f"ranks built different plans ({hashes}); replicas have diverged")

    def _param_group_states(self, optimizers: Optimizers) -> list[ParamGroupState]:
        groups = []
        for name in GAUSSIAN_GROUPS:
            param = self.model.gauss_params[name]
            opt = optimizers.optimizers[name]
            state = opt.state[param]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param)
                state["exp_avg_sq"] = torch.zeros_like(param)
            group = opt.param_groups[0]
            groups.append(
                ParamGroupState(
                    name=name,
                    param=param,
                    exp_avg=state["exp_avg"],
                    exp_avg_sq=state["exp_avg_sq"],
                    lr_at=_lr_schedule(optimizers, name),
                    betas=tuple(group["betas"]),
                    eps=float(group["eps"]),
                )
            )
        return groups

    # ------------------------------------------------------------------ densification

    def _accumulate_densification_stats(self, step: int, rows: Tensor) -> None:
        """This rank's share of DefaultStrategy's running statistics, in full-size rows."""
        strategy = self.model.strategy
        if step >= strategy.refine_stop_iter:
            return
        info = self.model.info
        means2d = info["means2d"]
        grad = means2d.absgrad if strategy.absgrad else means2d.grad
        if grad is None:
            return
        n = self.model.num_points
        cams = grad.shape[0]
        full_grad = torch.zeros(cams, n, 2, device=grad.device)
        full_grad[:, rows] = grad
        full_radii = torch.zeros(cams, n, dtype=info["radii"].dtype, device=grad.device)
        full_radii[:, rows] = info["radii"]
        holder = torch.zeros(cams, n, 2, device=grad.device)
        holder.absgrad = full_grad
        holder.grad = full_grad
        full_info = dict(info, means2d=holder, radii=full_radii)
        strategy._update_state(self.model.gauss_params, self.model.strategy_state, full_info)

    def _structural_change(self, step: int, optimizers: Optimizers) -> None:
        """Refine / reset identically on every replica (after a drain)."""
        from gsplat.strategy.ops import reset_opa

        assert self.engine is not None
        self.engine.drain()
        model, strategy, state = self.model, self.model.strategy, self.model.strategy_state
        for key, op in (
            ("grad2d", dist.ReduceOp.SUM),
            ("count", dist.ReduceOp.SUM),
            ("radii", dist.ReduceOp.MAX),
        ):
            if state.get(key) is not None:
                dist.all_reduce(state[key], op=op)
        params, opts = model.gauss_params, optimizers.optimizers
        before = model.num_points
        # Splits sample from the RNG: every replica must draw the same numbers.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._plan_seed() * 1_000_003 + step)
            refine = (
                step > strategy.refine_start_iter
                and step % strategy.refine_every == 0
                and step % strategy.reset_every >= strategy.pause_refine_after_reset
            )
            if refine and state.get("grad2d") is not None:
                strategy._grow_gs(params, opts, state, step)
                strategy._prune_gs(params, opts, state, step)
                state["grad2d"].zero_()
                state["count"].zero_()
                if state.get("radii") is not None:
                    state["radii"].zero_()
            if step % strategy.reset_every == 0:
                reset_opa(
                    params=params, optimizers=opts, state=state, value=strategy.prune_opa * 2.0
                )
        if self.rank == 0 and model.num_points != before:
            CONSOLE.log(f"step {step}: densification {before} -> {model.num_points} Gaussians")

    # ------------------------------------------------------------------ drains and metrics

    def drain(self, sync_optimizer_steps: Optimizers | None = None) -> None:
        """Apply every pending update on every replica (checkpoints, evaluation, the end)."""
        if self.engine is None:
            return
        self.engine.drain()
        if sync_optimizer_steps is not None:
            applied = int(self.engine.versions.max().item()) + 1
            for name in GAUSSIAN_GROUPS:
                opt = sync_optimizer_steps.optimizers[name]
                for state in opt.state.values():
                    state["step"] = torch.tensor(float(applied))

    def replica_hash(self) -> str:
        """sha256 of every Gaussian parameter: equal on all ranks after a drain."""
        digest = hashlib.sha256()
        for name in GAUSSIAN_GROUPS:
            digest.update(
                self.model.gauss_params[name].detach().cpu().contiguous().numpy().tobytes()
            )
        return digest.hexdigest()

    def run_summary(self) -> dict:
        """Per-rank metrics gathered on every rank (call at a drain point)."""
        mine = {
            "rank": self.rank,
            "replica_hash": self.replica_hash(),
            "engine": self.engine.summary() if self.engine is not None else {},
            "steps": self._step_log,
            "phases": self._phase_log,
        }
        ranks: list = [None] * self.world_size
        dist.all_gather_object(ranks, mine)
        return {"world_size": self.world_size, "sync": self.config.sync.mode, "ranks": ranks}

    def write_run_summary(self, base_dir: Path) -> None:
        summary = self.run_summary()
        if self.rank == 0:
            path = Path(self.config.run_summary_path or Path(base_dir) / "odin_run.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=1))
            waits = [sum(s["wait_s"] for s in r["steps"]) for r in summary["ranks"]]
            writer.put_scalar("odin/total_wait_s_max_rank", max(waits), step=0)
            CONSOLE.log(f"Odin run summary written to {path}")


def _lr_schedule(optimizers: Optimizers, name: str):
    """Learning rate nerfstudio's scheduler gives group ``name`` at global step ``s``."""
    scheduler = optimizers.schedulers.get(name)
    base_lr = float(optimizers.optimizers[name].param_groups[0]["lr"])
    if scheduler is None:
        return lambda s: base_lr
    base = float(scheduler.base_lrs[0])
    fn = scheduler.lr_lambdas[0]
    return lambda s: base * float(fn(s))
