"""OdinDataManager: full-image data manager whose training views follow the AOT plan.

One process: nerfstudio's ``FullImageDatamanager``'s views in its order (random, every
view once per epoch), plus input checks that fail with one clear line. Several processes:
``next_train(step)`` returns the view the plan assigns to this rank at ``step``, so the
runtime's dependency table describes exactly what each rank reads and writes. Either way a
view reaches the model without a read of the device: its camera is a view of the train
cameras, moved to the device once, with its size on the host (``set_host_size``), and its
image is uploaded without waiting.

With B views per rank per step (``--pipeline.views-per-rank``), ``next_train_views(step,
B)`` returns the step's B views: the plan's ``views[t, rank, :]`` in plan order, or (one
process) the next B views of nerfstudio's random epoch order.
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
from odin_ns.runtime.uploads import upload


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
        self._view_cameras: Cameras | None = None  # the train cameras on self.device

    def set_plan_views(self, views: np.ndarray, start_step: int) -> None:
        """Use ``views[t]`` (this rank's view ids at phase step t: int64 [T] or [T, B])
        from ``start_step`` on."""
        views = np.asarray(views, dtype=np.int64)
        self._plan_views = views[:, None] if views.ndim == 1 else views
        self._plan_start = start_step

    def plan_views(self, step: int) -> np.ndarray:
        """int64 [B] view ids this rank trains at ``step``, in plan order."""
        assert self._plan_views is not None
        t = step - self._plan_start
        if not 0 <= t < len(self._plan_views):
            raise RuntimeError(
                f"step {step} is outside the current plan (steps {self._plan_start}.."
                f"{self._plan_start + len(self._plan_views) - 1}); the plan was not rebuilt"
            )
        return self._plan_views[t]

    def plan_view(self, step: int) -> int:
        """The first of this rank's views at ``step``."""
        return int(self.plan_views(step)[0])

    def next_train(self, step: int) -> tuple[Cameras, dict]:
        if self._plan_views is None:
            return self._train_view(self._next_unseen_view())
        return self._train_view(self.plan_view(step))

    def _next_unseen_view(self) -> int:
        """One process: the next view of nerfstudio's order (``FullImageDatamanager.
        next_train``'s: every view once per epoch, the epoch drawn by
        ``sample_train_cameras``), which ``_train_view`` then hands over as the plan's views
        are (``tests/test_gpu_paths.py`` pins the order to nerfstudio's)."""
        image_idx = self.train_unseen_cameras.pop(0)
        if not self.train_unseen_cameras:
            self.train_unseen_cameras = self.sample_train_cameras()
        return image_idx

    def next_train_views(self, step: int, count: int) -> list[tuple[Cameras, dict]]:
        """The ``count`` (= B) views of ``step``: (camera [1], batch) per view, in order.

        Several processes: the plan's views of this rank at ``step`` (the plan must have B
        = ``count``). One process: ``count`` calls of ``next_train`` (nerfstudio's order).
        """
        if self._plan_views is None:
            return [self.next_train(step) for _ in range(count)]
        views = self.plan_views(step)
        if views.shape[0] != count:
            raise RuntimeError(f"the plan has {views.shape[0]} views per rank, not {count}")
        return [self._train_view(int(v)) for v in views]

    def _train_view(self, image_idx: int) -> tuple[Cameras, dict]:
        data = self.cached_train[image_idx].copy()
        data["image"] = upload(data["image"], self.device)
        if self._view_cameras is None:  # at the first view: once, not a view at a time
            self._view_cameras = self.train_cameras.to(self.device)  # (a no-op if cached there)
        camera = self._view_cameras[image_idx : image_idx + 1]
        set_host_size(camera, self.train_dataset.cameras, image_idx)
        if camera.metadata is None:
            camera.metadata = {}
        camera.metadata["cam_idx"] = image_idx
        return camera, data


def set_host_size(camera: Cameras, on_host: Cameras, index: int) -> None:
    """Give ``camera`` (train camera ``index``, [1], its fields on the device) the width and
    height of ``on_host`` (the dataset's cameras, on the host), copied: the render reads the
    size as integers (gsplat's arguments), and from device tensors each read would make the
    host wait for the device's queued work, the previous step's applies, before it launches
    the view's forward. The camera's fields are then on two devices: the render reads its
    size and never rescales it (``model.view_size``), and nothing else sees it."""
    camera.width = on_host.width[index : index + 1].clone()
    camera.height = on_host.height[index : index + 1].clone()
