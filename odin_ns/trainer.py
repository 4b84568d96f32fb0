"""OdinTrainer: nerfstudio's Trainer; in distributed runs it owns Odin's step.

With one process it is nerfstudio's Trainer unchanged. With several, ``train_iteration``
keeps nerfstudio's step shape (zero_grad, forward, loss, backward, scheduler step) and asks
a ``TrainingSession`` (``odin_ns.distributed.session_api``; replicated or sharded layout)
before and after backward: wait for the peer updates the step reads, publish its own, apply
what arrived. There is no local ``optimizer.step()`` and no
DDP all-reduce: the runtime applies each Gaussian update. Every point where someone reads
the whole model (checkpoint, evaluation, end of training) first drains the runtime, so what
is saved or measured is exactly the barrier-synchronous state.

Batches (``--pipeline.views-per-rank B``): a step trains B views per rank. The step loops
over them (splatfacto's model is unchanged: one camera per forward): forward, loss / B,
backward (gradients accumulate: the loss is the mean over the B views, as in gsplat's batched
trainer), then one publish; the visible rows are the OR over the B views and densification
statistics accumulate per view. One process with B > 1 runs the same loop, then one
optimizer step. The effective batch is ``E = R x B``: the trainer config converts every
step-based schedule from views to steps of E views (``odin_ns.distributed.batch_schedule``)
and the optimizers are scaled for E (``optimizer_binding.apply_batch_scaling``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from gsplat.strategy import DefaultStrategy
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils import comms
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE

from odin_ns import resume
from odin_ns.cuda import ops as ext_ops
from odin_ns.distributed import batch_schedule, sharded_session
from odin_ns.distributed.densify import ReplicatedDensifier
from odin_ns.distributed.optimizer_binding import (
    apply_batch_scaling,
    rebind_optimizer_params,
    store_plain_float_learning_rates,
)
from odin_ns.distributed.session import ReplicatedSession
from odin_ns.distributed.session_api import StepReads, StepTiming, TrainingSession
from odin_ns.distributed.sharded_checkpoint import read_checkpoint, row_ranges, take_rows
from odin_ns.errors import OdinInputError, first_line, non_finite_loss
from odin_ns.model import GAUSSIAN_GROUPS, RenderedView, union_visible
from odin_ns.pipeline import OdinPipeline, OdinPipelineConfig
from odin_ns.preflight import (
    check_checkpoint_gaussians,
    check_checkpoint_row_cap,
    check_mixed_precision,
    check_row_cap,
)


def keep_setup_out_of_collections() -> None:
    """Collect once, then leave every object alive now (about a million after nerfstudio's,
    torch's and gsplat's imports and the set-up) out of the garbage collector's later passes
    (``gc.freeze``): they live for the whole run. A full collection otherwise walks all of
    them: on the CPU machine it paused each rank for about 0.4 s (20 street steps) once in a
    300-step run, at a different step on each rank, a straggler that a barrier pays in full.
    Collections of what training makes still run."""
    gc.collect()
    gc.freeze()


def bind_cuda_device(device: str) -> None:
    """Make ``device`` (the trainer's: ``cuda:{local_rank}`` under ``ns-train
    --machine.num-devices N``) this process's current CUDA device, before anything is made
    on it. torch's object collectives and NCCL run on the current device, and nerfstudio's
    worker binds none, so every rank's would run on ``cuda:0`` (``odin-ns-train`` binds its
    ranks itself, ``launch._bind_cuda_device``: the same device). Nothing for other devices."""
    where = torch.device(device)
    if where.type == "cuda" and where.index is not None:
        torch.cuda.set_device(where)


@dataclass
class OdinTrainerConfig(TrainerConfig):
    """Trainer config for odin-splatfacto."""

    _target: type = field(default_factory=lambda: OdinTrainer)
    pipeline: OdinPipelineConfig = field(default_factory=OdinPipelineConfig)

    def save_config(self) -> None:
        # Saved configs point at the run's sync summary, so ns-viewer can show its panels.
        self.pipeline.run_summary_path = self.get_base_dir() / "odin_run.json"
        super().save_config()

    def setup(self, **kwargs) -> OdinTrainer:
        """The trainer, built from a copy of this config whose step-based settings are
        converted from views to steps of the effective batch (``schedule_in_views``).

        The saved ``config.yml`` keeps the settings in views, so a resume on any world size
        converts them again for its own batch.
        """
        world_size = int(kwargs.get("world_size", 1))
        config = copy.deepcopy(self)
        batch = batch_schedule.effective_batch(world_size, config.pipeline.views_per_rank)
        if config.pipeline.schedule_in_views and batch > 1:
            changes = batch_schedule.convert_trainer_config(config, batch)
            if comms.get_rank() == 0:
                CONSOLE.print(
                    batch_schedule.format_conversions(
                        changes, world_size, config.pipeline.views_per_rank
                    )
                )
        return config._target(config, **kwargs)


class OdinTrainer(Trainer):
    """Trainer whose distributed step synchronizes per primitive (see the module docstring)."""

    pipeline: OdinPipeline
    config: OdinTrainerConfig
    session: TrainingSession | None = None
    _resumed: dict[str, Any] | None = None  # the checkpoint's "odin" entry, same world size
    _checkpoint_rows: int | None = None  # sharded resume: N of the checkpoint read in ranges
    _densifier: ReplicatedDensifier | None = None  # one process, B > 1: per-view statistics

    @property
    def views_per_rank(self) -> int:
        """B: views each rank trains per step."""
        return int(self.config.pipeline.views_per_rank)

    @property
    def effective_batch(self) -> int:
        """E = R x B: views per optimizer step of the whole run."""
        return batch_schedule.effective_batch(self.world_size, self.views_per_rank)

    def setup_optimizers(self):
        """nerfstudio's optimizers, scaled for the effective batch (before any checkpoint
        is loaded: a checkpoint's param groups and schedulers hold the scaled values)."""
        optimizers = super().setup_optimizers()
        rule = self.config.pipeline.batch_scaling
        scaling = apply_batch_scaling(optimizers, rule, self.effective_batch)
        if self.effective_batch > 1 and comms.get_rank() == 0:
            CONSOLE.print(
                f"batch scaling '{rule}' for {self.effective_batch} views per step: lr x "
                f"{scaling.lr_factor:.4g}, eps x {scaling.eps_factor:.4g}, betas ** "
                f"{scaling.beta_power}"
            )
        return optimizers

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        check_mixed_precision(self.mixed_precision, self.world_size)  # (ns-train's ranks)
        bind_cuda_device(self.device)
        super().setup(test_mode)  # loads a checkpoint, if one is given
        resumed = self._resumed
        self._adapt_strategy_to_batch()
        if not self.pipeline.distributed:
            if self.views_per_rank > 1:
                # The loop accumulates each view's statistics (gsplat's strategy sees one
                # view per step_post_backward), then refines after the optimizer step.
                model = self.pipeline.model
                if not isinstance(model.strategy, DefaultStrategy):
                    raise OdinInputError(
                        "--pipeline.views-per-rank > 1 on one process needs the default "
                        "strategy (MCMC's per-step noise is not batched); use B = 1"
                    )
                model.external_densification = True
                seed = int(self.pipeline.datamanager.config.train_cameras_sampling_seed)
                self._densifier = ReplicatedDensifier(model.strategy, model.strategy_state, seed)
                self._densifier.ensure_state(model.num_points, model.means.device)
        self._check_row_cap("before training")
        self._load_kernels()
        if self.pipeline.distributed:
            self.session = self._open_session(resumed)
        if resumed is not None:
            # Last, so that nothing in the set-up draws from the restored generators.
            mine = resumed["ranks"][self._rank]
            resume.restore_rng_state(mine["rng"])
            if mine.get("datamanager") is not None:
                resume.restore_datamanager_state(self.pipeline.datamanager, mine["datamanager"])
        keep_setup_out_of_collections()

    def _load_kernels(self) -> None:
        """Build (if needed) and load the primitive-sync extension for the model's device
        now, in set-up: the first footprint and sync ops would otherwise load it inside the
        first phase start (an import of setuptools, a compiler probe and the build lock:
        0.05-0.3 s on the CPU machine, once per process). A failed build falls back to the
        torch references, as the ops always do; rank 0 says which is used."""
        tic = time.perf_counter()
        status = ext_ops.status(self.pipeline.model.means.device.type)
        if self._rank == 0:
            what = "compiled kernels" if status.compiled else f"torch references ({status.reason})"
            CONSOLE.log(
                f"odin_ns ops on {status.device_type}: {what}, loaded in "
                f"{time.perf_counter() - tic:.2f} s"
            )

    def _open_session(self, resumed: dict | None) -> TrainingSession:
        """The distributed step's session: sharded ownership or replicated replicas."""
        phase = resumed["phase"] if resumed is not None else None
        if self.sharded:
            return sharded_session.open_session(
                self, resumed_phase=phase, checkpoint_rows=self._checkpoint_rows
            )
        return ReplicatedSession(
            self.pipeline,
            self.optimizers,
            checkpoint_every=self.config.steps_per_save,
            resumed_phase=phase,
            live_panels=self.viewer_on,
        )

    @property
    def viewer_on(self) -> bool:
        """Whether the run shows nerfstudio's viewer (its panels, and what they read)."""
        return self.config.is_viewer_enabled() or self.config.is_viewer_legacy_enabled()

    @property
    def sharded(self) -> bool:
        return self.config.pipeline.parallel == "sharded"

    def _check_row_cap(self, when: str) -> None:
        """``--pipeline.max-rows-per-rank`` in replicated training (every rank holds the
        whole model); the sharded session checks its resident rows at each phase start."""
        cap = int(self.config.pipeline.max_rows_per_rank)
        if cap != 0 and not self.sharded:  # 0: no bound (a negative cap is refused)
            check_row_cap(self.pipeline.model.num_points, cap, when)

    @property
    def _rank(self) -> int:
        return self.pipeline.rank

    def _adapt_strategy_to_batch(self) -> None:
        """splatfacto builds the strategy's pause after an opacity reset as
        ``num_train_data + refine_every`` steps; with ``schedule_in_views`` the epoch of
        views it stands for is converted to steps of the effective batch too."""
        batch = self.effective_batch
        if batch == 1 or not self.config.pipeline.schedule_in_views:
            return
        model = self.pipeline.model
        strategy = model.strategy
        if not isinstance(strategy, DefaultStrategy):  # MCMC resets no opacities
            return
        views = int(model.num_train_data) + int(self.config.pipeline.model.refine_every) * batch
        strategy.pause_refine_after_reset = batch_schedule.pause_refine_after_reset_steps(
            int(model.num_train_data), int(self.config.pipeline.model.refine_every), batch
        )
        if comms.get_rank() == 0:
            CONSOLE.print(
                f"  strategy.pause_refine_after_reset  {views:>8} -> "
                f"{strategy.pause_refine_after_reset}"
            )

    def train_iteration(self, step: int):
        if self.session is None:
            if self.views_per_rank == 1:
                out = super().train_iteration(step)
            else:
                out = self._train_iteration_one_process(step)
            self._check_row_cap(f"after step {step}")
            return out
        started = time.time()
        reads = self.session.before_step(step)
        tic = time.perf_counter()
        self.optimizers.zero_grad_all()
        loss, loss_dict, metrics_dict, views = self._views_forward_backward(step, reads)
        timing = StepTiming(started=started, wait_s=reads.wait_s, compute_started=tic)
        compute_s = self.session.after_backward(step, views, timing)
        self.optimizers.scheduler_step_all(step)
        self._check_row_cap(f"after step {step}")  # densification grows the replicas
        metrics_dict["odin_wait_s"] = reads.wait_s
        metrics_dict["odin_compute_s"] = compute_s
        return loss, loss_dict, metrics_dict

    def _views_forward_backward(
        self, step: int, reads: StepReads | None = None, mixed_precision: bool = False
    ):
        """Forward, loss / B and backward for each of the step's B views (gradients
        accumulate), drawing the rows ``reads`` allows (None: every row). Returns (loss,
        loss_dict, metrics_dict, views): the mean over the views of the losses and metrics,
        and each view's ``RenderedView`` with ``n_cameras`` scaled by B in its info (what
        gsplat's strategy does for a batch whose loss is the mean over its cameras)."""
        count = self.views_per_rank
        model = self.pipeline.model
        rows = None if reads is None else reads.rows
        device = self.device.split(":")[0]
        device = "cpu" if device == "mps" else device
        views: list[RenderedView] = []
        losses: list[torch.Tensor] = []
        loss_dicts: list[dict] = []
        metrics_dicts: list[dict] = []
        for camera, batch in self.pipeline.datamanager.next_train_views(step, count):
            with torch.autocast(device_type=device, enabled=mixed_precision):
                outputs, view = model.render_training_view(camera, rows)
                metrics = model.get_metrics_dict(outputs, batch)
                loss_dict = model.get_loss_dict(outputs, batch, metrics)
                loss = functools.reduce(torch.add, loss_dict.values())
            scaled = loss if count == 1 else loss / count
            if mixed_precision:
                self.grad_scaler.scale(scaled).backward()
            else:
                scaled.backward()
            # (whether the loss is finite is read after the backward, with the gradients'
            # flags where a session publishes them: reading it here would wait for the
            # forward before the backward is queued)
            finite = torch.isfinite(loss.detach())
            info = batch_view_info(view.info, count)
            views.append(dataclasses.replace(view, info=info, loss_finite=finite))
            losses.append(loss)
            loss_dicts.append(loss_dict)
            metrics_dicts.append(metrics)
        if count == 1:
            return losses[0], loss_dicts[0], metrics_dicts[0], views
        loss = torch.stack([x.detach() for x in losses]).mean()
        return loss, mean_dicts(loss_dicts), mean_dicts(metrics_dicts), views

    def _train_iteration_one_process(self, step: int):
        """One process, B > 1: the same loop, one optimizer step, then gsplat's refine on the
        statistics of the step's B views (after the optimizer step, where splatfacto's
        ``step_post_backward`` callback runs)."""
        assert self._densifier is not None
        model = self.pipeline.model
        self.optimizers.zero_grad_all()
        loss, loss_dict, metrics_dict, views = self._views_forward_backward(
            step, mixed_precision=self.mixed_precision
        )
        if not bool(torch.stack([view.loss_finite for view in views]).all()):
            raise non_finite_loss(self._rank, step)
        model.visible_rows = union_visible(views)  # SelectiveAdam's mask for the step
        rows = torch.arange(model.num_points, device=model.means.device)
        for view in views:
            self._densifier.accumulate(step, view.info, rows, model.num_points)
        self.optimizers.optimizer_scaler_step_all(self.grad_scaler)
        scale = self.grad_scaler.get_scale()
        self.grad_scaler.update()
        if scale <= self.grad_scaler.get_scale():
            self.optimizers.scheduler_step_all(step)
        if self._densifier.is_structural(step):
            self._densifier.apply(step, model.gauss_params, self.optimizers.optimizers)
        return loss, loss_dict, metrics_dict

    def eval_iteration(self, step: int) -> None:
        enabled = (
            self.config.is_wandb_enabled()
            or self.config.is_tensorboard_enabled()
            or self.config.is_comet_enabled()
        )
        due = enabled and any(
            step_check(step, every)
            for every in (
                self.config.steps_per_eval_batch,
                self.config.steps_per_eval_image,
                self.config.steps_per_eval_all_images,
            )
        )
        if self.session is None or not due:
            return super().eval_iteration(step)
        self.session.drain()
        with self.session.evaluation(step) as evaluate_here:
            if evaluate_here:
                super().eval_iteration(step)

    @property
    def training_state(self) -> Literal["training", "paused", "completed"]:
        return self.__dict__.get("_training_state", "training")

    @training_state.setter
    def training_state(self, value: Literal["training", "paused", "completed"]) -> None:
        """The viewer's pause pauses rank 0 alone: while paused it tells its peers it is busy."""
        self.__dict__["_training_state"] = value
        if self.session is not None:
            self.session.set_paused(value == "paused")

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_path(self) -> Path | None:
        load_dir, load_checkpoint = self.config.load_dir, self.config.load_checkpoint
        if load_dir is not None:
            step = self.config.load_step
            if step is None:  # nerfstudio's naming: step-000000123.ckpt
                names = [p.name for p in Path(load_dir).glob("step-*.ckpt")]
                if not names:
                    raise OdinInputError(f"no checkpoint (step-*.ckpt) in '{load_dir}'")
                step = max(int(n[len("step-") : -len(".ckpt")]) for n in names)
            return Path(load_dir) / f"step-{step:09d}.ckpt"
        return Path(load_checkpoint) if load_checkpoint is not None else None

    def _load_checkpoint(self) -> None:
        """nerfstudio's resume, plus the state exact resume needs (``odin_ns.resume``)."""
        path = self._checkpoint_path()
        if path is None:
            CONSOLE.print("No Nerfstudio checkpoint to load, so training from scratch.")
            return
        try:
            if not path.exists():
                raise FileNotFoundError("the file does not exist")
            loaded = read_checkpoint(path)  # a memory map: tensors are read when touched
        except Exception as err:  # any failure to read it: unpickling raises many types
            raise OdinInputError(
                f"cannot resume from checkpoint '{path}': {first_line(err)}"
            ) from err
        rows = self._check_checkpoint_gaussians(path, loaded)
        if self.sharded and self.pipeline.distributed:
            loaded = self._take_loaded_range(path, loaded, rows)
        try:
            self.pipeline.load_pipeline(loaded["pipeline"], loaded["step"])
            rebind_optimizer_params(
                self.optimizers, self.pipeline.model.gauss_params, GAUSSIAN_GROUPS
            )
            self.optimizers.load_optimizers(loaded["optimizers"])
            if "schedulers" in loaded and self.config.load_scheduler:
                self.optimizers.load_schedulers(loaded["schedulers"])
            self.grad_scaler.load_state_dict(loaded["scalers"])
        except Exception as err:  # a checkpoint nerfstudio's loading rejects
            raise OdinInputError(
                f"cannot resume from checkpoint '{path}': {first_line(err)}"
            ) from err
        self._start_step = loaded["step"] + 1
        self._restore_odin_state(loaded.get("odin"), path)
        CONSOLE.print(f"Done loading Nerfstudio checkpoint from {path}")

    def _take_loaded_range(self, path: Path, loaded: Mapping, n: int) -> dict:
        """Sharded resume: the checkpoint (of ``n`` Gaussians) with only this rank's
        contiguous range of its Gaussians and their moments (``sharded_checkpoint.take_rows``),
        so no rank reads the whole model; the session's first phase start moves the rows to
        their owners."""
        world_size = self.pipeline.world_size
        check_checkpoint_row_cap(
            path, n, world_size, int(self.config.pipeline.max_rows_per_rank), "sharded"
        )
        bounds = row_ranges(n, world_size)
        self._checkpoint_rows = n
        return take_rows(loaded, int(bounds[self._rank]), int(bounds[self._rank + 1]))

    def _check_checkpoint_gaussians(self, path: Path, loaded: Mapping) -> int | None:
        """The checkpoint's Gaussians fit this run's model (group row counts agree, per-row
        shapes and moments match), before anything is loaded: one line, not a state-dict
        size mismatch from deep inside torch. Returns their number (None: no Gaussians)."""
        gauss = self.pipeline.model.gauss_params
        if not isinstance(loaded, Mapping) or not isinstance(loaded.get("pipeline"), Mapping):
            raise OdinInputError(
                f"cannot resume from checkpoint '{path}': not a nerfstudio checkpoint"
            )
        shapes = {name: tuple(gauss[name].shape[1:]) for name in GAUSSIAN_GROUPS if name in gauss}
        return check_checkpoint_gaussians(
            path, loaded["pipeline"], loaded.get("optimizers"), shapes
        )

    def _restore_odin_state(self, odin: dict | None, path: Path) -> None:
        model = self.pipeline.model
        world_size = self.pipeline.world_size
        if odin is None or odin.get("format") != resume.FORMAT:
            CONSOLE.print(
                f"note: '{path}' has no odin-ns resume state; training continues from its "
                "parameters, but the trajectory differs from an uninterrupted run"
            )
            return
        ranks = odin["ranks"]
        if len(ranks) == world_size:
            strategy = ranks[self._rank]["strategy"]
            self._resumed = odin
        else:
            # The refine step sums the ranks' statistics: give the sums to rank 0.
            strategy = resume.merge_strategy_states([r["strategy"] for r in ranks])
            if self._rank != 0:
                strategy = resume.zeros_like_strategy_state(strategy)
            CONSOLE.print(
                f"note: checkpoint of a {len(ranks)}-rank run resumed on {world_size} "
                f"rank(s): training continues, but the trajectory differs from here on"
            )
        resume.restore_strategy_state(model.strategy_state, strategy, model.means.device)

    def save_checkpoint(self, step: int) -> None:
        """A drained checkpoint with nerfstudio's layout plus every rank's resume state.

        Runs on every rank (the drain and the gather are collective); rank 0 writes.
        """
        if self.session is not None:
            self.session.drain()
        odin = self._resume_entry(step)
        store_plain_float_learning_rates(self.optimizers)
        path = self.checkpoint_dir / f"step-{step:09d}.ckpt"
        if self._rank == 0:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)

        def build_state() -> dict:
            """nerfstudio's checkpoint of this rank's model, with the resume entry."""
            return {
                "step": step,
                "pipeline": self.pipeline.state_dict(),
                "optimizers": {k: v.state_dict() for k, v in self.optimizers.optimizers.items()},
                "schedulers": {k: v.state_dict() for k, v in self.optimizers.schedulers.items()},
                "scalers": self.grad_scaler.state_dict(),
                "odin": odin,
            }

        if self.session is not None:  # collective: the layout merges the whole model
            self.session.save_checkpoint(path, build_state, self._write_checkpoint)
        else:
            self._write_checkpoint(build_state(), path)
        if self._rank != 0:
            return
        if self.config.save_only_latest_checkpoint:
            for old in self.checkpoint_dir.glob("*.ckpt"):
                if old != path:
                    old.unlink()

    def _resume_entry(self, step: int) -> dict:
        """The checkpoint's ``"odin"`` entry (``resume.resume_entry``): every rank's
        generators and statistics, gathered in rank order (collective; on rank 0, which
        writes the checkpoint: the others' entry has no ranks), and the phase state of a
        checkpoint taken after ``step`` (call after the drain)."""
        one_process = self.session is None
        mine = resume.capture_rank_state(
            self.pipeline.model.strategy_state,
            self.pipeline.datamanager if one_process else None,
        )
        ranks = [mine] if one_process else self.session.gather_to_first(mine)
        phase = None if one_process else self.session.resume_state(step)
        return resume.resume_entry(ranks, phase, "sharded" if self.sharded else "replicated")

    def _write_checkpoint(self, state: dict, path: Path) -> None:
        partial = path.with_suffix(".ckpt.partial")
        torch.save(state, partial)
        partial.replace(path)  # atomic: a crash mid-write never leaves a truncated step-*.ckpt

    def _after_train(self) -> None:
        if self.session is None:
            return super()._after_train()
        path = self.pipeline.config.run_summary_path or self.base_dir / "odin_run.json"
        self.session.finish(path)
        super()._after_train()  # the final checkpoint, the summary table, callbacks
        self.session.close()


def batch_view_info(info: Mapping, views_per_step: int) -> Mapping:
    """One view's rasterizer info for gsplat's statistics when the loss is the mean over
    ``views_per_step`` views: its ``means2d`` gradient is 1 / B of the single-view one, and
    gsplat's ``_update_state`` multiplies by ``n_cameras`` to undo a batch mean."""
    if views_per_step == 1:
        return info
    return {**info, "n_cameras": int(info["n_cameras"]) * views_per_step}


def mean_dicts(dicts: list[dict]) -> dict:
    """Key-wise mean of numeric (tensor or number) entries; others from the last dict."""
    out = dict(dicts[-1])
    for key in out:
        values = [d[key] for d in dicts if key in d]
        if all(isinstance(v, torch.Tensor) and v.numel() == 1 for v in values):
            out[key] = torch.stack([v.detach().float().reshape(()) for v in values]).mean()
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = sum(values) / len(values)
    return out
