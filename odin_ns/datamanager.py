"""OdinDataManager: full-image data manager whose training views follow the AOT plan.

One process: exactly nerfstudio's ``FullImageDatamanager`` (random order, every view
once per epoch), plus input checks that fail with one clear line. Several processes:
``next_train(step)`` returns the view the plan assigns to this rank at ``step``, so the
runtime's dependency table describes exactly what each rank reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.datamanagers.full_images_datamanager import (
    FullImageDatamanager,
    FullImageDatamanagerConfig,
)

from odin_ns.preflight import check_data_path, check_has_training_images, reading_scene


@dataclass
class OdinDataManagerConfig(FullImageDatamanagerConfig):
    """Full-image data manager driven by the Odin plan when training on several ranks."""

    _target: type = field(default_factory=lambda: OdinDataManager)


class OdinDataManager(FullImageDatamanager):
    """Per-rank training views in plan order; evaluation views unchanged."""

    config: OdinDataManagerConfig

    def __init__(self, config: OdinDataManagerConfig, *args, **kwargs):
        data = config.data if config.data is not None else config.dataparser.data
        check_data_path(data)
        with reading_scene(data):
            super().__init__(config, *args, **kwargs)
            if self.test_mode != "inference":
                _ = self.cached_train  # decode now: a bad image fails here with one line
        check_has_training_images(data, len(self.train_dataset))
        self._plan_views: np.ndarray | None = None
        self._plan_start = 0

    def set_plan_views(self, views: np.ndarray, start_step: int) -> None:
        """Use ``views[t]`` (this rank's view ids at phase step t) from ``start_step`` on."""
        self._plan_views = views
        self._plan_start = start_step

    def plan_view(self, step: int) -> int:
        assert self._plan_views is not None
        t = step - self._plan_start
        if not 0 <= t < len(self._plan_views):
            raise RuntimeError(
                f"step {step} is outside the current plan (steps {self._plan_start}.."
                f"{self._plan_start + len(self._plan_views) - 1}); the plan was not rebuilt"
            )
        return int(self._plan_views[t])

    def next_train(self, step: int) -> tuple[Cameras, dict]:
        if self._plan_views is None:
            return super().next_train(step)
        image_idx = self.plan_view(step)
        data = self.cached_train[image_idx].copy()
        data["image"] = data["image"].to(self.device)
        camera = self.train_cameras[image_idx : image_idx + 1].to(self.device)
        if camera.metadata is None:
            camera.metadata = {}
        camera.metadata["cam_idx"] = image_idx
        return camera, data
