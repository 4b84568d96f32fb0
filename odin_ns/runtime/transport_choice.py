"""Which transport carries publications: NCCL when every rank owns a GPU, else gloo.

``--pipeline.sync.transport``: "auto" (default) picks NCCL's device transport
(``device_transport`` over ``nccl.NcclLink``) when every rank has a CUDA device of its own
and NCCL is available, and the gloo transport (``transport.P2PTransport``: host buffers)
for CPU ranks and for ranks sharing a GPU (NCCL refuses two ranks on one device). "gloo" or
"nccl" forces one; "nccl" where it cannot run is refused with the reason before training.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from odin_ns.errors import OdinInputError
from odin_ns.runtime.device_transport import DeviceTransport
from odin_ns.runtime.nccl import NcclLink
from odin_ns.runtime.transport import P2PTransport, Transport

TRANSPORTS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class TransportChoice:
    """The transport picked (``kind``) and why, as printed once at start."""

    kind: Literal["gloo", "nccl"]
    reason: str


def decide_transport(
    requested: str, devices: list[tuple[str, int]], nccl_available: bool
) -> TransportChoice:
    """The rule, on every rank's (host name, CUDA device index or -1 for CPU).

    Raises:
        OdinInputError: "nccl" was requested where it cannot run.
    """
    if requested == "gloo":
        return TransportChoice("gloo", "forced by --pipeline.sync.transport gloo")
    if any(index < 0 for _, index in devices):
        why = "some ranks run on the CPU"
    elif len(set(devices)) < len(devices):
        why = "ranks share a GPU (NCCL holds one rank per device)"
    elif not nccl_available:
        why = "this torch has no NCCL"
    else:
        return TransportChoice("nccl", "every rank owns a GPU")
    if requested == "nccl":
        raise OdinInputError(f"--pipeline.sync.transport nccl cannot run here: {why}")
    return TransportChoice("gloo", why)


def choose_transport(requested: str, device: torch.device, group) -> TransportChoice:
    """``decide_transport`` on every rank's device, gathered over ``group`` (gloo)."""
    index = -1
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (socket.gethostname(), index), group=group)
    return decide_transport(requested, everyone, dist.is_nccl_available())


def open_transport(
    choice: TransportChoice,
    rank: int,
    world_size: int,
    group,
    device: torch.device,
    idle_timeout_s: float,
) -> Transport:
    """The chosen transport; ``group`` (gloo) carries gloo's publications or NCCL's
    notices."""
    host = P2PTransport(rank, world_size, group, idle_timeout_s, device.type == "cuda")
    if choice.kind == "gloo":
        return host
    return DeviceTransport(rank, world_size, NcclLink(world_size, device), host, device)


__all__ = [
    "TRANSPORTS",
    "TransportChoice",
    "choose_transport",
    "decide_transport",
    "open_transport",
]
