"""OdinTrainer: nerfstudio's Trainer whose step is driven by the Odin pipeline.

With one process it is nerfstudio's Trainer unchanged. With several, the pipeline's
runtime applies parameter updates (there is no local ``optimizer.step()`` and no DDP
all-reduce), and every point where someone reads the whole model — checkpoint, evaluation,
end of training — first drains the runtime, so what is saved or measured is exactly the
barrier-synchronous state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils.misc import step_check

from odin_ns.errors import OdinInputError
from odin_ns.pipeline import OdinPipeline


@dataclass
class OdinTrainerConfig(TrainerConfig):
    """Trainer config for odin-splatfacto."""

    _target: type = field(default_factory=lambda: OdinTrainer)

    def save_config(self) -> None:
        # Saved configs point at the run's sync summary, so ns-viewer can show its panels.
        self.pipeline.run_summary_path = self.get_base_dir() / "odin_run.json"
        super().save_config()


class OdinTrainer(Trainer):
    """Trainer that delegates distributed steps to :class:`OdinPipeline`."""

    pipeline: OdinPipeline

    @property
    def _distributed(self) -> bool:
        return isinstance(self.pipeline, OdinPipeline) and self.pipeline.distributed

    def train_iteration(self, step: int):
        if not self._distributed:
            return super().train_iteration(step)
        return self.pipeline.distributed_train_iteration(step, self.optimizers)

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
        if self._distributed and due:
            self.pipeline.drain()
        super().eval_iteration(step)

    def _load_checkpoint(self) -> None:
        try:
            super()._load_checkpoint()
        except Exception as err:  # any failure to read it: unpickling raises many types
            where = self.config.load_checkpoint or self.config.load_dir
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise OdinInputError(f"cannot resume from checkpoint '{where}': {reason}") from err

    def save_checkpoint(self, step: int) -> None:
        if self._distributed:
            self.pipeline.drain(sync_optimizer_steps=self.optimizers)
        # nerfstudio's exponential-decay scheduler leaves numpy floats in the learning rates;
        # torch >= 2.6 loads checkpoints with weights_only=True and rejects them, which breaks
        # ns-eval / ns-viewer. Store plain floats.
        for opt in self.optimizers.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = float(group["lr"])
        for scheduler in self.optimizers.schedulers.values():
            scheduler._last_lr = [float(lr) for lr in scheduler.get_last_lr()]
        super().save_checkpoint(step)

    def _after_train(self) -> None:
        if self._distributed:
            self.pipeline.drain(sync_optimizer_steps=self.optimizers)
            self.pipeline.write_run_summary(self.base_dir)
        super()._after_train()
