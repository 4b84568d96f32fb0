"""What one rank's engine did over a run: a record per step and every admission decision.

The engine writes into one ``RunLedger``, which the session owns and hands to every phase's
engine, in both layouts. So a run's totals, the live panels' counters and the admission log
are read from one object, in one shape, whatever the layout; nothing is merged over phases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from odin_ns.runtime.admission import FALLBACK_REASONS, Decision, ImpactTally, admission_totals
from odin_ns.runtime.config import SyncConfig


@dataclass
class StepMetrics:
    """What one step cost this rank. Applies and bytes between the step's read gate and the
    next step's count for this step (before the first step: ``RunLedger.outside``).

    ``max_version_lag``: steps between t and the oldest step with an update this rank has
    not applied yet, right after its read gate (replicated layout). Throughput-first:
    ``admitted`` delayed reads (pending sources read around), ``fallbacks`` (decisions that
    waited), ``delayed_rows`` (rows of the read set read at an older version than
    quality-first would: replicated, counted row by row), ``max_staleness`` (largest t - s
    admitted). Credits: ``credit_wait_s`` (a send waiting for a peer at
    ``max_inflight_bytes``), ``inflight_bytes_max`` (most bytes in flight to one peer after
    this step's sends), and in the sharded layout ``pushes_deferred`` / ``deferred_bytes_max``
    (pushes packed and queued for credits). ``busy_wait_s``: seconds of ``wait_s`` spent
    waiting on a peer that said it was busy. ``drain_wait_s``: seconds waited for peers
    after the step's read gate, in drains and rendezvous (a refine's or reset's structural
    change at the step; a phase start, checkpoint or evaluation before the next step), the
    drains' own applies left out: where a rank that runs ahead (throughput-first) pays for
    its lead."""

    step: int
    wait_s: float = 0.0
    apply_s: float = 0.0
    bytes_sent: int = 0
    bytes_recv: int = 0
    rows_applied: int = 0
    max_version_lag: int = 0
    admitted: int = 0
    fallbacks: int = 0
    delayed_rows: int = 0
    max_staleness: int = 0
    credit_wait_s: float = 0.0
    busy_wait_s: float = 0.0
    inflight_bytes_max: int = 0
    pushes_deferred: int = 0
    deferred_bytes_max: int = 0
    drain_wait_s: float = 0.0


@dataclass
class RunLedger:
    """One rank's record of a run (see the module docstring); engines write, sessions and
    benchmarks read."""

    steps: list[StepMetrics] = field(default_factory=list)
    outside: StepMetrics = field(default_factory=lambda: StepMetrics(step=-1))
    phases: int = 0  # plans bound (engines made or rebound)
    drains: int = 0
    drain_s: float = 0.0
    credit_s: float = 0.0  # credit waits, also those that timed out
    busy_s: float = 0.0  # waits that busy peers' beats extended (steps, drains, rendezvous)
    delayed_reads: int = 0  # rows read around pending updates (throughput-first)
    admissions: list[Decision] = field(default_factory=list)  # every admitted delayed read
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FALLBACK_REASONS, 0))
    staleness_hist: dict[int, int] = field(default_factory=dict)
    impacts: ImpactTally = field(default_factory=ImpactTally)  # every decision, against TAU_GRID

    def __post_init__(self):
        self.current = self.outside  # where applies and bytes count now

    def begin_step(self, step: int) -> StepMetrics:
        """A new step's record; applies and bytes count for it until the next one."""
        self.current = StepMetrics(step=int(step))
        self.steps.append(self.current)
        return self.current

    def drain_waited(self, seconds: float) -> None:
        """A drain or rendezvous waited ``seconds`` for peers (in the current step's record)."""
        self.current.drain_wait_s += seconds

    def credit_waited(self, seconds: float) -> None:
        """A send waited ``seconds`` for credits (in the step's record and the run's)."""
        self.current.credit_wait_s += seconds
        self.credit_s += seconds

    def in_flight(self, nbytes: int) -> None:
        """``nbytes`` are in flight to one peer on one stream after a send of this step."""
        self.current.inflight_bytes_max = max(self.current.inflight_bytes_max, int(nbytes))

    def read_delayed(self, rows: int) -> None:
        """The step reads ``rows`` of its read set around pending updates (throughput-first)."""
        self.current.delayed_rows = rows
        self.delayed_reads += rows

    def count(self, decisions: Sequence[Decision]) -> None:
        """Admission decisions made for the current step (throughput-first)."""
        cur = self.current
        for d in decisions:
            self.impacts.add(d)
            if d.admitted:
                self.admissions.append(d)
                self.staleness_hist[d.staleness] = self.staleness_hist.get(d.staleness, 0) + 1
                cur.admitted += 1
                cur.max_staleness = max(cur.max_staleness, d.staleness)
            else:
                self.fallbacks[str(d.reason)] += 1
                cur.fallbacks += 1

    def live_counters(self, config: SyncConfig) -> dict:
        """What the live panels show, in time independent of the run's length."""
        return {
            "mode": config.mode,
            "tau": float(config.tau),
            "staleness_window": int(config.staleness_window),
            "steps": len(self.steps),
            "admitted": len(self.admissions),
            "fallbacks": dict(self.fallbacks),
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
        }

    def summary(self, config: SyncConfig) -> dict:
        """Run totals (JSON-ready). The admission keys (``admitted`` ... ``staleness_hist``)
        are zero / empty outside throughput-first; ``decisions`` = admitted + fallbacks."""
        ms = self.steps
        every = [*ms, self.outside]
        waits = [m.wait_s for m in ms]
        return {
            "mode": config.mode,
            "phases": self.phases,
            "steps": len(ms),
            "wait_s_total": float(sum(waits)),
            "wait_s_mean": float(np.mean(waits)) if waits else 0.0,
            "wait_s_max": float(max(waits)) if waits else 0.0,
            "apply_s_total": float(sum(m.apply_s for m in every)),
            "bytes_sent": int(sum(m.bytes_sent for m in every)),
            "bytes_recv": int(sum(m.bytes_recv for m in every)),
            "rows_applied": int(sum(m.rows_applied for m in every)),
            "max_version_lag": int(max((m.max_version_lag for m in ms), default=0)),
            "drains": self.drains,
            "drain_s_total": self.drain_s,
            "drain_wait_s_total": float(sum(m.drain_wait_s for m in every)),
            "max_inflight_bytes": int(config.max_inflight_bytes),
            "inflight_bytes_max": int(max((m.inflight_bytes_max for m in every), default=0)),
            "credit_wait_s_total": float(self.credit_s),
            "pushes_deferred": int(sum(m.pushes_deferred for m in every)),
            "deferred_bytes_max": int(max((m.deferred_bytes_max for m in every), default=0)),
            "busy_wait_s_total": float(sum(m.busy_wait_s for m in every) + self.busy_s),
            "tau": float(config.tau),
            "staleness_window": int(config.staleness_window),
            "admission": config.admission,
            "stale_gradients": config.stale_gradients,
            **admission_totals(self.admissions, self.fallbacks, self.staleness_hist, self.impacts),
            "delayed_steps": len({d.step for d in self.admissions}),
            "delayed_primitive_reads": int(self.delayed_reads),
        }

    def admission_log(self) -> list[dict]:
        """Every admitted delayed read: step, peer, pub_step, staleness, overlap rows and
        ratio, evidence ratio (JSON-ready)."""
        return [
            {
                "step": d.step,
                "peer": d.peer,
                "pub_step": d.pub_step,
                "staleness": d.staleness,
                "overlap_rows": d.overlap_rows,
                "read_rows": d.read_rows,
                "overlap_ratio": d.overlap_ratio,
                "evidence_ratio": d.evidence_ratio,
            }
            for d in self.admissions
        ]

    def step_metrics(self) -> list[dict]:
        """Per-step metrics as dicts."""
        return [asdict(m) for m in self.steps]


def merge_admission_summaries(parts: list[dict]) -> dict:
    """Admission totals summed over ``parts``: a run's ``RunLedger.summary`` over its ranks
    (``bench.sync``)."""
    if not parts:
        return {}
    out = {
        "tau": parts[-1]["tau"],
        "staleness_window": parts[-1]["staleness_window"],
        "admitted": sum(p["admitted"] for p in parts),
        "fallbacks": {r: sum(p["fallbacks"][r] for p in parts) for r in FALLBACK_REASONS},
        "decisions": sum(p["decisions"] for p in parts),
        "delayed_steps": sum(p["delayed_steps"] for p in parts),
        "delayed_primitive_reads": sum(p["delayed_primitive_reads"] for p in parts),
        "max_staleness": max(p["max_staleness"] for p in parts),
    }
    out["admitted_fraction"] = out["admitted"] / out["decisions"] if out["decisions"] else 0.0
    out["impact_decisions"] = sum(p["impact_decisions"] for p in parts)
    out["impact_within_tau"] = {
        tau: sum(p["impact_within_tau"][tau] for p in parts)
        for tau in parts[-1]["impact_within_tau"]
    }
    hist: dict[str, int] = {}
    for p in parts:
        for k, v in p["staleness_hist"].items():
            hist[k] = hist.get(k, 0) + v
    out["staleness_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    weights = [p["admitted"] for p in parts]
    for key in ("overlap_ratio_admitted", "evidence_ratio_admitted"):
        means = [p[f"{key}_mean"] for p in parts]
        total = sum(weights)
        out[f"{key}_mean"] = (
            float(sum(m * w for m, w in zip(means, weights, strict=True)) / total) if total else 0.0
        )
        out[f"{key}_max"] = max(p[f"{key}_max"] for p in parts)
    return out


__all__ = ["RunLedger", "StepMetrics", "merge_admission_summaries"]
