"""The sharded owner applies per row: a row's step-s update waits only for that row's
writers at s (and its previous update), not for every writer of the step.

On an in-process loopback (two ranks in threads, ``harness.sharded_loopback``): rank 1 owns
rows 32..63 and reads (and writes) only its rows 56..63, every step; the slow rank 0 reads
its rows 0..7 and rank 1's row 40, every step. Rank 1 never reads anything rank 0 writes,
so it must never wait for rank 0: applying step s as a whole (waiting for rank 0's gradient
of row 40) would make it wait about rank 0's delay every step. The rows equal those of a run
in which rank 0 is not slow, bitwise (timing changes nothing in quality-first).
"""

from __future__ import annotations

import numpy as np
import torch
from harness.sharded_loopback import loopback_plan, run_sharded_loopback
from harness.toy import LoopbackHub

N, T = 64, 16
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63
SLOW_S = 0.03


def _run(slow_s: float, step_offset: int = 0):
    footprints = [[list(range(8)) + [40], list(range(56, 64))] for _ in range(T)]
    plan = loopback_plan(footprints, N)
    hubs = [LoopbackHub(2), LoopbackHub(2)]
    return run_sharded_loopback(plan, OWNER, hubs, seed=3, slow_s=slow_s, step_offset=step_offset)


def test_a_row_waits_only_for_its_own_writers():
    slow, out = _run(SLOW_S)
    waited = sum(m.wait_s for m in out[1].engine.metrics)
    assert waited < 0.25 * T * SLOW_S, waited  # rank 1 ran on, rank 0 slept T x SLOW_S
    # rank 0's gradients of row 40 reached rank 1 and were applied, in step order
    assert out[1].engine.log.oldest_unapplied(T) is None
    assert int(out[1].engine.versions[40 - 32]) == T - 1
    fast, _ = _run(0.0)
    for a, b in zip(slow, fast, strict=True):
        assert torch.equal(a, b)


def test_a_later_phase_reads_rows_an_earlier_phase_updated():
    """A phase that starts at step 20 with rows last updated anywhere in steps -1..19 (a
    phase start without a structural change): a row's first read in the phase needs no
    update of the phase, whatever its version."""
    _, out = _run(SLOW_S, step_offset=20)
    waited = sum(m.wait_s for m in out[1].engine.metrics)
    assert waited < 0.25 * T * SLOW_S, waited
    assert int(out[1].engine.versions[40 - 32]) == 20 + T - 1
