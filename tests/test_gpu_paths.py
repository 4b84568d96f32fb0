"""What the CUDA-only paths of set-up and resume do, checked on the CPU: torch.cuda's calls are
recorded (no GPU here), gsplat's kernel loader is stood in for (importing it here would build
gsplat's CUDA code: this machine has nvcc), and the per-view camera math is compared bit for
bit with splatfacto's and run on the ``meta`` device (no values: a read of the device raises)."""

from __future__ import annotations

import copy
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.models.splatfacto import get_viewmat as splatfacto_viewmat

from odin_ns import resume
from odin_ns.errors import OdinInputError
from odin_ns.model import get_viewmat, view_intrinsics, view_size
from odin_ns.preflight import check_rasterizer
from odin_ns.render import gsplat_backend
from odin_ns.trainer import bind_cuda_device


def test_the_trainer_binds_its_cuda_device(monkeypatch):
    """``ns-train --machine.num-devices N``: nerfstudio's worker binds no device, so the
    trainer makes its own (``cuda:{local_rank}``) current before anything is made on it;
    CPU trainers bind nothing."""
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    bind_cuda_device("cuda:3")
    bind_cuda_device("cpu")
    assert bound == [torch.device("cuda:3")]


def test_resume_saves_and_restores_this_devices_cuda_generator_only(monkeypatch):
    """A checkpoint holds the current CUDA device's generator, restored into the current
    device's: a run resumed where fewer GPUs are visible fails nowhere. One written before
    (every visible device's) restores the entry of this device's index, or its last."""
    states = {1: torch.tensor([7], dtype=torch.uint8)}
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[1])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": restored.append(s))
    state = resume.capture_rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[7]]
    resume.restore_rng_state(state)
    older = [torch.tensor([i], dtype=torch.uint8) for i in range(4)]
    resume.restore_rng_state({**state, "cuda": older})
    resume.restore_rng_state({**state, "cuda": older[:1]})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    resume.restore_rng_state({**state, "cuda": older})
    assert [s.tolist() for s in restored] == [[7], [1], [0], [3]]


def _backend_module(monkeypatch, **attrs) -> None:
    """gsplat's kernel loader, stood in for: a module with ``attrs``."""
    fake = types.ModuleType("gsplat.cuda._backend")
    fake.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, "gsplat.cuda._backend", fake)


def test_gsplat_kernels_missing_says_why(monkeypatch):
    _backend_module(monkeypatch, _C=object())
    assert gsplat_backend.gsplat_kernels_missing() is None
    _backend_module(monkeypatch, _C=None)  # gsplat found no toolkit to build them with
    assert "CUDA toolkit" in gsplat_backend.gsplat_kernels_missing()
    _backend_module(monkeypatch)  # the import did not give _C: a failed build
    assert gsplat_backend.gsplat_kernels_missing().startswith("building them failed")


def test_the_private_gsplat_attribute_read_is_pinned():
    """gsplat 1.4.0 keeps its loaded kernels in ``gsplat.cuda._backend._C``, None when it
    found nothing to build them with (read as text: importing it here would build them)."""
    source = Path(importlib.util.find_spec("gsplat.cuda._backend").origin).read_text()
    assert "\n_C = None\n" in source and "from gsplat import csrc as _C" in source


def test_a_gsplat_run_without_its_kernels_stops_before_training(monkeypatch):
    """``auto`` on a GPU (and ``gsplat``) checks that gsplat's kernels load, in the checks
    before anything starts (and builds them there, once): else one line that says why and
    what to do, instead of an ``AttributeError`` at the first render."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gsplat_backend, "gsplat_kernels_missing", lambda: "no nvcc")
    for name in ("auto", "gsplat"):
        with pytest.raises(OdinInputError) as err:
            check_rasterizer(name, "cuda")
        assert "no nvcc" in str(err.value) and "--pipeline.model.rasterizer torch" in str(err.value)
    monkeypatch.setattr(gsplat_backend, "gsplat_kernels_missing", lambda: None)
    check_rasterizer("auto", "cuda")
    monkeypatch.setattr(gsplat_backend, "gsplat_kernels_missing", lambda: pytest.fail("loaded"))
    check_rasterizer("torch", "cuda")  # the torch rasterizer needs no kernels
    check_rasterizer("auto", "cpu")  # a CPU run on a GPU machine: the torch rasterizer
    with pytest.raises(OdinInputError, match="needs CUDA tensors"):
        check_rasterizer("gsplat", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_rasterizer("auto", "cuda")  # no GPU: the torch rasterizer


def test_viewmat_equals_splatfactos_bit_for_bit():
    """The world-to-camera matrix, made without a host tensor (splatfacto multiplies by one
    made on the host per view: a blocking copy to the device), has the same bits."""
    gen = torch.Generator().manual_seed(0)
    c2w = torch.randn(5, 3, 4, generator=gen)
    c2w[0, 1, 1] = 0.0  # a signed zero
    ours, theirs = get_viewmat(c2w), splatfacto_viewmat(c2w)
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_selective_adam_finds_the_steps_visible_rows_once_for_every_group():
    """One process: each Gaussian group has its own optimizer; the visible rows' ids (a read
    of the device) are found once a step for all of them, and update the same rows as the
    mask; a mask from before a densification is refused."""
    from types import SimpleNamespace

    from odin_ns.model import OdinSplatfactoModel
    from odin_ns.optim import SelectiveAdam

    mask = torch.tensor([True, False, True, True, False])
    model = SimpleNamespace(
        config=SimpleNamespace(selective_adam=True), visible_rows=mask, num_points=5,
        _visible_ids=None,
    )  # fmt: skip
    source = lambda: OdinSplatfactoModel._visible_for_optimizer(model)  # noqa: E731
    ids = source()
    assert ids.tolist() == [0, 2, 3] and source() is ids  # found once
    model.visible_rows = mask.clone()
    assert source() is not ids and torch.equal(source(), ids)  # a new step's mask
    gen = torch.Generator().manual_seed(0)
    start, grad = torch.randn(5, 3, generator=gen), torch.randn(5, 3, generator=gen)
    moved = []
    for rows in (mask, ids):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        opt = SelectiveAdam([param], lr=0.1)
        opt.visibility_source = lambda rows=rows: rows
        opt.step()
        moved.append(param.detach())
    assert torch.equal(moved[0], moved[1]) and torch.equal(moved[0][1], start[1])
    model.num_points = 7  # densified since the mask was made
    with pytest.raises(ValueError, match="before densification"):
        source()


def _train_cameras(count: int = 4) -> Cameras:
    """``count`` pinhole cameras with odd sizes and random poses and intrinsics."""
    gen = torch.Generator().manual_seed(1)
    return Cameras(
        camera_to_worlds=torch.randn(count, 3, 4, generator=gen),
        fx=torch.rand(count, 1, generator=gen) * 500 + 100,
        fy=torch.rand(count, 1, generator=gen) * 500 + 100,
        cx=torch.rand(count, 1, generator=gen) * 300,
        cy=torch.rand(count, 1, generator=gen) * 200,
        width=torch.tensor([[641], [333], [1001], [17]]),
        height=torch.tensor([[479], [250], [563], [9]]),
    )


@pytest.mark.parametrize("downscale", [1, 2, 4, 8])
def test_view_intrinsics_and_size_equal_nerfstudios_rescale_bit_for_bit(downscale):
    """The render's intrinsics and size at 1 / downscale of a camera's resolution, made
    without writing the camera, have the bits of nerfstudio's ``rescale_output_resolution``
    then ``get_intrinsics_matrices`` (as splatfacto makes them), odd sizes rounded down."""
    cameras = _train_cameras()
    for i in range(cameras.shape[0]):
        camera = cameras[i : i + 1]
        theirs = copy.deepcopy(camera)
        theirs.rescale_output_resolution(1 / downscale)
        K = view_intrinsics(camera, downscale)
        assert torch.equal(K.view(torch.int32), theirs.get_intrinsics_matrices().view(torch.int32))
        assert view_size(camera, downscale) == (int(theirs.width), int(theirs.height))
        assert torch.equal(camera.fx, cameras.fx[i : i + 1])  # the camera is not written


def test_a_training_views_camera_is_prepared_without_reading_the_device(object_scene):
    """The data manager's training views (one process: nerfstudio's order; several: the
    plan's) with its data on the ``meta`` device, which holds no values (any read raises):
    each view's camera is on the device but for its size, which is the dataset's, on the
    host, and the render's use of it (view matrix, intrinsics, size) reads nothing of the
    device. nerfstudio's way (``get_intrinsics_matrices``, ``width.item()``) reads it."""
    import numpy as np
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from odin_ns.datamanager import OdinDataManagerConfig

    config = OdinDataManagerConfig(
        dataparser=NerfstudioDataParserConfig(data=object_scene), cache_images_type="uint8"
    )
    manager = config.setup(device="meta", test_mode="val")
    on_host = manager.train_dataset.cameras
    one_process = manager.next_train(0)
    manager.set_plan_views(np.array([3, 5]), 0)
    for camera, batch in (one_process, manager.next_train(0)):
        i = camera.metadata["cam_idx"]
        assert camera.fx.device.type == batch["image"].device.type == "meta"
        assert camera.width.device.type == camera.height.device.type == "cpu"
        assert (int(camera.width), int(camera.height)) == (on_host.width[i], on_host.height[i])
        assert camera.width.data_ptr() != on_host.width[i : i + 1].data_ptr()  # a copy
        viewmat = get_viewmat(camera.camera_to_worlds)
        K = view_intrinsics(camera, 2)
        assert viewmat.device.type == K.device.type == "meta" and K.shape == (1, 3, 3)
        size = (int(on_host.width[i]) // 2, int(on_host.height[i]) // 2)
        assert view_size(camera, 2) == size
    theirs = manager.train_cameras[3:4]
    for read in (theirs.get_intrinsics_matrices, theirs.width.item):
        with pytest.raises((NotImplementedError, RuntimeError)):
            read()


def test_one_process_views_come_in_nerfstudios_order(object_scene):
    """One process: the data manager's views are nerfstudio's ``FullImageDatamanager``'s,
    in its order over two epochs, with the same images and cameras (its own ``next_train``
    copies each view's camera to the device, and where the images are cached on the host
    its image, with blocking copies; ours hands each view over as the plan's)."""
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from odin_ns.datamanager import OdinDataManagerConfig

    # (the images cached "on the device", the CPU: a host cache pins them, which needs CUDA)
    parser = NerfstudioDataParserConfig(data=object_scene)
    managers = [
        kind(dataparser=parser).setup(device="cpu", test_mode="val")
        for kind in (OdinDataManagerConfig, FullImageDatamanagerConfig)
    ]
    views = 2 * len(managers[0].train_dataset)
    ours, theirs = ([m.next_train(s) for s in range(views)] for m in managers)
    assert [c.metadata["cam_idx"] for c, _ in ours] == [c.metadata["cam_idx"] for c, _ in theirs]
    for (camera, batch), (their_camera, their_batch) in zip(ours, theirs, strict=True):
        assert torch.equal(batch["image"], their_batch["image"])
        assert torch.equal(camera.camera_to_worlds, their_camera.camera_to_worlds)
        assert torch.equal(camera.width, their_camera.width)


@pytest.mark.parametrize(
    "scale_regularization, step, mask",
    [(False, 3, False), (True, 10, False), (True, 11, True)],
)
def test_losses_equal_splatfactos_with_the_zero_made_on_the_device(
    scale_regularization, step, mask
):
    """The model's losses are splatfacto's, term for term and bit for bit (with and without
    its scale regulariser, with a mask), but for where its zero regulariser is made: on the
    device, not copied there from the host at every step (a blocking copy a view)."""
    from nerfstudio.data.scene_box import SceneBox
    from nerfstudio.models.splatfacto import SplatfactoModel

    from odin_ns.model import OdinSplatfactoModelConfig

    config = OdinSplatfactoModelConfig(
        num_random=64,
        rasterizer="torch",
        num_downscales=0,
        use_scale_regularization=scale_regularization,
    )
    box = SceneBox(aabb=torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]))
    model = config.setup(scene_box=box, num_train_data=2, metadata={})
    model.step = step
    gen = torch.Generator().manual_seed(step)
    outputs = {"rgb": torch.rand(12, 16, 3, generator=gen), "background": torch.rand(3)}
    batch = {"image": (torch.rand(12, 16, 3, generator=gen) * 255).to(torch.uint8)}
    if mask:
        batch["mask"] = torch.rand(12, 16, 1, generator=gen) > 0.3
    ours = model.get_loss_dict(outputs, batch)
    theirs = SplatfactoModel.get_loss_dict(model, outputs, batch)
    assert set(ours) == set(theirs) | {"mcmc_scale_reg", "opacity_reg"} & set(ours)
    for name, value in theirs.items():
        assert torch.equal(ours[name].view(torch.int32), value.view(torch.int32)), name
