"""Reliability: bounded in-flight memory (credits), slow is not dead (busy notices), a NaN
gradient on one rank, resume on another world size.

Engine-level cases use the toy harness (threads over a loopback, or 2 processes over gloo);
the cases that need nerfstudio's loop run ``odin-ns-train`` with a test-only wrapper worker
(``tests/harness/fault_worker.py``) that injects the fault from the outside.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import (
    ListPlan,
    Phase,
    ToyRun,
    reference_train,
    run_threads,
    spawn_ranks,
    toy_groups,
    toy_outcome_worker,
)

from odin_ns.runtime import SyncConfig, SyncTimeout

BIN = Path(sys.executable).parent
TESTS = Path(__file__).resolve().parent
PREFIX = "odin-ns-train: error: "


def _disjoint_plan(steps: int) -> ListPlan:
    """Rank 0 and rank 1 never share a row: quality-first never waits, so rank 0 runs ahead
    of a stalled rank 1 as far as its credits let it."""
    return ListPlan(
        [[np.arange(0, 150, 2) + t % 2, np.arange(150, 300, 2) + t % 2] for t in range(steps)]
    )


def _overlap_plan(steps: int) -> ListPlan:
    return ListPlan([[np.arange(0, 200), np.arange(100, 300)] for _ in range(steps)])


# ------------------------------------------------------------------------- credits
@pytest.mark.slow
def test_stalled_peer_bounded_inflight_then_timeout(tmp_path):
    """Rank 1 stops (a silent 10 s sleep) at step 2; rank 0 runs ahead until its unreceived
    publications to rank 1 reach the cap, waits for credits (visible in its metrics), and
    ends with SyncTimeout naming rank 1, its in-flight bytes never above the cap."""
    width = 3 + 12 + 1 + 1
    one = 75 * width * 4  # bytes of one publication
    cap = 3 * one
    config = SyncConfig(timeout_s=2.0, max_inflight_bytes=cap)
    run = ToyRun([Phase(_disjoint_plan(40), 0)], config, stall_at={1: (2, 10.0)})
    codes, results, errors, elapsed = spawn_ranks(
        toy_outcome_worker, 2, tmp_path, (run,), timeout_s=60
    )
    assert results[0] is not None, errors
    rank0 = results[0]
    assert rank0["error"] is not None and rank0["error"].startswith(
        "SyncTimeout: rank 0: peer 1 (step "
    ), rank0
    assert "waiting for credits" in rank0["error"], rank0["error"]
    summary = rank0["summary"]
    assert 0 < summary["inflight_bytes_max"] <= cap, summary
    assert summary["credit_wait_s_total"] >= config.timeout_s, summary
    assert max(m["inflight_bytes_max"] for m in rank0["steps"]) <= cap
    assert summary["steps"] < 40, "rank 0 ran the whole plan: no credit bound"
    assert results[1] is not None and results[1]["error"] is not None, results[1]
    assert results[1]["error"].startswith(("PeerFailure: rank 1: peer 0", "SyncTimeout: rank 1"))
    assert elapsed < 45


def test_credits_do_not_change_results():
    """A cap below one publication still lets one through: the run equals the reference."""
    phases = [Phase(_overlap_plan(8), 0)]
    ref, ref_versions = reference_train(toy_groups(300), phases)
    run = ToyRun(phases, SyncConfig(timeout_s=20, max_inflight_bytes=1), jitter_s=0.002)
    for res in run_threads(2, run):
        for a, b in zip(res.groups, ref, strict=True):
            assert torch.equal(a.param, b.param)
        assert torch.equal(res.engine.versions, ref_versions)


def test_config_rejects_bad_reliability_options():
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        SyncConfig(max_inflight_bytes=0)
    with pytest.raises(ValueError, match="heartbeat_s"):
        SyncConfig(heartbeat_s=0)
    assert SyncConfig(timeout_s=1.0, heartbeat_s=2.0).beat_s == 0.25


# ------------------------------------------------------------------ slow is not dead
def test_busy_peer_is_waited_for_threads():
    """Rank 0 is busy (announced) for 3 x timeout_s between steps: rank 1 waits, both
    finish with the reference's parameters; the same pause unannounced times out."""
    phases = [Phase(_overlap_plan(8), 0)]
    ref, _ = reference_train(toy_groups(300), phases)
    config = SyncConfig(timeout_s=0.8, heartbeat_s=0.1)
    results = run_threads(2, ToyRun(phases, config, busy_at={0: (3, 2.4)}))
    for res in results:
        for a, b in zip(res.groups, ref, strict=True):
            assert torch.equal(a.param, b.param)
    assert results[1].engine.summary()["busy_wait_s_total"] >= 2.0
    with pytest.raises(SyncTimeout, match=r"rank 1: peer 0 \(step 3\): timed out after 0.8 s"):
        run_threads(2, ToyRun(phases, config, stall_at={0: (3, 2.4)}))


@pytest.mark.slow
def test_busy_peer_is_waited_for_gloo(tmp_path):
    """The same over gloo, the busy notices going through the process group's store."""
    config = SyncConfig(timeout_s=1.0, heartbeat_s=0.2)
    run = ToyRun([Phase(_overlap_plan(8), 0)], config, busy_at={0: (3, 4.0)})
    codes, results, errors, elapsed = spawn_ranks(
        toy_outcome_worker, 2, tmp_path, (run,), timeout_s=60
    )
    assert codes == [0, 0], errors
    assert [r["error"] for r in results] == [None, None]
    assert results[1]["summary"]["busy_wait_s_total"] >= 3.0
    assert elapsed < 45
