"""OdinSplatfactoModel: nerfstudio's splatfacto, runnable on CPU, with selective Adam.

What changes against ``SplatfactoModel`` (and nothing else: same parameters, same loss,
same densification strategy):

- the rasterizer is ``odin_ns.render.rasterize`` with a selectable backend (``gsplat`` on
  CUDA, ``torch`` on CPU), so training and evaluation run on machines without a GPU;
- the step's visible primitives (``radii > 0``) feed ``SelectiveAdam``: invisible
  primitives keep parameters and moments bit-identical (DESIGN 3.2);
- ``render_training_view(camera, rows)`` restricts rendering to a primitive subset (the
  Odin runtime's planned footprint), which makes a rank's read and write set exactly the
  plan's, and returns what the distributed session needs of the view (``RenderedView``);
- ``eval_copy`` (sharded training, rank 0): evaluation and the viewer render this copy of
  the whole model (``odin_ns.distributed.sharded_eval``) instead of the rank's own table;
- a training view reads nothing of the device before its forward: its intrinsics are made
  on the device and its size read from host integers (``view_intrinsics``, ``view_size``),
  and splatfacto's losses are made with their zero scale regulariser on the device
  (``_splatfacto_losses``), the same bits as splatfacto's;
- LPIPS is built lazily at evaluation and only from weights already on disk, so
  construction, training and evaluation never touch the network;
- ``strategy="mcmc"`` swaps gsplat's ``DefaultStrategy`` for its ``MCMCStrategy``
  (relocation and sampling at refine steps, position noise every step, opacity and scale
  regularisers), with the noise drawn by ``odin_ns.distributed.mcmc_noise`` so that replicas
  need no communication for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.model_components.lib_bilagrid import total_variation_loss
from nerfstudio.models.splatfacto import (
    RGB2SH,
    SplatfactoModel,
    SplatfactoModelConfig,
    num_sh_bases,
    random_quat_tensor,
)
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor

from odin_ns.distributed.densify import MCMCDensifier
from odin_ns.distributed.mcmc_noise import MCMCNoise
from odin_ns.distributed.optimizer_binding import learning_rate_at
from odin_ns.optim import SelectiveAdam, check_mask_rows
from odin_ns.preflight import check_rasterizer
from odin_ns.render import rasterize

GAUSSIAN_GROUPS = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


@dataclass(frozen=True)
class RenderedView:
    """What one training view's render tells the step beyond its image.

    Attributes:
        visible_rows: [N] bool over the model's rows: drawn with ``radii > 0``.
        info: gsplat's projection info of the view (``means2d`` keeps its gradient after
            backward; ``radii``, ``width``, ``height``, ``n_cameras``, ...), over the drawn rows.
        pixels: H x W of the rendered image.
        loss_finite: [] bool on the device, whether the view's loss is finite: set by the
            trainer with the loss, and read with the step's gradients (one read of the
            device a step, not one more per view); None: not set.
    """

    visible_rows: Tensor
    info: dict
    pixels: int
    loss_finite: Tensor | None = None


def union_visible(views: list[RenderedView]) -> Tensor:
    """[N] bool: rows visible in any of the views (a step of B views)."""
    visible = views[0].visible_rows
    for view in views[1:]:
        visible = visible | view.visible_rows
    return visible


@dataclass
class OdinSplatfactoModelConfig(SplatfactoModelConfig):
    """Splatfacto with a CPU-capable rasterizer and visibility-masked Adam."""

    _target: type = field(default_factory=lambda: OdinSplatfactoModel)
    rasterizer: Literal["auto", "gsplat", "torch"] = "auto"
    """Rasterizer backend: gsplat (CUDA), torch (CPU), or auto (gsplat when CUDA is available)."""
    selective_adam: bool = True
    """Update only primitives visible in the step's views (False: plain Adam, for comparison)."""
    strategy: Literal["default", "mcmc"] = "default"
    """Densification: gsplat's DefaultStrategy (splatfacto's) or MCMCStrategy (3DGS as MCMC:
    relocation, sampling up to cap_max, position noise; warmup_length, refine_every and
    stop_split_at give its schedule)."""
    cap_max: int = 1_000_000
    """MCMC: most Gaussians."""
    noise_lr: float = 5e5
    """MCMC: position-noise scale (times the means' learning rate)."""
    mcmc_min_opacity: float = 0.005
    """MCMC: Gaussians at or below this opacity are relocated."""
    opacity_reg: float = 0.0
    """Loss weight of mean(sigmoid(opacities)) (gsplat's MCMC preset: 0.01)."""
    scale_reg: float = 0.0
    """Loss weight of mean(exp(scales)) (gsplat's MCMC preset: 0.01)."""
    init_opacity: float = 0.1
    """Opacity of the initial Gaussians (gsplat's MCMC preset: 0.5)."""
    init_scale: float = 1.0
    """Initial scale as a multiple of the mean 3-NN distance (gsplat's MCMC preset: 0.1)."""
    noise_seed: int = 0
    """MCMC: seed of the counter-based noise draws and of single-process relocation."""
    noise_schedule: Literal["eager", "lazy"] = "eager"
    """MCMC, one process: add every Gaussian's noise after each step (eager) or just before
    the next render (lazy). Same bits; distributed runs are always lazy (per row, in version
    order)."""


def get_viewmat(camera_to_worlds: Tensor) -> Tensor:
    """OpenGL camera-to-world [C, 3, 4] -> gsplat (OpenCV) world-to-camera [C, 4, 4]."""
    # OpenGL -> OpenCV axes: the y and z columns negated (in place of splatfacto's product
    # with a [1, -1, -1] tensor made on the host: the same bits, without a blocking copy to
    # the device per view)
    R = camera_to_worlds[:, :3, :3]
    R = torch.cat([R[:, :, :1], -R[:, :, 1:]], dim=2)
    T = camera_to_worlds[:, :3, 3:4]
    R_inv = R.transpose(1, 2)
    viewmat = torch.zeros(R.shape[0], 4, 4, device=R.device, dtype=R.dtype)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = R_inv
    viewmat[:, :3, 3:4] = -torch.bmm(R_inv, T)
    return viewmat


def view_intrinsics(camera: Cameras, downscale: int) -> Tensor:
    """[C, 3, 3] float32 pinhole intrinsics of ``camera`` at 1 / ``downscale`` of its
    resolution, made on the camera's device: nerfstudio's ``rescale_output_resolution(1 /
    downscale)`` then ``get_intrinsics_matrices()`` (splatfacto's), the same bits for the
    power-of-two factors splatfacto uses, without their device reads (the first copies the
    scale to the device; the second fills a host matrix from device fields, one read each)."""
    fx, fy, cx, cy = (getattr(camera, name).reshape(-1) for name in ("fx", "fy", "cx", "cy"))
    if downscale != 1:
        scale = 1 / downscale
        fx, fy, cx, cy = fx * scale, fy * scale, cx * scale, cy * scale
    zero, one = torch.zeros_like(fx), torch.ones_like(fx)
    entries = (fx, zero, cx, zero, fy, cy, zero, zero, one)
    return torch.stack(entries, dim=1).reshape(-1, 3, 3).to(torch.float32)


def view_size(camera: Cameras, downscale: int) -> tuple[int, int]:
    """(W, H) of a [1] ``camera`` at 1 / ``downscale`` of its resolution, rounded down (as
    ``rescale_output_resolution`` rounds them for power-of-two factors, and as splatfacto
    downscales the image it compares with). Its width and height are read: free where they
    are host tensors (``OdinDataManager``'s training views), a read of the device where
    they are not."""
    width, height = int(camera.width.reshape(-1)[0]), int(camera.height.reshape(-1)[0])
    return width // downscale, height // downscale


def cached_lpips():
    """LPIPS(AlexNet) if its weights are already on disk, else None (never downloads)."""
    from torchvision.models import AlexNet_Weights

    weights_file = os.path.basename(AlexNet_Weights.IMAGENET1K_V1.url)
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", weights_file)
    if not os.path.exists(cached):
        return None
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    return LearnedPerceptualImagePatchSimilarity(normalize=True)


class OdinSplatfactoModel(SplatfactoModel):
    """Splatfacto whose rasterizer, optimizer masking and metrics work offline and on CPU."""

    config: OdinSplatfactoModelConfig

    def populate_modules(self):
        # one CLI line for gsplat without CUDA or its kernels
        check_rasterizer(self.config.rasterizer, str(self.kwargs.get("device", "cuda")))
        # Same initialisation as splatfacto, without its hard-coded `.cuda()` and without
        # building LPIPS (which downloads AlexNet weights) in the constructor.
        dim_sh = num_sh_bases(self.config.sh_degree)
        if self.seed_points is not None and not self.config.random_init:
            means = torch.nn.Parameter(self.seed_points[0].float())
        else:
            means = torch.nn.Parameter(
                (torch.rand((self.config.num_random, 3)) - 0.5) * self.config.random_scale
            )
        distances, _ = self.k_nearest_sklearn(means.data, 3)
        avg_dist = torch.from_numpy(distances).mean(dim=-1, keepdim=True).clamp_min(1e-7)
        num_points = means.shape[0]
        has_colors = (
            self.seed_points is not None
            and not self.config.random_init
            and self.seed_points[1].shape[0] > 0
        )
        if has_colors:
            rgb = self.seed_points[1].float() / 255
            shs = torch.zeros((num_points, dim_sh, 3))
            shs[:, 0, :] = RGB2SH(rgb) if self.config.sh_degree > 0 else torch.logit(rgb, eps=1e-10)
            # contiguous rows: the runtime updates them in place, row by row
            features_dc, features_rest = shs[:, 0, :].contiguous(), shs[:, 1:, :].contiguous()
        else:
            features_dc = torch.rand(num_points, 3)
            features_rest = torch.zeros((num_points, dim_sh - 1, 3))
        self.gauss_params = torch.nn.ParameterDict(
            {
                "means": means,
                "scales": torch.nn.Parameter(
                    torch.log(avg_dist.repeat(1, 3) * self.config.init_scale)
                ),
                "quats": torch.nn.Parameter(random_quat_tensor(num_points)),
                "features_dc": torch.nn.Parameter(features_dc),
                "features_rest": torch.nn.Parameter(features_rest),
                "opacities": torch.nn.Parameter(
                    torch.logit(self.config.init_opacity * torch.ones(num_points, 1))
                ),
            }
        )
        self._lpips = None
        self._lpips_checked = False
        self._drawn_rows: Tensor | None = None  # set only inside render_training_view
        self._last_view: RenderedView | None = None
        self.external_densification = False
        self.visible_rows: Tensor | None = None  # SelectiveAdam's mask of the last step
        # (that mask, its [K] int64 ids): found once for every group's optimizer
        self._visible_ids: tuple[Tensor, Tensor] | None = None
        # Sharded training, rank 0: the whole model's parameters (``sharded_eval``), which
        # evaluation and the viewer render while ``gauss_params`` is only this rank's table.
        self.eval_copy: dict[str, Tensor] | None = None
        self.optimizers = {}

        # Everything else (camera optimizer, PSNR/SSIM, background, strategy) as splatfacto,
        # by running its constructor tail on our parameters.
        self._populate_shared_modules()

    def _populate_shared_modules(self) -> None:
        from gsplat.strategy import DefaultStrategy
        from nerfstudio.model_components.lib_bilagrid import BilateralGrid
        from nerfstudio.utils.colors import get_color
        from pytorch_msssim import SSIM
        from torchmetrics.image import PeakSignalNoiseRatio

        self.camera_optimizer = self.config.camera_optimizer.setup(
            num_cameras=self.num_train_data, device="cpu"
        )
        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self.step = 0
        self.crop_box = None
        if self.config.background_color == "random":
            # Viser's default background; only used when rendering outside training.
            self.background_color = torch.tensor([0.1490, 0.1647, 0.2157])
        else:
            self.background_color = get_color(self.config.background_color)
        if self.config.use_bilateral_grid:
            self.bil_grids = BilateralGrid(
                num=self.num_train_data,
                grid_X=self.config.grid_shape[0],
                grid_Y=self.config.grid_shape[1],
                grid_W=self.config.grid_shape[2],
            )
        self.mcmc_noise: MCMCNoise | None = None
        self._mcmc_densifier: MCMCDensifier | None = None
        self._noise_done_through = -1  # lazy single process: last step whose noise is due
        if self.config.strategy == "mcmc":
            self._populate_mcmc()
            return
        self.strategy = DefaultStrategy(
            prune_opa=self.config.cull_alpha_thresh,
            grow_grad2d=self.config.densify_grad_thresh,
            grow_scale3d=self.config.densify_size_thresh,
            grow_scale2d=self.config.split_screen_size,
            prune_scale3d=self.config.cull_scale_thresh,
            prune_scale2d=self.config.cull_screen_size,
            refine_scale2d_stop_iter=self.config.stop_screen_size_at,
            refine_start_iter=self.config.warmup_length,
            refine_stop_iter=self.config.stop_split_at,
            reset_every=self.config.reset_alpha_every * self.config.refine_every,
            refine_every=self.config.refine_every,
            pause_refine_after_reset=self.num_train_data + self.config.refine_every,
            absgrad=self.config.use_absgrad,
            revised_opacity=False,
            verbose=False,
        )
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)

    def _populate_mcmc(self) -> None:
        from gsplat.strategy import MCMCStrategy

        self.strategy = MCMCStrategy(
            cap_max=self.config.cap_max,
            noise_lr=self.config.noise_lr,
            refine_start_iter=self.config.warmup_length,
            refine_stop_iter=self.config.stop_split_at,
            refine_every=self.config.refine_every,
            min_opacity=self.config.mcmc_min_opacity,
            verbose=False,
        )
        self.strategy_state = self.strategy.initialize_state()
        self.mcmc_noise = MCMCNoise(
            self.gauss_params,
            noise_lr=self.config.noise_lr,
            seed=self.config.noise_seed,
            num_rows=self.num_points,
            skip_step=self._mcmc_structural,
        )

    def _mcmc_structural(self, step: int) -> bool:
        s = self.strategy
        return s.refine_start_iter < step < s.refine_stop_iter and step % s.refine_every == 0

    def _single_process_mcmc_densifier(self) -> MCMCDensifier:
        """Single process: the MCMC adapter of ``odin_ns.distributed.densify`` (built on
        first use; a method, not a property, since nerfstudio's viewer reads every property
        of the model, and only MCMC models have one)."""
        if self._mcmc_densifier is None:
            self._mcmc_densifier = MCMCDensifier(
                self.strategy, self.strategy_state, self.config.noise_seed, self.mcmc_noise
            )
        return self._mcmc_densifier

    # ------------------------------------------------------------------ training hooks

    def step_cb(self, optimizers: Optimizers, step):
        super().step_cb(optimizers, step)
        for name in GAUSSIAN_GROUPS:
            opt = self.optimizers.get(name)
            if isinstance(opt, SelectiveAdam):
                opt.visibility_source = self._visible_for_optimizer
        noise = self.mcmc_noise
        if noise is not None:
            noise.lr_at = learning_rate_at(optimizers, "means")
            if noise.version.numel() != self.num_points:  # a loaded checkpoint: drained
                noise.resize(self.num_points, step - 1)
            if self.config.noise_schedule == "lazy" and not self.external_densification:
                noise.catch_up_all(step - 1)  # before this step renders

    def step_post_backward(self, step):
        # Distributed: the session densifies at a drain and keeps the noise per row.
        if self.external_densification:
            return
        if self.mcmc_noise is None:
            return super().step_post_backward(step)
        # gsplat's order after the optimizer step: relocate + add at refine steps, then noise
        densifier = self._single_process_mcmc_densifier()
        if densifier.is_structural(step):
            densifier.apply(step, self.gauss_params, self.optimizers)
        elif self.config.noise_schedule == "eager":
            self.mcmc_noise.catch_up_all(step)
        self._noise_done_through = step

    def state_dict(self, *args, **kwargs):
        # A checkpoint reads every row: lazy single-process noise catches up first.
        self._flush_lazy_noise()
        return super().state_dict(*args, **kwargs)

    def _flush_lazy_noise(self) -> None:
        noise = self.mcmc_noise
        if noise is not None and not self.external_densification:
            if noise.version.numel() == self.num_points:
                noise.catch_up_all(self._noise_done_through)

    def get_loss_dict(self, outputs, batch, metrics_dict=None) -> dict[str, Tensor]:
        loss_dict = self._splatfacto_losses(outputs, batch)
        if self.training and self.config.opacity_reg > 0.0:
            # gsplat's MCMC regularisers (each row's gradient reads only that row)
            reg = torch.sigmoid(self.opacities).mean()
            loss_dict["opacity_reg"] = self.config.opacity_reg * reg
        if self.training and self.config.scale_reg > 0.0:
            loss_dict["mcmc_scale_reg"] = self.config.scale_reg * torch.exp(self.scales).mean()
        return loss_dict

    def _splatfacto_losses(self, outputs, batch) -> dict[str, Tensor]:
        """splatfacto's losses (``SplatfactoModel.get_loss_dict``, nerfstudio 1.1.5): the
        same terms and bits, its zero scale regulariser made on the device. splatfacto
        copies a host zero there (``torch.tensor(0.0).to(device)``) at every step without
        the regulariser (9 in 10 with it, all with splatfacto's default): a blocking copy,
        one wait of the host for the device's queued work a view, on a GPU. Pinned against
        splatfacto's by ``tests/test_gpu_paths.py``."""
        gt_img = self.composite_with_background(
            self.get_gt_img(batch["image"]), outputs["background"]
        )
        pred_img = outputs["rgb"]
        if "mask" in batch:  # the masked part of both images black, as splatfacto does
            mask = self._downscale_if_required(batch["mask"]).to(self.device)
            assert mask.shape[:2] == gt_img.shape[:2] == pred_img.shape[:2]
            gt_img, pred_img = gt_img * mask, pred_img * mask
        l1 = torch.abs(gt_img - pred_img).mean()
        ssim = self.ssim(gt_img.permute(2, 0, 1)[None, ...], pred_img.permute(2, 0, 1)[None, ...])
        lam = self.config.ssim_lambda
        if self.config.use_scale_regularization and self.step % 10 == 0:
            scale_exp = torch.exp(self.scales)
            ratio = scale_exp.amax(dim=-1) / scale_exp.amin(dim=-1)
            limit = torch.tensor(self.config.max_gauss_ratio)  # (a host scalar: no copy)
            scale_reg = 0.1 * (torch.maximum(ratio, limit) - self.config.max_gauss_ratio).mean()
        else:
            scale_reg = torch.zeros((), device=self.device)
        loss_dict = {"main_loss": (1 - lam) * l1 + lam * (1 - ssim), "scale_reg": scale_reg}
        if self.training:
            self.camera_optimizer.get_loss_dict(loss_dict)
            if self.config.use_bilateral_grid:
                loss_dict["tv_loss"] = 10 * total_variation_loss(self.bil_grids.grids)
        return loss_dict

    def get_metrics_dict(self, outputs, batch) -> dict[str, Tensor]:
        metrics = super().get_metrics_dict(outputs, batch)
        if not self.training and self.eval_copy is not None:
            metrics["gaussian_count"] = int(self.eval_copy["means"].shape[0])  # what was drawn
        return metrics

    def _visible_for_optimizer(self) -> Tensor | None:
        """SelectiveAdam's rows of the step: the [K] int64 ids of ``visible_rows``, found
        once for every group's optimizer (finding them reads the device: one wait a step,
        not one per group); None: every row (plain Adam)."""
        mask = self.visible_rows
        if not self.config.selective_adam or mask is None:
            return None
        check_mask_rows(mask, self.num_points)
        if self._visible_ids is None or self._visible_ids[0] is not mask:
            self._visible_ids = (mask, mask.nonzero().squeeze(-1))
        return self._visible_ids[1]

    # ------------------------------------------------------------------ rendering

    def render_training_view(
        self, camera: Cameras, rows: Tensor | None
    ) -> tuple[dict[str, Tensor | list], RenderedView]:
        """The training forward of one view, drawing only ``rows`` ([K] int64; None: every
        row). Returns nerfstudio's outputs and the view's ``RenderedView``."""
        self._drawn_rows = rows
        try:
            outputs = self(camera)
        finally:
            self._drawn_rows = None
        assert self._last_view is not None
        view, self._last_view = self._last_view, None
        return outputs, view

    def get_outputs(self, camera: Cameras) -> dict[str, Tensor | list]:
        if not isinstance(camera, Cameras):
            raise TypeError(f"get_outputs expects a Cameras object, got {type(camera).__name__}")
        if self.training:
            if camera.shape[0] != 1:
                raise ValueError("splatfacto trains on one camera at a time")
            camera_to_worlds = self.camera_optimizer.apply_to_camera(camera)
        else:
            camera_to_worlds = camera.camera_to_worlds

        rows = self._drawn_rows if self.training else None  # evaluation sees every primitive
        if not self.training:
            self._flush_lazy_noise()  # lazy single process: what the last step added
        # What is drawn: the parameters, or (not training, sharded) rank 0's whole-model copy.
        gauss = self.gauss_params if self.training or self.eval_copy is None else self.eval_copy
        if self.crop_box is not None and not self.training:
            crop = self.crop_box.within(gauss["means"]).squeeze(-1)
            if crop.sum() == 0:
                return self.get_empty_outputs(
                    int(camera.width.item()), int(camera.height.item()), self.background_color
                )
            rows = crop.nonzero().squeeze(-1)

        def take(t: Tensor) -> Tensor:
            return t if rows is None else t[rows]

        colors = torch.cat(
            (take(gauss["features_dc"])[:, None, :], take(gauss["features_rest"])), dim=1
        )
        downscale = self._get_downscale_factor()
        viewmat = get_viewmat(camera_to_worlds.to(self.device))
        K = view_intrinsics(camera, downscale).to(self.device)
        W, H = view_size(camera, downscale)

        render_mode = (
            "RGB+ED" if self.config.output_depth_during_training or not self.training else "RGB"
        )
        if self.config.sh_degree > 0:
            sh_degree = min(self.step // self.config.sh_degree_interval, self.config.sh_degree)
        else:
            colors = torch.sigmoid(colors).squeeze(1)
            sh_degree = None

        render, alpha, info = rasterize(
            means=take(gauss["means"]),
            quats=take(gauss["quats"]),
            scales=torch.exp(take(gauss["scales"])),
            opacities=torch.sigmoid(take(gauss["opacities"])).squeeze(-1),
            colors=colors,
            viewmats=viewmat,
            Ks=K,
            width=W,
            height=H,
            near_plane=0.01,
            far_plane=1e10,
            render_mode=render_mode,
            sh_degree=sh_degree,
            absgrad=getattr(self.strategy, "absgrad", False),
            rasterize_mode=self.config.rasterize_mode,
            backend=self.config.rasterizer,
        )
        self.info = info
        if self.training:
            visible = (info["radii"] > 0).any(dim=0)
            if rows is not None:
                full = torch.zeros(self.num_points, dtype=torch.bool, device=visible.device)
                full[rows] = visible
                visible = full
            self.visible_rows = visible
            self._last_view = RenderedView(visible, info, pixels=H * W)
            if rows is None:
                self.strategy.step_pre_backward(
                    self.gauss_params, self.optimizers, self.strategy_state, self.step, info
                )
            else:
                info["means2d"].retain_grad()

        background = self._get_background_color()
        rgb = torch.clamp(render[..., :3] + (1 - alpha) * background, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training:
            if camera.metadata is not None and "cam_idx" in camera.metadata:
                rgb = self._apply_bilateral_grid(rgb, camera.metadata["cam_idx"], H, W)
        depth = None
        if render_mode == "RGB+ED":
            depth = render[..., 3:4]
            depth = torch.where(alpha > 0, depth, depth.detach().max()).squeeze(0)
        if background.shape[0] == 3 and not self.training:
            background = background.expand(H, W, 3)
        return {
            "rgb": rgb.squeeze(0),
            "depth": depth,
            "accumulation": alpha.squeeze(0),
            "background": background,
        }

    # ------------------------------------------------------------------ evaluation

    @property
    def lpips(self):
        if not self._lpips_checked:
            self._lpips_checked = True
            self._lpips = cached_lpips()
            if self._lpips is None:
                CONSOLE.print(
                    "[yellow]LPIPS skipped: AlexNet weights are not in torch's hub cache "
                    f"({torch.hub.get_dir()}) and odin-ns never downloads them.[/yellow]"
                )
            else:
                self._lpips = self._lpips.to(self.device)
        return self._lpips

    def get_image_metrics_and_images(self, outputs, batch):
        gt_rgb = self.composite_with_background(
            self.get_gt_img(batch["image"]), outputs["background"]
        )
        predicted_rgb = outputs["rgb"]
        combined_rgb = torch.cat([gt_rgb, predicted_rgb], dim=1)
        gt = torch.moveaxis(gt_rgb, -1, 0)[None, ...]
        pred = torch.moveaxis(predicted_rgb, -1, 0)[None, ...]
        metrics = {"psnr": float(self.psnr(gt, pred).item()), "ssim": float(self.ssim(gt, pred))}
        if self.lpips is not None:
            metrics["lpips"] = float(self.lpips(gt, pred))
        return metrics, {"img": combined_rgb}
