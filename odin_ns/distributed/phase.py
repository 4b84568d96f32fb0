"""Phases: when one starts, the footprints it is planned from, and the AOT plan itself.

A phase is a run of steps with a fixed primitive set. It starts at the first step, after
every structural step (refine / opacity reset), and at least every ``max_phase_steps``
steps (fresh footprints, since Gaussians move). At a phase start every rank computes the
footprints, in every training view, of its R-th of the Gaussians whose footprints are due,
the ranks gather them (as tensors), and every rank builds the same plan
(``odin_ns.schedule.build_plan``), continuing the previous phase's epoch so that each view
is still trained once per epoch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist
from nerfstudio.cameras.cameras import Cameras
from torch import Tensor

from odin_ns.cuda import ops
from odin_ns.distributed.densify import next_phase_end
from odin_ns.model import OdinSplatfactoModel, get_viewmat
from odin_ns.schedule import (
    Plan,
    PlanOptions,
    build_plan,
    compute_footprints,
    plan_conflict,
    previous_step_reads,
)
from odin_ns.schedule.footprint import jacobian_bound


@dataclass
class PhaseRecord:
    """What one phase start did and cost (JSON-ready through ``vars``)."""

    phase: int
    start_step: int
    num_steps: int
    num_gaussians: int
    footprint_seconds: float
    plan_seconds: float
    mean_footprint_rows: float
    views_per_rank: int
    predicted_conflict: float
    # share of (step, rank) pairs whose reads share a primitive with a peer's previous step
    predicted_previous_step_reads: float = 0.0
    footprints_reused: bool = False
    footprint_rows_computed: int = -1  # N (recomputed), the new rows only (carried), 0 (reused)
    phase_start_s: float = 0.0  # the whole phase start: drain, exchange, footprints, plan, bind
    # The split of phase_start_s (seconds; footprint_seconds = compute + gather + reference
    # + the carrying bookkeeping):
    drain_s: float = 0.0  # drain and rendezvous (waits for the slowest rank's last step)
    footprint_compute_s: float = 0.0  # compute_footprints of this rank's share of the rows
    gather_s: float = 0.0  # the footprint all-gathers (waits for the slowest rank's share)
    reference_s: float = 0.0  # footprint_reference (the slacks) and the hold checks
    stats_s: float = 0.0  # the record's plan statistics (conflict, previous-step reads)
    exchange_s: float = 0.0  # telemetry exchange and plan-hash check (one all-gather)
    bind_s: float = 0.0  # plan views to the data manager, optimizer groups, engine rebind


class SectionTimer:
    """Seconds per named section, summed over calls (one phase start's split)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        tic = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - tic


@dataclass
class FootprintReference:
    """What a phase start's footprints were computed from, to tell when they still hold.

    Per Gaussian (all [N]): ``means`` [N, 3], ``max_scale`` (largest activated scale) and
    ``slack``: how far it may move, in world units of ``motion`` (mean shift plus 3x
    largest-scale growth), before it can reach more than the reuse threshold into a view
    whose footprint it is not in (``footprint_slack``); inf when it is in every view's.
    """

    footprints: sp.csr_matrix
    means: Tensor
    max_scale: Tensor
    slack: Tensor

    @property
    def num_rows(self) -> int:
        return int(self.means.shape[0])

    def take(self, rows: np.ndarray) -> FootprintReference:
        """The per-Gaussian state of rows ``rows`` ([M] int64) with their footprint columns."""
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.means.device)
        return FootprintReference(
            self.footprints[:, rows], self.means[index], self.max_scale[index], self.slack[index]
        )

    def joined(
        self, other: FootprintReference, column: np.ndarray, footprints: sp.csr_matrix
    ) -> FootprintReference:
        """The reference of ``footprints`` [V, M], whose row i's state is row ``column[i]``
        ([M] int64) of [this reference's rows | ``other``'s rows]."""
        index = torch.from_numpy(column).to(self.means.device)

        def rows(a: Tensor, b: Tensor) -> Tensor:
            return torch.cat([a, b])[index]

        return FootprintReference(
            footprints,
            rows(self.means, other.means),
            rows(self.max_scale, other.max_scale),
            rows(self.slack, other.slack),
        )


@dataclass
class GaussianRows:
    """Some of a model's Gaussians, as footprint code reads a model: ``means`` [M, 3],
    ``scales`` [M, 3] (log), ``quats`` [M, 4], ``opacities`` [M, 1] (logit)."""

    means: Tensor
    scales: Tensor
    quats: Tensor
    opacities: Tensor

    @property
    def num_points(self) -> int:
        return int(self.means.shape[0])

    @classmethod
    def of(cls, model, rows: Tensor | slice) -> GaussianRows:
        """Rows ``rows`` ([M] int64: copies; a slice: views) of ``model``'s Gaussians, detached."""
        return cls(
            *(getattr(model, n).detach()[rows] for n in ("means", "scales", "quats", "opacities"))
        )


def geometry_keys(model, opacity_threshold: float = 1.0 / 255.0) -> np.ndarray:
    """[N, 11] float32 of what a Gaussian's footprint depends on: means, log scales, quats
    and whether its opacity passes ``compute_footprints``' threshold (as 0 / 1)."""
    passes = (torch.sigmoid(model.opacities.detach()) >= opacity_threshold).float()
    parts = [model.means.detach(), model.scales.detach(), model.quats.detach(), passes]
    return torch.cat([t.reshape(t.shape[0], -1).float().cpu() for t in parts], 1).numpy()


def row_sources(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """[N_after] int64: for each row of ``after`` [N_after, K], a row of ``before``
    [N_before, K] with bitwise the same key (any of them if several), or -1 for none.

    After a structural step, rows with a source kept their footprint-relevant state
    (untouched, duplicated or opacity-reset Gaussians); rows without one are new geometry
    (split children, relocated or sampled Gaussians) whose footprints must be computed.
    """

    def keys(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        return x.view(np.dtype((np.void, x.shape[1] * 4))).reshape(-1)

    old, new = keys(before), keys(after)
    if old.size == 0:
        return np.full(new.size, -1, dtype=np.int64)
    order = np.argsort(old, kind="stable")
    pos = np.minimum(np.searchsorted(old[order], new), old.size - 1)
    return np.where(old[order][pos] == new, order[pos], -1).astype(np.int64)


@torch.no_grad()
def footprint_slack(
    footprints: sp.csr_matrix,
    model: OdinSplatfactoModel | GaussianRows,
    cameras: Cameras,
    margin_px: float,
    tol_px: float,
    near: float = 0.01,
) -> Tensor:
    """[N] world-unit slack of each Gaussian's footprint row of ``footprints`` [V, N].

    A view whose footprint holds the Gaussian keeps holding it, whatever it does (a
    footprint is a superset of what is drawn), so only the other views bound its motion.
    In such a view, a Gaussian in front of the camera (depth z, projected centre at
    max(|x|, |y|) / z = a, largest scale s) whose 3-sigma disc, at the radius bound
    ``3 sqrt(s^2 j2 / z^2 + 0.4) + 1`` (``compute_footprints``' bound, j2 the view's
    Jacobian bound) grown by ``margin_px``, misses the image by d >= 0 pixels, can come
    at most ``tol_px`` into it after a ``motion`` M if, to first order,

        M * (f sqrt(1 + a^2) + sqrt(j2) (1 + 3 s / z)) / (z - M) <= d + tol_px

    (centre motion plus radius growth: a move of M brings it closer by at most M, and its
    scale grows by at most M / 3), i.e. M <= (d + tol_px) z / (K + d + tol_px), with
    f = max(fx, fy) and K the bracket, and z - M > ``near``. A Gaussian behind a view
    (z <= ``near``) may move less than ``near - z``. The slack is the smallest of these.

    Cost: O(V N) time. On host tensors the compiled kernel (``torch.ops.odin.footprint_slack``,
    one pass over the pairs, no temporaries: street, 24 views x 16k Gaussians, 18 -> 5 ms)
    when the CPU library is built, else ``footprint_slack_reference`` (within 2e-6 relative:
    float32 chains evaluated in other orders, each within 3.3e-6 of float64); both are
    elementwise, so a
    row's slack does not depend on which rows a rank computes with it. Fine for
    hundreds of views, not for city captures of thousands (there it belongs in
    ``compute_footprints``' culling, whose boxes bound d).
    """
    on_host = model.means.device.type == "cpu"
    kernel = ops.host_op("footprint_slack") if on_host else None
    if kernel is None:
        return footprint_slack_reference(footprints, model, cameras, margin_px, tol_px, near)
    means, smax, viewmats, consts = _slack_inputs(model, cameras)
    return kernel(
        means.contiguous(),
        smax.contiguous(),
        viewmats.contiguous(),
        consts.contiguous(),
        *ops.csr_tensors(footprints),
        float(margin_px),
        float(tol_px),
        float(near),
    )


def _slack_inputs(model, cameras: Cameras) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(means [N, 3], largest scale [N], viewmats [V, 4, 4], per-view constants [V, 8]: fx,
    fy, cx, cy, width, height, Jacobian bound j2, max(fx, fy)), float32, of the slack."""
    device = model.means.device
    means = model.means.detach().float()
    smax = torch.exp(model.scales.detach()).amax(dim=1).float()
    viewmats = get_viewmat(cameras.camera_to_worlds.to(device)).float()  # [V, 4, 4]
    Ks = cameras.get_intrinsics_matrices().to(device).float()
    fx, fy, cx, cy = Ks[:, 0, 0], Ks[:, 1, 1], Ks[:, 0, 2], Ks[:, 1, 2]  # [V] each
    width = cameras.width.reshape(-1).to(device).float()
    height = cameras.height.reshape(-1).to(device).float()
    j2 = jacobian_bound(fx, fy, cx, cy, width, height)[2]  # [V], compute_footprints' bound
    consts = torch.stack([fx, fy, cx, cy, width, height, j2, torch.maximum(fx, fy)], 1)  # [V, 8]
    return means, smax, viewmats, consts


def footprint_slack_reference(
    footprints: sp.csr_matrix,
    model: OdinSplatfactoModel | GaussianRows,
    cameras: Cameras,
    margin_px: float,
    tol_px: float,
    near: float = 0.01,
) -> Tensor:
    """``footprint_slack`` in torch, blocks of views of at most ~1M (view, Gaussian) pairs
    (the compiled kernel's specification; also the path on CUDA tensors)."""
    means, smax, viewmats, consts = _slack_inputs(model, cameras)
    device = means.device
    num_views, num = footprints.shape
    indptr, indices = footprints.indptr, torch.from_numpy(footprints.indices.astype(np.int64))
    slack = torch.full((num,), float("inf"), device=device)
    shrink = 1.0 - 1e-6  # strictly before the near plane
    block = max(1, (1 << 20) // max(1, num))  # views per block: [block, N] at most ~1M pairs
    means_t = means.T.contiguous()  # [3, N]
    smax2 = smax**2
    for v0 in range(0, num_views, block):
        v1 = min(num_views, v0 + block)
        # [B, 1] each: the block's view constants, broadcast over the N rows
        bfx, bfy, bcx, bcy, bw, bh, bj2, bf = (c[:, None] for c in consts[v0:v1].unbind(1))
        # [B, N] camera coordinates, written out elementwise: every value is the same
        # operations whatever the block's shape (a matrix product's rounding may depend on
        # it, and ranks compute different row sets), 5x faster than a batched product
        rot, trans = viewmats[v0:v1, :3, :3], viewmats[v0:v1, :3, 3:]
        x, y, z = (
            rot[:, j, 0:1] * means_t[0]
            + rot[:, j, 1:2] * means_t[1]
            + rot[:, j, 2:3] * means_t[2]
            + trans[:, j]
            for j in range(3)
        )
        front = z > near
        zs = torch.where(front, z, torch.ones_like(z))
        radius = 3.0 * torch.sqrt(smax2 * (bj2 / zs**2) + 0.4) + 1.01 + margin_px
        miss_u = ((bfx * x / zs + bcx) - 0.5 * bw).abs() - 0.5 * bw - radius
        miss_v = ((bfy * y / zs + bcy) - 0.5 * bh).abs() - 0.5 * bh - radius
        d = torch.maximum(miss_u, miss_v).clamp(min=0.0) + tol_px
        a = torch.maximum(x.abs(), y.abs()) / zs
        k = bf * torch.sqrt(1.0 + a**2) + bj2.sqrt() * (1.0 + 3.0 * smax / zs)
        bound = torch.minimum(d * zs / (k + d), (zs - near) * shrink)
        bound = torch.where(front, bound, (near - z) * shrink)
        lengths = torch.from_numpy(np.diff(indptr[v0 : v1 + 1]).astype(np.int64))
        in_view = torch.repeat_interleave(torch.arange(v1 - v0), lengths)  # the block's pairs
        in_row = indices[indptr[v0] : indptr[v1]]
        bound[in_view.to(device), in_row.to(device)] = float("inf")  # views that hold it
        slack = torch.minimum(slack, bound.amin(dim=0))
    return slack


@torch.no_grad()
def footprint_reference(
    footprints: sp.csr_matrix,
    model: OdinSplatfactoModel | GaussianRows,
    cameras: Cameras,
    margin_px: float,
    tol_px: float,
) -> FootprintReference:
    """The reference of ``footprints`` [V, N], the footprints of ``model``'s Gaussians."""
    return FootprintReference(
        footprints=footprints,
        means=model.means.detach().clone(),
        max_scale=torch.exp(model.scales.detach()).amax(dim=1),
        slack=footprint_slack(footprints, model, cameras, margin_px, tol_px),
    )


def motion(
    ref: FootprintReference, model: OdinSplatfactoModel | GaussianRows, rows: Tensor | None = None
) -> Tensor:
    """[M] world-unit motion of ``model``'s row i since ``ref``'s row ``rows[i]`` (None: the
    same rows): mean shift plus 3x growth of the largest scale (shrinking counts 0)."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    shift = (model.means.detach() - pick(ref.means)).norm(dim=1)
    growth = (torch.exp(model.scales.detach()).amax(dim=1) - pick(ref.max_scale)).clamp(min=0.0)
    return shift + 3.0 * growth


def footprints_hold(
    ref: FootprintReference, model: OdinSplatfactoModel | GaussianRows, rows: Tensor | None = None
) -> Tensor:
    """[M] bool: ``model``'s row i still has the footprint of ``ref``'s row ``rows[i]``
    (None: the same rows), within the reference's threshold: it moved within its slack."""
    slack = ref.slack if rows is None else ref.slack[rows]
    return motion(ref, model, rows) <= slack


def footprint_columns(
    left: sp.csr_matrix, right: sp.csr_matrix, column: np.ndarray
) -> sp.csr_matrix:
    """[V, M] CSR (sorted indices) whose column i is column ``column[i]`` ([M] int64) of
    [``left`` | ``right``] (both [V, *] bool). Columns are picked in CSC form (a row gather
    of the transpose) and converted once, not sliced and re-sorted as CSR."""
    both = sp.hstack([left.tocsc(), right.tocsc()], format="csc")
    return both[:, column].tocsr()


@torch.no_grad()
def local_footprints(
    model: OdinSplatfactoModel, cameras: Cameras, views: np.ndarray, margin_px: float
) -> sp.csr_matrix:
    """[len(views), N] footprints of ``views`` for the model's current Gaussians."""
    device = model.means.device
    return compute_footprints(
        means=model.means.detach(),
        scales=torch.exp(model.scales.detach()),
        quats=model.quats.detach(),
        opacities=torch.sigmoid(model.opacities.detach()).squeeze(-1),
        viewmats=get_viewmat(cameras.camera_to_worlds[views].to(device)),
        Ks=cameras.get_intrinsics_matrices()[views].to(device),
        width=cameras.width[views].squeeze(-1),
        height=cameras.height[views].squeeze(-1),
        margin_px=margin_px,
    )


def all_gather_rows(rows: Tensor, world_size: int, group=None) -> Tensor:
    """Every rank's ``rows`` ([K_r, C] CPU tensor, K_r may differ and be 0) concatenated in
    rank order: one all-gather of the counts, one of the rows padded to the largest."""
    count = torch.tensor([rows.shape[0]], dtype=torch.int64)
    counts = [torch.zeros_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count, group=group)
    payload = torch.zeros(max(1, max(int(k) for k in counts)), rows.shape[1], dtype=rows.dtype)
    payload[: rows.shape[0]] = rows
    parts = [torch.zeros_like(payload) for _ in range(world_size)]
    dist.all_gather(parts, payload, group=group)
    return torch.cat([p[: int(k)] for p, k in zip(parts, counts, strict=True)])


def gather_footprint_columns(
    local: sp.csr_matrix,
    columns: np.ndarray,
    num_columns: int,
    world_size: int,
    group=None,
    values: Tensor | None = None,
) -> tuple[sp.csr_matrix, Tensor | None]:
    """[V, M] footprints (canonical CSR) from every rank's [V, K_r] footprints of its
    columns ``columns`` ([K_r] sorted int64 into the M; the ranks' columns are disjoint),
    and with them, in the same collective, per-column ``values`` ([K_r, C] float64: row i
    belongs to column ``columns[i]``), returned as [M, C] float64 in column order (zeros
    for a column no rank sent; None without ``values``).

    One ``all_gather_rows`` of int64 per rank: K_r, the columns, the V row lengths, the
    column ids, then the values' bits (exact), no pickling. Stacked in rank order, each
    view's ids come out sorted when every rank's columns are one range after the previous
    rank's (the replicated split); otherwise (owners' rows) they are sorted once.
    """
    num_views = local.shape[0]
    columns = np.asarray(columns, dtype=np.int64)
    width = 0 if values is None else int(values.shape[1])
    bits = np.zeros(0, dtype=np.int64)
    if values is not None:
        bits = values.detach().double().cpu().contiguous().numpy().view(np.int64).reshape(-1)
    payload = np.concatenate(
        [[columns.size], columns, np.diff(local.indptr), columns[local.indices], bits]
    ).astype(np.int64)
    parts = all_gather_rows(torch.from_numpy(payload)[:, None], world_size, group)[:, 0].numpy()
    row_of, col_of, at = [], [], 0
    gathered = np.zeros((num_columns, width), dtype=np.float64)
    for _ in range(world_size):
        k = int(parts[at])
        cols, at = parts[at + 1 : at + 1 + k], at + 1 + k
        lens, at = parts[at : at + num_views], at + num_views
        nnz = int(lens.sum())
        row_of.append(np.repeat(np.arange(num_views), lens))
        col_of.append(parts[at : at + nnz])
        at += nnz
        gathered[cols] = parts[at : at + k * width].view(np.float64).reshape(k, width)
        at += k * width
    rows, cols = np.concatenate(row_of), np.concatenate(col_of)
    out = sp.csr_matrix(  # COO -> CSR keeps each row's entries in rank order
        sp.coo_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), (num_views, num_columns))
    )
    out.sort_indices()  # a check (no work) when already sorted
    out.sum_duplicates()  # canonical: the ranks' columns are disjoint, so a check as well
    return out, (None if values is None else torch.from_numpy(gathered))


def reference_values(ref: FootprintReference) -> Tensor:
    """[K, 5] float64 of ``ref``'s rows: mean (3), largest scale, slack (every value exact)."""
    return torch.cat([ref.means, torch.stack([ref.max_scale, ref.slack], 1)], 1).double().cpu()


def reference_of_values(
    footprints: sp.csr_matrix, values: Tensor, device: torch.device | str
) -> FootprintReference:
    """The reference of ``footprints`` [V, M] whose rows are ``values`` [M, 5]
    (``reference_values``' layout)."""
    out = values.float().to(device)
    return FootprintReference(footprints, out[:, :3].contiguous(), out[:, 3], out[:, 4])


class PhaseController:
    """Owns the current plan and the phase boundaries of one rank's run.

    Args:
        rank, world_size: this rank and R.
        seed: plan seed (the data manager's sampling seed): identical on every rank.
        strategy: "odin" (low-conflict spatial streams) or "random" (baseline deal).
        options: the odin strategy's knobs (``PlanOptions``; default: its defaults).
        max_phase_steps: re-plan at least this often.
        margin_px: pixels added around each projected footprint.
        reuse_shift_px: at a re-plan, a Gaussian keeps the footprint computed earlier if
            it (or, after a structural step, its source row: the parent of a duplicate or a
            split child) cannot have come more than this many pixels into a view whose
            footprint it is not in (``footprints_hold``); the others' are computed again; 0
            recomputes every time. Footprints only restrict what is drawn (read set = write
            set = plan), so reuse never affects exactness.
        group: process group of the footprint gather (gloo: CPU tensors).
        views_per_rank: B, views each rank trains per step (``Plan.views`` is [T, R, B];
            a step's footprint is the union of its B views'; the plan balances each step's
            cost across ranks with B views each).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        seed: int,
        strategy: str,
        max_phase_steps: int,
        margin_px: float,
        reuse_shift_px: float = 0.0,
        group=None,
        views_per_rank: int = 1,
        options: PlanOptions | None = None,
    ):
        if views_per_rank < 1:
            raise ValueError(f"views_per_rank must be >= 1, got {views_per_rank}")
        self.rank = rank
        self.world_size = world_size
        self.seed = int(seed)
        self.strategy = strategy
        self.max_phase_steps = int(max_phase_steps)
        self.margin_px = float(margin_px)
        self.reuse_shift_px = float(reuse_shift_px)
        self.group = group
        self.views_per_rank = int(views_per_rank)
        self.options = options
        self._reference: FootprintReference | None = None
        self._sources: np.ndarray | None = None  # [N] rows' sources after a structural step
        self.computed_rows = -1  # Gaussians whose footprints the last phase start computed
        self.timer = SectionTimer()  # the current phase start's split
        self.reused = 0  # phase starts that kept the previous footprints
        self.plan: Plan | None = None
        self.start_step = 0
        self.end_step = 0  # first step of the next phase
        self.index = 0

    def due(self, step: int) -> bool:
        """Whether a new phase starts at ``step``."""
        return self.plan is None or step >= self.end_step

    def boundary(self, step: int, densifier, checkpoint_every: int) -> int | None:
        """The last step of a phase starting at ``step``, if it must end before
        ``max_phase_steps``: the first structural step that ends a phase
        (``densify.next_phase_end``) or checkpoint step (nerfstudio saves after steps
        ``k * checkpoint_every``, k >= 1; 0: no checkpoints), whichever comes first."""
        stop = step + self.max_phase_steps
        candidates = [next_phase_end(densifier, step, stop)]
        if checkpoint_every > 0:
            k = max(1, -(-step // checkpoint_every))  # ceil(step / every), at least 1
            if k * checkpoint_every < stop:
                candidates.append(k * checkpoint_every)
        found = [c for c in candidates if c is not None]
        return min(found) if found else None

    def end_after(self, step: int, sources: np.ndarray | None = None) -> None:
        """End the current phase after ``step`` (a structural step changed the model).

        ``sources`` ([N_new] int64, ``row_sources`` of the change; identical on every rank):
        the rows that kept their footprint-relevant state carry their footprints into the
        next phase, which computes only the new rows' (if the carried ones still hold).
        None: the next phase recomputes every footprint.
        """
        self.end_step = step + 1
        if sources is None or self._reference is None:
            self.forget_footprints()
        else:
            self._sources = np.asarray(sources, dtype=np.int64)

    def forget_footprints(self) -> None:
        """The next phase start recomputes footprints (after a structural change, and at a
        checkpoint boundary, where a resumed run has no footprints to reuse)."""
        self._reference = None
        self._sources = None

    def local_step(self, step: int) -> int:
        return step - self.start_step

    def _num_rows(self, model) -> int:
        """N, the Gaussians the footprints cover (the sharded controller: every rank's)."""
        return model.num_points

    def _footprints(self, model: OdinSplatfactoModel, cameras: Cameras) -> sp.csr_matrix:
        """The phase's footprints: each Gaussian's earlier one where it still holds, the
        others' computed now (every rank the same decision: ``_rows_that_hold``)."""
        ref, sources = self._reference, self._sources
        self._sources = None
        n = self._num_rows(model)
        if ref is not None and self.reuse_shift_px > 0:
            if sources is None and n == ref.num_rows:
                sources = np.arange(n)  # no structural change: every row is its own source
            if sources is not None:
                return self._carried_footprints(ref, sources, model, cameras)
        footprints, self._reference = self._fresh_footprints(np.arange(n), model, cameras)
        self.computed_rows = n
        return footprints

    def _share(self, rows: np.ndarray) -> np.ndarray:
        """Positions in ``rows`` ([M] sorted global ids) whose footprints and reference this
        rank computes: every rank holds every row, so one contiguous R-th of them (the
        sharded controller: the rows it owns)."""
        return np.array_split(np.arange(rows.size), self.world_size)[self.rank]

    def _gaussians(self, model, ids: np.ndarray) -> GaussianRows:
        """The model's Gaussians of global ids ``ids`` ([K] sorted) as ``GaussianRows``."""
        return GaussianRows.of(model, torch.from_numpy(ids).to(model.means.device))

    def _fresh_footprints(
        self, rows: np.ndarray, model, cameras: Cameras
    ) -> tuple[sp.csr_matrix, FootprintReference | None]:
        """[V, M] footprints of Gaussians ``rows`` ([M] sorted ids) in every view, and
        their reference (None without reuse). Each rank computes its share of the rows
        (``_share``) in every view, then one gather: every rank holds every footprint. A
        row split, not a view split, so no rank repeats another's per-Gaussian work (the
        kd-tree, covariances, the reference)."""
        share = self._share(rows)
        gaussians = self._gaussians(model, rows[share])
        with self.timer.section("footprint_compute"):
            mine = local_footprints(gaussians, cameras, np.arange(len(cameras)), self.margin_px)
        part = None
        if self.reuse_shift_px > 0:
            with self.timer.section("reference"):
                part = footprint_reference(
                    mine, gaussians, cameras, self.margin_px, self.reuse_shift_px
                )
        with self.timer.section("gather"):  # the footprints and their reference, at once
            footprints, values = gather_footprint_columns(
                mine,
                share,
                rows.size,
                self.world_size,
                self.group,
                values=None if part is None else reference_values(part),
            )
        if values is None:
            return footprints, None
        return footprints, reference_of_values(footprints, values, model.means.device)

    def _rows_that_hold(self, ref: FootprintReference, sources: np.ndarray, model) -> np.ndarray:
        """[N] bool: rows with a source (``sources`` [N] int64 into ``ref``'s rows, -1 for
        none) whose source's footprint still holds for them (``footprints_hold``). Each
        rank decides for its share of the rows (``_share``), then one all-reduce of [N]
        uint8 flags: every rank the same decision."""
        share = self._share(np.arange(sources.size))
        mine = share[sources[share] >= 0]
        device = model.means.device
        with self.timer.section("reference"):
            held = footprints_hold(
                ref, self._gaussians(model, mine), torch.from_numpy(sources[mine]).to(device)
            )
        flags = torch.zeros(sources.size, dtype=torch.uint8)
        flags[torch.from_numpy(mine[held.cpu().numpy()])] = 1
        with self.timer.section("gather"):
            dist.all_reduce(flags, group=self.group)  # the shares are disjoint: 0 or 1
        return flags.numpy() > 0

    def _carried_footprints(
        self, ref: FootprintReference, sources: np.ndarray, model, cameras: Cameras
    ) -> sp.csr_matrix:
        """Footprints that carry what still holds (``_rows_that_hold``: those rows keep
        their source's footprint); the other rows' are computed now."""
        hold = self._rows_that_hold(ref, sources, model)
        new = np.flatnonzero(~hold)
        if new.size == 0 and np.array_equal(sources, np.arange(ref.num_rows)):
            self.reused += 1  # every footprint holds, in the same order: the same matrix
            self.computed_rows = 0
            return ref.footprints
        if new.size:  # the same decision on every rank: all compute and gather, or none
            fresh, fresh_ref = self._fresh_footprints(new, model, cameras)  # [V, len(new)]
        else:
            fresh_ref = ref.take(np.empty(0, dtype=np.int64))
            fresh = fresh_ref.footprints
        column = np.where(hold, sources, 0)  # each row's column of [ref's rows | new rows]
        column[new] = ref.num_rows + np.arange(new.size)
        footprints = footprint_columns(ref.footprints, fresh, column)
        self._reference = ref.joined(fresh_ref, column, footprints)
        if new.size == 0:
            self.reused += 1
        self.computed_rows = int(new.size)
        return footprints

    def resume_state(self, next_step: int) -> dict:
        """What a phase starting at ``next_step`` continues from (epoch position, phase
        count), as plain lists and ints for a checkpoint."""
        assert self.plan is not None
        resume = self.plan.resume(next_step - self.start_step)
        pending = resume["pending"]
        return {
            "epoch": int(resume["epoch"]),
            "pending": None if pending is None else [int(v) for v in pending],
            "phase_index": self.index,
        }

    def start(
        self,
        step: int,
        model: OdinSplatfactoModel,
        cameras: Cameras,
        next_boundary: int | None,
        resumed: dict | None = None,
    ) -> tuple[Plan, PhaseRecord]:
        """Plan the phase that starts at ``step`` (call on every rank, after a drain).

        Args:
            next_boundary: the first step in the coming ``max_phase_steps`` after which the
                phase must end (a structural step, or a checkpoint step), or None.
            resumed: a checkpoint's ``resume_state`` (the run's first phase after a resume).
        """
        self.timer = SectionTimer()
        tic = time.perf_counter()
        reused_before = self.reused
        footprints = self._footprints(model, cameras)
        computed_rows = self.computed_rows
        footprint_s = time.perf_counter() - tic

        tic = time.perf_counter()
        end = next_boundary + 1 if next_boundary is not None else step + self.max_phase_steps
        num_steps = max(1, end - step)
        # Continue the previous phase's epoch, so every view is still trained once per epoch.
        if resumed is not None:
            self.index = int(resumed["phase_index"])
            pending = resumed["pending"]
            resume = {
                "epoch": int(resumed["epoch"]),
                "pending": None if pending is None else np.asarray(pending, dtype=np.int64),
            }
        elif self.plan is not None:
            resume = self.plan.resume(step - self.start_step)
        else:
            resume = {}
        plan = build_plan(
            footprints,
            num_ranks=self.world_size,
            num_steps=num_steps,
            views_per_rank=self.views_per_rank,
            seed=self.seed,
            strategy=self.strategy,
            options=self.options,
            **resume,
        )
        plan_s = time.perf_counter() - tic
        with self.timer.section("stats"):
            conflict = float(np.mean(plan_conflict(plan))) if num_steps > 1 else 0.0
            previous = float(np.mean(previous_step_reads(plan)[1:])) if num_steps > 1 else 0.0
        times = self.timer.seconds
        record = PhaseRecord(
            phase=self.index,
            start_step=step,
            num_steps=num_steps,
            num_gaussians=model.num_points,
            footprint_seconds=footprint_s,
            plan_seconds=plan_s,
            mean_footprint_rows=float(np.mean(plan.message_rows)),
            views_per_rank=plan.views_per_rank,
            predicted_conflict=conflict,
            predicted_previous_step_reads=previous,
            footprints_reused=self.reused > reused_before,
            footprint_rows_computed=computed_rows,
            footprint_compute_s=times.get("footprint_compute", 0.0),
            gather_s=times.get("gather", 0.0),
            reference_s=times.get("reference", 0.0),
            stats_s=times.get("stats", 0.0),
        )
        self.plan = plan
        self.start_step, self.end_step = step, step + num_steps
        self.index += 1
        return plan, record
