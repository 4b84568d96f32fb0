"""Primitive-sync runtime: publications, versions, apply, barrier / quality-first modes."""

from odin_ns.runtime.engine import (
    MODES,
    ParamGroupState,
    PrimitiveSyncEngine,
    StepMetrics,
    SyncConfig,
)
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.transport import Arrival, P2PTransport, Transport

__all__ = [
    "MODES",
    "Arrival",
    "P2PTransport",
    "ParamGroupState",
    "PeerFailure",
    "PrimitiveSyncEngine",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
    "Transport",
]
