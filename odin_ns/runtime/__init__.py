"""Primitive-sync runtime: the one engine (``engine``) over an ownership map (``layout``:
every rank owns every row in the replicated layout), a phase's step tables
(``step_tables``), its update log, throughput-first's admission, the transports and the
liveness of ranks."""

from odin_ns.runtime.admission import FALLBACK_REASONS, Decision, fallback_reason
from odin_ns.runtime.config import MODES, ParamGroupState, SyncConfig
from odin_ns.runtime.errors import PeerFailure, SyncError, SyncTimeout
from odin_ns.runtime.ledger import RunLedger, StepMetrics
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
    "RunLedger",
    "StepMetrics",
    "SyncConfig",
    "SyncError",
    "SyncTimeout",
    "Transport",
    "fallback_reason",
]
