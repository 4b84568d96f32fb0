"""``ns-train odin-splatfacto``: splatfacto trained with Odin's primitive-level synchronization.

Three methods share the model, trainer and pipeline:

- ``odin-splatfacto``: splatfacto's settings (gsplat's DefaultStrategy);
- ``odin-splatfacto-big``: splatfacto-big's settings (lower cull and densify thresholds,
  faster bilateral grid);
- ``odin-splatfacto-mcmc``: gsplat's MCMCStrategy with the settings of gsplat's simple
  trainer's ``mcmc`` preset (cap_max, noise_lr, relocation schedule, init opacity 0.5 and
  scale 0.1, opacity and scale regularisers 0.01); the position noise is drawn per
  (seed, step, Gaussian) so replicas need no communication for it.

One process behaves like ``splatfacto`` (same model, loss, densification and learning
rates) with visibility-masked Adam, on CPU when no GPU is present. Several processes
(``--machine.num-devices N`` on GPUs, ``odin-ns-train --nproc-per-node N`` anywhere) train
replicas that synchronize per primitive, as ``--pipeline.sync.mode`` says.
"""

from __future__ import annotations

import torch
from nerfstudio.configs.base_config import MachineConfig, ViewerConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.engine.optimizers import AdamOptimizerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig
from nerfstudio.plugins.types import MethodSpecification

from odin_ns.datamanager import OdinDataManagerConfig
from odin_ns.model import OdinSplatfactoModelConfig
from odin_ns.optim import SelectiveAdamOptimizerConfig
from odin_ns.pipeline import OdinPipelineConfig
from odin_ns.trainer import OdinTrainerConfig


def _gaussian_optimizer(lr: float) -> SelectiveAdamOptimizerConfig:
    return SelectiveAdamOptimizerConfig(lr=lr, eps=1e-15)


def _trainer(
    method_name: str, model: OdinSplatfactoModelConfig, bilateral_grid_lr: float = 2e-3
) -> OdinTrainerConfig:
    return OdinTrainerConfig(
        method_name=method_name,
        steps_per_eval_image=100,
        steps_per_eval_batch=0,
        steps_per_save=2000,
        steps_per_eval_all_images=1000,
        max_num_iterations=30000,
        mixed_precision=False,
        machine=MachineConfig(device_type="cuda" if torch.cuda.is_available() else "cpu"),
        pipeline=OdinPipelineConfig(
            datamanager=OdinDataManagerConfig(
                dataparser=NerfstudioDataParserConfig(load_3D_points=True),
                cache_images_type="uint8",
            ),
            model=model,
        ),
        optimizers={
            "means": {
                "optimizer": _gaussian_optimizer(1.6e-4),
                "scheduler": ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=30000),
            },
            "features_dc": {"optimizer": _gaussian_optimizer(0.0025), "scheduler": None},
            "features_rest": {"optimizer": _gaussian_optimizer(0.0025 / 20), "scheduler": None},
            "opacities": {"optimizer": _gaussian_optimizer(0.05), "scheduler": None},
            "scales": {"optimizer": _gaussian_optimizer(0.005), "scheduler": None},
            "quats": {"optimizer": _gaussian_optimizer(0.001), "scheduler": None},
            "camera_opt": {
                "optimizer": AdamOptimizerConfig(lr=1e-4, eps=1e-15),
                "scheduler": ExponentialDecaySchedulerConfig(
                    lr_final=5e-7, max_steps=30000, warmup_steps=1000, lr_pre_warmup=0
                ),
            },
            "bilateral_grid": {
                "optimizer": AdamOptimizerConfig(lr=bilateral_grid_lr, eps=1e-15),
                "scheduler": ExponentialDecaySchedulerConfig(
                    lr_final=1e-4, max_steps=30000, warmup_steps=1000, lr_pre_warmup=0
                ),
            },
        },
        viewer=ViewerConfig(num_rays_per_chunk=1 << 15),
        vis="viewer",
    )


odin_splatfacto = MethodSpecification(
    config=_trainer("odin-splatfacto", OdinSplatfactoModelConfig()),
    description="Splatfacto with Odin primitive-level synchronization for multi-process training.",
)

odin_splatfacto_big = MethodSpecification(
    config=_trainer(
        "odin-splatfacto-big",
        OdinSplatfactoModelConfig(cull_alpha_thresh=0.005, densify_grad_thresh=0.0005),
        bilateral_grid_lr=5e-3,
    ),
    description="splatfacto-big's settings with Odin primitive-level synchronization.",
)

odin_splatfacto_mcmc = MethodSpecification(
    config=_trainer(
        "odin-splatfacto-mcmc",
        OdinSplatfactoModelConfig(
            strategy="mcmc",
            cap_max=1_000_000,
            noise_lr=5e5,
            mcmc_min_opacity=0.005,
            warmup_length=500,
            refine_every=100,
            stop_split_at=25_000,
            init_opacity=0.5,
            init_scale=0.1,
            opacity_reg=0.01,
            scale_reg=0.01,
        ),
    ),
    description="Splatfacto with gsplat's MCMC strategy (3DGS as MCMC) and Odin "
    "primitive-level synchronization; the position noise needs no communication.",
)
