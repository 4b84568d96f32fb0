"""What the primitive-sync engine is configured with: modes, options, parameter groups."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

MODES = ("barrier", "quality-first", "throughput-first", "ddp")


@dataclass
class ParamGroupState:
    """One parameter group of the replica; the tensors are the model's own (updated in place).

    ``param``, ``exp_avg``, ``exp_avg_sq``: [N, ...] with the same shape. ``lr_at(s)``
    gives the learning rate of global step s.
    """

    name: str
    param: Tensor  # [N, ...]
    exp_avg: Tensor  # [N, ...]
    exp_avg_sq: Tensor  # [N, ...]
    lr_at: Callable[[int], float]
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-15

    @property
    def row_dim(self) -> int:
        """Flattened size of one row."""
        return math.prod(self.param.shape[1:])


@dataclass
class SyncConfig:
    """Options of the primitive-sync engine.

    Attributes:
        mode: what a step waits for before it reads (``odin_ns.runtime.engine``):
            "barrier" (wait for every peer's every earlier step: the synchronous
            baseline), "quality-first" (wait only for what the step's read set depends
            on), "throughput-first" (quality-first, but a pending low-impact peer update
            of the read set may be read around; bounded staleness) or "ddp" (what DDP
            does: a dense all-reduce of every gradient row every step and a global wait).
        timeout_s: deadline of every blocking wait (a step's reads, credits, drains,
            rendezvous), counted from the last time a peer was heard from.
        idle_timeout_s: limit of the transport's background waits (a gloo wait that times
            out breaks the connection, so keep this long; deadlines above fire first).
        tau: throughput-first admission threshold (>= 0), read at every decision (so it
            may be changed between phases); 0 admits nothing (reads as in quality-first).
            The impact rule admits a delayed read whose delayed rows carry at most tau ** 2
            of the read's expected gradient mass (overlap ratio x gradient evidence); at the
            default 1.0 it refuses a read whose delayed rows carry more than the whole read
            would at the mean strength. The overlap rule needs overlap ratio <= tau and
            evidence < tau (0.2 is the value it was measured at).
        staleness_window: K, the most steps a delayed read may lag (t - s <= K).
        admission: throughput-first's rule (``odin_ns.runtime.admission``): "impact"
            (default: the delayed rows' share of the read's expected gradient mass; many
            weak rows may be read around, as where views overlap densely) or "overlap"
            (few overlapping rows, weak ones: it admits almost nothing where a step reads
            what the peer's last step wrote, as in object captures and forward sequences).
        stale_gradients: what throughput-first does with a rank's gradient of the rows it
            read around a pending update: "apply" (default: summed into the step's update
            like any other row, computed on the values read: delayed-gradient SGD) or
            "drop" (they carry no update from that rank at that step: zero rows, not
            visible). Dropping throws away most of a view's signal where the rows read
            around are most of it (fox, impact rule at tau 1: -0.23 dB dropped, -0.002
            applied); ``docs/architecture.md``, throughput-first.
        max_inflight_bytes: credits: the most bytes of this rank's publications to one peer
            whose send has not completed (the peer has not taken them yet). A rank at the cap
            waits in ``after_backward`` (``ledger.StepMetrics.credit_wait_s``) until the peer catches up;
            one publication is always allowed, however large. Bounds the host memory a rank
            running ahead of a slow peer holds (default 64 MiB per peer).
        transport: what carries publications between ranks (``runtime.transport_choice``):
            "auto" (NCCL's device transport when every rank owns a GPU, else gloo over host
            memory), "gloo" or "nccl" (refused where it cannot run).
        heartbeat_s: while a rank is busy with work of its own (``engine.busy``: rank 0's
            checkpoint write, evaluation, a paused viewer) it beats this often, and peers
            waiting on it reset their deadlines at every beat: a peer times out only when
            the rank it waits for has been silent for ``timeout_s``. Capped at a quarter
            of ``timeout_s``. Every rank also pulses this often for its whole life; a wait
            on a peer that has missed ten pulses fails at once (``PeerFailure``: its
            process ended or its node is gone), not at ``timeout_s``.
    """

    mode: str = "quality-first"
    timeout_s: float = 120.0
    idle_timeout_s: float = 1800.0
    tau: float = 1.0
    staleness_window: int = 4
    admission: Literal["overlap", "impact"] = "impact"
    max_inflight_bytes: int = 64 << 20
    heartbeat_s: float = 2.0
    transport: Literal["auto", "gloo", "nccl"] = "auto"
    stale_gradients: Literal["drop", "apply"] = "apply"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"SyncConfig.mode must be one of {MODES}, got {self.mode!r}")
        if not self.timeout_s > 0 or not self.idle_timeout_s > 0:
            raise ValueError(
                f"timeouts must be > 0, got timeout_s={self.timeout_s}, "
                f"idle_timeout_s={self.idle_timeout_s}"
            )
        if self.staleness_window < 0:
            raise ValueError("staleness_window must be >= 0")
        if self.admission not in ("overlap", "impact"):
            raise ValueError(
                f"SyncConfig.admission must be 'overlap' or 'impact', got {self.admission!r}"
            )
        if self.stale_gradients not in ("drop", "apply"):
            raise ValueError(
                "SyncConfig.stale_gradients must be 'drop' or 'apply', got "
                f"{self.stale_gradients!r}"
            )
        if self.transport not in ("auto", "gloo", "nccl"):
            raise ValueError(
                f"SyncConfig.transport must be 'auto', 'gloo' or 'nccl', got {self.transport!r}"
            )
        if not (math.isfinite(self.tau) and self.tau >= 0):
            raise ValueError(f"SyncConfig.tau must be a finite number >= 0, got {self.tau}")
        if self.max_inflight_bytes < 1 or not self.heartbeat_s > 0:
            raise ValueError(
                f"need max_inflight_bytes >= 1 and heartbeat_s > 0, got "
                f"{self.max_inflight_bytes} and {self.heartbeat_s}"
            )

    @property
    def beat_s(self) -> float:
        """The heartbeat period used: ``heartbeat_s``, at most ``timeout_s / 4``."""
        return min(self.heartbeat_s, self.timeout_s / 4)

    def apply_panel_request(self, request: dict) -> None:
        """Take the viewer panels' tau / K request (``{}``, or ``{"tau": .., "K": ..}``, as
        the phase-start exchange brings it to every rank at once)."""
        self.tau = float(request.get("tau", self.tau))
        self.staleness_window = int(request.get("K", self.staleness_window))


__all__ = ["MODES", "ParamGroupState", "SyncConfig"]
