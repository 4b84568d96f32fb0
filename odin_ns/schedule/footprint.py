"""Per-view footprints: which primitives can touch each view (DESIGN 3.1).

A primitive is in view v's footprint when gsplat would give it a positive radius in v
(in front of the near plane, 3-sigma screen radius plus a pixel margin overlapping the
image) and it is not transparent (opacity >= ``opacity_threshold``). The radius is gsplat's
exactly: ``ceil(3 * sqrt(b + sqrt(max(0.01, b^2 - det))))`` of the 2D covariance plus the
0.3 px blur, with gsplat's clamped perspective Jacobian. So the footprint contains every
primitive the rasterizer draws (``radii > 0``) that can change a pixel: a primitive with
opacity < 1/255 never passes gsplat's ``alpha >= 1/255`` test, gets no gradient and is left
out (set ``opacity_threshold=0`` to keep it).

Scale: the kept primitives go into a median-split kd-tree (leaves of ``leaf_size``,
coarse nodes of 32 leaves). Each (view, coarse node) pair, then each (view, leaf) pair
under a surviving node, is culled with a conservative bound: the node's world AABB taken
to camera space (centre R c + t, half extent |R| e), depth clamped to the near plane, and
an upper bound on the radius from the node's largest scale,
``3 * sqrt(s_max^2 * ||J||_F^2 + 0.4) + 1`` (||J||_F bounded with gsplat's Jacobian clamp).
Primitives of surviving leaves are tested one by one, ``chunk`` pairs at a time: a
projected mean within 2 px (the smallest gsplat radius) + margin of the image is in, one
outside even with the per-primitive radius bound is out, and only the rest get the exact
2D covariance. The final test of every candidate pair is ``odin_ns.cuda.ops.footprint_cull``
(gsplat's image test on the exact radius): the compiled CPU kernel, or the CUDA kernel when
``means`` is on a GPU. All math is float32 (like gsplat), on CPU apart from that op; the
bounds carry a slack for rounding. On a CPU shared with other jobs, torch's intra-op
thread pool can be several times slower than one thread: callers may want
``torch.set_num_threads(1)``.

Cost: ~64 CPU s and < 2 GiB peak for 50k views x 1M primitives of a synthetic city
(~370 primitives per view); it grows with the number of (view, leaf) pairs near a frustum.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from odin_ns.cuda import ops as ext_ops
from odin_ns.render.projection import three_sigma_radius

# Smallest gsplat radius: the 0.3 px blur and the 0.01 floor give v1 >= 0.4, ceil(3*sqrt(0.4)) = 2.
_MIN_RADIUS = 2.0


def _as_float_tensor(x, name: str) -> Tensor:
    t = torch.as_tensor(x)
    if not torch.is_floating_point(t):
        t = t.float()
    return t.detach().to("cpu", torch.float32)


def _per_view(x: int | Sequence[int] | np.ndarray | Tensor, num_views: int, name: str) -> Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
    if t.numel() == 1:
        t = t.expand(num_views).clone()
    if t.numel() != num_views:
        raise ValueError(f"{name} has {t.numel()} entries but there are {num_views} cameras")
    if not bool((t > 0).all()):
        raise ValueError(f"{name} must be positive")
    return t


def jacobian_bound(
    fx: Tensor, fy: Tensor, cx: Tensor, cy: Tensor, width: Tensor, height: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(Lx, Ly, J2), each [V] in the inputs' dtype: Lx, Ly bound |x/z|, |y/z| after gsplat's
    clamp; J2 / z^2 bounds ||J||_F^2 (the radius bound ``3 sqrt(s^2 J2 / z^2 + 0.4) + 1``)."""
    tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
    lim_x = torch.maximum((width - cx) / fx, cx / fx) + 0.3 * tan_x
    lim_y = torch.maximum((height - cy) / fy, cy / fy) + 0.3 * tan_y
    return lim_x, lim_y, fx**2 * (1 + lim_x**2) + fy**2 * (1 + lim_y**2)


def _view_table(viewmats: Tensor, Ks: Tensor, width: Tensor, height: Tensor) -> Tensor:
    """Per-view constants [V, 21] (float64): R(9), t(3), fx, fy, cx, cy, W, H, Lx, Ly, J2
    (``jacobian_bound``)."""
    vm = viewmats.double()
    K = Ks.double()
    fx, fy, cx, cy = K[:, 0, 0], K[:, 1, 1], K[:, 0, 2], K[:, 1, 2]
    lim_x, lim_y, j2 = jacobian_bound(fx, fy, cx, cy, width, height)
    cols = [vm[:, :3, :3].reshape(-1, 9), vm[:, :3, 3]]
    cols += [c[:, None] for c in (fx, fy, cx, cy, width, height, lim_x, lim_y, j2)]
    return torch.cat(cols, dim=1)


def _exact_radius(
    R: Tensor,  # [P, 3, 3]
    mean_c: Tensor,  # [P, 3]
    covar: Tensor,  # [P, 3, 3] world covariance
    consts: Tensor,  # [P, 6]: fx, fy, cx, cy, W, H
    eps2d: float,
) -> Tensor:
    """gsplat's 3-sigma radius (before the image test), float32, [P]."""
    cov_c = R @ covar @ R.transpose(1, 2)
    x, y, z = mean_c.unbind(-1)
    fx, fy, cx, cy, W, H = consts.unbind(-1)
    lim_x_pos = (W - cx) / fx + 0.3 * (0.5 * W / fx)
    lim_x_neg = cx / fx + 0.3 * (0.5 * W / fx)
    lim_y_pos = (H - cy) / fy + 0.3 * (0.5 * H / fy)
    lim_y_neg = cy / fy + 0.3 * (0.5 * H / fy)
    tx = z * torch.minimum(torch.maximum(x / z, -lim_x_neg), lim_x_pos)
    ty = z * torch.minimum(torch.maximum(y / z, -lim_y_neg), lim_y_pos)
    zero = torch.zeros_like(z)
    J = torch.stack([fx / z, zero, -fx * tx / z**2, zero, fy / z, -fy * ty / z**2], -1)
    J = J.reshape(-1, 2, 3)
    cov2d = J @ cov_c @ J.transpose(1, 2)
    return three_sigma_radius(cov2d[:, 0, 0] + eps2d, cov2d[:, 0, 1], cov2d[:, 1, 1] + eps2d)


def _kd_cells(
    points: np.ndarray, leaf: int, fanout: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median-split kd-tree over ``points`` [M, 3]: the kd order of scipy's balanced
    ``cKDTree`` (each node split at the median of its widest axis, built in C), cut by
    sizes alone, as that tree cuts its nodes (a node of m points into its first m // 2
    and the rest, until at most ``leaf``; a few cuts may fall elsewhere than scipy's).

    Returns (order [M], leaf_starts [L + 1], coarse_starts [C + 1]): positions
    ``order[leaf_starts[i]:leaf_starts[i + 1]]`` form leaf i (<= ``leaf`` points); coarse
    nodes (<= ``leaf * fanout`` points) are unions of consecutive leaves. Any contiguous
    ranges of any order give the same footprints (boxes are taken over each range's own
    points, and culling is conservative); a tighter tree only tests fewer pairs. No walk
    over the tree's nodes in Python (thousands of objects, and garbage-collector passes).
    """
    m = points.shape[0]
    order = np.asarray(cKDTree(points, leafsize=leaf, balanced_tree=True).indices, np.int64)
    starts = np.array([0, m], dtype=np.int64)
    coarse = starts if m <= leaf * fanout else None
    while np.diff(starts).max() > leaf:
        sizes = np.diff(starts)
        split = sizes > leaf
        starts = np.union1d(starts, starts[:-1][split] + sizes[split] // 2)
        if coarse is None and np.diff(starts).max() <= leaf * fanout:
            coarse = starts
    return order, starts, coarse


def _box_params(pts: np.ndarray, smax: np.ndarray, starts: np.ndarray) -> Tensor:
    """[C, 7] float32 per node: AABB centre (3), half extent (3), largest scale."""
    lo = np.minimum.reduceat(pts, starts[:-1], axis=0)
    hi = np.maximum.reduceat(pts, starts[:-1], axis=0)
    sm = np.maximum.reduceat(smax, starts[:-1])
    out = np.concatenate([0.5 * (lo + hi), 0.5 * (hi - lo), sm[:, None]], axis=1)
    return torch.from_numpy(out).float()


def _box_visible(tab: Tensor, box: Tensor, margin: float, near: float, far: float) -> Tensor:
    """Conservative test: may any primitive of the box pass the footprint test?

    ``tab`` [..., 21] view constants and ``box`` [..., 7] broadcast against each other.
    The box is taken to camera space as an AABB (centre R c + t, half extent |R| e), its
    members' depth is at least max(z_lo, near), and their radius is bounded with the
    box's largest scale (see the module docstring).
    """
    R = [tab[..., k] for k in range(9)]
    t0, t1, t2 = tab[..., 9], tab[..., 10], tab[..., 11]
    cx_, cy_, cz_, ex, ey, ez, sm = box.unbind(-1)
    X = R[0] * cx_ + R[1] * cy_ + R[2] * cz_ + t0
    Y = R[3] * cx_ + R[4] * cy_ + R[5] * cz_ + t1
    Z = R[6] * cx_ + R[7] * cy_ + R[8] * cz_ + t2
    # Slack for float32 rounding here and in the per-primitive test.
    slack = 1e-5 * (cx_.abs() + cy_.abs() + cz_.abs() + t0.abs() + t1.abs() + t2.abs()) + 1e-5
    EX = R[0].abs() * ex + R[1].abs() * ey + R[2].abs() * ez + slack
    EY = R[3].abs() * ex + R[4].abs() * ey + R[5].abs() * ez + slack
    EZ = R[6].abs() * ex + R[7].abs() * ey + R[8].abs() * ez + slack
    fx, fy, cx, cy, W, H, _, _, j2 = (tab[..., 12 + k] for k in range(9))
    z_hi = Z + EZ
    z_lo = torch.clamp(Z - EZ, min=near)
    rb = 3.0 * torch.sqrt(sm**2 * j2 / z_lo**2 + 0.4) * (1 + 1e-4) + 1.01 + margin
    u_lo = fx * torch.minimum((X - EX) / z_lo, (X - EX) / z_hi) + cx
    u_hi = fx * torch.maximum((X + EX) / z_lo, (X + EX) / z_hi) + cx
    v_lo = fy * torch.minimum((Y - EY) / z_lo, (Y - EY) / z_hi) + cy
    v_hi = fy * torch.maximum((Y + EY) / z_lo, (Y + EY) / z_hi) + cy
    return (
        (z_hi >= near)
        & (Z - EZ <= far)
        & (u_hi + rb > 0)
        & (u_lo - rb < W)
        & (v_hi + rb > 0)
        & (v_lo - rb < H)
    )


def _test_members(
    tab: Tensor,  # [Q, 21] float32 view constants of each candidate (view, leaf)
    member: Tensor,  # [Q, L] int64 sorted-primitive ids (-1 = padding)
    mu: Tensor,  # [M, 3]
    covar: Tensor,  # [M, 3, 3]
    smax: Tensor,  # [M]
    opacity: Tensor,  # [M]
    margin: float,
    near: float,
    far: float,
    eps2d: float,
    device: torch.device,
) -> Tensor:
    """Footprint test of each (view, member) pair (gsplat's inequalities): [K] int64 flat
    positions ``q * L + j`` of the pairs in, ascending.

    Pairs with the projected mean within 2 px (the smallest radius) + margin of the image
    are in; pairs outside even with the radius bound are out; the rest get the exact radius.
    Gathers go through flat positions (``take`` / ``index_select``), not 2-D indexing.
    """
    ok = member >= 0
    mem = member.clamp(min=0)
    p = mu.index_select(0, mem.reshape(-1)).reshape(*mem.shape, 3)  # [Q, L, 3]
    R = tab[:, :9].reshape(-1, 1, 3, 3)
    x, y, z = (
        (R[..., k, 0] * p[..., 0] + R[..., k, 1] * p[..., 1] + R[..., k, 2] * p[..., 2])
        + tab[:, None, 9 + k]
        for k in range(3)
    )
    fx, fy, cx, cy, W, H = (tab[:, 12 + k, None] for k in range(6))
    valid = ok & (z >= near) & (z <= far)
    zs = torch.where(valid, z, torch.ones_like(z))
    u = fx * x / zs + cx
    v = fy * y / zs + cy
    du = (u - 0.5 * W).abs() - 0.5 * W - margin
    dv = (v - 0.5 * H).abs() - 0.5 * H - margin
    d = torch.maximum(du, dv)
    sure_in = valid & (d < _MIN_RADIUS - 1e-3)
    bound = (
        3.0 * torch.sqrt(smax.take(mem) ** 2 * tab[:, 20, None] / zs**2 + 0.4) * (1 + 1e-4) + 1.01
    )
    maybe = valid & ~sure_in & (d < bound + 1e-3)
    # The final decision of every candidate pair is the footprint_cull op's (gsplat's image
    # test, in the same float32 operation order): a sure pair passes it with the smallest
    # gsplat radius, a maybe pair is tested with its exact radius.
    pairs = (sure_in | maybe).reshape(-1).nonzero().squeeze(-1)  # flat positions, ascending
    if pairs.numel() == 0:
        return pairs
    q = pairs // member.shape[1]
    radius = torch.full((pairs.numel(),), _MIN_RADIUS)
    pick = maybe.take(pairs).nonzero().squeeze(-1)
    if pick.numel():
        at = pairs[pick]
        mean_c = torch.stack([x.take(at), y.take(at), z.take(at)], -1)
        tq = tab.index_select(0, q[pick])
        covar_m = covar.index_select(0, mem.take(at))
        radius[pick] = _exact_radius(
            tq[:, :9].reshape(-1, 3, 3), mean_c, covar_m, tq[:, 12:18], eps2d
        )
    opacity_p = opacity.take(mem.take(pairs))
    kept = _cull_pairs(u.take(pairs), v.take(pairs), radius, z.take(pairs), opacity_p,
                       tab[:, 16:18], q, margin, near, device)  # fmt: skip
    return pairs[kept]


def _cull_pairs(
    u: Tensor,  # [P] projected centres, pixels
    v: Tensor,  # [P]
    radius: Tensor,  # [P] radius to test (> 0)
    depth: Tensor,  # [P] camera depth
    opacity: Tensor,  # [P] activated opacity of the pair's primitive
    size: Tensor,  # [Q, 2] float32 image (width, height) of each candidate's view
    candidate: Tensor,  # [P] int64 the pair's candidate (row of ``size``)
    margin: float,
    near: float,
    device: torch.device,
) -> Tensor:
    """[K] int64 positions of the pairs ``footprint_cull`` keeps, ascending.

    One op call per distinct image size, on ``device`` (the compiled CPU kernel, or the CUDA
    kernel when the caller's tensors live on a GPU; the torch reference without the
    extension).
    """
    # distinct sizes over the Q candidates, as one integer key each (sizes are whole pixels)
    key = size[:, 0].long() * (1 << 32) + size[:, 1].long()
    keys, candidate_group = torch.unique(key, return_inverse=True)
    parts = []
    for g, k in enumerate(keys.tolist()):
        w, h = k >> 32, k & 0xFFFFFFFF
        if len(keys) == 1:  # one image size (the usual case): every pair
            sel = None
            pu, pv, pr, pd, po = u, v, radius, depth, opacity
        else:
            sel = (candidate_group.take(candidate) == g).nonzero().squeeze(-1)
            pu, pv, pr, pd, po = (t.take(sel) for t in (u, v, radius, depth, opacity))
        indptr, idx = ext_ops.footprint_cull(
            torch.stack([pu, pv], -1)[None].to(device),  # [1, P_g, 2]
            pr[None].to(device),  # [1, P_g]
            pd[None].to(device),  # [1, P_g]
            po.to(device),  # [P_g]
            int(w),
            int(h),
            margin,
            near,
            0.0,  # opacities were thresholded when the primitives were kept
        )
        idx = idx.cpu()
        parts.append(idx if sel is None else sel.take(idx))
    kept = torch.cat(parts)
    return kept if len(parts) == 1 else kept.sort().values


@torch.no_grad()
def compute_footprints(
    means: Tensor,  # [N, 3]
    scales: Tensor,  # [N, 3] activated (not log)
    quats: Tensor,  # [N, 4] wxyz, any norm
    opacities: Tensor,  # [N] activated (not logit)
    viewmats: Tensor,  # [V, 4, 4] world-to-camera, OpenCV (camera looks down +z)
    Ks: Tensor,  # [V, 3, 3]
    width: int | Sequence[int] | Tensor,  # scalar or [V]
    height: int | Sequence[int] | Tensor,  # scalar or [V]
    margin_px: float = 2.0,
    opacity_threshold: float = 1.0 / 255.0,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    chunk: int = 1 << 20,
    leaf_size: int = 64,
) -> sp.csr_matrix:
    """Footprints of V views over N primitives as a [V, N] bool CSR (sorted indices).

    Primitive i is in view v's footprint iff ``opacities[i] >= opacity_threshold``,
    ``near_plane <= depth <= far_plane`` and gsplat's 3-sigma radius grown by
    ``margin_px`` overlaps the image (gsplat's inequalities). Skew in ``Ks`` is ignored,
    as in gsplat's CUDA kernel. A view may see nothing (empty row). Inputs may be torch
    tensors or numpy arrays (any device; computed on CPU in float32).

    ``chunk`` bounds the (view, primitive) pairs tested at once (~100 bytes each);
    ``leaf_size`` is the culling granularity (primitives per kd-tree leaf).
    """
    device = means.device if isinstance(means, Tensor) else torch.device("cpu")
    means = _as_float_tensor(means, "means")
    scales = _as_float_tensor(scales, "scales")
    quats = _as_float_tensor(quats, "quats")
    opacities = _as_float_tensor(opacities, "opacities").reshape(-1)
    viewmats = _as_float_tensor(viewmats, "viewmats")
    Ks = _as_float_tensor(Ks, "Ks")
    if means.ndim != 2 or means.shape[1] != 3:
        raise ValueError(f"means must be [N, 3], got {list(means.shape)}")
    n = means.shape[0]
    for name, t, shape in (("scales", scales, (n, 3)), ("quats", quats, (n, 4))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    if opacities.shape[0] != n:
        raise ValueError(f"opacities has {opacities.shape[0]} entries but means has {n}")
    if viewmats.ndim != 3 or viewmats.shape[1:] != (4, 4):
        raise ValueError(f"viewmats must be [V, 4, 4], got {list(viewmats.shape)}")
    if Ks.ndim != 3 or Ks.shape[1:] != (3, 3):
        raise ValueError(f"Ks must be [V, 3, 3], got {list(Ks.shape)}")
    num_views = viewmats.shape[0]
    if Ks.shape[0] != num_views:
        raise ValueError(f"viewmats has {num_views} cameras but Ks has {Ks.shape[0]}")
    width_t = _per_view(width, num_views, "width")
    height_t = _per_view(height, num_views, "height")
    if not bool(torch.isfinite(means).all()):
        raise ValueError("means contain NaN or inf")
    for name, t in (("scales", scales), ("quats", quats), ("opacities", opacities)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contain NaN or inf")
    if not bool(torch.isfinite(viewmats).all() and torch.isfinite(Ks).all()):
        raise ValueError("viewmats or Ks contain NaN or inf")
    if bool((Ks[:, 0, 0] <= 0).any() or (Ks[:, 1, 1] <= 0).any()):
        raise ValueError("Ks must have positive focal lengths")
    if bool((scales < 0).any()):
        raise ValueError("scales must be activated (non-negative), got negative values")
    if bool((quats.norm(dim=-1) == 0).any()):
        raise ValueError("quats contain a zero quaternion")
    if margin_px < 0 or not near_plane > 0 or not far_plane > near_plane:
        raise ValueError(
            f"need margin_px >= 0 and 0 < near_plane < far_plane, got {margin_px}, "
            f"{near_plane}, {far_plane}"
        )
    if chunk < 1 or leaf_size < 1:
        raise ValueError(f"chunk and leaf_size must be >= 1, got {chunk}, {leaf_size}")

    keep = (opacities >= opacity_threshold).nonzero().squeeze(-1)
    index_dtype = np.int32 if n < 2**31 else np.int64
    if num_views == 0 or keep.numel() == 0:
        return sp.csr_matrix(
            (np.zeros(0, bool), np.zeros(0, index_dtype), np.zeros(num_views + 1, np.int64)),
            shape=(num_views, n),
        )

    # Kept primitives in kd-tree order; leaves (<= leaf_size) nested in coarse nodes.
    from gsplat.cuda._torch_impl import _quat_scale_to_covar_preci

    pts = means.index_select(0, keep).double().numpy()
    kd, leaf_starts, coarse_starts = _kd_cells(pts, leaf_size, 32)
    order_np = keep.numpy()[kd]
    order = torch.from_numpy(order_np)
    mu, quats_o, scales_o = (t.index_select(0, order) for t in (means, quats, scales))
    covar, _ = _quat_scale_to_covar_preci(quats_o, scales_o, True, False)
    smax = scales_o.amax(dim=-1)
    opac = opacities.index_select(0, order)
    pts, smax_np = pts[kd], smax.double().numpy()
    leaf_box = _box_params(pts, smax_np, leaf_starts)
    coarse_box = _box_params(pts, smax_np, coarse_starts)
    # Leaves of each coarse node: leaf_starts[first[c]:first[c + 1]] lie in coarse node c.
    first = torch.from_numpy(np.searchsorted(leaf_starts, coarse_starts))
    leaf_len = torch.from_numpy(np.diff(leaf_starts))
    leaf_start = torch.from_numpy(leaf_starts[:-1])
    L = int(leaf_len.max())
    lane = torch.arange(L)

    tab = _view_table(viewmats, Ks, width_t, height_t).float()
    margin, near, far = float(margin_px), float(near_plane), float(far_plane)
    num_coarse = coarse_box.shape[0]
    views_per_block = max(1, min(num_views, (1 << 20) // num_coarse))
    indptr = np.zeros(num_views + 1, dtype=np.int64)
    parts: list[np.ndarray] = []
    for v0 in range(0, num_views, views_per_block):
        v1 = min(num_views, v0 + views_per_block)
        # Coarse culling, dense over (views of the block) x (coarse nodes).
        cv, cc = (
            _box_visible(tab[v0:v1, None], coarse_box[None], margin, near, far).nonzero().unbind(-1)
        )
        # Expand to leaves, cull again.
        cnt = first[cc + 1] - first[cc]
        lv = torch.repeat_interleave(cv, cnt)
        ll = torch.repeat_interleave(first[cc] - torch.cumsum(cnt, 0) + cnt, cnt)
        ll = ll + torch.arange(ll.numel())
        if ll.numel():
            vis = _box_visible(
                tab.index_select(0, v0 + lv), leaf_box.index_select(0, ll), margin, near, far
            )
            lv, ll = lv[vis], ll[vis]
        hits_v: list[np.ndarray] = []
        hits_p: list[np.ndarray] = []
        step = max(1, chunk // L)
        for q0 in range(0, ll.numel(), step):
            qv, ql = lv[q0 : q0 + step], ll[q0 : q0 + step]
            member = leaf_start[ql, None] + lane[None]
            member = torch.where(lane[None] < leaf_len[ql, None], member, -1)
            hit = _test_members(
                tab.index_select(0, v0 + qv), member, mu, covar, smax, opac, margin, near, far,
                eps2d, device,
            )  # fmt: skip
            hits_v.append(qv.take(hit // L).numpy())
            hits_p.append(member.take(hit).numpy())
        hv = np.concatenate(hits_v) if hits_v else np.zeros(0, dtype=np.int64)
        hp = order_np[np.concatenate(hits_p)] if hits_p else np.zeros(0, dtype=np.int64)
        indptr[v0 + 1 : v1 + 1] = np.bincount(hv, minlength=v1 - v0)
        pairs = np.sort(hv * np.int64(n) + hp)  # (view, primitive) pairs are unique
        parts.append((pairs % n).astype(index_dtype))
    np.cumsum(indptr, out=indptr)
    indices = np.concatenate(parts)
    out = sp.csr_matrix(
        (np.ones(indices.shape[0], dtype=bool), indices, indptr), shape=(num_views, n)
    )
    out.has_sorted_indices = True
    return out
