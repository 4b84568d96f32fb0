"""Primitive-sync runtime: update log, read gates (barrier / quality-first /
throughput-first / ddp), publications over a transport, and the engine that runs them."""

from odin_ns.runtime.admission import FALLBACK_REASONS, Decision, fallback_reason
from odin_ns.runtime.config import MODES, ParamGroupState, SyncConfig
from odin_ns.runtime.engine import PrimitiveSyncEngine
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.ledger import RunLedger, StepMetrics
from odin_ns.runtime.recorder import ReadRecord, ReadRecorder
from odin_ns.runtime.transport import ALL_PEERS, Arrival, P2PTransport, Transport

__all__ = [
    "ALL_PEERS",
    "FALLBACK_REASONS",
    "MODES",
    "Arrival",
    "Decision",
    "P2PTransport",
    "ParamGroupState",
    "PeerFailure",
    "PrimitiveSyncEngine",
    "ReadRecord",
    "ReadRecorder",
    "RunLedger",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
    "Transport",
    "fallback_reason",
]
