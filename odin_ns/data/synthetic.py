"""Procedural multi-view scenes rendered with an exact CPU ray caster.

Tests, the demo and the benchmarks need small, real-looking multi-view data that the project
makes itself. A scene is analytic geometry (axis-aligned boxes, spheres, a ground plane and a
far sky dome) with procedural textures (checkers, stripes, value noise, window facades) and
Lambertian shading under a fixed sun with hard shadows. Nothing is view-dependent (no
specular), and images are 2x2 supersampled; they are the ground truth the 3DGS model fits.

Three layouts:

- ``object``: cameras orbit one object group on a checkered ground disc; every view sees most
  of the scene (weak locality).
- ``street``: cameras drive down a street looking forward-sideways at one side, then back up
  it looking at the other side; each view sees its own stretch of facades (strong locality,
  uneven per-view content). This is the workload where primitive-level sync pays off.
- ``drive``: the same street filmed as a car's forward camera does, one pass down the right
  lane looking along the road: the far facades, the street's end and the sky are in every
  frame (dense overlap; most of a step's rows were written by the steps before, as in real
  driving sequences). This is the hard case for primitive-level sync.

Output is nerfstudio's ``transforms.json`` layout (``images/frame_XXXXX.png``, OPENCV camera
without distortion, camera-to-world matrices in the OpenGL convention: the camera looks down
-z with +y up; world +z is up), plus ``sparse_pc.ply``: points sampled on surfaces seen by the
training views, with their shaded colors and depth-proportional position noise, like an SfM
cloud (sky hits are mostly dropped: 25% kept, on the far dome). Held-out views are listed in ``train_filenames`` / ``val_filenames`` /
``test_filenames``; nerfstudio's parser (1.1.5) uses these lists whatever ``--eval-mode`` says,
so ``ns-train ... nerfstudio-data --data DIR`` trains on the training views only and ``ns-eval``
evaluates the held-out ones. Eval views lie on the same trajectory, between training views.

Usage::

    python -m odin_ns.data.synthetic --out DIR --layout street --views 24 --eval-views 4
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

Color = tuple[float, float, float]

LAYOUTS = ("object", "street", "drive")
DEFAULT_OBJECT_POINTS = 8000
STREET_POINTS_PER_VIEW = 600
# 2x2 rotated-grid supersampling offsets inside a pixel (pixel = [0, 1) x [0, 1)).
_SUBPIXEL_OFFSETS = ((0.375, 0.125), (0.875, 0.375), (0.125, 0.625), (0.625, 0.875))
_EPS = 1e-4

# Palettes (immutable tuples of RGB in [0, 1]).
_FACADE_COLORS: tuple[Color, ...] = (
    (0.80, 0.74, 0.62),
    (0.72, 0.45, 0.35),
    (0.86, 0.84, 0.78),
    (0.55, 0.60, 0.66),
    (0.90, 0.80, 0.55),
    (0.62, 0.70, 0.58),
    (0.76, 0.56, 0.50),
    (0.66, 0.62, 0.72),
    (0.93, 0.90, 0.86),
    (0.50, 0.42, 0.38),
)
_OBJECT_COLORS: tuple[Color, ...] = (
    (0.85, 0.20, 0.18),
    (0.15, 0.45, 0.80),
    (0.95, 0.75, 0.15),
    (0.20, 0.65, 0.30),
    (0.60, 0.25, 0.70),
    (0.95, 0.50, 0.15),
    (0.10, 0.60, 0.65),
    (0.90, 0.90, 0.88),
    (0.20, 0.20, 0.25),
)


@dataclass(frozen=True)
class Texture:
    """A procedural surface pattern; ``kind`` picks the pattern, the rest parameterize it."""

    kind: str  # solid|checker|stripes|noise|facade|object_ground|street_ground|sky
    color_a: Color
    color_b: Color = (0.0, 0.0, 0.0)
    color_c: Color = (0.0, 0.0, 0.0)
    scale: float = 1.0  # pattern period in meters (checker cell, stripe width, noise feature)
    seed: int = 0
    extent: float = 0.0  # object_ground: disc radius; street_ground: half width of the road
    floor_height: float = 3.0  # facade
    window_spacing: float = 2.5  # facade


@dataclass(frozen=True)
class Box:
    """Axis-aligned box; ``top`` textures the +z face (roofs), ``texture`` the others."""

    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    texture: Texture
    top: Texture | None = None


@dataclass(frozen=True)
class Sphere:
    """Sphere; textures use (longitude, latitude) arc lengths as surface coordinates."""

    center: tuple[float, float, float]
    radius: float
    texture: Texture


@dataclass
class Scene:
    """Geometry + lighting. Primitive ids: 0 sky dome, 1 ground, 2.. boxes, then spheres."""

    boxes: list[Box]
    spheres: list[Sphere]
    ground: Texture
    sky: Texture
    dome_center: tuple[float, float, float]
    dome_radius: float
    light_dir: tuple[float, float, float]  # unit vector towards the sun
    ambient: float = 0.42
    sun: float = 0.72
    seed: int = 0  # seeds the noise table
    noise: Noise = field(init=False)
    box_lo: np.ndarray = field(init=False)  # [B, 3]
    box_hi: np.ndarray = field(init=False)  # [B, 3]
    sph_c: np.ndarray = field(init=False)  # [S, 3]
    sph_r: np.ndarray = field(init=False)  # [S]

    def __post_init__(self) -> None:
        self.box_lo = np.array([b.lo for b in self.boxes], np.float64).reshape(-1, 3)
        self.box_hi = np.array([b.hi for b in self.boxes], np.float64).reshape(-1, 3)
        self.sph_c = np.array([s.center for s in self.spheres], np.float64).reshape(-1, 3)
        self.sph_r = np.array([s.radius for s in self.spheres], np.float64).reshape(-1)
        self.noise = Noise.from_seed(self.seed)
        light = np.asarray(self.light_dir, np.float64)
        self.light_dir = tuple((light / np.linalg.norm(light)).tolist())

    @property
    def num_boxes(self) -> int:
        return len(self.boxes)

    def occluder_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """AABBs of all boxes then all spheres: lo [B+S, 3], hi [B+S, 3]."""
        lo = np.concatenate([self.box_lo, self.sph_c - self.sph_r[:, None]])
        hi = np.concatenate([self.box_hi, self.sph_c + self.sph_r[:, None]])
        return lo, hi


@dataclass(frozen=True)
class PinholeCamera:
    """Pinhole camera; ``c2w`` is camera-to-world in the OpenGL/nerfstudio convention."""

    c2w: np.ndarray  # [4, 4]
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int


# ---------------------------------------------------------------------------------------------
# Procedural noise


def _hash3(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int) -> np.ndarray:
    """Integer lattice hash -> float in [0, 1). Inputs int64 [K]."""
    m = 0xFFFFFFFF
    h = (ix * 374761393 + iy * 668265263 + iz * 2147483647 + seed * 1442695041) & m
    h = ((h ^ (h >> 13)) * 1274126177) & m
    h = ((h ^ (h >> 16)) * 2246822519) & m
    h = h ^ (h >> 15)
    return (h & 0xFFFFFF).astype(np.float64) / float(1 << 24)


_NOISE_BITS = 5  # lattice period 32 cells per axis (small table: cache-friendly gathers)
_NOISE_N = 1 << _NOISE_BITS
_OCTAVE_ROTATION = ((0.0, 0.8, 0.6), (-0.8, 0.36, -0.48), (-0.6, -0.48, 0.64))


@dataclass(frozen=True)
class Noise:
    """Periodic 3D value noise from a random lattice table.

    ``corners[c]`` holds the 8 lattice values of cell c, so one gather per lookup fetches all
    of them. Different ``seed`` arguments shift the lattice by a hashed integer offset, so
    textures with different seeds get independent-looking noise from the same table.
    """

    corners: np.ndarray  # [32**3, 8] float32, corner order (dz, dy, dx) bits

    @staticmethod
    def from_seed(seed: int) -> Noise:
        lattice = np.random.default_rng(seed).random((_NOISE_N,) * 3, dtype=np.float32)
        shifts = [(dx, dy, dz) for dz in (0, 1) for dy in (0, 1) for dx in (0, 1)]
        corners = np.stack(
            [
                np.roll(lattice, (-dx, -dy, -dz), axis=(0, 1, 2)).reshape(-1)
                for dx, dy, dz in shifts
            ],
            axis=1,
        )
        return Noise(corners)

    def value(self, p: np.ndarray, seed: int) -> np.ndarray:
        """Smooth value noise in [0, 1); p: [K, 3] -> [K]."""
        base = np.floor(p)
        f = p - base
        f = f * f * (3.0 - 2.0 * f)
        axes = np.arange(3, dtype=np.int64)
        off = (_hash3(np.full(3, seed, np.int64), axes, axes, 7919) * _NOISE_N).astype(np.int64)
        i = (base.astype(np.int64) + off) & (_NOISE_N - 1)
        cell = (i[:, 0] << (2 * _NOISE_BITS)) | (i[:, 1] << _NOISE_BITS) | i[:, 2]
        c = self.corners.take(cell, axis=0)  # [K, 8]
        fx, fy, fz = f[:, 0:1], f[:, 1:2], f[:, 2]
        cx = c[:, 0::2] + (c[:, 1::2] - c[:, 0::2]) * fx  # [K, 4] (dz, dy)
        cy = cx[:, 0::2] + (cx[:, 1::2] - cx[:, 0::2]) * fy  # [K, 2] (dz)
        return cy[:, 0] + (cy[:, 1] - cy[:, 0]) * fz

    def fbm(self, p: np.ndarray, seed: int, octaves: int = 4) -> np.ndarray:
        """Fractal sum of value noise, normalized to [0, 1); p: [K, 3] -> [K]."""
        rot = 2.0 * np.asarray(_OCTAVE_ROTATION)  # rotate octaves: hides the lattice period
        total = np.zeros(len(p))
        amp, norm, q = 1.0, 0.0, p
        for o in range(octaves):
            total += amp * self.value(q, seed + 101 * o)
            norm += amp
            amp *= 0.5
            q = np.einsum("ij,kj->ik", q, rot)
        return total / norm


def _mix(a: Color, b: Color, w: np.ndarray) -> np.ndarray:
    """Blend two colors by weight w [K] in [0, 1] -> [K, 3]."""
    ca, cb = np.asarray(a), np.asarray(b)
    return ca[None] * (1.0 - w[:, None]) + cb[None] * w[:, None]


# ---------------------------------------------------------------------------------------------
# Textures


def _box_face(p: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Face of the box nearest to each hit point: axis [K] in {0,1,2}, sign [K] in {-1,+1}."""
    d = np.concatenate([np.abs(p - lo), np.abs(p - hi)], axis=1)  # [K, 6]
    k = np.argmin(d, axis=1)
    return k % 3, np.where(k >= 3, 1.0, -1.0)


def _face_uv(p: np.ndarray, lo: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Face-local coordinates (horizontal, vertical-or-second) from the box corner: [K, 2]."""
    q = p - lo
    u = np.where(axis == 0, q[:, 1], q[:, 0])
    v = np.where(axis == 2, q[:, 1], q[:, 2])
    return np.stack([u, v], axis=1)


def _pattern(tex: Texture, p: np.ndarray, uv: np.ndarray, noise: Noise) -> np.ndarray:
    """Albedo [K, 3] of ``tex`` at world points p [K, 3] with surface coordinates uv [K, 2]."""
    if tex.kind == "noise":
        return _mix(tex.color_a, tex.color_b, noise.fbm(p / tex.scale, tex.seed, octaves=4))
    grain = noise.fbm(p / max(tex.scale, 1e-6) * 2.0, tex.seed, octaves=2)
    if tex.kind == "solid":
        return np.asarray(tex.color_a)[None] * (0.92 + 0.16 * grain[:, None])
    if tex.kind == "checker":
        cell = np.floor(uv / tex.scale).astype(np.int64)
        odd = ((cell[:, 0] + cell[:, 1]) & 1).astype(np.float64)
        return _mix(tex.color_a, tex.color_b, odd) * (0.9 + 0.2 * grain[:, None])
    if tex.kind == "stripes":
        odd = (np.floor(uv[:, 1] / tex.scale).astype(np.int64) & 1).astype(np.float64)
        return _mix(tex.color_a, tex.color_b, odd) * (0.9 + 0.2 * grain[:, None])
    if tex.kind == "facade":
        return _facade(tex, uv, grain)
    if tex.kind == "object_ground":
        return _object_ground(tex, p, grain, noise)
    if tex.kind == "street_ground":
        return _street_ground(tex, p, grain, noise)
    raise ValueError(f"unknown texture kind {tex.kind!r}")


def _facade(tex: Texture, uv: np.ndarray, grain: np.ndarray) -> np.ndarray:
    """Wall with a window grid per floor, a cornice line per floor and a shop band below."""
    s, z = uv[:, 0], uv[:, 1]
    wall = np.asarray(tex.color_a)[None] * (0.85 + 0.3 * grain[:, None])
    floor_i = np.floor(z / tex.floor_height).astype(np.int64)
    fz = z / tex.floor_height - floor_i
    col_i = np.floor(s / tex.window_spacing).astype(np.int64)
    fs = s / tex.window_spacing - col_i
    in_window = (fs > 0.25) & (fs < 0.75) & (fz > 0.3) & (fz < 0.82) & (floor_i >= 1)
    frame = (fs > 0.2) & (fs < 0.8) & (fz > 0.25) & (fz < 0.87) & (floor_i >= 1) & ~in_window
    lit = _hash3(col_i, floor_i, np.zeros_like(col_i), tex.seed) > 0.8
    glass = _mix((0.16, 0.22, 0.32), (0.40, 0.52, 0.62), fz)
    glass = np.where(lit[:, None], np.asarray((0.95, 0.82, 0.45))[None], glass)
    cornice = (fz < 0.06) & (floor_i >= 1)
    shop = floor_i == 0
    shop_win = shop & (fz > 0.12) & (fz < 0.85) & (np.abs(fs - 0.5) < 0.4)
    out = wall.copy()
    out[cornice] = np.asarray(tex.color_b)
    out[frame] = np.asarray((0.92, 0.92, 0.9))
    out[in_window] = glass[in_window]
    out[shop] = (np.asarray(tex.color_b)[None] * (0.8 + 0.3 * grain[:, None]))[shop]
    out[shop_win] = _mix((0.12, 0.14, 0.18), (0.30, 0.34, 0.38), fz)[shop_win]
    return out


def _object_ground(tex: Texture, p: np.ndarray, grain: np.ndarray, noise: Noise) -> np.ndarray:
    """Checkered disc of radius ``extent`` with a rim, on grass."""
    r = np.hypot(p[:, 0], p[:, 1])
    cell = np.floor(p[:, :2] / tex.scale).astype(np.int64)
    odd = ((cell[:, 0] + cell[:, 1]) & 1).astype(np.float64)
    disc = _mix(tex.color_a, tex.color_b, odd) * (0.92 + 0.16 * grain[:, None])
    grass_n = noise.fbm(p * 1.5, tex.seed + 7, octaves=4)
    grass = _mix((0.22, 0.42, 0.16), (0.48, 0.58, 0.26), grass_n)
    rim = np.asarray(tex.color_c)[None] * np.ones((len(p), 1))
    out = np.where((r < tex.extent)[:, None], disc, grass)
    return np.where((np.abs(r - tex.extent) < 0.12)[:, None], rim, out)


def _street_ground(tex: Texture, p: np.ndarray, grain: np.ndarray, noise: Noise) -> np.ndarray:
    """Asphalt road (|y| < extent) with lane marks, tiled sidewalks, gravel behind them."""
    x, y = p[:, 0], p[:, 1]
    ay = np.abs(y)
    asphalt = _mix((0.20, 0.20, 0.22), (0.42, 0.41, 0.40), noise.fbm(p * 3.0, tex.seed, octaves=4))
    dash = (ay < 0.09) & (np.mod(x, 4.0) < 2.0)
    edge = np.abs(ay - (tex.extent - 0.3)) < 0.08
    tile_i = np.floor(p[:, :2] / 0.6).astype(np.int64)
    tile_f = p[:, :2] / 0.6 - tile_i
    grout = (tile_f < 0.05).any(axis=1)
    tone = _hash3(tile_i[:, 0], tile_i[:, 1], np.zeros_like(tile_i[:, 0]), tex.seed + 3)
    tiles = _mix((0.62, 0.60, 0.57), (0.78, 0.76, 0.72), tone) * (0.93 + 0.14 * grain[:, None])
    tiles[grout] = np.asarray((0.38, 0.37, 0.36))
    gravel = _mix((0.36, 0.33, 0.28), (0.55, 0.50, 0.42), noise.fbm(p * 4.0, tex.seed + 5))
    out = np.where((ay < tex.extent)[:, None], asphalt, tiles)
    out[dash] = np.asarray((0.92, 0.82, 0.30))
    out[edge & (ay < tex.extent)] = np.asarray((0.90, 0.90, 0.88))
    return np.where((ay > tex.extent + 2.5)[:, None], gravel, out)


def _sky(
    tex: Texture, p: np.ndarray, center: np.ndarray, radius: float, noise: Noise
) -> np.ndarray:
    """Vertical gradient from ``color_a`` (horizon) to ``color_b`` (zenith) with soft clouds."""
    q = (p - center) / radius
    elev = np.clip(q[:, 2], 0.0, 1.0)
    base = _mix(tex.color_a, tex.color_b, np.sqrt(elev))
    cloud = noise.fbm(q * 6.0, tex.seed, octaves=4)
    w = np.clip((cloud - 0.52) * 4.0, 0.0, 1.0) * np.clip(elev * 6.0, 0.0, 1.0)
    return base * (1.0 - w[:, None]) + 0.97 * w[:, None]


# ---------------------------------------------------------------------------------------------
# Ray casting


def _ray_box(
    o: list[np.ndarray | float], inv_d: list[np.ndarray], lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Entry distance of rays into an AABB (inf where missed or behind) -> [K].

    ``o`` and ``inv_d`` are per-axis columns ([K] arrays; origins may be scalars when all rays
    share one), which avoids slow small-axis reductions.
    """
    tnear = tfar = None
    for a in range(3):
        t0 = (lo[a] - o[a]) * inv_d[a]
        t1 = (hi[a] - o[a]) * inv_d[a]
        near, far = np.minimum(t0, t1), np.maximum(t0, t1)
        tnear = near if tnear is None else np.maximum(tnear, near, out=tnear)
        tfar = far if tfar is None else np.minimum(tfar, far, out=tfar)
    hit = (tnear <= tfar) & (tnear > _EPS)
    return np.where(hit, tnear, np.inf)


def _ray_sphere(o: np.ndarray, d: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
    """Entry distance of unit-direction rays into a sphere from outside (inf if missed) -> [K]."""
    oc = o - c
    b = np.einsum("ij,ij->i", oc, d)
    disc = b * b - (np.einsum("ij,ij->i", oc, oc) - r * r)
    t = -b - np.sqrt(np.maximum(disc, 0.0))
    return np.where((disc >= 0.0) & (t > _EPS), t, np.inf)


def cast_rays(
    scene: Scene, origins: np.ndarray, dirs: np.ndarray, candidates: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest hit of each ray: t [K] and primitive id [K] (0 sky, 1 ground, 2+ objects).

    Args:
        origins: [K, 3] ray origins inside the sky dome.
        dirs: [K, 3] unit directions.
        candidates: ids into boxes-then-spheres that may be hit (a culling superset); all if None.
    """
    oc = origins - np.asarray(scene.dome_center)
    b = np.einsum("ij,ij->i", oc, dirs)
    c = np.einsum("ij,ij->i", oc, oc) - scene.dome_radius**2
    t_best = -b + np.sqrt(np.maximum(b * b - c, 0.0))
    prim = np.zeros(len(origins), np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = np.where(dirs[:, 2] < 0.0, -origins[:, 2] / dirs[:, 2], np.inf)
    closer = (t_ground > _EPS) & (t_ground < t_best)
    t_best = np.where(closer, t_ground, t_best)
    prim[closer] = 1
    t_any = _ray_objects(scene, origins, dirs, candidates, t_best, prim)
    return t_any, prim


def _ray_objects(
    scene: Scene,
    origins: np.ndarray,
    dirs: np.ndarray,
    candidates: np.ndarray | None,
    t_best: np.ndarray,
    prim: np.ndarray,
) -> np.ndarray:
    """Intersect boxes and spheres, updating t_best [K] and prim [K] in place; returns t_best."""
    n_obj = scene.num_boxes + len(scene.spheres)
    ids = np.arange(n_obj) if candidates is None else candidates
    safe = np.where(np.abs(dirs) < 1e-12, 1e-12, dirs)
    inv_d = [np.ascontiguousarray(1.0 / safe[:, a]) for a in range(3)]
    shared = bool((origins == origins[:1]).all()) if len(origins) else True
    o_cols = [
        float(origins[0, a]) if shared else np.ascontiguousarray(origins[:, a]) for a in range(3)
    ]
    for i in ids.tolist():
        if i < scene.num_boxes:
            t = _ray_box(o_cols, inv_d, scene.box_lo[i], scene.box_hi[i])
        else:
            j = i - scene.num_boxes
            t = _ray_sphere(origins, dirs, scene.sph_c[j], float(scene.sph_r[j]))
        closer = t < t_best
        t_best[closer] = t[closer]
        prim[closer] = 2 + i
    return t_best


def _shade(
    scene: Scene, points: np.ndarray, prim: np.ndarray, shadow_candidates: np.ndarray | None
) -> np.ndarray:
    """Color [K, 3] of hit points [K, 3] on primitives prim [K] (Lambert + hard sun shadows)."""
    k = len(points)
    albedo = np.zeros((k, 3))
    normal = np.zeros((k, 3))
    sky = prim == 0
    center = np.asarray(scene.dome_center)
    albedo[sky] = _sky(scene.sky, points[sky], center, scene.dome_radius, scene.noise)
    ground = prim == 1
    albedo[ground] = _pattern(scene.ground, points[ground], points[ground][:, :2], scene.noise)
    normal[ground] = (0.0, 0.0, 1.0)
    for pid in np.unique(prim[prim >= 2]).tolist():
        sel = prim == pid
        p = points[sel]
        i = pid - 2
        if i < scene.num_boxes:
            box = scene.boxes[i]
            axis, sign = _box_face(p, scene.box_lo[i], scene.box_hi[i])
            n = np.zeros((len(p), 3))
            n[np.arange(len(p)), axis] = sign
            uv = _face_uv(p, scene.box_lo[i], axis)
            col = _pattern(box.texture, p, uv, scene.noise)
            if box.top is not None:
                top = (axis == 2) & (sign > 0)
                col[top] = _pattern(box.top, p[top], uv[top], scene.noise)
        else:
            sph = scene.spheres[i - scene.num_boxes]
            n = (p - np.asarray(sph.center)) / sph.radius
            lon = np.arctan2(n[:, 1], n[:, 0]) * sph.radius
            lat = np.arcsin(np.clip(n[:, 2], -1.0, 1.0)) * sph.radius
            col = _pattern(sph.texture, p, np.stack([lon, lat], axis=1), scene.noise)
        albedo[sel] = col
        normal[sel] = n
    light = np.asarray(scene.light_dir)
    lambert = np.clip(np.einsum("ij,j->i", normal, light), 0.0, None)
    lit = ~sky & (lambert > 0.0)
    visible = np.zeros(k)
    if lit.any():
        o = points[lit] + 1e-3 * normal[lit]
        d = np.broadcast_to(light, o.shape)
        t = np.full(len(o), np.inf)
        _ray_objects(scene, o, d, shadow_candidates, t, np.zeros(len(o), np.int64))
        visible[lit] = np.isinf(t)
    hemi = 0.8 + 0.2 * normal[:, 2]
    shading = scene.ambient * hemi + scene.sun * lambert * visible
    return np.where(sky[:, None], albedo, albedo * shading[:, None])


# ---------------------------------------------------------------------------------------------
# Cameras and culling


def look_at(eye: np.ndarray, target: np.ndarray, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Camera-to-world [4, 4], OpenGL convention (camera looks down -z, +y up)."""
    eye, target = np.asarray(eye, np.float64), np.asarray(target, np.float64)
    back = eye - target
    back /= np.linalg.norm(back)
    right = np.cross(np.asarray(up, np.float64), back)
    right /= np.linalg.norm(right)
    cam_up = np.cross(back, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, cam_up, back, eye
    return c2w


def camera_rays(cam: PinholeCamera, px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, ...]:
    """World rays through continuous pixel coordinates px, py [K] (pixel centers at +0.5).

    Returns origins [K, 3] and unit directions [K, 3].
    """
    d_cam = np.stack([(px - cam.cx) / cam.fx, -(py - cam.cy) / cam.fy, -np.ones_like(px)], axis=1)
    d = np.einsum("ij,kj->ik", d_cam, cam.c2w[:3, :3])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return np.broadcast_to(cam.c2w[:3, 3], d.shape).copy(), d


def _frustum_candidates(scene: Scene, cam: PinholeCamera) -> np.ndarray:
    """Objects whose AABB is not entirely outside one frustum plane (conservative) -> ids."""
    lo, hi = scene.occluder_bounds()
    if len(lo) == 0:
        return np.zeros(0, np.int64)
    corners = np.stack(
        [np.where(np.array(m)[None, :] == 1, hi, lo) for m in np.ndindex(2, 2, 2)], axis=1
    )  # [N, 8, 3]
    w2c_r = cam.c2w[:3, :3].T
    q = (corners - cam.c2w[:3, 3]) @ w2c_r.T
    x, y, depth = q[..., 0], q[..., 1], -q[..., 2]
    outside = (
        (depth <= 0.0).all(axis=1)
        | (x * cam.fx + cam.cx * depth < 0.0).all(axis=1)
        | (x * cam.fx - (cam.width - cam.cx) * depth > 0.0).all(axis=1)
        | (y * cam.fy - cam.cy * depth > 0.0).all(axis=1)
        | (y * cam.fy + (cam.height - cam.cy) * depth < 0.0).all(axis=1)
    )
    return np.nonzero(~outside)[0]


def _shadow_candidates(scene: Scene, points: np.ndarray) -> np.ndarray:
    """Objects that may shadow any of points [K, 3]: AABB overlap with the swept sun rays."""
    lo, hi = scene.occluder_bounds()
    if len(lo) == 0 or len(points) == 0:
        return np.zeros(0, np.int64)
    light = np.asarray(scene.light_dir)
    top = hi[:, 2].max()
    s = np.clip((top - points[:, 2]) / max(light[2], 1e-3), 0.0, None)
    ends = points + s[:, None] * light
    sweep_lo = np.minimum(points.min(axis=0), ends.min(axis=0))
    sweep_hi = np.maximum(points.max(axis=0), ends.max(axis=0))
    overlap = (lo <= sweep_hi).all(axis=1) & (hi >= sweep_lo).all(axis=1)
    return np.nonzero(overlap)[0]


def render_view(scene: Scene, cam: PinholeCamera) -> np.ndarray:
    """Render an anti-aliased (2x2 supersampled) uint8 image [H, W, 3]."""
    h, w = cam.height, cam.width
    yy, xx = np.meshgrid(
        np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij"
    )
    xx, yy = xx.reshape(-1), yy.reshape(-1)
    px = np.concatenate([xx + ox for ox, _ in _SUBPIXEL_OFFSETS])
    py = np.concatenate([yy + oy for _, oy in _SUBPIXEL_OFFSETS])
    chunk = 16384  # bounds temporaries for large images
    rgb = np.concatenate(
        [
            _trace(scene, cam, px[a : a + chunk], py[a : a + chunk])[0]
            for a in range(0, len(px), chunk)
        ]
    )
    img = rgb.reshape(len(_SUBPIXEL_OFFSETS), h, w, 3).mean(axis=0)
    return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)


def _trace(
    scene: Scene, cam: PinholeCamera, px: np.ndarray, py: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Trace pixel rays: colors [K, 3], hit points [K, 3], primitive ids [K], depths [K]."""
    o, d = camera_rays(cam, px, py)
    t, prim = cast_rays(scene, o, d, _frustum_candidates(scene, cam))
    points = o + t[:, None] * d
    shadow = _shadow_candidates(scene, points[prim != 0])
    rgb = _shade(scene, points, prim, shadow)
    z_cam = -np.einsum("ij,j->i", points - cam.c2w[:3, 3], cam.c2w[:3, 2])
    return rgb, points, prim, z_cam


def sample_point_cloud(
    scene: Scene,
    cams: list[PinholeCamera],
    num_points: int,
    rng: np.random.Generator,
    noise: float = 0.004,
    sky_keep: float = 0.25,
) -> tuple[np.ndarray, np.ndarray]:
    """SfM-like cloud: surface points seen by ``cams`` with their colors, jittered.

    Each camera contributes the hits of random pixel rays (so density follows image coverage,
    as in SfM); sky hits are kept with probability ``sky_keep``; positions get isotropic noise
    of ``noise`` x depth and colors a few levels of noise. Returns xyz [P, 3] float32 and
    rgb [P, 3] uint8.
    """
    per_cam = math.ceil(2 * num_points / len(cams)) + 1
    xyz_all, rgb_all = [], []
    for cam in cams:
        px = rng.uniform(0.0, cam.width, per_cam)
        py = rng.uniform(0.0, cam.height, per_cam)
        rgb, pts, prim, depth = _trace(scene, cam, px, py)
        keep = (prim != 0) | (rng.uniform(size=per_cam) < sky_keep)
        pts = pts + rng.normal(size=pts.shape) * (noise * depth)[:, None]
        rgb = rgb + rng.normal(size=rgb.shape) * (3.0 / 255.0)
        xyz_all.append(pts[keep])
        rgb_all.append(rgb[keep])
    xyz, rgb = np.concatenate(xyz_all), np.concatenate(rgb_all)
    if len(xyz) < num_points:
        raise ValueError(f"could only sample {len(xyz)} points, fewer than {num_points}")
    pick = np.sort(rng.choice(len(xyz), num_points, replace=False))
    rgb8 = np.clip(rgb[pick] * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return xyz[pick].astype(np.float32), rgb8


# ---------------------------------------------------------------------------------------------
# Layouts


def _pick(rng: np.random.Generator, palette: tuple[Color, ...]) -> Color:
    return palette[int(rng.integers(len(palette)))]


def _shade_color(c: Color, f: float) -> Color:
    return (c[0] * f, c[1] * f, c[2] * f)


def _object_scene(rng: np.random.Generator) -> Scene:
    """One textured box group with spheres on a checkered disc, hedges far around."""
    seed = int(rng.integers(1 << 20))
    colors = [_OBJECT_COLORS[i] for i in rng.permutation(len(_OBJECT_COLORS))]
    boxes: list[Box] = []
    spheres: list[Sphere] = []
    sx, sy, sz = rng.uniform(0.55, 0.75), rng.uniform(0.45, 0.6), rng.uniform(0.9, 1.2)
    boxes.append(
        Box((-sx, -sy, 0.0), (sx, sy, sz), Texture("checker", colors[0], colors[1], scale=0.3))
    )
    tx = rng.uniform(-0.2, 0.2)
    boxes.append(
        Box(
            (tx - 0.3, -0.25, sz),
            (tx + 0.25, 0.25, sz + rng.uniform(0.35, 0.55)),
            Texture("stripes", colors[2], colors[8], scale=0.08, seed=seed),
        )
    )
    px, py = rng.uniform(1.1, 1.5), rng.uniform(-1.6, -1.0)
    boxes.append(
        Box(
            (px - 0.18, py - 0.18, 0.0),
            (px + 0.18, py + 0.18, rng.uniform(1.4, 1.9)),
            Texture("stripes", colors[3], (0.95, 0.95, 0.92), scale=0.2),
        )
    )
    kinds = ("stripes", "checker", "noise", "checker")
    for j in range(4):
        ang = 2 * math.pi * j / 4 + rng.uniform(0.3, 0.9)
        dist, r = rng.uniform(1.5, 2.2), rng.uniform(0.3, 0.55)
        ca, cb = colors[(4 + j) % 8], colors[(5 + j) % 8]
        spheres.append(
            Sphere(
                (dist * math.cos(ang), dist * math.sin(ang), r),
                r,
                Texture(
                    kinds[j], ca, cb, scale=0.15 if kinds[j] != "noise" else 0.2, seed=seed + j
                ),
            )
        )
    for j in range(10):
        ang = 2 * math.pi * (j + rng.uniform(0.0, 0.5)) / 10
        dist = rng.uniform(13.0, 17.0)
        cx, cy = dist * math.cos(ang), dist * math.sin(ang)
        half, hgt = rng.uniform(1.0, 2.5), rng.uniform(1.2, 3.5)
        tex = Texture(
            "noise",
            _shade_color(_pick(rng, _FACADE_COLORS), 0.8),
            _pick(rng, _FACADE_COLORS),
            scale=0.6,
            seed=seed + 10 + j,
        )
        if j % 2:
            spheres.append(
                Sphere(
                    (cx, cy, hgt),
                    hgt,
                    Texture(
                        "noise", (0.15, 0.35, 0.12), (0.4, 0.6, 0.2), scale=0.5, seed=seed + 30 + j
                    ),
                )
            )
        else:
            boxes.append(Box((cx - half, cy - half, 0.0), (cx + half, cy + half, hgt), tex))
    ground = Texture(
        "object_ground",
        (0.88, 0.86, 0.80),
        (0.30, 0.30, 0.34),
        colors[6],
        scale=0.5,
        seed=seed + 50,
        extent=3.4,
    )
    sky = Texture("sky", (0.85, 0.88, 0.92), (0.35, 0.55, 0.85), seed=seed + 60)
    light = (0.45, -0.35, 0.82)
    return Scene(boxes, spheres, ground, sky, (0.0, 0.0, 0.0), 40.0, light, seed=seed)


def _object_cameras(
    rng: np.random.Generator, n: int, width: int, height: int
) -> list[PinholeCamera]:
    """Orbit at varied elevation (12-40 deg) and distance around the object group."""
    f = 0.5 * width / math.tan(math.radians(55.0) / 2)
    az0 = rng.uniform(0, 2 * math.pi)
    phase = rng.uniform(0, 2 * math.pi)
    target = np.array([0.0, 0.0, 0.55])
    cams = []
    for i in range(n):
        a = az0 + 2 * math.pi * i / n
        el = math.radians(12.0 + 28.0 * (0.5 + 0.5 * math.sin(3 * 2 * math.pi * i / n + phase)))
        r = 6.0 * (1.0 + 0.1 * math.sin(2 * 2 * math.pi * i / n))
        eye = target + r * np.array(
            [math.cos(el) * math.cos(a), math.cos(el) * math.sin(a), math.sin(el)]
        )
        aim = target + rng.uniform(-0.2, 0.2, 3)
        cams.append(PinholeCamera(look_at(eye, aim), f, f, width / 2, height / 2, width, height))
    return cams


def _street_length(n: int) -> float:
    return max(40.0, 3.2 * n)


def _street_scene(rng: np.random.Generator, n_views: int) -> Scene:
    """A street along +x lined on both sides with varied buildings, trees, lamps and cars."""
    seed = int(rng.integers(1 << 20))
    length = _street_length(n_views)
    road, walk = 4.0, 2.5
    front = road + walk
    boxes: list[Box] = []
    spheres: list[Sphere] = []
    for side in (-1.0, 1.0):
        x = -14.0
        while x < length + 14.0:
            if rng.uniform() < 0.18:
                x += rng.uniform(2.0, 4.0)  # alley
            w = rng.uniform(5.0, 11.0)
            depth, hgt = rng.uniform(6.0, 12.0), rng.uniform(5.0, 20.0)
            setback = 0.0 if rng.uniform() < 0.7 else rng.uniform(0.3, 1.5)
            y0, y1 = front + setback, front + setback + depth
            lo = (x, -y1 if side < 0 else y0, 0.0)
            hi = (x + w, -y0 if side < 0 else y1, hgt)
            wall = _pick(rng, _FACADE_COLORS)
            tex = Texture(
                "facade",
                wall,
                _shade_color(_pick(rng, _FACADE_COLORS), 0.75),
                scale=0.8,
                seed=seed + len(boxes),
                floor_height=rng.uniform(2.8, 3.6),
                window_spacing=rng.uniform(1.8, 3.0),
            )
            roof = Texture("noise", (0.25, 0.24, 0.24), (0.45, 0.42, 0.40), scale=1.0)
            boxes.append(Box(lo, hi, tex, roof))
            x += w
    end_tex = Texture("facade", (0.70, 0.66, 0.60), (0.45, 0.40, 0.36), seed=seed + 999)
    boxes.append(Box((-24.0, -22.0, 0.0), (-16.0, 22.0, 24.0), end_tex))
    boxes.append(Box((length + 16.0, -22.0, 0.0), (length + 24.0, 22.0, 24.0), end_tex))
    for side in (-1.0, 1.0):
        x = rng.uniform(-4.0, 4.0)
        while x < length + 8.0:
            kind = rng.uniform()
            yw = side * (road + 1.2)
            if kind < 0.45:  # tree: trunk + crown
                boxes.append(
                    Box(
                        (x - 0.15, yw - 0.15, 0.0),
                        (x + 0.15, yw + 0.15, 2.4),
                        Texture("noise", (0.30, 0.20, 0.12), (0.45, 0.32, 0.20), scale=0.2),
                    )
                )
                r = rng.uniform(1.0, 1.5)
                spheres.append(
                    Sphere(
                        (x, yw, 2.3 + r * 0.8),
                        r,
                        Texture(
                            "noise",
                            (0.10, 0.30, 0.08),
                            (0.45, 0.62, 0.22),
                            scale=0.35,
                            seed=seed + int(x * 10),
                        ),
                    )
                )
            elif kind < 0.65:  # lamp post
                boxes.append(
                    Box(
                        (x - 0.08, yw - 0.08, 0.0),
                        (x + 0.08, yw + 0.08, 4.2),
                        Texture("stripes", (0.15, 0.16, 0.18), (0.30, 0.32, 0.34), scale=0.5),
                    )
                )
                spheres.append(Sphere((x, yw, 4.4), 0.25, Texture("solid", (0.98, 0.95, 0.80))))
            else:  # parked car: body + cabin
                yc = side * (road - 1.1)
                body = _pick(rng, _OBJECT_COLORS)
                boxes.append(
                    Box(
                        (x - 2.1, yc - 0.9, 0.15),
                        (x + 2.1, yc + 0.9, 1.05),
                        Texture("stripes", body, _shade_color(body, 0.6), scale=0.45),
                    )
                )
                boxes.append(
                    Box(
                        (x - 1.1, yc - 0.8, 1.05),
                        (x + 0.9, yc + 0.8, 1.6),
                        Texture("checker", (0.15, 0.18, 0.24), _shade_color(body, 0.9), scale=0.5),
                    )
                )
            x += rng.uniform(7.0, 13.0)
    ground = Texture("street_ground", (0.3, 0.3, 0.3), scale=0.5, seed=seed + 77, extent=road)
    sky = Texture("sky", (0.86, 0.88, 0.90), (0.30, 0.50, 0.82), seed=seed + 88)
    center = (length / 2, 0.0, 0.0)
    light = (0.35, -0.5, 0.79)
    return Scene(boxes, spheres, ground, sky, center, length / 2 + 60.0, light, seed=seed)


def _street_cameras(
    rng: np.random.Generator, n: int, width: int, height: int
) -> list[PinholeCamera]:
    """Drive +x looking forward-left (+y side), then back -x looking at the -y side."""
    f = 0.5 * width / math.tan(math.radians(72.0) / 2)
    length = _street_length(n)
    n1 = (n + 1) // 2
    cams = []
    for i in range(n):
        first = i < n1
        k, m = (i, n1) if first else (i - n1, n - n1)
        s = (k + 0.5) / m
        x = length * s if first else length * (1.0 - s)
        x += rng.uniform(-0.4, 0.4)
        lane = -1.5 if first else 1.5
        eye = np.array([x, lane + rng.uniform(-0.3, 0.3), rng.uniform(1.5, 1.9)])
        yaw = math.radians(60.0 + 12.0 * math.sin(2 * math.pi * s * 2.3) + rng.uniform(-4.0, 4.0))
        pitch = math.radians(4.0 + 8.0 * math.sin(2 * math.pi * s * 1.7) + rng.uniform(-2.0, 2.0))
        sgn = 1.0 if first else -1.0
        fwd = np.array(
            [
                sgn * math.cos(yaw) * math.cos(pitch),
                sgn * math.sin(yaw) * math.cos(pitch),
                math.sin(pitch),
            ]
        )
        cams.append(
            PinholeCamera(look_at(eye, eye + fwd), f, f, width / 2, height / 2, width, height)
        )
    return cams


def _drive_cameras(
    rng: np.random.Generator, n: int, width: int, height: int
) -> list[PinholeCamera]:
    """One pass +x down the right lane (-y), looking along the road (yaw within about 6
    degrees of +x, slight pitch), stopping short of the street's end so that the end wall
    stays ahead in every frame."""
    f = 0.5 * width / math.tan(math.radians(72.0) / 2)
    length = _street_length(n)
    cams = []
    for i in range(n):
        s = (i + 0.5) / n
        x = 0.8 * length * s + rng.uniform(-0.2, 0.2)
        eye = np.array([x, -1.5 + rng.uniform(-0.2, 0.2), rng.uniform(1.4, 1.7)])
        yaw = math.radians(4.0 * math.sin(2 * math.pi * s * 1.3) + rng.uniform(-2.0, 2.0))
        pitch = math.radians(1.0 + rng.uniform(-1.5, 1.5))
        fwd = np.array(
            [math.cos(yaw) * math.cos(pitch), math.sin(yaw) * math.cos(pitch), math.sin(pitch)]
        )
        cams.append(
            PinholeCamera(look_at(eye, eye + fwd), f, f, width / 2, height / 2, width, height)
        )
    return cams


# ---------------------------------------------------------------------------------------------
# Writing


def write_ply(path: Path, xyz: np.ndarray, rgb: np.ndarray) -> None:
    """Binary little-endian PLY with float x,y,z and uchar red,green,blue (nerfstudio/open3d)."""
    rec = np.empty(
        len(xyz),
        dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")],
    )
    rec["x"], rec["y"], rec["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    rec["r"], rec["g"], rec["b"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element vertex {len(xyz)}\n"
        "property float x\nproperty float y\nproperty float z\n"
        "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n"
    )
    with open(path, "wb") as fh:
        fh.write(header.encode("ascii"))
        fh.write(rec.tobytes())


def eval_indices(total: int, num_eval: int) -> np.ndarray:
    """Held-out view ids spread evenly along the trajectory, never the first or last view."""
    ids = np.floor((np.arange(num_eval) + 0.5) * total / num_eval).astype(np.int64)
    return np.clip(ids, 1, total - 2)


def _parse_size(size: str) -> tuple[int, int]:
    parts = size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--size must look like WIDTHxHEIGHT (e.g. 160x96), got {size!r}")
    return int(parts[0]), int(parts[1])


def layout_geometry(
    layout: str, num_views: int, num_points: int, width: int = 160, height: int = 96, seed: int = 0
) -> tuple[list[PinholeCamera], np.ndarray]:
    """A layout's cameras and its SfM-like point cloud ([P, 3] float32), drawn as
    ``make_scene`` draws them, without rendering images: footprint studies of large
    versions of a layout (``odin_ns.bench.scale``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    rng = np.random.default_rng(seed)
    if layout == "object":
        scene = _object_scene(rng)
        cams = _object_cameras(rng, num_views, width, height)
    else:
        scene = _street_scene(rng, num_views)
        make_cameras = _street_cameras if layout == "street" else _drive_cameras
        cams = make_cameras(rng, num_views, width, height)
    xyz, _ = sample_point_cloud(scene, cams, num_points, rng)
    return cams, xyz


def make_scene(
    out_dir: Path,
    layout: str = "object",
    num_views: int = 24,
    num_eval_views: int = 4,
    width: int = 160,
    height: int = 96,
    seed: int = 0,
    num_points: int | None = None,
) -> Path:
    """Render a procedural scene into ``out_dir`` in nerfstudio's transforms.json layout.

    Args:
        out_dir: output folder (created; existing ``images/frame_*.png`` are replaced).
        layout: "object" (orbit, weak locality), "street" (strong spatial locality) or
            "drive" (the street seen from a forward camera: dense overlap).
        num_views: training views; num_eval_views: held-out views (listed as val and test).
        width, height: image size in pixels.
        seed: everything (geometry, textures, cameras, cloud) is a function of the seed.
        num_points: initial point cloud size; default 8000 (object) or 600 per training
            view (street and drive, so each stretch of the street keeps its own points).

    Returns:
        out_dir.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if num_views < 2:
        raise ValueError(f"num_views must be >= 2, got {num_views}")
    if num_eval_views < 1:
        raise ValueError(f"num_eval_views must be >= 1, got {num_eval_views}")
    if num_eval_views > num_views:
        raise ValueError(f"num_eval_views ({num_eval_views}) must be <= num_views ({num_views})")
    if width < 8 or height < 8:
        raise ValueError(f"image size must be at least 8x8, got {width}x{height}")
    if num_points is None:
        num_points = (
            DEFAULT_OBJECT_POINTS if layout == "object" else STREET_POINTS_PER_VIEW * num_views
        )
    if num_points < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out_dir = Path(out_dir)
    total = num_views + num_eval_views
    rng = np.random.default_rng(seed)
    if layout == "object":
        scene = _object_scene(rng)
        cams = _object_cameras(rng, total, width, height)
    else:
        scene = _street_scene(rng, total)
        make_cameras = _street_cameras if layout == "street" else _drive_cameras
        cams = make_cameras(rng, total, width, height)
    is_eval = np.zeros(total, bool)
    is_eval[eval_indices(total, num_eval_views)] = True
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    for old in sorted((out_dir / "images").glob("frame_*.png")):
        old.unlink()
    frames, train_names, eval_names = [], [], []
    for i, cam in enumerate(cams):
        name = f"images/frame_{i:05d}.png"
        Image.fromarray(render_view(scene, cam)).save(out_dir / name)
        c2w = [[round(float(v), 8) for v in row] for row in cam.c2w]
        frames.append({"file_path": name, "transform_matrix": c2w})
        (eval_names if is_eval[i] else train_names).append(name)
    train_cams = [c for c, e in zip(cams, is_eval, strict=True) if not e]
    xyz, rgb = sample_point_cloud(scene, train_cams, num_points, rng)
    write_ply(out_dir / "sparse_pc.ply", xyz, rgb)
    cam0 = cams[0]
    meta = {
        "camera_model": "OPENCV",
        "fl_x": cam0.fx,
        "fl_y": cam0.fy,
        "cx": cam0.cx,
        "cy": cam0.cy,
        "w": width,
        "h": height,
        "k1": 0.0,
        "k2": 0.0,
        "p1": 0.0,
        "p2": 0.0,
        "ply_file_path": "sparse_pc.ply",
        "train_filenames": train_names,
        "val_filenames": eval_names,
        "test_filenames": eval_names,
        "odin_synthetic": {"layout": layout, "seed": seed, "num_points": num_points},
        "frames": frames,
    }
    (out_dir / "transforms.json").write_text(json.dumps(meta, indent=2))
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m odin_ns.data.synthetic",
        description="Render a procedural multi-view scene in nerfstudio's transforms.json layout.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--layout", choices=LAYOUTS, default="object")
    parser.add_argument("--views", type=int, default=24, help="training views")
    parser.add_argument("--eval-views", type=int, default=4, help="held-out views")
    parser.add_argument("--size", default="160x96", help="WIDTHxHEIGHT")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--points",
        type=int,
        default=None,
        help="initial point cloud size (default: 8000 object, 600 per train view otherwise)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        width, height = _parse_size(args.size)
        out = make_scene(
            args.out,
            args.layout,
            args.views,
            args.eval_views,
            width,
            height,
            args.seed,
            args.points,
        )
    except ValueError as err:
        parser.error(str(err))
    print(
        f"wrote {args.layout} scene ({args.views} train + {args.eval_views} eval views, "
        f"{width}x{height}) to {out} in {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    main()
