"""The device transport's protocol under NCCL's semantics, on CPU (no GPU needed).

``harness.nccl_double`` enforces what NCCL does (in-order communicators, no tags, a posted
receive blocks what follows it, sizes must match, one calling thread, set-up order) and the
protocol's own notice rule; first each rule is shown to bite, then the protocol
(``runtime.device_transport.DeviceTransport``, the code ``runtime.nccl.NcclLink`` serves on
GPUs) trains both layouts at 2-4 ranks with random latencies and a slow rank, and must
equal the synchronous result bit for bit.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from harness.nccl_double import DeviceHub, DoubleError, NcclDouble
from harness.sharded_loopback import loopback_plan, run_sharded_loopback
from harness.toy import (
    ListPlan,
    LoopbackHub,
    Phase,
    ToyRun,
    random_footprints,
    reference_train,
    run_threads,
    toy_groups,
)
from torch import Tensor

from odin_ns.errors import OdinInputError
from odin_ns.runtime import SyncConfig
from odin_ns.runtime.device_transport import channel, channels_in_order
from odin_ns.runtime.errors import PeerFailure
from odin_ns.runtime.transport_choice import decide_transport


def _in_threads(*fns):
    """Run each function on its own thread; their results (re-raising the first error)."""
    out, errors = [None] * len(fns), []

    def target(i):
        try:
            out[i] = fns[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(fns))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    if errors:
        raise errors[0]
    return out


def _poll(handles, seconds: float) -> bool:
    """Whether every handle completes within ``seconds`` (polled every millisecond)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(h.is_completed() for h in handles):
            return True
        time.sleep(1e-3)
    return False


# ----------------------------------------------------------- the double's rules bite
def test_nccl_double_one_comm_per_pair_deadlocks_per_direction_does_not():
    """Both ranks send, then receive. On one communicator for both directions each rank's
    receive waits behind its own send, and the two sends never meet a receive: nothing
    completes (what NCCL does with messages larger than its buffers). On one channel per
    direction (the protocol's) the same calls complete."""
    pair = (0, 1)
    shared = NcclDouble(2, strict_notices=False)
    both_sent = threading.Barrier(2)

    def on_pair(rank):
        shared._open(rank, [pair])
        send = shared._post(rank, "send", pair, 1 - rank, torch.ones(3))
        both_sent.wait()
        recv = shared._post(rank, "recv", pair, 1 - rank, torch.empty(3))
        return _poll([send, recv], 0.2)  # a deadlock: nothing completes, however long

    assert _in_threads(lambda: on_pair(0), lambda: on_pair(1)) == [False, False]

    directed = NcclDouble(2)
    got = [torch.empty(3), torch.empty(3)]
    both_sent = threading.Barrier(2)

    def per_direction(rank):
        link = directed.link(rank)
        link.open([ch for ch in channels_in_order(2) if rank in ch])
        send = link.isend(channel(rank, 1 - rank), torch.full((3,), float(rank)))
        both_sent.wait()  # the notice rule: receive once the peer's send is posted
        recv = link.irecv(channel(1 - rank, rank), got[rank])
        return _poll([send, recv], 10.0)  # completes within ~1 ms; a busy host may lag

    assert _in_threads(lambda: per_direction(0), lambda: per_direction(1)) == [True, True]
    assert got[0].tolist() == [1.0] * 3 and got[1].tolist() == [0.0] * 3


def test_nccl_double_size_mismatch_thread_and_notice_rules_fail_loudly():
    def opened(world=2):
        double = NcclDouble(world)
        for r in range(world):
            double.link(r).open([ch for ch in channels_in_order(world) if r in ch])
        return double

    double = opened()
    double.link(0).isend(channel(0, 1), torch.ones(4, 2))
    with pytest.raises(DoubleError, match="size mismatch"):
        double.link(1).irecv(channel(0, 1), torch.empty(3, 2))
    with pytest.raises(DoubleError, match="size mismatch"):  # both ranks fail
        double.link(0).isend(channel(0, 1), torch.ones(1, 2))

    double = opened()
    with pytest.raises(DoubleError, match="before the peer posted its send"):
        double.link(1).irecv(channel(0, 1), torch.empty(3, 2))

    double = opened()
    double.link(0).isend(channel(0, 1), torch.ones(1, 2))
    with pytest.raises(DoubleError, match="second thread"):
        _in_threads(lambda: double.link(0).isend(channel(0, 1), torch.ones(1, 2)))

    double = NcclDouble(3)
    double._open(0, [(0, 1), (0, 2)])
    double._open(1, [(1, 2), (0, 1)])
    with pytest.raises(DoubleError, match="cycle"):
        double._open(2, [(0, 2), (1, 2)])


def test_nccl_transport_refuses_a_publication_it_did_not_plan():
    """A notice announcing another row count than the plan's fails the receiver with the
    reason, before anything is received."""
    hub = DeviceHub(2)

    def sender():
        tx = hub.transport(0)
        tx.send(1, 0, 0, torch.ones(5, 3))
        return tx

    def receiver():
        tx = hub.transport(1)
        tx.post_recv(0, 0, 0, 4, 3)
        with pytest.raises(PeerFailure, match="expected step 0 with 4 rows"):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                tx.take(0.05)
        return tx

    _in_threads(sender, receiver)


def test_notices_carry_row_counts_exactly_past_float32s_24_bits():
    """A notice is two float32s, so row counts past 2^24 (where one float32 rounds) travel
    exactly, to 2^48."""
    from odin_ns.runtime.device_transport import notice_of, rows_of

    for rows in (0, 1, 5, 2**24 - 1, 2**24, 2**24 + 1, 123_456_789, 2**48 - 1):
        notice = notice_of(rows)
        assert notice.dtype == torch.float32 and notice.shape == (1, 2)
        assert rows_of(notice) == rows
    assert int(torch.tensor(float(2**24 + 1), dtype=torch.float32)) != 2**24 + 1  # (why)


# ------------------------------------------------------- the protocol trains exactly
def _phases(world: int, seed: int) -> list[Phase]:
    p1 = ListPlan(random_footprints(300, 10, world, seed=seed))
    p2 = ListPlan(random_footprints(340, 5, world, seed=seed + 1))
    return [Phase(p1, 0), Phase(p2, 13, grow=40)]


@pytest.mark.parametrize(
    "world,mode",
    [(2, "quality-first"), (2, "ddp"), (3, "barrier"), (4, "quality-first"), (4, "barrier")],
)
def test_nccl_protocol_replicated_equals_synchronous(world, mode):
    """Random latencies on the device links, random step delays and a slow rank 0: every
    replica ends bit for bit at the synchronous result (quality-first = barrier = ddp at 2
    ranks), with credits small enough that ranks run into them."""
    phases = _phases(world, seed=20 + world)
    ref, ref_versions = reference_train(toy_groups(300), phases)
    cfg = SyncConfig(mode=mode, timeout_s=20, max_inflight_bytes=4096)
    run = ToyRun(phases, cfg, jitter_s=0.002, sleep_s={0: 0.004})
    hub = DeviceHub(world, seed=world)
    for groups, engine, _, _ in run_threads(world, run, hub):
        for g, r in zip(groups, ref, strict=True):
            assert torch.equal(g.param, r.param)
        assert torch.equal(engine.versions, ref_versions)
    kinds = {kind for _, kind, _, _ in hub.double.posted}
    assert kinds == {"send", "recv"} or mode == "ddp"  # rows travelled on device links


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_protocol_sharded_equals_loopback(world):
    """The sharded engine's gradients and pushes over two device transports (random
    latencies, slow rank 0) end with the rows of the same plan over loopbacks without
    delays, bit for bit."""
    n = 96
    rng = np.random.default_rng(world)
    owner = rng.integers(0, world, n).astype(np.int64)
    plan = loopback_plan(random_footprints(n, 12, world, seed=40 + world, size=24), n)
    plain, _ = run_sharded_loopback(
        plan, owner, [LoopbackHub(world), LoopbackHub(world)], seed=5, slow_s=0.0
    )
    hubs = [DeviceHub(world, seed=1), DeviceHub(world, seed=2)]
    device, out = run_sharded_loopback(plan, owner, hubs, seed=5, slow_s=0.004)
    for a, b in zip(plain, device, strict=True):
        assert torch.equal(a, b)
    assert all(r.engine.log.oldest_unapplied(plan.num_steps) is None for r in out.values())


# ------------------------------------------------ NcclLink itself, over gloo processes
def _rows(src: int, dst: int, step: int) -> Tensor:
    """The publication ``src`` sends ``dst`` at ``step``: 0-4 rows of known values."""
    rows = (3 * src + 5 * dst + step) % 5
    return torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) + 100 * src + step


def link_rank(rank: int, world_size: int, steps: int) -> list:
    """One process of ``NcclLink`` over gloo: it opens this rank's channels, posts every
    receive of ``steps`` publications per peer, sends its own (``_rows``; zero rows
    included), waits for all, and all-reduces rank + 1 polling ``is_completed``; returns
    (peer, step, rows) per receive and the sum (peer -1)."""
    from odin_ns.runtime.device_transport import channel, channels_in_order
    from odin_ns.runtime.nccl import NcclLink

    link = NcclLink(world_size, torch.device("cpu"), timeout_s=60.0, backend="gloo")
    link.open([ch for ch in channels_in_order(world_size) if rank in ch])
    peers = [q for q in range(world_size) if q != rank]
    got = [(q, s, torch.empty(_rows(q, rank, s).shape)) for s in range(steps) for q in peers]
    handles = [link.irecv(channel(q, rank), buf) for q, _, buf in got]
    handles += [
        link.isend(channel(rank, q), _rows(rank, q, s)) for s in range(steps) for q in peers
    ]
    for handle in handles:  # (gloo's sends and receives complete only in wait())
        handle.wait()
    total = torch.full((2, 3), float(rank + 1))
    reduce = link.all_reduce(total)
    deadline = time.monotonic() + 30.0
    while not reduce.is_completed() and time.monotonic() < deadline:
        time.sleep(1e-3)
    reduce.wait()
    return [*got, (-1, steps, total)]


def test_nccl_link_over_gloo_processes_sets_up_and_addresses_every_channel(tmp_path):
    """``NcclLink``'s own code, not the double: every channel's group created in one order
    by every rank, the set-up exchange of each channel in the global order (src sends, dst
    receives: blocking, as NCCL's set-up is), its sends' and receives' ranks within the
    two-rank groups and the all-reduce, between 3 processes over gloo (the suite has no
    GPU; what only NCCL does, the double enforces, and gloo's sends complete only when
    waited on, so the protocol's polling runs over the double). Every publication arrives
    whole from the peer it names, in step order; the sum once."""
    from harness import spawn_ranks

    world, steps = 3, 3
    codes, results, errors, _ = spawn_ranks(link_rank, world, tmp_path, args=(steps,))
    assert codes == [0] * world, errors
    for rank, got in enumerate(results):
        *received, (_, _, total) = got
        assert [(q, s) for q, s, _ in received] == [
            (q, s) for s in range(steps) for q in range(world) if q != rank
        ]
        for q, s, buf in received:
            assert torch.equal(buf, _rows(q, rank, s))
        assert torch.equal(total, torch.full((2, 3), 6.0))


# ---------------------------------------------------------------- the choice rule
def test_nccl_is_chosen_only_when_every_rank_owns_a_gpu():
    own = ["GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1"]  # (UUIDs: unique across machines)
    assert decide_transport("auto", own, True).kind == "nccl"
    assert decide_transport("gloo", own, True).kind == "gloo"
    assert decide_transport("auto", own, False).kind == "gloo"
    shared = ["GPU-a0", "GPU-a0"]
    assert "share a GPU" in decide_transport("auto", shared, True).reason
    cpu = [None, None]
    assert decide_transport("auto", cpu, True).kind == "gloo"
    for devices in (shared, cpu):
        with pytest.raises(OdinInputError, match="transport nccl cannot run here"):
            decide_transport("nccl", devices, True)
    # past torch's 32 CUDA streams per device channels would share streams: gloo, and a
    # forced nccl refused (sharded: two transports, from R = 9; replicated from R = 17)
    eight = [f"GPU-{r}" for r in range(8)]
    assert decide_transport("auto", eight, True, transports=2).kind == "nccl"
    nine = [*eight, "GPU-8"]
    choice = decide_transport("auto", nine, True, transports=2)
    assert choice.kind == "gloo" and "35 NCCL communicators" in choice.reason
    assert decide_transport("auto", nine, True).kind == "nccl"
    seventeen = [f"GPU-{r}" for r in range(17)]
    assert decide_transport("auto", seventeen[:16], True).kind == "nccl"
    assert decide_transport("auto", seventeen, True).kind == "gloo"
    with pytest.raises(OdinInputError, match="share torch's 32 CUDA streams"):
        decide_transport("nccl", nine, True, transports=2)
    with pytest.raises(ValueError, match="transport"):
        SyncConfig(transport="infiniband")


def test_nccl_link_sets_each_channel_up_with_its_first_send_and_receive(monkeypatch):
    """``NcclLink.open`` makes each of the rank's channels carry one send (src) and one
    receive (dst), in the global order, and no collective on a channel's group: torch gives
    an unbatched send or receive a two-rank communicator of its own, made (blocking both
    ranks) at the first one, so a warm-up all-reduce would leave the protocol's first send
    to make it inside a step, blocking its host until the peer received, which the peer does
    only on that send's notice. (torch.distributed recorded; the groups stand-ins.)"""
    from odin_ns.runtime import nccl

    calls: list[tuple] = []
    groups = iter(range(100))
    monkeypatch.setattr(nccl.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(nccl.dist, "new_group", lambda *a, **k: next(groups))
    monkeypatch.setattr(nccl.dist, "send", lambda t, dst, group: calls.append(("send", dst, group)))
    monkeypatch.setattr(nccl.dist, "recv", lambda t, src, group: calls.append(("recv", src, group)))
    monkeypatch.setattr(
        nccl.dist, "all_reduce", lambda t, group: calls.append(("all_reduce", None, group))
    )
    link = nccl.NcclLink(3, torch.device("cpu"), timeout_s=60.0)
    mine = [ch for ch in channels_in_order(3) if 1 in ch]
    link.open(mine)
    expected = [
        ("send", ch.dst, link.channels[ch]) if ch.src == 1 else ("recv", ch.src, link.channels[ch])
        for ch in mine
    ]
    assert calls == [*expected, ("all_reduce", None, link.everyone)]
