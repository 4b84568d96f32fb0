"""Rank 0's copy of a sharded model (``odin_ns.distributed.sharded_eval``) and the
heartbeat-aware rendezvous sharded sessions wait in (``odin_ns.runtime.liveness``).

The copy, gathered over gloo from 2 and 3 processes with random owners, is the whole table
in global order; bounded, it is the most opaque rows of the whole model (a numpy reference),
whoever owns them. The rendezvous waits for a peer that beats while busy past the timeout,
and times out on a silent one.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
import torch
from harness.memory_liveness import MemoryBoard, MemoryLiveness
from harness.toy import spawn_ranks

from odin_ns.distributed.sharded_eval import gather_eval_copy, select_copy_rows
from odin_ns.model import GAUSSIAN_GROUPS
from odin_ns.runtime.errors import SyncTimeout
from odin_ns.runtime.liveness import PeerSilence, Rendezvous

SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "features_dc": (3,),
          "features_rest": (15, 3), "opacities": (1,)}  # fmt: skip


def _table(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    table = {name: torch.randn((n, *SHAPES[name]), generator=g) for name in GAUSSIAN_GROUPS}
    table["opacities"][0::5] = table["opacities"][1::5]  # ties the order must break (n % 5 == 0)
    return table


def _reference_rows(opacity: np.ndarray, cap: int) -> np.ndarray:
    """Global ids of the ``cap`` most opaque rows, ties to the lower id (sorted)."""
    order = sorted(range(opacity.size), key=lambda i: (-float(opacity[i]), i))
    return np.sort(np.asarray(order[:cap], dtype=np.int64))


@pytest.mark.parametrize("cap", [0, 10, 37, 200])
def test_select_copy_rows_keeps_the_most_opaque_of_the_whole_model(cap):
    rng = np.random.default_rng(cap)
    n = 60
    opacity = rng.normal(size=n).astype(np.float32)
    opacity[::4] = opacity[1::4][: opacity[::4].size]  # ties
    owner = rng.integers(0, 3, size=n)
    owned = [np.flatnonzero(owner == q) for q in range(3)]
    keeps = select_copy_rows([opacity[o] for o in owned], owned, cap)
    kept = np.sort(np.concatenate([o[k] for o, k in zip(owned, keeps, strict=True)]))
    expected = np.arange(n) if cap == 0 or cap >= n else _reference_rows(opacity, cap)
    assert np.array_equal(kept, expected)
    assert all(np.all(np.diff(k) > 0) for k in keeps)  # ascending positions


def copy_rank(rank: int, world_size: int, n: int, caps: tuple[int, ...], seed: int):
    """One gather per cap (each rank process pays its imports once for all caps)."""
    table = _table(n, seed)
    owner = np.random.default_rng(seed).integers(0, world_size, size=n)
    if world_size == 3:
        owner[owner == 2] = 0  # rank 2 owns nothing: an empty shard sends nothing
    owned = np.flatnonzero(owner == rank)
    params = {name: t[torch.from_numpy(owned)] for name, t in table.items()}
    copies = []
    for cap in caps:
        copy = gather_eval_copy(params, owned, n, step=7, cap=cap, rank=rank, world_size=world_size)
        copies.append(None if copy is None else (copy.ids, copy.params, copy.complete, copy.step))
    return copies


@pytest.mark.parametrize("ranks", [2, 3])
def test_gathered_copy_is_the_model_or_its_most_opaque_rows(tmp_path, ranks):
    n, seed, caps = 50, 3, (0, 25)
    codes, results, errors, _ = spawn_ranks(copy_rank, ranks, tmp_path, args=(n, caps, seed))
    assert codes == [0] * ranks, errors
    for i, cap in enumerate(caps):
        assert all(r[i] is None for r in results[1:])
        ids, params, complete, step = results[0][i]
        table = _table(n, seed)
        opacity = table["opacities"][:, 0].numpy()
        expected = np.arange(n) if cap == 0 else _reference_rows(opacity, cap)
        assert np.array_equal(ids, expected), cap
        assert complete == (cap == 0) and step == 7
        for name in GAUSSIAN_GROUPS:
            assert torch.equal(params[name], table[name][torch.from_numpy(expected)]), (cap, name)


def _rendezvous_after(board: MemoryBoard, rank: int, delay_s: float, busy: bool) -> None:
    live = MemoryLiveness(board, rank, beat_s=0.05)
    if busy:
        with live.busy("evaluating"):
            time.sleep(delay_s)
    else:
        time.sleep(delay_s)
    live.arrive()
    live.close()


@pytest.mark.parametrize("busy", [True, False])
def test_rendezvous_waits_for_a_busy_peer_and_times_out_on_a_silent_one(busy):
    board = MemoryBoard()
    peer = threading.Thread(target=_rendezvous_after, args=(board, 1, 0.8, busy))
    peer.start()
    live = MemoryLiveness(board, 0, beat_s=0.05)
    silence = PeerSilence(live, 0, 2, beat_s=0.05, timeout_s=0.3)  # the peer takes 0.8 s
    meeting = Rendezvous(live, silence, 0, 2, timeout_s=0.3)
    try:
        if busy:
            assert meeting.meet("a drain") >= 0.7
        else:
            with pytest.raises(SyncTimeout, match=r"peer 1 .*in a drain \(rendezvous 1\)$"):
                meeting.meet("a drain")
    finally:
        peer.join()
        live.close()


def _session(copy):
    """A sharded session whose rank-0 copy is ``copy`` (None: another rank), for what
    ``ShardedSession.evaluation`` decides; busy sections are recorded."""
    from odin_ns.distributed.sharded_session import ShardedSession

    session = ShardedSession.__new__(ShardedSession)  # only what evaluation reads
    session.eval_copy_max_rows, session.released, session.busy_for = 5, 0, []
    session.refresh_eval_copy = lambda step: copy

    def release():
        session.released += 1

    def busy(what):
        session.busy_for.append(what)
        return contextlib.nullcontext()

    session.release_eval_copy, session.busy = release, busy
    return session


def test_a_bounded_copy_is_not_evaluated_and_is_released(capsys):
    from odin_ns.distributed.sharded_eval import EvalCopy

    partial = _session(EvalCopy({}, np.arange(5), num_rows=9, step=3))
    with partial.evaluation(3) as evaluate_here:
        assert not evaluate_here
    assert partial.released == 1 and partial.busy_for == []
    assert "evaluation skipped" in capsys.readouterr().out
    other_rank = _session(None)  # ranks other than 0 get no copy and evaluate nothing
    with other_rank.evaluation(3) as evaluate_here:
        assert not evaluate_here
    assert other_rank.released == 0 and other_rank.busy_for == []
    whole = _session(EvalCopy({}, np.arange(9), num_rows=9, step=3))
    with whole.evaluation(3) as evaluate_here:  # rank 0 evaluates while peers wait
        assert evaluate_here and whole.busy_for == ["evaluating"] and whole.released == 0
    assert whole.released == 1
