"""Throughput-first in the sharded engine (``odin_ns.runtime.sharded_admission``), on an
in-process loopback: two ranks in threads, rank 0 slow, over a hand-made plan in which rank
1 reads, every step, a row rank 0 owns and writes (a push source) and a row it owns that
rank 0 writes too (an owned source waiting for rank 0's gradient).

- ``tau = 0`` admits nothing: the owners' rows are bitwise quality-first's, and rank 1's
  waits are fallbacks (overlap).
- ``tau`` large, ``K = 2``: rank 1 reads around rank 0 (admitted delayed reads), never
  more than K steps stale (checked row by row at every read against the owned rows'
  applied versions and the cache's versions), the late pushes still land, and the owners' rows differ
  from quality-first's (the stale reads' gradients were applied).
"""

from __future__ import annotations

import numpy as np
import torch
from harness.sharded_loopback import loopback_plan, run_sharded_loopback
from harness.toy import LoopbackHub

from odin_ns.runtime import SyncConfig

N, T = 64, 16
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63
SLOW_S = 0.03  # rank 0's extra seconds per step


def _footprints() -> list[list[list[int]]]:
    """Rank 0: its rows 0..7 and rank 1's row 32. Rank 1: its rows 56..63 and 32, and rank
    0's row 0: at every step t >= 1 rank 1 needs rank 0's gradient of row 32 at t - 1 (owned
    source) and rank 0's push of row 0 after t - 1 (push source)."""
    return [[list(range(8)) + [32], list(range(56, 64)) + [0, 32]] for _ in range(T)]


def _staleness_bound(engine, t: int) -> int:
    """The largest staleness bound of any row local step t reads (0: every row current)."""
    if engine.admission is None:
        return 0
    st = engine.steps[t]
    worst = 0
    lagging, oldest = engine.lagging_owned_reads(t)  # owned reads lacking an update
    if lagging.size:
        worst = t - oldest
    cached = st.reads[st.reads >= engine.layout.num_owned]
    if cached.size:
        worst = max(worst, t - engine.admission.oldest_missing(cached))
    return worst


def _run(sync: SyncConfig | None):
    plan = loopback_plan(_footprints(), N)
    params, out = run_sharded_loopback(
        plan, OWNER, [LoopbackHub(2), LoopbackHub(2)], seed=5, slow_s=SLOW_S,
        observe=_staleness_bound, sync=sync,
    )  # fmt: skip
    return params, {r: (x.engine, max(x.observed)) for r, x in out.items()}


def test_tau_zero_reads_what_quality_first_reads():
    exact, _ = _run(None)
    zero, out = _run(SyncConfig(mode="throughput-first", tau=0.0, staleness_window=4))
    for a, b in zip(exact, zero, strict=True):
        assert torch.equal(a, b)
    engine, worst = out[1]
    summary = engine.summary()
    assert summary["mode"] == "throughput-first" and summary["admitted"] == 0
    assert summary["fallbacks"]["overlap"] > 0  # rank 1 waited for the slow rank 0
    assert worst == 0  # every row read current


def test_admitted_reads_stay_within_k_steps_and_late_updates_land():
    exact, _ = _run(None)
    k = 2
    stale, out = _run(SyncConfig(mode="throughput-first", tau=10.0, staleness_window=k))
    engine, worst = out[1]
    summary = engine.summary()
    assert summary["admitted"] > 0, summary  # rank 1 read around the slow rank 0
    assert 0 < summary["max_staleness"] <= k
    assert 0 < worst <= k  # row by row, at every read
    log = engine.ledger.admissions
    assert all(d.staleness <= k and d.overlap_ratio <= 10.0 for d in log)
    assert all(d.evidence_ratio < 10.0 for d in log)
    # every push rank 0 sent reached rank 1, late or not, and every step was applied
    assert engine.push_recv[0] == len(engine.inn[0])
    assert all(e.log.oldest_unapplied(T) is None for e, _ in out.values())
    assert summary["fallbacks"]["staleness"] > 0  # K bounded how far rank 1 ran ahead
    for a in stale:
        assert torch.isfinite(a).all()
    assert any(not torch.equal(a, b) for a, b in zip(exact, stale, strict=True))
