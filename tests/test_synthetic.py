"""Procedural scenes: nerfstudio can read them, they are exact, local (street) and deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from odin_ns.data import synthetic
from odin_ns.data.synthetic import make_scene

SMALL = {"width": 80, "height": 48}


def _parse(data: Path, split: str):
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    parser = NerfstudioDataParserConfig(data=data, load_3D_points=True).setup()
    return parser.get_dataparser_outputs(split)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, Path]:
    """Default view counts (24 + 4) at a small image size, one per layout."""
    root = tmp_path_factory.mktemp("synthetic")
    return {
        layout: make_scene(root / layout, layout=layout, seed=3, **SMALL)
        for layout in ("object", "street")
    }


def _visible_sets(cameras, xyz: torch.Tensor) -> list[set[int]]:
    """Ids of points inside each camera's image (pinhole, nerfstudio/OpenGL convention)."""
    out = []
    for i in range(len(cameras)):
        c2w = cameras.camera_to_worlds[i]
        q = (xyz - c2w[:3, 3]) @ c2w[:3, :3]
        depth = -q[:, 2]
        u = cameras.fx[i] * q[:, 0] / depth + cameras.cx[i]
        v = -cameras.fy[i] * q[:, 1] / depth + cameras.cy[i]
        inside = (depth > 0) & (u >= 0) & (u < cameras.width[i]) & (v >= 0)
        inside &= v < cameras.height[i]
        out.append(set(torch.nonzero(inside).flatten().tolist()))
    return out


def _jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / max(1, len(a | b))


@pytest.mark.parametrize("layout", ["object", "street"])
def test_nerfstudio_parser_reads_scene(scenes, layout):
    from nerfstudio.data.datasets.base_dataset import InputDataset

    data = scenes[layout]
    meta = json.loads((data / "transforms.json").read_text())
    train, test = _parse(data, "train"), _parse(data, "test")
    assert len(train.image_filenames) == len(train.cameras) == 24
    assert len(test.image_filenames) == len(test.cameras) == 4
    assert [str(p.relative_to(data)) for p in test.image_filenames] == meta["test_filenames"]
    assert not set(train.image_filenames) & set(test.image_filenames)
    assert int(train.cameras.width[0]) == 80 and int(train.cameras.height[0]) == 48
    expected_points = 8000 if layout == "object" else 24 * synthetic.STREET_POINTS_PER_VIEW
    assert train.metadata["points3D_xyz"].shape == (expected_points, 3)
    assert train.metadata["points3D_rgb"].shape == (expected_points, 3)
    for outputs in (train, test):
        dataset = InputDataset(outputs)
        for i in (0, len(dataset) - 1):
            image = dataset[i]["image"]
            assert image.shape == (48, 80, 3)
            assert image.std() > 0.05  # textured, not blank


def test_ns_eval_uses_held_out_views(scenes):
    """ns-eval evaluates the datamanager's eval dataset (test split): the held-out views."""
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    data = scenes["object"]
    meta = json.loads((data / "transforms.json").read_text())
    for eval_mode in ("fraction", "filename", "interval"):
        dataparser = NerfstudioDataParserConfig(data=data, eval_mode=eval_mode)
        config = FullImageDatamanagerConfig(dataparser=dataparser, cache_images="cpu")
        manager = config.setup(device="cpu", test_mode="test")
        names = [str(p.relative_to(data)) for p in manager.eval_dataset.image_filenames]
        assert names == meta["test_filenames"]
        assert len(manager.train_dataset) == 24


@pytest.mark.parametrize("layout", ["object", "street"])
def test_rays_match_nerfstudio_cameras(scenes, layout):
    """The renderer's pixel rays equal nerfstudio's rays for the written cameras."""
    data = scenes[layout]
    outputs = _parse(data, "train")
    meta = json.loads((data / "transforms.json").read_text())
    frames = {f["file_path"]: f for f in meta["frames"]}
    transform = outputs.dataparser_transform.double().numpy()  # [3, 4]
    for i in (0, 7, 23):
        frame = frames[str(outputs.image_filenames[i].relative_to(data))]
        cam = synthetic.PinholeCamera(
            np.array(frame["transform_matrix"]),
            meta["fl_x"],
            meta["fl_y"],
            meta["cx"],
            meta["cy"],
            meta["w"],
            meta["h"],
        )
        ys, xs = np.meshgrid(np.arange(cam.height), np.arange(cam.width), indexing="ij")
        o, d = synthetic.camera_rays(cam, xs.reshape(-1) + 0.5, ys.reshape(-1) + 0.5)
        o = (o @ transform[:, :3].T + transform[:, 3]) * outputs.dataparser_scale
        d = d @ transform[:, :3].T
        rays = outputs.cameras.generate_rays(camera_indices=i)
        ref_o = rays.origins.reshape(-1, 3).double().numpy()
        ref_d = rays.directions.reshape(-1, 3).double().numpy()
        np.testing.assert_allclose(o, ref_o, atol=1e-5)
        np.testing.assert_allclose(d, ref_d, atol=1e-5)


@pytest.mark.parametrize("layout", ["object", "street"])
def test_point_colors_agree_with_images(scenes, layout):
    """Projecting the cloud into a view lands most points on pixels of their own color.

    Control: the same projection with the y axis flipped (a convention error) does not.
    """
    from nerfstudio.data.datasets.base_dataset import InputDataset

    outputs = _parse(scenes[layout], "train")
    dataset = InputDataset(outputs)
    cams = outputs.cameras
    xyz = outputs.metadata["points3D_xyz"]
    rgb = outputs.metadata["points3D_rgb"].float() / 255.0
    match = {1.0: [], -1.0: []}
    for i in range(0, len(cams), 3):
        image = dataset[i]["image"]
        c2w = cams.camera_to_worlds[i]
        q = (xyz - c2w[:3, 3]) @ c2w[:3, :3]
        depth = -q[:, 2]
        u = cams.fx[i] * q[:, 0] / depth + cams.cx[i]
        for flip, out in match.items():
            v = -flip * cams.fy[i] * q[:, 1] / depth + cams.cy[i]
            inside = (depth > 0) & (u >= 0) & (u < 80) & (v >= 0) & (v < 48)
            pixels = image[v[inside].long(), u[inside].long()]
            err = (pixels - rgb[inside]).abs().amax(dim=1)
            out.append((err < 0.1).float().mean().item())
    good, flipped = np.mean(match[1.0]), np.mean(match[-1.0])
    assert good > 0.4, good
    assert good > 2.0 * flipped, (good, flipped)


def test_street_has_spatial_locality(scenes):
    """Street views far apart share almost no points; neighbours and object views share many."""
    stats = {}
    for layout, data in scenes.items():
        outputs = _parse(data, "train")
        sets = _visible_sets(outputs.cameras, outputs.metadata["points3D_xyz"])
        pos = outputs.cameras.camera_to_worlds[:, :3, 3]
        dist = torch.cdist(pos, pos)
        n = len(sets)
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        far = [_jaccard(sets[i], sets[j]) for i, j in pairs if dist[i, j] > 0.4 * dist.max()]
        stats[layout] = {
            "neighbour": np.mean([_jaccard(sets[i], sets[i + 1]) for i in range(n - 1)]),
            "far": np.mean(far),
            "all": np.mean([_jaccard(sets[i], sets[j]) for i, j in pairs]),
            "visible": np.mean([len(s) for s in sets]) / len(outputs.metadata["points3D_xyz"]),
        }
    street, obj = stats["street"], stats["object"]
    assert street["neighbour"] > 0.2, stats
    assert street["far"] < 0.1 * street["neighbour"], stats
    assert street["far"] < 0.1 * obj["far"], stats
    assert street["all"] < 0.5 * obj["all"], stats
    assert street["visible"] < 0.3 < obj["visible"], stats


def test_drive_views_overlap_densely(scenes, tmp_path):
    """The forward camera (``drive``) sees the far street in every frame: far-apart views
    share many points, unlike the sideways street views of the same street."""
    sets = {}
    drive = make_scene(tmp_path / "drive", layout="drive", seed=3, **SMALL)
    for layout, data in (("street", scenes["street"]), ("drive", drive)):
        outputs = _parse(data, "train")
        seen = _visible_sets(outputs.cameras, outputs.metadata["points3D_xyz"])
        n = len(seen)
        far = [_jaccard(seen[i], seen[j]) for i in range(n) for j in range(i + n // 2, n)]
        sets[layout] = {"far": float(np.mean(far)), "first_last": _jaccard(seen[0], seen[-1])}
    assert sets["drive"]["far"] > 0.1 and sets["drive"]["far"] > 5 * sets["street"]["far"], sets
    assert sets["drive"]["first_last"] > 0.02, sets


def test_ray_casting_matches_brute_force_marching():
    """Analytic box/sphere hits equal the first inside-sample of a fine ray march."""
    rng = np.random.default_rng(0)
    tex = synthetic.Texture("solid", (0.5, 0.5, 0.5))
    boxes = [
        synthetic.Box((-1.0, -0.5, 0.0), (0.5, 0.5, 1.0), tex),
        synthetic.Box((1.0, 1.0, 0.0), (1.5, 2.0, 2.5), tex),
    ]
    spheres = [
        synthetic.Sphere((0.0, 1.5, 0.6), 0.6, tex),
        synthetic.Sphere((-1.5, 0, 1), 0.4, tex),
    ]
    scene = synthetic.Scene(boxes, spheres, tex, tex, (0.0, 0.0, 0.0), 50.0, (0.3, 0.2, 0.9))
    k, step, steps = 300, 2e-3, 4000
    origins = rng.uniform([-4.0, -4.0, 2.6], [4.0, 4.0, 3.6], (k, 3))  # above every object
    targets = rng.uniform(-1.0, 1.0, (k, 3)) * [1.5, 2.0, 1.0] + [0.0, 0.5, 1.0]
    dirs = targets - origins
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    t, prim = synthetic.cast_rays(scene, origins, dirs)

    ts = (np.arange(steps) + 1) * step
    p = origins[:, None, :] + ts[None, :, None] * dirs[:, None, :]  # [K, T, 3]
    first = np.full(k, np.inf)
    first_id = np.zeros(k, np.int64)
    for i, box in enumerate(boxes):
        inside = ((p >= box.lo) & (p <= box.hi)).all(axis=2)
        hit_t = np.where(inside.any(axis=1), ts[inside.argmax(axis=1)], np.inf)
        closer = hit_t < first
        first[closer], first_id[closer] = hit_t[closer], 2 + i
    for j, sph in enumerate(spheres):
        inside = ((p - sph.center) ** 2).sum(axis=2) <= sph.radius**2
        hit_t = np.where(inside.any(axis=1), ts[inside.argmax(axis=1)], np.inf)
        closer = hit_t < first
        first[closer], first_id[closer] = hit_t[closer], 2 + len(boxes) + j
    hits = np.isfinite(first)
    assert hits.sum() > k // 3  # the test rays do hit things
    np.testing.assert_array_equal(prim[hits], first_id[hits])
    assert np.all(first[hits] - t[hits] >= -1e-9)
    assert np.all(first[hits] - t[hits] <= step + 1e-9)
    # Rays that march into nothing end on the ground or the sky, never on an object.
    assert np.all(prim[~hits] <= 1)


def test_deterministic_given_seed(tmp_path):
    kwargs = {"num_views": 4, "num_eval_views": 1, "width": 40, "height": 24, "num_points": 500}
    for layout in ("object", "street"):
        a = make_scene(tmp_path / f"{layout}_a", layout=layout, seed=7, **kwargs)
        b = make_scene(tmp_path / f"{layout}_b", layout=layout, seed=7, **kwargs)
        c = make_scene(tmp_path / f"{layout}_c", layout=layout, seed=8, **kwargs)
        files = ["transforms.json", "sparse_pc.ply"] + [
            f"images/frame_{i:05d}.png" for i in range(5)
        ]
        for name in files:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
        assert (a / "transforms.json").read_bytes() != (c / "transforms.json").read_bytes()
        assert (a / "images/frame_00000.png").read_bytes() != (
            c / "images/frame_00000.png"
        ).read_bytes()


def test_cli_writes_scene_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "cli"
    synthetic.main(
        ["--out", str(out), "--layout", "street", "--views", "3", "--eval-views", "1"]
        + ["--size", "32x24", "--seed", "1", "--points", "300"]
    )
    meta = json.loads((out / "transforms.json").read_text())
    assert len(meta["frames"]) == 4 and len(meta["train_filenames"]) == 3
    assert meta["test_filenames"] == meta["val_filenames"] == ["images/frame_00002.png"]
    assert meta["camera_model"] == "OPENCV" and meta["ply_file_path"] == "sparse_pc.ply"
    assert sorted(p.name for p in (out / "images").iterdir()) == [
        f"frame_{i:05d}.png" for i in range(4)
    ]
    with pytest.raises(SystemExit):
        synthetic.main(["--out", str(out), "--size", "32by24"])
    assert "WIDTHxHEIGHT" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layout": "forest"}, "layout"),
        ({"num_views": 1}, "num_views"),
        ({"num_eval_views": 0}, "num_eval_views"),
        ({"num_views": 3, "num_eval_views": 4}, "num_eval_views"),
        ({"width": 4}, "image size"),
        ({"num_points": 0}, "num_points"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_raise_value_error(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_scene(tmp_path / "bad", **kwargs)
