"""Credits in the sharded engine (``max_inflight_bytes``), on an in-process loopback.

Two ranks in threads run ``Engine`` over a hand-made plan in which both credit paths
must bind: rank 1 runs ahead of a slow rank 0 and sends it a gradient row every step (its
sends wait for rank 0 to take the previous one), and one of rank 1's applies makes three
pushes to rank 0 current at once, read at steps 9-11: rank 1 registers them one a step
(``engine.PUSH_LEAD`` steps past its last finished one), each while the previous one waits
for rank 0 to post its receive, so the later two are packed and queued. With a 1-byte cap the
owners' rows end bitwise equal to an uncapped run's, and no more than one message is ever
in flight to a peer on a stream.
"""

from __future__ import annotations

import numpy as np
import torch
from harness.sharded_loopback import loopback_plan, run_sharded_loopback
from harness.toy import LoopbackHub, LoopbackTransport

N, T = 64, 12
OWNER = np.repeat([0, 1], N // 2).astype(np.int64)  # rank 0 owns 0..31, rank 1 owns 32..63


def _footprints() -> list[list[list[int]]]:
    """Rank 0: its rows 0..7, and rank 1's rows 48, 49, 50 at steps 9, 10, 11 (all written
    last by rank 1 at step 4: three pushes ready at once). Rank 1: its rows 56..63, rank 0's
    row 16 + t (a gradient message to rank 0 every step, never read again: no push), and
    48..50 at step 4."""
    steps = []
    for t in range(T):
        r0 = list(range(8)) + {9: [48], 10: [49], 11: [50]}.get(t, [])
        r1 = list(range(56, 64)) + [16 + t] + ([48, 49, 50] if t == 4 else [])
        steps.append([r0, r1])
    return steps


class CountingLoopback(LoopbackTransport):
    """A loopback end whose unreceived sends count as in flight (the hub's mail)."""

    def inflight_bytes(self, peer: int) -> tuple[int, int | None]:
        with self.hub.lock:
            mail = [
                buf
                for (src, dst, _), (_, buf) in self.hub.mail.items()
                if src == self.rank and dst == peer
            ]
        return sum(b.numel() * b.element_size() for b in mail), None


def _hub() -> LoopbackHub:
    hub = LoopbackHub(2)
    hub.ports = [CountingLoopback(hub, r) for r in range(2)]
    return hub


def _run(cap: int | None) -> tuple[list[torch.Tensor], list]:
    plan = loopback_plan(_footprints(), N)
    params, out = run_sharded_loopback(
        plan, OWNER, [_hub(), _hub()], seed=3, slow_s=0.02, max_inflight_bytes=cap
    )
    return params, [out[r].engine.metrics for r in range(2)]


def test_credits_bind_on_both_streams_and_change_no_bit():
    free, _ = _run(cap=None)
    capped, metrics = _run(cap=1)
    for a, b in zip(free, capped, strict=True):
        assert torch.equal(a, b)
    rank1 = metrics[1]
    assert sum(m.credit_wait_s for m in rank1) > 0  # gradient sends to the slow rank waited
    assert sum(m.pushes_deferred for m in rank1) >= 2  # the pushes ready at step 4
    assert max(m.deferred_bytes_max for m in rank1) > 0
    # one message at most in flight to a peer on a stream: here each is one row (a gradient
    # row has the visible flag too)
    width = sum(int(np.prod(p.shape[1:])) for p in free)
    for m in (x for ms in metrics for x in ms):
        assert m.inflight_bytes_max <= 4 * (width + 1), m
