"""The torch rasterizer against references: a dense per-pixel compositor written here
(float64, every pixel against every Gaussian), autograd through it, gradcheck, gsplat's
pure-torch projection and tile helpers, and gsplat's DefaultStrategy running on its info."""

from __future__ import annotations

import math

import pytest
import torch
from gsplat.cuda._torch_impl import (
    _fully_fused_projection,
    _isect_offset_encode,
    _isect_tiles,
    _quat_scale_to_covar_preci,
    _spherical_harmonics,
)

from odin_ns.render import GSPLAT_NEEDS_CUDA, composite, rasterize, resolve_backend
from odin_ns.render.projection import project_gaussians
from odin_ns.render.sh import sh_to_color
from odin_ns.render.tiles import build_pair_plan
from odin_ns.render.torch_backend import rasterize_torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is faster, and immune to other jobs on the two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


W, H = 32, 24
# (sub-tile side, rows per sweep step): the default, and small ones that force many
# sweep steps and sub-tiles so that carried transmittance and early exit are exercised.
LAYOUTS = [(4, composite.CHUNK_ROWS), (2, 3), (8, 5)]


def make_scene(
    n: int = 80,
    C: int = 2,
    width: int = W,
    height: int = H,
    sh_degree: int | None = 3,
    seed: int = 0,
    dtype=torch.float64,
    log_scale: tuple[float, float] = (-1.5, -0.5),
    special: bool = True,
    anisotropy: float = 0.0,
):
    """Random Gaussians in front of C cameras, dense enough that pixels hit the
    transmittance stop; a few sit outside the view or behind the near plane, and a few
    are opaque enough for alpha to clamp at 0.999."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=dtype)

    f = 30.0
    z = 2.0 + 3.0 * rand(n)
    special = special and n >= 10
    if special:
        z[:2] = torch.tensor([-1.0, 0.005], dtype=dtype)  # behind the camera / before near
        z[2:6] = 1.6  # in front of everything else
    u = (rand(n) * 1.3 - 0.15) * width
    v = (rand(n) * 1.3 - 0.15) * height
    means = torch.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], -1)
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    lo, hi = log_scale
    scales = torch.exp(lo + (hi - lo) * rand(n, 3))
    scales[:, 0] *= math.exp(-anisotropy)  # thin, elongated ellipses
    opacities = 0.5 + 0.49 * rand(n)
    if special:
        # Four small, nearly opaque Gaussians centered on pixel centers of camera 0.
        scales[2:6] = 0.08
        centers = torch.tensor([[5.5, 4.5], [20.5, 11.5], [9.5, 15.5], [25.5, 5.5]], dtype=dtype)
        means[2:6, 0] = (centers[:, 0] - width / 2) / f * z[2:6]
        means[2:6, 1] = (centers[:, 1] - height / 2) / f * z[2:6]
        opacities[2:6] = 0.9995
    if sh_degree is None:
        colors = rand(n, 3)
    else:
        colors = 0.5 * torch.randn(n, (sh_degree + 1) ** 2, 3, generator=g, dtype=dtype)
    viewmats = []
    for c in range(C):
        ang = 0.1 * c
        V = torch.eye(4, dtype=dtype)
        V[:3, :3] = torch.tensor(
            [[math.cos(ang), 0, math.sin(ang)], [0, 1, 0], [-math.sin(ang), 0, math.cos(ang)]],
            dtype=dtype,
        )
        V[:3, 3] = torch.tensor([0.2 * c, -0.1 * c, 0.1 * c], dtype=dtype)
        viewmats.append(V)
    Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=dtype)
    return means, quats, scales, opacities, colors, torch.stack(viewmats), Ks.expand(C, 3, 3)


# ---------------------------------------------------------------------------------------
# Dense reference
# ---------------------------------------------------------------------------------------


def reference_project(means, quats, scales, viewmats, Ks, width, height, antialiased):
    covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    return _fully_fused_projection(
        means, covars, viewmats, Ks, width, height, eps2d=0.3, calc_compensations=antialiased
    )


def reference_features(means, colors, viewmats, depths, sh_degree, render_mode):
    C = viewmats.shape[0]
    if sh_degree is None:
        feats = colors.expand(C, -1, -1)
    else:
        campos = torch.inverse(viewmats)[:, :3, 3]
        dirs = means[None] - campos[:, None]
        rgb = _spherical_harmonics(sh_degree, dirs, colors.expand(C, -1, -1, -1))
        feats = torch.clamp_min(rgb + 0.5, 0.0)
    if render_mode in ("RGB+D", "RGB+ED"):
        feats = torch.cat([feats, depths[..., None]], -1)
    elif render_mode in ("D", "ED"):
        feats = depths[..., None]
    return feats


def dense_composite(means2d, conics, opac, feats, radii, depths, width, height, stats=None):
    """Every pixel against every Gaussian, front to back, with gsplat's rules.

    ``means2d`` is [C, N, 2], or [C, H*W, N, 2] to give every pixel its own copy (so that
    autograd yields per-pixel gradients). A Gaussian is a candidate for a pixel when its
    radius is positive and the pixel's 16x16 tile is in the Gaussian's tile range, as in
    gsplat. Returns (colors [C, H, W, D], transmittance [C, H, W, 1]).
    """
    C, N = radii.shape
    ts = 16
    tw, th = math.ceil(width / ts), math.ceil(height / ts)
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    px, py = xs.flatten().double() + 0.5, ys.flatten().double() + 0.5
    tix, tiy = xs.flatten() // ts, ys.flatten() // ts
    per_pixel = means2d.dim() == 4
    colors_out, trans_out = [], []
    for c in range(C):
        center = means2d[c, 0] if per_pixel else means2d[c]
        r = radii[c].double()
        cx, cy = center[:, 0].detach() / ts, center[:, 1].detach() / ts
        tx0 = torch.floor(cx - r / ts).clamp(0, tw)
        tx1 = torch.ceil(cx + r / ts).clamp(0, tw)
        ty0 = torch.floor(cy - r / ts).clamp(0, th)
        ty1 = torch.ceil(cy + r / ts).clamp(0, th)
        T = torch.ones(height * width, dtype=conics.dtype)
        acc = torch.zeros(height * width, feats.shape[-1], dtype=conics.dtype)
        done = torch.zeros(height * width, dtype=torch.bool)
        for g in torch.argsort(depths[c].detach(), stable=True).tolist():
            if radii[c, g] <= 0:
                continue
            cand = (tix >= tx0[g]) & (tix < tx1[g]) & (tiy >= ty0[g]) & (tiy < ty1[g])
            mx = means2d[c, :, g, 0] if per_pixel else means2d[c, g, 0]
            my = means2d[c, :, g, 1] if per_pixel else means2d[c, g, 1]
            dx, dy = mx - px, my - py
            a, b, cc = conics[c, g]
            sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
            raw = opac[c, g] * torch.exp(-sigma)
            alpha = torch.clamp(raw, max=0.999)
            ok = cand & ~done & (sigma >= 0) & (alpha >= 1.0 / 255.0)
            next_T = T * (1.0 - alpha)
            stop = ok & (next_T <= 1e-4)
            ok = ok & ~stop
            done = done | stop
            if stats is not None:
                stats["stops"] += int(stop.sum())
                stats["clamped"] += int((ok & (raw > 0.999)).sum())
                stats["skipped"] += int((cand & ~done & (alpha < 1.0 / 255.0)).sum())
            w = torch.where(ok, alpha * T, torch.zeros_like(alpha))
            acc = acc + w[:, None] * feats[c, g][None]
            T = torch.where(ok, next_T, T)
        colors_out.append(acc.reshape(height, width, -1))
        trans_out.append(T.reshape(height, width, 1))
    return torch.stack(colors_out), torch.stack(trans_out)


def finish(colors, trans, backgrounds, render_mode):
    """Background and expected depth, as gsplat's rasterization does after compositing."""
    alphas = 1.0 - trans
    if backgrounds is not None:
        C = colors.shape[0]
        if render_mode in ("RGB+D", "RGB+ED"):
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], -1)
        elif render_mode in ("D", "ED"):
            backgrounds = backgrounds.new_zeros(C, 1)
        colors = colors + trans * backgrounds[:, None, None, :]
    if render_mode in ("ED", "RGB+ED"):
        colors = torch.cat([colors[..., :-1], colors[..., -1:] / alphas.clamp(min=1e-10)], -1)
    return colors, alphas


def dense_rasterize(
    means,
    quats,
    scales,
    opacities,
    colors,
    viewmats,
    Ks,
    width,
    height,
    sh_degree=None,
    backgrounds=None,
    render_mode="RGB",
    rasterize_mode="classic",
    stats=None,
):
    radii, means2d, depths, conics, comp = reference_project(
        means, quats, scales, viewmats, Ks, width, height, rasterize_mode == "antialiased"
    )
    opac = opacities[None].expand(viewmats.shape[0], -1)
    if comp is not None:
        opac = opac * comp
    feats = reference_features(means, colors, viewmats, depths, sh_degree, render_mode)
    c, t = dense_composite(means2d, conics, opac, feats, radii, depths, width, height, stats)
    return finish(c, t, backgrounds, render_mode)


def _new_stats():
    return {"stops": 0, "clamped": 0, "skipped": 0}


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sh_degree", [None, 0, 3])
@pytest.mark.parametrize("rasterize_mode", ["classic", "antialiased"])
@pytest.mark.parametrize("render_mode", ["RGB", "ED", "RGB+ED", "RGB+D"])
def test_forward_matches_dense_reference(sh_degree, rasterize_mode, render_mode):
    scene = make_scene(sh_degree=sh_degree, seed=1)
    bg = torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    stats = _new_stats()
    ref_c, ref_a = dense_rasterize(
        *scene,
        W,
        H,
        sh_degree=sh_degree,
        backgrounds=bg,
        render_mode=render_mode,
        rasterize_mode=rasterize_mode,
        stats=stats,
    )
    # The scene must exercise every rule, or this test could not catch a broken one.
    assert stats["stops"] > 30 and stats["skipped"] > 100, stats
    assert stats["clamped"] >= 4 or rasterize_mode == "antialiased", stats
    for sub, chunk in LAYOUTS:
        out_c, out_a, info = rasterize_torch(
            *scene,
            W,
            H,
            near_plane=0.01,
            far_plane=1e10,
            radius_clip=0.0,
            eps2d=0.3,
            sh_degree=sh_degree,
            tile_size=16,
            backgrounds=bg,
            render_mode=render_mode,
            absgrad=False,
            rasterize_mode=rasterize_mode,
            sub_tile=sub,
            chunk_rows=chunk,
        )
        D = {"RGB": 3, "ED": 1, "D": 1}.get(render_mode, 4)
        assert out_c.shape == (2, H, W, D) and out_a.shape == (2, H, W, 1)
        torch.testing.assert_close(out_c, ref_c, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(out_a, ref_a, rtol=1e-9, atol=1e-9)
        assert (info["radii"] > 0).sum() < info["radii"].numel()  # some were culled


def test_float32_close_to_float64_reference():
    scene = make_scene(sh_degree=3, seed=2)
    ref_c, ref_a = dense_rasterize(*scene, W, H, sh_degree=3, render_mode="RGB+ED")
    scene32 = [t.float() for t in scene]
    out_c, out_a, _ = rasterize(*scene32, W, H, sh_degree=3, render_mode="RGB+ED", backend="torch")
    assert out_c.dtype == torch.float32
    torch.testing.assert_close(out_a.double(), ref_a, rtol=0, atol=2e-5)
    torch.testing.assert_close(out_c[..., :3].double(), ref_c[..., :3], rtol=0, atol=5e-5)
    torch.testing.assert_close(out_c[..., 3:].double(), ref_c[..., 3:], rtol=1e-4, atol=1e-3)


def test_nonsquare_image_and_partial_tiles():
    scene = make_scene(sh_degree=None, seed=3, width=37, height=21)
    ref_c, ref_a = dense_rasterize(*scene, 37, 21)
    out_c, out_a, info = rasterize(*scene, 37, 21, backend="torch")
    torch.testing.assert_close(out_c, ref_c, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out_a, ref_a, rtol=1e-9, atol=1e-9)
    assert info["tile_width"] == 3 and info["tile_height"] == 2


# ---------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------


def _grads(fn, scene, bg, loss_w):
    params = [t.clone().requires_grad_(True) for t in scene[:5]]
    bgp = bg.clone().requires_grad_(True)
    colors, alphas = fn(params, bgp)[:2]
    loss = (colors * loss_w[0]).sum() + (alphas * loss_w[1]).sum()
    loss.backward()
    return [p.grad for p in params] + [bgp.grad]


@pytest.mark.parametrize(
    ("sh_degree", "rasterize_mode", "render_mode"),
    [(3, "classic", "RGB"), (0, "antialiased", "RGB+ED"), (None, "classic", "D")],
)
@pytest.mark.parametrize(("sub", "chunk", "block"), [(*lay, None) for lay in LAYOUTS] + [(4, 4, 3)])
def test_gradients_match_autograd_through_reference(
    sh_degree, rasterize_mode, render_mode, sub, chunk, block, monkeypatch
):
    if block is not None:  # a sweep step handles `block` sub-tiles at a time
        monkeypatch.setattr(composite, "MAX_BLOCK_PAIRS", block * sub * sub * chunk)
    scene = make_scene(sh_degree=sh_degree, seed=4)
    gen = torch.Generator().manual_seed(5)
    bg = torch.rand(2, 3, dtype=torch.float64, generator=gen)
    D = {"RGB": 3, "ED": 1, "D": 1}.get(render_mode, 4)
    loss_w = (
        torch.randn(2, H, W, D, dtype=torch.float64, generator=gen),
        torch.randn(2, H, W, 1, dtype=torch.float64, generator=gen),
    )
    kw = dict(sh_degree=sh_degree, render_mode=render_mode, rasterize_mode=rasterize_mode)

    def ref(p, bgp):
        return dense_rasterize(*p, *scene[5:], W, H, backgrounds=bgp, **kw)

    def ours(p, bgp):
        return rasterize_torch(
            *p,
            *scene[5:],
            W,
            H,
            near_plane=0.01,
            far_plane=1e10,
            radius_clip=0.0,
            eps2d=0.3,
            tile_size=16,
            backgrounds=bgp,
            absgrad=False,
            sub_tile=sub,
            chunk_rows=chunk,
            **kw,
        )

    names = ["means", "quats", "scales", "opacities", "colors", "backgrounds"]
    unused = {"colors", "backgrounds"} if render_mode == "D" else set()
    grads = zip(names, _grads(ref, scene, bg, loss_w), _grads(ours, scene, bg, loss_w), strict=True)
    for name, g_ref, g_ours in grads:
        if name in unused:
            assert g_ref is None and g_ours is None, name
            continue
        assert g_ref.abs().max() > 0, name
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-8, atol=1e-10, msg=name)


def test_gradcheck_tiny_float64():
    means, quats, scales, opacities, colors, viewmats, Ks = make_scene(
        n=6, C=1, width=12, height=10, sh_degree=1, seed=6, log_scale=(-1.5, -1.0)
    )
    means = means[2:]  # in view, no clamp: a smooth neighborhood
    quats, scales, colors = quats[2:], scales[2:], colors[2:]
    opacities = torch.linspace(0.4, 0.8, 4, dtype=torch.float64)
    bg = torch.tensor([[0.2, 0.5, 0.1]], dtype=torch.float64)

    def fn(m, q, s, o, c):
        out, alpha, _ = rasterize(
            m,
            q,
            s,
            o,
            c,
            viewmats,
            Ks,
            12,
            10,
            sh_degree=1,
            backgrounds=bg,
            rasterize_mode="antialiased",
            render_mode="RGB+ED",
            backend="torch",
        )
        return out, alpha

    inputs = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities, colors)]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


def test_absgrad_matches_per_pixel_reference():
    scene = make_scene(sh_degree=3, seed=7, n=40)
    means, quats, scales, opacities, colors, viewmats, Ks = scene
    gen = torch.Generator().manual_seed(8)
    loss_c = torch.randn(2, H, W, 3, dtype=torch.float64, generator=gen)
    loss_a = torch.randn(2, H, W, 1, dtype=torch.float64, generator=gen)

    params = [t.clone().requires_grad_(True) for t in scene[:5]]
    out_c, out_a, info = rasterize(
        *params, viewmats, Ks, W, H, sh_degree=3, absgrad=True, backend="torch"
    )
    info["means2d"].retain_grad()
    ((out_c * loss_c).sum() + (out_a * loss_a).sum()).backward()
    absgrad = info["means2d"].absgrad
    grad = info["means2d"].grad

    # Reference: every pixel gets its own copy of means2d, so autograd returns each pixel's
    # contribution to d loss / d means2d separately.
    with torch.no_grad():
        radii, means2d, depths, conics, _ = reference_project(
            means, quats, scales, viewmats, Ks, W, H, False
        )
        feats = reference_features(means, colors, viewmats, depths, 3, "RGB")
    per_pixel = means2d[:, None].expand(2, H * W, -1, -1).clone().requires_grad_(True)
    opac = opacities[None].expand(2, -1)
    c, t = dense_composite(per_pixel, conics, opac, feats, radii, depths, W, H)
    ((c * loss_c).sum() + ((1 - t) * loss_a).sum()).backward()
    ref_abs = per_pixel.grad.abs().sum(1)
    ref_grad = per_pixel.grad.sum(1)

    assert absgrad.shape == (2, means.shape[0], 2)
    assert (ref_abs > grad.abs() * (1 + 1e-6)).any()  # abs-sum differs from |sum|
    torch.testing.assert_close(absgrad, ref_abs, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-12)


def test_bitwise_deterministic():
    """Same inputs, same outputs and gradients, bit for bit (Odin's exactness needs it)."""
    scene = [t.float() for t in make_scene(sh_degree=3, seed=17)]
    results = []
    for _ in range(2):
        params = [t.clone().requires_grad_(True) for t in scene[:5]]
        out, alpha, info = rasterize(
            *params, *scene[5:], W, H, sh_degree=3, absgrad=True, backend="torch"
        )
        (out.square().sum() + alpha.sum()).backward()
        results.append([out, alpha, info["means2d"].absgrad] + [p.grad for p in params])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------
# Projection and tiles
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("antialiased", [False, True])
def test_projection_matches_gsplat_torch_impl(antialiased):
    means, quats, scales, _, _, viewmats, Ks = make_scene(n=200, seed=10, sh_degree=None)
    ref = reference_project(means, quats, scales, viewmats, Ks, W, H, antialiased)
    ours = project_gaussians(
        means, quats, scales, viewmats, Ks, W, H, calc_compensations=antialiased
    )
    radii, means2d, depths, conics, comp = ref
    vis = radii > 0
    assert 0 < vis.sum() < vis.numel()
    torch.testing.assert_close(ours.radii, radii)
    torch.testing.assert_close(ours.depths, depths)
    torch.testing.assert_close(ours.means2d[vis], means2d[vis])
    torch.testing.assert_close(ours.conics[vis], conics[vis])
    if antialiased:
        torch.testing.assert_close(ours.compensations[vis], comp[vis])


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_sh_matches_gsplat_torch_impl(degree):
    gen = torch.Generator().manual_seed(degree)
    dirs = torch.randn(2, 30, 3, dtype=torch.float64, generator=gen)
    coeffs = torch.randn(30, 25, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    ours = sh_to_color(degree, dirs, coeffs)
    ref = _spherical_harmonics(degree, dirs, coeffs.expand(2, -1, -1, -1))
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), coeffs)
    (g_ref,) = torch.autograd.grad(ref.sum(), coeffs)
    torch.testing.assert_close(g_ours, g_ref)
    assert (g_ours[:, (degree + 1) ** 2 :] == 0).all()


def test_radius_clip_culls_small_gaussians():
    means, quats, scales, _, _, viewmats, Ks = make_scene(n=100, seed=11, sh_degree=None)
    full = project_gaussians(means, quats, scales, viewmats, Ks, W, H)
    clip = float(full.radii[full.radii > 0].median())
    clipped = project_gaussians(means, quats, scales, viewmats, Ks, W, H, radius_clip=clip)
    expected = torch.where(full.radii > clip, full.radii, torch.zeros_like(full.radii))
    torch.testing.assert_close(clipped.radii, expected)
    assert (full.radii > 0).sum() > (clipped.radii > 0).sum() > 0


@pytest.mark.parametrize("sub", [2, 4, 8])
def test_pair_plan_keeps_every_contributing_pair(sub):
    """Every (pixel, Gaussian) pair that passes the alpha test within gsplat's tile range
    has its (sub-tile, Gaussian) row in the plan, front to back; and the culling is tight."""
    width, height = 40, 28
    means, quats, scales, opacities, _, viewmats, Ks = make_scene(
        n=120, seed=20 + sub, sh_degree=None, width=width, height=height, anisotropy=2.0
    )
    proj = project_gaussians(means, quats, scales, viewmats, Ks, width, height)
    opac = opacities[None].expand(2, -1)
    plan = build_pair_plan(
        proj.means2d, proj.radii, proj.depths, proj.conics, opac, 16, width, height, sub=sub
    )
    seg = torch.repeat_interleave(torch.arange(plan.n_seg), plan.seg_counts)
    planned = set(zip(seg.tolist(), plan.gid.tolist(), strict=True))
    assert len(planned) == plan.n_rows  # no duplicate rows

    # Brute force over all pixels.
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    px, py = xs.flatten().double() + 0.5, ys.flatten().double() + 0.5
    m2, con, r = proj.means2d.detach(), proj.conics.detach(), proj.radii
    needed = set()
    for c in range(2):
        dx = m2[c, :, 0, None] - px  # [N, P]
        dy = m2[c, :, 1, None] - py
        a, b, cc = (con[c, :, k, None] for k in range(3))
        sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
        alpha = torch.clamp(opac[c, :, None] * torch.exp(-sigma), max=0.999)
        tx0 = torch.floor(m2[c, :, 0] / 16 - r[c] / 16).clamp(0, 3)[:, None]
        tx1 = torch.ceil(m2[c, :, 0] / 16 + r[c] / 16).clamp(0, 3)[:, None]
        ty0 = torch.floor(m2[c, :, 1] / 16 - r[c] / 16).clamp(0, 2)[:, None]
        ty1 = torch.ceil(m2[c, :, 1] / 16 + r[c] / 16).clamp(0, 2)[:, None]
        tix, tiy = (xs.flatten() // 16)[None], (ys.flatten() // 16)[None]
        in_tiles = (tix >= tx0) & (tix < tx1) & (tiy >= ty0) & (tiy < ty1) & (r[c, :, None] > 0)
        hit = in_tiles & (sigma >= 0) & (alpha >= 1.0 / 255.0)
        g, pix = torch.nonzero(hit, as_tuple=True)
        s = (c * plan.sub_h + ys.flatten()[pix] // sub) * plan.sub_w + xs.flatten()[pix] // sub
        needed |= set(zip(s.tolist(), (c * means.shape[0] + g).tolist(), strict=True))
    assert needed <= planned
    assert len(planned) < 1.5 * len(needed), (len(planned), len(needed))
    # Front to back inside every sub-tile.
    d = proj.depths.detach().flatten()[plan.gid]
    same = seg[1:] == seg[:-1]
    assert (d[1:][same] >= d[:-1][same]).all()


def test_tile_info_matches_gsplat_torch_impl():
    # No two Gaussians at the same depth: gsplat's torch helper sorts ties unstably.
    scene = make_scene(n=30, seed=12, sh_degree=None, width=40, height=36, special=False)
    _, _, info = rasterize(*scene, 40, 36, backend="torch")
    tiles_per_gauss, isect_ids, flatten_ids = _isect_tiles(
        info["means2d"].detach().float(),
        info["radii"],
        info["depths"].detach().float(),
        16,
        info["tile_width"],
        info["tile_height"],
    )
    offsets = _isect_offset_encode(isect_ids, 2, info["tile_width"], info["tile_height"])
    torch.testing.assert_close(info["tiles_per_gauss"], tiles_per_gauss)
    torch.testing.assert_close(info["isect_ids"], isect_ids)
    torch.testing.assert_close(info["flatten_ids"], flatten_ids)
    torch.testing.assert_close(info["isect_offsets"], offsets)
    assert (info["width"], info["height"], info["n_cameras"], info["tile_size"]) == (40, 36, 2, 16)


# ---------------------------------------------------------------------------------------
# gsplat's DefaultStrategy on our info
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("absgrad", [False, True])
def test_default_strategy_grows_and_prunes(absgrad):
    from gsplat.strategy import DefaultStrategy

    means, quats, scales, opacities, colors, viewmats, Ks = make_scene(
        n=80, seed=13, sh_degree=3, dtype=torch.float32
    )
    opacities[-10:] = 0.001  # below prune_opa: pruned at the refine step
    params = torch.nn.ParameterDict(
        {
            "means": means,
            "scales": torch.log(scales),
            "quats": quats,
            "opacities": torch.logit(opacities),
            "sh0": colors[:, :1].clone(),
            "shN": colors[:, 1:].clone(),
        }
    )
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    strategy = DefaultStrategy(
        refine_start_iter=0,
        refine_every=2,
        reset_every=1000,
        grow_grad2d=1e-7,
        grow_scale3d=0.25,
        prune_opa=0.005,
        absgrad=absgrad,
    )
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state(scene_scale=1.0)

    def train_step(step):
        out, alpha, info = rasterize(
            params["means"],
            params["quats"],
            torch.exp(params["scales"]),
            torch.sigmoid(params["opacities"]),
            torch.cat([params["sh0"], params["shN"]], 1),
            viewmats,
            Ks,
            W,
            H,
            sh_degree=3,
            absgrad=absgrad,
            backend="torch",
        )
        strategy.step_pre_backward(params, optimizers, state, step, info)
        (out - 0.5).square().mean().add(alpha.mean()).backward()
        for opt in optimizers.values():
            opt.step()
        return info

    # Step 1 (no refinement): the running statistics follow gsplat's definition.
    info = train_step(1)
    g = (info["means2d"].absgrad if absgrad else info["means2d"].grad).clone()
    g[..., 0] *= W / 2.0 * 2
    g[..., 1] *= H / 2.0 * 2
    vis = info["radii"] > 0
    expected = torch.zeros(80).index_add_(0, torch.where(vis)[1], g[vis].norm(dim=-1))
    strategy.step_post_backward(params, optimizers, state, 1, info)
    torch.testing.assert_close(state["grad2d"], expected)
    torch.testing.assert_close(state["count"], vis.sum(0).float())
    for opt in optimizers.values():
        opt.zero_grad()

    # Step 2 (refinement): duplicate small, split large, prune transparent Gaussians.
    info = train_step(2)
    g = (info["means2d"].absgrad if absgrad else info["means2d"].grad).clone()
    g[..., 0] *= W
    g[..., 1] *= H
    vis = info["radii"] > 0
    grad2d = state["grad2d"].clone().index_add_(0, torch.where(vis)[1], g[vis].norm(dim=-1))
    count = state["count"] + vis.sum(0).float()
    high = grad2d / count.clamp_min(1) > strategy.grow_grad2d
    small = torch.exp(params["scales"]).max(-1).values <= strategy.grow_scale3d
    low = torch.sigmoid(params["opacities"]) < strategy.prune_opa
    n_dupli, n_split = int((high & small).sum()), int((high & ~small).sum())
    n_prune = int(low.sum() + (low & high & small).sum() + (low & high & ~small).sum())
    assert n_dupli > 0 and n_split > 0 and n_prune > 0
    strategy.step_post_backward(params, optimizers, state, 2, info)
    assert len(params["means"]) == 80 + n_dupli + n_split - n_prune
    assert (torch.sigmoid(params["opacities"]) >= strategy.prune_opa).all()
    for k, opt in optimizers.items():
        assert opt.state[opt.param_groups[0]["params"][0]]["exp_avg"].shape == params[k].shape


# ---------------------------------------------------------------------------------------
# Backends and bad input
# ---------------------------------------------------------------------------------------


def test_backend_resolution_and_gsplat_without_cuda():
    assert resolve_backend("torch", "cpu") == "torch"
    assert resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="unknown rasterizer"):
        resolve_backend("cuda", "cpu")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; the no-CUDA message cannot be checked")
    with pytest.raises(ValueError) as err:
        resolve_backend("gsplat", "cpu")
    assert str(err.value) == GSPLAT_NEEDS_CUDA
    assert "\n" not in str(err.value)
    scene = make_scene(n=5, seed=14, sh_degree=None)
    with pytest.raises(ValueError, match="needs CUDA"):
        rasterize(*scene, W, H, backend="gsplat")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"packed": True}, "packed=False only"),
        ({"render_mode": "RGBD"}, "render_mode"),
        ({"rasterize_mode": "fancy"}, "rasterize_mode"),
        ({"sh_degree": 3}, "SH coefficients"),
        ({"backgrounds": torch.zeros(2, 4, dtype=torch.float64)}, "backgrounds"),
        ({"width": 0}, "positive"),
    ],
)
def test_bad_input_raises_clear_error(change, message):
    scene = list(make_scene(n=5, seed=15, sh_degree=None))
    width = change.get("width", W)
    kwargs = {k: v for k, v in change.items() if k != "width"}
    with pytest.raises(ValueError, match=message):
        rasterize(*scene, width, H, backend="torch", **kwargs)
    with pytest.raises(ValueError, match="quats must have shape"):
        rasterize(scene[0], scene[1][:3], *scene[2:], W, H, backend="torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_backend_matches_gsplat_on_cuda():
    scene = [t.float().cuda() for t in make_scene(sh_degree=3, seed=16)]
    bg = torch.rand(2, 3, device="cuda")
    results = {}
    for backend in ("gsplat", "torch"):
        params = [t.clone().requires_grad_(True) for t in scene[:5]]
        out_c, out_a, info = rasterize(
            *params,
            *scene[5:],
            W,
            H,
            sh_degree=3,
            backgrounds=bg,
            render_mode="RGB+ED",
            rasterize_mode="antialiased",
            absgrad=True,
            backend=backend,
        )
        info["means2d"].retain_grad()
        (out_c[..., :3].sum() + out_a.square().sum()).backward()
        results[backend] = (out_c, out_a, info, [p.grad for p in params])
    (gc, ga, gi, gg), (tc, ta, ti, tg) = results["gsplat"], results["torch"]
    torch.testing.assert_close(ti["radii"], gi["radii"])
    torch.testing.assert_close(ta, ga, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tc, gc, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ti["means2d"].absgrad, gi["means2d"].absgrad, rtol=1e-3, atol=1e-5)
    for a, b in zip(tg, gg, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
