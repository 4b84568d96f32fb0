"""A device without values: counts the reads of device data that would synchronize a GPU.

Used by ``bench.control_plane`` (``device_reads_per_step``) and ``tests/test_sync_count.py``.

The engine's step runs with its data plane (parameters, moments, gradients, the visible
mask, publications, everything made from them or created on the parameters' device) on
PyTorch's ``meta`` device, whose tensors have shapes and no values, while its host control
plane (plans, ids, versions) stays on the CPU with real values. The compiled ops run their
shape-only kernels there (``odin_ns.cuda.ops``), as the CUDA kernels run without a read of
the device. A step whose decisions needed device values would have to read them back;
``DeviceReads`` catches every such read, on a meta tensor, of the kinds that synchronize a
CUDA stream with the host:

- ``_local_scalar_dense`` (``.item()``, ``int(t)``, ``bool(t)``, ``float(t)``);
- ``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing (output sizes that
  depend on values);
- copies to the CPU (``.cpu()``, ``.to("cpu")``, ``copy_`` into a host tensor);
- blocking copies from the CPU (``.to(device)`` without ``non_blocking``): torch waits for
  the stream after them (``runtime.uploads.upload`` does not).

Each is counted with the line of ``odin_ns`` that made it and answered with zeros (or an
empty selection; an upload with its meta tensor), so the step goes on: the double cannot
say what the values were, only that the code asked for them. Reads of host tensors are not
counted: they do not touch the device.

Apart from the reads, ``uploads`` counts every copy from the host to the device, blocking
or not, by line, and ``upload_bytes`` what they move: each is a staging copy and a copy
launched, which the step path makes once per step for its id lists
(``runtime.uploads.upload_together``). ``device_ops`` counts, by op, every other operation
on the device's tensors that is not a view: each is a dispatch from the host that queues
work on the device (a kernel launch or more), the part of the host's step a GPU's speed
does not shorten.
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SIZE_FROM_VALUES = {"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"}
# every op ``_read_kind`` may call a read of device values (or an upload): the rest cannot
MAY_READ = {"_local_scalar_dense", "index", "_to_copy", "copy_", *SIZE_FROM_VALUES}


def _on_meta(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def _meta_device(d) -> bool:
    return d is not None and torch.device(d).type == "meta"


def _read_kind(name: str, args, kwargs) -> str | None:
    """Which read of device values the op is (None: none)."""
    if name == "_local_scalar_dense" and _on_meta(args[0]):
        return "scalar"
    if name in SIZE_FROM_VALUES and _on_meta(args[0]):
        return "size"
    if name == "index" and _on_meta(args[0]):
        masks = [i for i in (args[1] or ()) if isinstance(i, torch.Tensor)]
        if any(i.dtype == torch.bool for i in masks):
            return "size"
    if name == "_to_copy" and _on_meta(args[0]):
        target = kwargs.get("device")
        if target is not None and torch.device(target).type == "cpu":
            return "copy"
    if name == "copy_" and _on_meta(args[1]) and args[0].device.type == "cpu":
        return "copy"
    if name == "_to_copy" and _meta_device(kwargs.get("device")):
        blocking = not kwargs.get("non_blocking", False)
        return "upload" if args[0].device.type == "cpu" and blocking else None
    if name == "copy_" and _on_meta(args[0]) and args[1].device.type == "cpu":
        blocking = not (kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True))
        return "upload" if blocking else None
    return None


def _is_upload(name: str, args, kwargs) -> bool:
    """Whether the op copies host memory to the device (blocking or not)."""
    if name == "_to_copy":
        return args[0].device.type == "cpu" and _meta_device(kwargs.get("device"))
    return name == "copy_" and _on_meta(args[0]) and args[1].device.type == "cpu"


def _answer(func, name: str, args, kwargs):
    """Zeros (or an empty selection) in place of the values the double does not have."""
    src = args[0]
    if name == "_local_scalar_dense":
        return False if src.dtype == torch.bool else (0.0 if src.is_floating_point() else 0)
    if name == "nonzero":
        return torch.empty((0, src.dim()), dtype=torch.int64, device="meta")
    if name == "index":
        return src.new_empty((0, *src.shape[1:]))
    if name == "_to_copy" and src.device.type == "cpu":  # an upload: the meta tensor
        return func(*args, **kwargs)
    if name == "_to_copy":
        return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype)
    if name == "copy_" and _on_meta(args[0]):  # an upload
        return func(*args, **kwargs)
    if name == "copy_":
        return args[0].zero_()
    return src.new_empty((0,))


class DeviceReads(TorchDispatchMode):
    """Counts reads of meta tensors' values (see the module docstring) while active.

    ``counting`` off lets set-up run through the double without being counted, and at
    little cost: only the ops that may read values are looked at (``bench.control_plane
    --late-peers`` times its meta twin's step through it so).
    """

    def __init__(self):
        super().__init__()
        self.counting = True
        self.reads: Counter[tuple[str, str]] = Counter()  # (op, odin_ns line) -> reads
        self.uploads: Counter[str] = Counter()  # odin_ns line -> host-to-device copies
        self.upload_bytes = 0  # the bytes those copies move
        self.device_ops: Counter[str] = Counter()  # op -> dispatches of device work

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if not self.counting and name not in MAY_READ:  # only answering: it reads nothing
            return func(*args, **kwargs)
        to_meta = _meta_device(kwargs.get("device"))
        if not to_meta and not any(_on_meta(t) for t in tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        if self.counting and _is_upload(name, args, kwargs):
            self.uploads[_caller()] += 1
            host = args[0] if name == "_to_copy" else args[1]
            self.upload_bytes += host.numel() * host.element_size()
        elif self.counting and not func.is_view:
            self.device_ops[name] += 1
        kind = _read_kind(name, args, kwargs)
        if kind is None:
            return func(*args, **kwargs)
        if self.counting:
            self.reads[(name, _caller())] += 1
        return _answer(func, name, args, kwargs)


def _caller() -> str:
    """``file:line code`` of the innermost frame in ``odin_ns`` outside the benchmarks and
    the upload helpers (the line that asked for the copy)."""
    for frame in reversed(traceback.extract_stack(limit=24)):
        name = frame.filename
        if "odin_ns" in name and "/bench/" not in name and not name.endswith("uploads.py"):
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.line}"
    return "?"


__all__ = ["DeviceReads"]
