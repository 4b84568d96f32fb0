"""Which transport carries publications: NCCL when every rank owns a GPU, else gloo.

``--pipeline.sync.transport``: "auto" (default) picks NCCL's device transport
(``device_transport`` over ``nccl.NcclLink``) when every rank has a CUDA device of its own
and NCCL is available, and the gloo transport (``transport.P2PTransport``: host buffers)
for CPU ranks and for ranks sharing a GPU (NCCL refuses two ranks on one device). "gloo" or
"nccl" forces one; "nccl" where it cannot run is refused with the reason before training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from odin_ns.errors import OdinInputError
from odin_ns.runtime.device_transport import DeviceTransport
from odin_ns.runtime.nccl import STREAMS_PER_DEVICE, NcclLink, communicators_per_rank
from odin_ns.runtime.transport import P2PTransport, Transport

TRANSPORTS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class TransportChoice:
    """The transport picked (``kind``) and why, as printed once at start."""

    kind: Literal["gloo", "nccl"]
    reason: str


def decide_transport(
    requested: str, gpus: list[str | None], nccl_available: bool, transports: int = 1
) -> TransportChoice:
    """The rule, on every rank's GPU (its UUID, unique across machines; None: a CPU rank).
    ``transports``: the device transports each rank opens (the sharded layout: two), which
    the reason counts communicators for.

    Raises:
        OdinInputError: "nccl" was requested where it cannot run.
    """
    if requested == "gloo":
        return TransportChoice("gloo", "forced by --pipeline.sync.transport gloo")
    comms = communicators_per_rank(len(gpus), transports)
    if any(gpu is None for gpu in gpus):
        why = "some ranks run on the CPU"
    elif len(set(gpus)) < len(gpus):
        why = "ranks share a GPU (NCCL holds one rank per device)"
    elif not nccl_available:
        why = "this torch has no NCCL on every rank"
    elif comms > STREAMS_PER_DEVICE:
        why = (
            f"a rank's {comms} NCCL communicators "
            f"would share torch's {STREAMS_PER_DEVICE} CUDA streams per GPU, and a receive "
            "queued behind another channel's waiting send can close a cycle of waits"
        )
    else:
        return TransportChoice("nccl", "every rank owns a GPU")
    if requested == "nccl":
        raise OdinInputError(f"--pipeline.sync.transport nccl cannot run here: {why}")
    return TransportChoice("gloo", why)


def choose_transport(
    requested: str, device: torch.device, group, transports: int = 1
) -> TransportChoice:
    """``decide_transport`` on every rank's GPU and NCCL, gathered over ``group`` (gloo).
    A GPU is named by its UUID, not its index: ranks that each see only their own GPU (a
    per-rank ``CUDA_VISIBLE_DEVICES``) all call it ``cuda:0``."""
    gpu = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpu = str(torch.cuda.get_device_properties(index).uuid)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (gpu, dist.is_nccl_available()), group=group)
    gpus = [g for g, _ in everyone]
    return decide_transport(requested, gpus, all(n for _, n in everyone), transports)


def open_transport(
    choice: TransportChoice,
    rank: int,
    world_size: int,
    group,
    device: torch.device,
    idle_timeout_s: float,
) -> Transport:
    """The chosen transport; ``group`` (gloo) carries gloo's publications or NCCL's
    notices. NCCL's watchdog allows an operation ``idle_timeout_s``, as the host transport
    allows a silent peer."""
    # (pinned receive buffers where gloo carries a GPU's publications; NCCL's notices are
    # read on the host)
    pinned = choice.kind == "gloo" and device.type == "cuda"
    host = P2PTransport(rank, world_size, group, idle_timeout_s, pinned)
    if choice.kind == "gloo":
        return host
    link = NcclLink(world_size, device, idle_timeout_s)
    return DeviceTransport(rank, world_size, link, host, device)


__all__ = [
    "TRANSPORTS",
    "TransportChoice",
    "choose_transport",
    "decide_transport",
    "open_transport",
]
