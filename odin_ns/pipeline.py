"""OdinPipeline: nerfstudio's VanillaPipeline without the DDP wrap.

One process: VanillaPipeline unchanged (the model's SelectiveAdam steps locally).
Several processes: the model is not wrapped in DDP; ``OdinTrainer`` drives each step
through a distributed session (``odin_ns.distributed.session_api``) that synchronizes per
primitive. The pipeline holds what nerfstudio looks for on a pipeline: the model, the data manager, the
config, and the viewer element with the Odin panels (live on rank 0, or a finished run's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch.distributed as dist
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig

from odin_ns.datamanager import OdinDataManagerConfig
from odin_ns.distributed.telemetry import SyncTelemetry
from odin_ns.errors import OdinInputError
from odin_ns.model import OdinSplatfactoModel, OdinSplatfactoModelConfig
from odin_ns.preflight import check_distributed_setup
from odin_ns.runtime import SyncConfig
from odin_ns.viewer_ext import OdinPanelsElement


@dataclass
class OdinPipelineConfig(VanillaPipelineConfig):
    """Pipeline for odin-splatfacto: the runtime replaces DDP when world size > 1."""

    _target: type = field(default_factory=lambda: OdinPipeline)
    datamanager: OdinDataManagerConfig = field(default_factory=OdinDataManagerConfig)
    model: OdinSplatfactoModelConfig = field(default_factory=OdinSplatfactoModelConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    """How ranks synchronize: ddp (dense all-reduce baseline), barrier (synchronous
    baseline), quality-first, throughput-first."""
    parallel: Literal["replicated", "sharded"] = "replicated"
    """replicated: every rank holds every Gaussian. sharded: each Gaussian's parameters and
    Adam moments live on one owner rank; ranks cache the rows their planned steps read
    (odin_ns.distributed.sharded_session; needs >= 2 ranks)."""
    max_rows_per_rank: int = 0
    """The most Gaussian rows one rank may hold (0: no cap). replicated: the whole model
    (checked before training and after every densification); sharded: owned + cached rows
    (checked at every phase start; the first phase still starts from the whole model)."""
    eval_copy_max_rows: int = 0
    """sharded: the most Gaussians rank 0's copy of the model holds (0: no bound). Rank 0
    gathers the parameters (not the moments) of every rank's owned rows at each evaluation
    step and, with the live viewer, at each phase start; above the bound the copy keeps the
    most opaque Gaussians, the viewer shows those and evaluation during training is skipped
    (ns-eval on the checkpoint still evaluates the whole model)."""
    ownership: Literal["locality", "random"] = "locality"
    """sharded: owners from the plan's view streams (locality) or a random deal (baseline)."""
    rebalance: Literal["auto", "always", "never"] = "auto"
    """sharded, at every phase start after the first: auto rebalances ownership (rows move
    with their Adam moments) when owned rows leave N/R +- 10% or the remote-read bytes it
    saves over the phase exceed the migration bytes; always / never: every phase / never."""
    plan_strategy: Literal["odin", "random"] = "odin"
    """AOT plan: low-conflict spatial streams (odin) or a random deal (baseline)."""
    plan_step_order: Literal["low-conflict", "shuffled"] = "low-conflict"
    """odin plan: order each epoch's steps so that a rank's view overlaps few views its peers
    trained just before (fewer quality-first waits when a peer runs late), or shuffle them."""
    footprint_margin_px: float = 16.0
    """Pixels added around each projected 3-sigma footprint when planning."""
    max_phase_steps: int = 100
    """Re-plan at least this often, even without a structural change."""
    footprint_reuse_shift_px: float = 4.0
    """At a re-plan (and after a structural step, from each row's parent), a Gaussian keeps
    its footprint unless it may have come more than this many pixels into a view whose
    footprint it is not in (0: always recompute). Footprints only restrict what is drawn,
    so this never affects exactness, only how stale the restriction is."""
    run_summary_path: Path | None = None
    """Where the run's odin_run.json goes (set when the config is saved); ns-viewer reads it."""
    snapshot_every: int = 5
    """Rank 0 refreshes the viewer panels' snapshot every this many steps."""
    views_per_rank: int = 1
    """B: views each rank trains per optimizer step (loss averaged over them; the step's
    footprint is the union of theirs). One process with B > 1 trains B views per step too."""
    batch_scaling: Literal["none", "sqrt", "linear"] = "sqrt"
    """Adapt learning rates, Adam eps and betas to the effective batch R x B: sqrt
    (Grendel-GS / gsplat: lr x sqrt(E), eps / sqrt(E), betas ** E), linear (lr x E) or none."""
    schedule_in_views: bool = True
    """Read every step-based schedule (model, strategy, lr schedulers, --max-num-iterations,
    save / eval intervals) in training views and convert it to optimizer steps of R x B
    views, so one command line trains the same views on 1 or R ranks."""


class OdinPipeline(VanillaPipeline):
    """VanillaPipeline whose multi-process step is driven by ``OdinTrainer`` (no DDP)."""

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
        self.telemetry = SyncTelemetry(self.rank, world_size, config.sync.mode)
        # nerfstudio's ViewerState installs ViewerElements found on the pipeline: live panels on
        # rank 0 of a distributed run, saved ones when ns-viewer opens a finished run.
        self.panels: OdinPanelsElement | None = None
        summary = config.run_summary_path
        if world_size > 1 and self.rank == 0:
            self.panels = OdinPanelsElement(lambda: self.telemetry.snapshot)
        elif world_size == 1 and summary is not None and Path(summary).exists():
            self.panels = OdinPanelsElement.from_run_json(Path(summary))
        if config.parallel == "sharded" and world_size == 1 and test_mode == "val":
            raise OdinInputError(  # training; ns-eval / ns-viewer load a merged checkpoint
                "--pipeline.parallel sharded needs at least 2 ranks (launch with "
                "odin-ns-train --nproc-per-node N); one process holds the whole model anyway"
            )
        if self.distributed:
            check_distributed_setup(world_size, len(self.datamanager.train_dataset), config.model)
            # The session sums statistics across ranks and refines at a drain point.
            self.model.external_densification = True

    @property
    def distributed(self) -> bool:
        return self.world_size > 1
