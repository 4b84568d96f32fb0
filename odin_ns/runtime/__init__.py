"""Primitive-sync runtime: publications, versions, apply; barrier / quality-first /
throughput-first modes."""

from odin_ns.runtime.admission import FALLBACK_REASONS, Decision, fallback_reason
from odin_ns.runtime.engine import (
    MODES,
    ParamGroupState,
    PrimitiveSyncEngine,
    ReadRecord,
    StepMetrics,
    SyncConfig,
)
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.transport import Arrival, P2PTransport, Transport

__all__ = [
    "FALLBACK_REASONS",
    "MODES",
    "Arrival",
    "Decision",
    "P2PTransport",
    "ParamGroupState",
    "PeerFailure",
    "PrimitiveSyncEngine",
    "ReadRecord",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
    "Transport",
    "fallback_reason",
]
