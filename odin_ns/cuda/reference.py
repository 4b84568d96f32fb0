"""Pure-torch references of the ``torch.ops.odin`` ops: the specification, and the fallback.

Each function has the signature of its compiled op and the same defined behaviour:

- repeated ids: ``pack_rows`` copies a repeated row once per occurrence;
  ``accumulate_ready_rows`` adds it once per occurrence, in part and list order
  (``index_add_``);
  ``validate_reads`` reports it once per occurrence; ``apply_ready_rows`` and
  ``record_row_norms`` require strictly increasing ids (the engine's union of footprints is
  sorted and unique);
- empty id lists give empty outputs and leave in-place arguments untouched;
- bad input (shape, dtype, device, out-of-range ids) raises ValueError before anything is
  written; checks that read values (id ranges, sorted ids) run on host tensors always and
  on an accelerator's only with ``ODIN_NS_DEBUG_CHECKS=1`` (``reads_values``).

They run on any device; the compiled CPU kernels match them bit for bit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
from torch import Tensor


def _check(cond: bool, op: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {message}")


def reads_values(t: Tensor) -> bool:
    """Whether checks may read ``t``'s values: always on the host; on an accelerator that
    read waits for the stream, so only with ``ODIN_NS_DEBUG_CHECKS=1`` (an out-of-range id
    still stops the kernel there with a device-side assertion: torch's and the extension's
    CUDA kernels check every id they index by)."""
    return t.device.type == "cpu" or os.environ.get("ODIN_NS_DEBUG_CHECKS") == "1"


def _check_ids(ids: Tensor, n: int, op: str, name: str = "ids") -> None:
    _check(ids.dim() == 1, op, f"{name} must be 1-D, got shape {list(ids.shape)}")
    _check(ids.dtype == torch.int64, op, f"{name} must be torch.int64, got {ids.dtype}")
    if ids.numel() == 0 or not reads_values(ids):
        return
    lo, hi = (int(x) for x in torch.stack(torch.aminmax(ids)).tolist())
    _check(
        lo >= 0 and hi < n,
        op,
        f"{name} out of range: values span [{lo}, {hi}] but must lie in [0, {n})",
    )


def _check_same_device(op: str, device: torch.device, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        _check(
            t.device == device, op, f"{name} is on {t.device} but the other inputs are on {device}"
        )


def footprint_cull(
    means2d: Tensor,  # [V, N, 2] projected centres, pixels
    radii: Tensor,  # [V, N] 3-sigma radius, pixels; <= 0 means culled by the projection
    depths: Tensor,  # [V, N] camera-space depth
    opacities: Tensor,  # [N] activated opacity
    width: int,
    height: int,
    margin_px: float,
    near_plane: float,
    opacity_threshold: float,
) -> tuple[Tensor, Tensor]:
    """Views x primitives CSR of the primitives each view can touch.

    Kept: radius > 0, depth >= near_plane, opacity >= opacity_threshold, a finite centre,
    and gsplat's image test with the radius grown by ``margin_px``:
    ``(x + radius) + margin > 0``, ``(x - radius) - margin < W``, and the same for y and H
    (the square of half-width radius + margin overlaps the image). Computed in float32, in
    this operation order (``compute_footprints`` relies on it to match gsplat bit for bit).

    Returns:
        indptr: [V + 1] int64; indices: [nnz] int64, ascending within each view.
    """
    op = "footprint_cull"
    _check(
        means2d.dim() == 3 and means2d.shape[2] == 2,
        op,
        f"means2d must have shape [V, N, 2], got {list(means2d.shape)}",
    )
    V, N = means2d.shape[0], means2d.shape[1]
    for name, t, shape in (
        ("radii", radii, [V, N]),
        ("depths", depths, [V, N]),
        ("opacities", opacities, [N]),
    ):
        _check(list(t.shape) == shape, op, f"{name} must have shape {shape}, got {list(t.shape)}")
    _check_same_device(op, means2d.device, radii=radii, depths=depths, opacities=opacities)
    for name, t in (
        ("means2d", means2d),
        ("radii", radii),
        ("depths", depths),
        ("opacities", opacities),
    ):
        _check(
            t.dtype != torch.bool and not t.is_complex(),
            op,
            f"{name} must be real-valued, got {t.dtype}",
        )
    _check(
        width > 0 and height > 0, op, f"width and height must be positive, got {width} x {height}"
    )
    _check(margin_px >= 0, op, f"margin_px must be >= 0, got {margin_px}")

    xy = means2d.float()
    x, y = xy[..., 0], xy[..., 1]
    radii, depths, opacities = radii.float(), depths.float(), opacities.float()
    keep = (
        (radii > 0)
        & (depths >= near_plane)
        & (opacities >= opacity_threshold)[None, :]
        & torch.isfinite(x)
        & torch.isfinite(y)
        & ((x + radii) + margin_px > 0)
        & ((x - radii) - margin_px < width)
        & ((y + radii) + margin_px > 0)
        & ((y - radii) - margin_px < height)
    )
    counts = keep.sum(dim=1)
    indptr = torch.zeros(V + 1, dtype=torch.int64, device=means2d.device)
    indptr[1:] = torch.cumsum(counts, dim=0)
    indices = keep.nonzero()[:, 1].contiguous()
    return indptr, indices


def _check_columns(columns: list[Tensor], ids: Tensor, op: str) -> list[int]:
    """``pack_rows`` / ``scatter_rows``' column groups: at least one, each [N, ...] with one
    N, on ``ids``' device; returns each group's row width d_g."""
    _check(len(columns) > 0, op, "columns must not be empty")
    _check(
        columns[0].dim() >= 1,
        op,
        f"columns[0] must have shape [N, ...], got {list(columns[0].shape)}",
    )
    N = columns[0].shape[0]
    for k, t in enumerate(columns):
        _check(
            t.dim() >= 1 and t.shape[0] == N,
            op,
            f"columns[{k}] must have shape [N, ...] with N = {N}, got {list(t.shape)}",
        )
        _check(
            t.device == ids.device, op, f"columns[{k}] is on {t.device} but ids is on {ids.device}"
        )
    return [math.prod(t.shape[1:]) for t in columns]


def pack_rows(
    ids: Tensor,  # [M] int64 row ids
    columns: list[Tensor],  # K column groups of shape [N, ...] (flattened to [N, d_g]), float
) -> Tensor:
    """Gather rows ``ids`` of every column group into one [M, W = sum(d_g)] float32 buffer."""
    op = "pack_rows"
    dims = _check_columns(columns, ids, op)
    for k, t in enumerate(columns):
        _check(
            t.is_floating_point(),
            op,
            f"columns[{k}] must be a floating-point tensor, got {t.dtype}",
        )
    N = columns[0].shape[0]
    _check_ids(ids, N, op)
    return torch.cat(
        [t.reshape(N, d)[ids].float() for t, d in zip(columns, dims, strict=True)], dim=1
    )


def scatter_rows(
    columns: list[Tensor],  # K column groups [N, ...] float32 contiguous, written in place
    ids: Sequence[Tensor],  # per part j [M_j] int64 strictly increasing row ids
    buffers: Sequence[Tensor],  # per part j [M_j, W_j] float32, W_j >= sum(d_g)
) -> None:
    """In place, part j after part j - 1: row ``ids[j][i]`` of every column group (flattened
    to [N, d_g]) = its columns of ``buffers[j][i]``, groups side by side in ``pack_rows``'
    layout (its inverse); a row two parts name ends with the later part's values; columns of
    a buffer past ``sum(d_g)`` are not read. Every part is checked before any is written."""
    op = "scatter_rows"
    _check(len(ids) == len(buffers), op, f"{len(ids)} id lists but {len(buffers)} buffers")
    for j, (part, buffer) in enumerate(zip(ids, buffers, strict=True)):
        _check_scatter_part(columns, part, buffer, op, j)
    for part, buffer in zip(ids, buffers, strict=True):
        off = 0
        for t in columns:
            d = math.prod(t.shape[1:])
            t.view(t.shape[0], d)[part] = buffer[:, off : off + d]
            off += d


def _check_scatter_part(
    columns: list[Tensor], ids: Tensor, buffer: Tensor, op: str, j: int
) -> None:
    """``scatter_rows``' part j: ``ids`` [M] in range and strictly increasing, ``buffer``
    [M, W >= sum(d_g)] float32 on their device, the columns float32 and contiguous."""
    dims = _check_columns(columns, ids, op)
    for k, t in enumerate(columns):
        _check(t.dtype == torch.float32, op, f"columns[{k}] must be torch.float32, got {t.dtype}")
        _check(t.is_contiguous(), op, f"columns[{k}] must be contiguous (it is updated in place)")
    _check_ids(ids, columns[0].shape[0], op, f"ids[{j}]")
    M = ids.shape[0]
    _check(
        buffer.dim() == 2 and buffer.shape[0] == M and buffer.shape[1] >= sum(dims),
        op,
        f"buffers[{j}] must have shape [M, W] with M = {M}, W >= {sum(dims)}, got "
        f"{list(buffer.shape)}",
    )
    _check(
        buffer.dtype == torch.float32, op, f"buffers[{j}] must be torch.float32, got {buffer.dtype}"
    )
    _check(
        buffer.device == ids.device,
        op,
        f"buffers[{j}] is on {buffer.device} but ids[{j}] is on {ids.device}",
    )
    if M > 1 and reads_values(ids):
        _check(bool((ids[1:] > ids[:-1]).all()), op, f"ids[{j}] must be strictly increasing")


def accumulate_ready_rows(
    acc: Tensor,  # [U, W] float32 accumulator over the step's union rows, updated in place
    ready: Tensor,  # [U] bool rows being applied now
    positions: Sequence[Tensor],  # per part j [M_j] int64 union position of each row
    contribs: Sequence[Tensor],  # per part j [M_j, W] float32 one rank's publication rows
) -> None:
    """In place, for each part j in order, for i = 0..M_j-1 in order: if
    ready[positions[j][i]]: acc[positions[j][i]] += contribs[j][i].

    The engine zeroes ``acc`` and passes the step's parts in rank order, so every replica
    adds the same floats in the same order (bitwise identical sums). Repeated positions add
    once per occurrence, in list order (``index_add_``). Every part is checked before any is
    added.
    """
    op = "accumulate_ready_rows"
    _check(acc.dim() == 2, op, f"acc must have shape [U, W], got {list(acc.shape)}")
    U, W = acc.shape
    _check(list(ready.shape) == [U], op, f"ready must have shape [{U}], got {list(ready.shape)}")
    _check(acc.dtype == torch.float32, op, f"acc must be torch.float32, got {acc.dtype}")
    _check(ready.dtype == torch.bool, op, f"ready must be torch.bool, got {ready.dtype}")
    _check(
        len(positions) == len(contribs),
        op,
        f"{len(positions)} position lists but {len(contribs)} contributions",
    )
    _check_same_device(op, acc.device, ready=ready)
    _check(acc.is_contiguous(), op, "acc must be contiguous (it is updated in place)")
    for j, (pos, contrib) in enumerate(zip(positions, contribs, strict=True)):
        _check(pos.dim() == 1, op, f"positions[{j}] must be 1-D, got shape {list(pos.shape)}")
        M = pos.shape[0]
        _check(
            list(contrib.shape) == [M, W],
            op,
            f"contribs[{j}] must have shape [{M}, {W}], got {list(contrib.shape)}",
        )
        _check(
            contrib.dtype == torch.float32,
            op,
            f"contribs[{j}] must be torch.float32, got {contrib.dtype}",
        )
        _check_same_device(op, acc.device, **{f"positions[{j}]": pos, f"contribs[{j}]": contrib})
        _check_ids(pos, U, op, f"positions[{j}]")
    for pos, contrib in zip(positions, contribs, strict=True):
        if pos.numel():
            keep = ready.index_select(0, pos)
            acc.index_add_(0, pos[keep], contrib[keep])


def _check_union_ids(ids: Tensor, U: int, N: int, op: str) -> None:
    """A step's union of footprints: [U] int64, in [0, N), strictly increasing."""
    _check(
        ids.dim() == 1 and ids.shape[0] == U,
        op,
        f"ids must have shape [{U}], got {list(ids.shape)}",
    )
    _check_ids(ids, N, op)
    if U > 1 and reads_values(ids):
        _check(
            bool((ids[1:] > ids[:-1]).all()),
            op,
            "ids must be strictly increasing (the step's sorted union of footprints)",
        )


def check_apply_inputs(
    params: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    ids: Tensor,
    acc: Tensor,
    ready: Tensor,
    lrs: Sequence[float],
    betas: Sequence[tuple[float, float]],
    eps: Sequence[float],
    step: int,
    versions: Tensor,
) -> list[int]:
    """Validate ``apply_ready_rows``'s arguments (ValueError); per group the row size d_g."""
    op = "apply_ready_rows"
    G = len(params)
    _check(G > 0, op, "params must not be empty")
    for name, seq in (
        ("exp_avgs", exp_avgs),
        ("exp_avg_sqs", exp_avg_sqs),
        ("lrs", lrs),
        ("betas", betas),
        ("eps", eps),
    ):
        _check(len(seq) == G, op, f"{name} has {len(seq)} entries but there are {G} groups")
    _check(versions.dim() == 1, op, f"versions must have shape [N], got {list(versions.shape)}")
    _check(versions.dtype == torch.int64, op, f"versions must be torch.int64, got {versions.dtype}")
    N = versions.shape[0]
    device = versions.device
    dims = []
    for g in range(G):
        p = params[g]
        _check(
            p.dim() >= 1 and p.shape[0] == N,
            op,
            f"params[{g}] must have shape [N, ...] with N = {N}, got {list(p.shape)}",
        )
        _check(
            p.dtype in (torch.float32, torch.float64),
            op,
            f"params[{g}] must be float32 or float64, got {p.dtype}",
        )
        for name, t in (("exp_avgs", exp_avgs[g]), ("exp_avg_sqs", exp_avg_sqs[g])):
            _check(
                t.shape == p.shape,
                op,
                f"{name}[{g}] must have shape {list(p.shape)} like params[{g}], "
                f"got {list(t.shape)}",
            )
            _check(t.dtype == p.dtype, op, f"{name}[{g}] must be {p.dtype}, got {t.dtype}")
        for name, t in (("params", p), ("exp_avgs", exp_avgs[g]), ("exp_avg_sqs", exp_avg_sqs[g])):
            _check(
                t.device == device, op, f"{name}[{g}] is on {t.device} but versions is on {device}"
            )
            _check(
                t.is_contiguous(), op, f"{name}[{g}] must be contiguous (it is updated in place)"
            )
        b1, b2 = betas[g]
        _check(
            0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0,
            op,
            f"betas[{g}] must lie in [0, 1), got ({b1}, {b2})",
        )
        dims.append(math.prod(p.shape[1:]))
    _check(acc.dim() == 2, op, f"acc must have shape [U, W], got {list(acc.shape)}")
    U, W = acc.shape
    _check(
        W == sum(dims) + 1,
        op,
        f"acc must have {sum(dims) + 1} columns (groups {dims} + the visible flag), got {W}",
    )
    _check(acc.dtype == torch.float32, op, f"acc must be torch.float32, got {acc.dtype}")
    _check(list(ready.shape) == [U], op, f"ready must have shape [{U}], got {list(ready.shape)}")
    _check(ready.dtype == torch.bool, op, f"ready must be torch.bool, got {ready.dtype}")
    _check(versions.is_contiguous(), op, "versions must be contiguous (it is updated in place)")
    _check(step >= 0, op, f"step is the 0-based global step, got {step}")
    _check_same_device(op, device, ids=ids, acc=acc, ready=ready)
    _check_union_ids(ids, U, N, op)
    return dims


@torch.no_grad()
def apply_ready_rows(
    params: Sequence[Tensor],  # per group [N, ...] float32/float64, updated in place
    exp_avgs: Sequence[Tensor],  # per group [N, ...] like params, updated in place
    exp_avg_sqs: Sequence[Tensor],  # per group [N, ...] like params, updated in place
    ids: Tensor,  # [U] int64 strictly increasing primitive ids (the step's union)
    acc: Tensor,  # [U, W] float32 summed rows: groups' columns in order, then visible flag
    ready: Tensor,  # [U] bool rows to apply
    lrs: Sequence[float],  # per group learning rate of this step
    betas: Sequence[tuple[float, float]],  # per group (beta1, beta2)
    eps: Sequence[float],  # per group epsilon
    step: int,  # 0-based global step of the update
    versions: Tensor,  # [N] int64 per-primitive applied version, updated in place
) -> None:
    """Apply global step ``step``'s summed update to the ready rows.

    For every i with ready[i]: versions[ids[i]] = step; if acc[i, W-1] > 0 (some writer saw
    the primitive), every group g gets the selective Adam update of row ids[i] with gradient
    acc[i, off_g:off_g + d_g] cast to its dtype and bias-correction count ``step + 1``
    (``odin_ns.optim.selective_adam_update_``, bitwise torch.optim.Adam(foreach=False)).
    Rows not ready, and invisible ready rows, keep their parameters and moments bit for bit.
    """
    from odin_ns.optim import selective_adam_update_

    dims = check_apply_inputs(
        params, exp_avgs, exp_avg_sqs, ids, acc, ready, lrs, betas, eps, step, versions
    )
    move = ready & (acc[:, -1] > 0)
    rows = ids[move]
    if rows.numel() > 0:
        grad_rows = acc[move]
        off = 0
        for param, m, v, lr, (b1, b2), e, d in zip(
            params, exp_avgs, exp_avg_sqs, lrs, betas, eps, dims, strict=True
        ):
            if d > 0:
                grad = grad_rows[:, off : off + d].reshape(rows.shape[0], *param.shape[1:])
                # rows is sorted, so a full-size gradient (every row moves) is also in order.
                selective_adam_update_(
                    param, grad.to(param.dtype), m, v, rows, lr, b1, b2, e, step=step + 1
                )
            off += d
    versions[ids[ready]] = step


def check_record_inputs(
    norms: Tensor, active: Tensor, ids: Tensor, acc: Tensor, ready: Tensor
) -> None:
    """Validate ``record_row_norms``' arguments (ValueError)."""
    op = "record_row_norms"
    _check(norms.dim() == 1, op, f"norms must have shape [N], got {list(norms.shape)}")
    N = norms.shape[0]
    _check(norms.dtype == torch.float32, op, f"norms must be torch.float32, got {norms.dtype}")
    _check(list(active.shape) == [N], op, f"active must have shape [{N}], got {list(active.shape)}")
    _check(active.dtype == torch.bool, op, f"active must be torch.bool, got {active.dtype}")
    for name, t in (("norms", norms), ("active", active)):
        _check(t.is_contiguous(), op, f"{name} must be contiguous (it is updated in place)")
    _check(
        acc.dim() == 2 and acc.shape[1] >= 1,
        op,
        f"acc must have shape [U, W], got {list(acc.shape)}",
    )
    U = acc.shape[0]
    _check(acc.dtype == torch.float32, op, f"acc must be torch.float32, got {acc.dtype}")
    _check(list(ready.shape) == [U], op, f"ready must have shape [{U}], got {list(ready.shape)}")
    _check(ready.dtype == torch.bool, op, f"ready must be torch.bool, got {ready.dtype}")
    _check_same_device(op, norms.device, active=active, ids=ids, acc=acc, ready=ready)
    _check_union_ids(ids, U, N, op)


@torch.no_grad()
def record_row_norms(
    norms: Tensor,  # [N] float32 per-primitive gradient-row norm, updated in place
    active: Tensor,  # [N] bool per-primitive visible flag, updated in place
    ids: Tensor,  # [U] int64 strictly increasing primitive ids (the step's union)
    acc: Tensor,  # [U, W] float32 summed rows: gradient columns, then the visible flag
    ready: Tensor,  # [U] bool rows to record
) -> None:
    """Record an apply's gradient evidence: for every i with ready[i],
    norms[ids[i]] = ||acc[i, :W-1]||_2 and active[ids[i]] = acc[i, W-1] > 0; the other rows
    keep theirs.

    The norm's sum of squares is taken in float64, column after column (each square is
    exact there), its square root in float64, then rounded to float32: one order of
    operations, so every implementation gives the same bits.
    """
    check_record_inputs(norms, active, ids, acc, ready)
    rows = ids[ready]
    if rows.numel() == 0:
        return
    picked = acc[ready]
    total = torch.zeros(rows.shape[0], dtype=torch.float64, device=acc.device)
    for c in range(acc.shape[1] - 1):
        column = picked[:, c].double()
        total += column * column
    norms[rows] = total.sqrt().float()
    active[rows] = picked[:, -1] > 0


def validate_reads(
    read_ids: Tensor,  # [M] int64 primitives a step is about to read
    versions: Tensor,  # [N] int64 last applied version per primitive
    required: Tensor,  # [M] int64 version each read needs
) -> Tensor:
    """[K] int64: the read ids whose version is below the required one, in read order."""
    op = "validate_reads"
    _check(versions.dim() == 1, op, f"versions must have shape [N], got {list(versions.shape)}")
    _check(read_ids.dim() == 1, op, f"read_ids must be 1-D, got shape {list(read_ids.shape)}")
    M = read_ids.shape[0]
    _check(
        list(required.shape) == [M],
        op,
        f"required must have shape [{M}], got {list(required.shape)}",
    )
    _check(versions.dtype == torch.int64, op, f"versions must be torch.int64, got {versions.dtype}")
    _check(required.dtype == torch.int64, op, f"required must be torch.int64, got {required.dtype}")
    _check_same_device(op, versions.device, read_ids=read_ids, required=required)
    _check_ids(read_ids, versions.shape[0], op, "read_ids")
    return read_ids[versions[read_ids] < required]
