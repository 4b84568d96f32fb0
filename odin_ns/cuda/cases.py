"""Random inputs of every ``torch.ops.odin`` op in the engine's layout, and how to run them.

Shared by ``tests/test_cuda_ext.py``, ``odin_ns.bench.ops`` and the GPU check: one
``make_inputs(op, n, gen)`` per op, ``copy_inputs`` (fresh storage per run, so in-place ops
do not share it), ``run_op`` (an op's outputs by name: returned tensors, or the in-place
arguments it updates) and ``compare`` (exact, or within ``TOLERANCES``).

Engine layout (splatfacto, sh_degree 3): a publication row holds the gradient rows of the
six parameter groups side by side (means 3, scales 3, quats 4, features_dc 3, features_rest
45, opacities 1) and the visible flag: W = 60 float32 columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# splatfacto's per-primitive parameter groups: name -> shape of one row (59 floats in all).
SPLATFACTO_ROWS: dict[str, tuple[int, ...]] = {
    "means": (3,),
    "scales": (3,),
    "quats": (4,),
    "features_dc": (3,),
    "features_rest": (15, 3),
    "opacities": (1,),
}
SPLATFACTO_LRS = (1.6e-4, 5e-3, 1e-3, 2.5e-3, 1.25e-4, 5e-2)
WIDTH = sum(math.prod(s) for s in SPLATFACTO_ROWS.values()) + 1  # 60: groups + visible flag

# Outputs each op is compared on: returned tensors, or the in-place arguments it updates.
INPLACE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "scatter_rows": ("columns",),
    "accumulate_ready_rows": ("acc",),
    "apply_ready_rows": ("params", "exp_avgs", "exp_avg_sqs", "versions"),
    "record_row_norms": ("norms", "active"),
}
OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "footprint_cull": ("indptr", "indices"),
    "pack_rows": ("buffer",),
    "validate_reads": ("stale_ids",),
}
# the parts one call of accumulate_ready_rows adds (writers' contributions) or one call of
# scatter_rows writes (pushes)
PARTS = 3
# Ops whose id list may repeat ids (defined behaviour), and that list's argument name (a
# list of id lists for accumulate_ready_rows: repeats within each).
DUPLICATES_DEFINED = {
    "pack_rows": "ids",
    "accumulate_ready_rows": "positions",
    "validate_reads": "read_ids",
}
# (rtol, atol) of outputs allowed to differ between CPU and CUDA; the rest must be exact:
# the GPU's IEEE square root against torch's CPU (MKL) one, atomics order on repeated ids
# (and their subnormals flushed to zero: none in these cases' magnitudes).
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    ("apply_ready_rows", "params"): (1e-5, 1e-7),
    ("accumulate_ready_rows", "acc"): (1e-5, 1e-6),
}


def subset_ids(n: int, m: int, gen: torch.Generator, duplicates: bool = False) -> Tensor:
    """[m] int64 ids in [0, n): sorted unique (a footprint), or drawn with repetition."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    if duplicates:
        return torch.randint(0, n, (m,), generator=gen)
    return torch.randperm(n, generator=gen)[: min(m, n)].sort().values


def splatfacto_state(n: int, gen: torch.Generator) -> dict[str, list[Tensor]]:
    """Per-group parameters and Adam moments of ``n`` primitives (mid-training magnitudes)."""
    shapes = [(n, *s) for s in SPLATFACTO_ROWS.values()]
    return dict(
        params=[torch.randn(s, generator=gen) for s in shapes],
        exp_avgs=[torch.randn(s, generator=gen) * 1e-3 for s in shapes],
        exp_avg_sqs=[torch.rand(s, generator=gen) * 1e-5 for s in shapes],
    )


def publication(m: int, gen: torch.Generator, writers: int = 1) -> Tensor:
    """[m, WIDTH] float32 rows: gradients and a visible column summed over ``writers``."""
    rows = torch.randn(m, WIDTH, generator=gen) * 1e-2
    rows[:, -1] = torch.randint(0, writers + 1, (m,), generator=gen).float()
    return rows


def make_inputs(
    op: str,
    n: int,
    gen: torch.Generator,
    fraction: float = 0.2,
    duplicates: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``op`` with ``n`` primitives / union rows (CPU tensors).

    ``fraction``: id-list length / n (footprint, contribution or read-set size);
    ``duplicates``: draw that list with repetition (ops in ``DUPLICATES_DEFINED``).
    """
    m = int(round(n * fraction))
    if op == "footprint_cull":
        views, width, height = 4, 640, 480
        # Centres over twice the image extent: about a quarter land inside.
        xy = torch.rand(views, n, 2, generator=gen) * 2.0 - 0.5
        means2d = xy * torch.tensor([width, height], dtype=torch.float32)
        radii = torch.rand(views, n, generator=gen) * 24.0 - 1.0  # ~4% culled (<= 0)
        depths = torch.rand(views, n, generator=gen) * 10.0 - 0.5
        return dict(
            means2d=means2d,
            radii=radii,
            depths=depths,
            opacities=torch.rand(n, generator=gen),
            width=width,
            height=height,
            margin_px=2.0,
            near_plane=0.01,
            opacity_threshold=1.0 / 255.0,
        )
    if op == "pack_rows":
        columns = [torch.randn(n, math.prod(s), generator=gen) for s in SPLATFACTO_ROWS.values()]
        columns.append((torch.rand(n, 1, generator=gen) < 0.7).float())  # visible flag
        columns.append(torch.rand(n, generator=gen))  # a [N] column: a push's row evidence
        return dict(ids=subset_ids(n, m, gen, duplicates), columns=columns)
    if op == "scatter_rows":
        # pushes' rows written into a table of n rows, part after part (a later push of a row
        # overwrites an earlier one's; a publication row is wider: its last column is not read)
        ids = [subset_ids(n, m, gen) for _ in range(PARTS)]
        columns = [torch.randn(n, *s, generator=gen) for s in SPLATFACTO_ROWS.values()]
        return dict(columns=columns, ids=ids, buffers=[publication(len(i), gen) for i in ids])
    if op == "accumulate_ready_rows":
        # n union rows; each of three ranks' contributions covers ``fraction`` of them.
        positions = [subset_ids(n, m, gen, duplicates) for _ in range(PARTS)]
        return dict(
            acc=torch.randn(n, WIDTH, generator=gen),
            ready=torch.rand(n, generator=gen) < 0.8,
            positions=positions,
            contribs=[publication(len(p), gen) for p in positions],
        )
    if op == "apply_ready_rows":
        # n primitives; the step's union holds ``fraction`` of them.
        ids = subset_ids(n, m, gen)
        return dict(
            **splatfacto_state(n, gen),
            ids=ids,
            acc=publication(len(ids), gen, writers=2),
            ready=torch.rand(len(ids), generator=gen) < 0.8,
            lrs=list(SPLATFACTO_LRS),
            betas=[(0.9, 0.999)] * len(SPLATFACTO_ROWS),
            eps=[1e-15] * len(SPLATFACTO_ROWS),
            step=int(torch.randint(0, 30000, (1,), generator=gen)),
            versions=torch.randint(-1, 100, (n,), generator=gen),
        )
    if op == "record_row_norms":
        # an apply's evidence: n rows of a table (NaN: never updated), ``fraction`` in the union
        ids = subset_ids(n, m, gen)
        norms = torch.rand(n, generator=gen)
        norms[torch.rand(n, generator=gen) < 0.3] = math.nan
        return dict(
            norms=norms,
            active=torch.rand(n, generator=gen) < 0.5,
            ids=ids,
            acc=publication(len(ids), gen, writers=2),
            ready=torch.rand(len(ids), generator=gen) < 0.8,
        )
    if op == "validate_reads":
        read_ids = subset_ids(n, m, gen, duplicates)
        return dict(
            read_ids=read_ids,
            versions=torch.randint(0, 10, (n,), generator=gen),
            required=torch.randint(0, 10, (len(read_ids),), generator=gen),
        )
    raise ValueError(f"unknown op {op!r}")


def copy_inputs(inputs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """Fresh copies on ``device`` (in-place ops must not share storage between runs)."""

    def copy(x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.to(device, copy=True)
        if isinstance(x, list):
            return [copy(t) for t in x]
        return x

    return {k: copy(v) for k, v in inputs.items()}


def run_op(fn: Callable, op: str, inputs: dict[str, Any]) -> dict[str, Tensor]:
    """Run ``fn`` (``op``'s signature) on ``inputs``; its outputs by name.

    In-place list arguments give one output per tensor (``params[0]``, ...).
    """
    out = fn(**inputs)
    if op in INPLACE_OUTPUTS:
        named: dict[str, Tensor] = {}
        for name in INPLACE_OUTPUTS[op]:
            value = inputs[name]
            if isinstance(value, list):
                named.update({f"{name}[{g}]": t for g, t in enumerate(value)})
            else:
                named[name] = value
        return named
    out = out if isinstance(out, tuple) else (out,)
    return dict(zip(OUTPUT_NAMES[op], out, strict=True))


def compare(op: str, expected: dict[str, Tensor], actual: dict[str, Tensor]) -> dict[str, Any]:
    """Exact comparison (NaN equal to NaN), or within TOLERANCES for the outputs listed
    there."""
    report: dict[str, Any] = {"match": True, "exact": True, "max_abs_diff": 0.0}
    for name, want in expected.items():
        got = actual[name].cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            report.update(match=False, exact=False, detail=f"{name}: {got.shape} {got.dtype}")
            return report
        if torch.equal(got, want) or (
            want.is_floating_point() and torch.allclose(got, want, 0.0, 0.0, equal_nan=True)
        ):  # (a NaN where the other has one: a table's unknown rows)
            continue
        report["exact"] = False
        if want.is_floating_point():
            diff = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
            report["max_abs_diff"] = max(report["max_abs_diff"], diff)
            rtol, atol = TOLERANCES.get((op, name.split("[")[0]), (0.0, 0.0))
            if (rtol or atol) and torch.allclose(got, want, rtol=rtol, atol=atol):
                continue
        report.update(match=False, detail=f"{name} differs")
    return report
