"""Dispatcher: each op runs the compiled kernel for its tensors' device, else the reference.

Host ops (``HOST_OPS``: the plan's, the footprint slack's, the update log's per-step ones; CPU library only) are served by
``host_op``: the compiled kernel, or None, and the caller runs its numpy / scipy twin.

The extension builds lazily, on the first call for a device type (CPU library for CPU
tensors; CPU + CUDA libraries for CUDA tensors), and at most once per process. A failed
build never raises here: it warns once and the torch reference is used (same results).
``ODIN_NS_EXT=0`` forces the references; ``ODIN_NS_EXT=cpu`` compiles only the CPU kernels.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_ns.cuda import reference

OPS = (
    "footprint_cull",
    "pack_rows",
    "scatter_rows",
    "accumulate_ready_rows",
    "apply_ready_rows",
    "record_row_norms",
    "validate_reads",
)
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}
# Host kernels of phase starts and of the update log's steps; their twins:
# schedule.plan.dependency_pass_reference, schedule.locality.view_overlaps_reference,
# distributed.phase.footprint_slack_reference, runtime.step_kernels.step_record_reference,
# writer_groups_reference, add_arrivals_reference, take_ready_reference,
# mark_ready_reference, first_lacking_reference, lacking_rows_reference,
# write_versions_reference and any_unapplied_reference; runtime.step_tables.owner_rows_reference
# and reader_rows_reference.
HOST_OPS = (
    "plan_dependencies", "view_overlaps", "footprint_slack", "step_record", "writer_groups",
    "add_arrivals", "take_ready", "mark_ready", "first_lacking", "lacking_rows",
    "write_versions", "any_unapplied", "owner_rows", "reader_rows",
)  # fmt: skip


@dataclass(frozen=True)
class BackendStatus:
    """Whether compiled kernels serve a device type, and why not when they do not."""

    device_type: str
    compiled: bool
    reason: str  # empty when compiled


@functools.cache
def _load(device_type: str) -> BackendStatus:
    """Build and load the library for ``device_type`` once per process (never raises)."""
    from odin_ns.cuda import build

    if device_type == "cpu":
        loader = build.load_cpu
    elif device_type == "cuda":
        if os.environ.get("ODIN_NS_EXT") == "cpu":
            return BackendStatus(device_type, False, "ODIN_NS_EXT=cpu: CUDA kernels not built")
        loader = build.load_cuda
    elif device_type == "meta":
        if not _load("cpu").compiled:  # the schemas come with the CPU library
            return BackendStatus(device_type, False, _load("cpu").reason)
        _register_meta_kernels()
        return BackendStatus(device_type, True, "")
    else:
        return BackendStatus(device_type, False, f"no compiled kernels for {device_type}")
    try:
        loader()
    except Exception as error:  # noqa: BLE001 - any build failure falls back to references
        reason = build.summarize_error(error)
        warnings.warn(
            f"odin_ns.cuda: {device_type} kernels unavailable, using torch references ({reason})",
            RuntimeWarning,
            stacklevel=3,
        )
        return BackendStatus(device_type, False, reason)
    return BackendStatus(device_type, True, "")


def _register_meta_kernels() -> None:
    """Shape-only kernels of the step's ops (``meta`` tensors: no data). They let the
    engine's step run on meta tensors with the compiled ops' data flow, which is how
    tests count the step's reads of the device without a GPU. ``validate_reads`` has none:
    its output size depends on data (the engine runs it on host tensors)."""

    def pack_rows(ids, columns):
        width = sum(math.prod(c.shape[1:]) for c in columns)
        return ids.new_empty((ids.shape[0], width), dtype=torch.float32)

    def in_place(*args):
        return None

    for name, fn in (
        ("pack_rows", pack_rows),
        ("scatter_rows", in_place),
        ("accumulate_ready_rows", in_place),
        ("apply_ready_rows", in_place),
        ("record_row_norms", in_place),
    ):
        torch.library.register_fake(f"odin::{name}")(fn)


def status(device_type: str = "cpu") -> BackendStatus:
    """Which implementation ops on ``device_type`` tensors use (builds on first call)."""
    if os.environ.get("ODIN_NS_EXT") == "0":
        return BackendStatus(device_type, False, "disabled by ODIN_NS_EXT=0")
    return _load(device_type)


def has_kernel(name: str, device_type: str) -> bool:
    """Whether the loaded extension registers a ``device_type`` kernel for op ``name``."""
    key = _DISPATCH_KEYS.get(device_type)
    if key is None or not hasattr(torch.ops.odin, name):
        return False
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"odin::{name}", key))
    except (AttributeError, RuntimeError):
        return True


@functools.cache
def _compiled(name: str, device_type: str) -> Callable | None:
    """The compiled op with the reference's Python signature, or None (per op fallback)."""
    if not has_kernel(name, device_type):
        return None
    fn = getattr(torch.ops.odin, name)
    # A library built from older sources may register the name with another signature.
    schema_args = [a.name for a in fn.default._schema.arguments]
    if schema_args != list(inspect.signature(getattr(reference, name)).parameters):
        warnings.warn(
            f"odin_ns.cuda: compiled {name} has arguments {schema_args}, not the reference's; "
            "using the reference (rebuild with python -m odin_ns.cuda build)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    if name != "apply_ready_rows":
        return fn

    def apply_ready_rows(params, exp_avgs, exp_avg_sqs, ids, acc, ready, lrs, betas, eps,
                         step, versions):  # fmt: skip
        # The schema takes betas as one flat float[] (beta1_0, beta2_0, beta1_1, ...).
        flat = [float(b) for pair in betas for b in pair]
        fn(list(params), list(exp_avgs), list(exp_avg_sqs), ids, acc, ready,
           [float(x) for x in lrs], flat, [float(x) for x in eps], int(step), versions)  # fmt: skip

    return apply_ready_rows


def implementation(name: str, device: torch.device | str) -> Callable:
    """The callable ``name`` runs for tensors on ``device``: compiled op or reference.

    Falls back per op: an op the loaded library does not register runs its reference.
    """
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; ops are {OPS}")
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    if status(device_type).compiled:
        fn = _compiled(name, device_type)
        if fn is not None:
            return fn
    return getattr(reference, name)


class RowOps:
    """The step's data-plane ops for tensors on one device, resolved once.

    The module's functions below look their implementation up on every call (the
    environment, the library's status, the device's name: 1.7 us; scatter and apply also open
    a ``no_grad`` context, 1.6 us), which the engine's step pays about 200 times at R = 64
    sharded. The engine resolves them when it binds instead. A compiled op writes its
    tensors' memory and records nothing for autograd, so it runs as it is; a torch twin (no
    library, or ``ODIN_NS_EXT=0``) runs under ``no_grad``, as the module's functions run it.
    Same arguments as the module's functions, column groups as lists.

    Args:
        device: the parameters' device.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.pack_rows = self._resolve("pack_rows")
        self.scatter_rows = self._resolve("scatter_rows")
        self.accumulate_ready_rows = self._resolve("accumulate_ready_rows")
        self.apply_ready_rows = self._resolve("apply_ready_rows")
        self.record_row_norms = self._resolve("record_row_norms")

    def _resolve(self, name: str) -> Callable:
        fn = implementation(name, self.device)
        return torch.no_grad()(fn) if fn is getattr(reference, name) else fn


def host_op(name: str) -> Callable | None:
    """The compiled host kernel ``name`` (one of ``HOST_OPS``), or None when the CPU library
    is not built, is disabled (``ODIN_NS_EXT=0``) or predates the op: the caller then runs
    the kernel's numpy / scipy twin (same results)."""
    if name not in HOST_OPS:
        raise ValueError(f"unknown host op {name!r}; host ops are {HOST_OPS}")
    if not status("cpu").compiled or not has_kernel(name, "cpu"):
        return None
    return getattr(torch.ops.odin, name)


def csr_tensors(matrix) -> tuple[Tensor, Tensor]:
    """(indptr, indices) of a scipy CSR matrix as host tensors of one integer type (the
    host ops' CSR input; int64 when scipy stored them in different types), no copy else."""
    indptr, indices = matrix.indptr, matrix.indices
    if indptr.dtype != indices.dtype:
        indptr, indices = indptr.astype("int64"), indices.astype("int64")
    return torch.from_numpy(indptr), torch.from_numpy(indices)


@torch.no_grad()
def footprint_cull(
    means2d: Tensor,  # [V, N, 2]
    radii: Tensor,  # [V, N] 3-sigma radius in pixels, <= 0: culled
    depths: Tensor,  # [V, N]
    opacities: Tensor,  # [N] activated opacity
    width: int,
    height: int,
    margin_px: float,
    near_plane: float,
    opacity_threshold: float,
) -> tuple[Tensor, Tensor]:
    """CSR (indptr [V + 1], indices [nnz]) of the primitives each view can touch."""
    fn = implementation("footprint_cull", means2d.device)
    return fn(
        means2d,
        radii,
        depths,
        opacities,
        int(width),
        int(height),
        float(margin_px),
        float(near_plane),
        float(opacity_threshold),
    )


def pack_rows(ids: Tensor, columns: Sequence[Tensor]) -> Tensor:
    """[M, W] float32: rows ``ids`` ([M] int64) of every [N, d_g] column group, side by side."""
    return implementation("pack_rows", ids.device)(ids, list(columns))


@torch.no_grad()
def scatter_rows(
    columns: Sequence[Tensor], ids: Sequence[Tensor], buffers: Sequence[Tensor]
) -> None:
    """In place, part j after part j - 1: rows ``ids[j]`` ([M_j] int64, strictly increasing)
    of every [N, d_g] column group = their columns of ``buffers[j]`` ([M_j, W >= sum(d_g)]
    float32): ``pack_rows``' inverse, a row two parts name ending with the later part's."""
    device = ids[0].device if len(ids) else columns[0].device
    implementation("scatter_rows", device)(list(columns), list(ids), list(buffers))


def accumulate_ready_rows(
    acc: Tensor, ready: Tensor, positions: Sequence[Tensor], contribs: Sequence[Tensor]
) -> None:
    """In place, part j after part j - 1: acc[positions[j][i]] += contribs[j][i] where
    ready[positions[j][i]], i in order (one dispatch for a step's parts).

    acc [U, W] float32, ready [U] bool; per part positions [M_j] int64, contribs [M_j, W]
    float32.
    """
    implementation("accumulate_ready_rows", acc.device)(acc, ready, list(positions), list(contribs))


@torch.no_grad()
def apply_ready_rows(
    params: Sequence[Tensor],  # per group [N, ...], updated in place
    exp_avgs: Sequence[Tensor],  # per group [N, ...], updated in place
    exp_avg_sqs: Sequence[Tensor],  # per group [N, ...], updated in place
    ids: Tensor,  # [U] int64 strictly increasing
    acc: Tensor,  # [U, W] float32, W = sum(d_g) + 1 (last column: visible flag)
    ready: Tensor,  # [U] bool
    lrs: Sequence[float],
    betas: Sequence[tuple[float, float]],
    eps: Sequence[float],
    step: int,  # 0-based global step; bias correction uses step + 1
    versions: Tensor,  # [N] int64, updated in place
) -> None:
    """Selective Adam on the ready, visible rows; versions[ids[ready]] = step."""
    implementation("apply_ready_rows", versions.device)(
        params, exp_avgs, exp_avg_sqs, ids, acc, ready, lrs, betas, eps, step, versions
    )


@torch.no_grad()
def record_row_norms(
    norms: Tensor, active: Tensor, ids: Tensor, acc: Tensor, ready: Tensor
) -> None:
    """In place, for every ready row i (``ready`` [U] bool): ``norms[ids[i]]`` ([N] float32) =
    the L2 norm of its gradient columns ``acc[i, :-1]`` ([U, W] float32), ``active[ids[i]]``
    ([N] bool) = its visible flag ``acc[i, -1] > 0``; ``ids`` [U] int64 strictly increasing."""
    implementation("record_row_norms", norms.device)(norms, active, ids, acc, ready)


@torch.no_grad()
def validate_reads(read_ids: Tensor, versions: Tensor, required: Tensor) -> Tensor:
    """[K] int64: the read ids whose applied version is below the required one."""
    return implementation("validate_reads", versions.device)(read_ids, versions, required)
