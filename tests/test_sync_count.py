"""No host synchronization in the steady-state step: at most 2 reads of the device per step.

One rank's engine (``odin_ns.bench.control_plane``'s rank under test: the session's engine
calls, R - 1 injected peers one step behind it) runs with its data plane on a device
without values (``odin_ns.bench.device_reads``); every read of device values it makes is
one a GPU would wait for. ``pytest -k sync_count`` selects these tests.
"""

from __future__ import annotations

import pytest
import torch

from odin_ns.bench.control_plane import RANKS_UNDER_TEST, city_footprints, device_reads_per_step
from odin_ns.bench.device_reads import DeviceReads
from odin_ns.cuda import ops
from odin_ns.runtime.uploads import upload_together

RANKS, WARMUP, STEPS = 4, 8, 12
MAX_READS_PER_STEP = 2
MAX_UPLOADS_PER_STEP = 3  # quality-first: the step path's lists, two applies' ready masks

pytestmark = pytest.mark.skipif(
    not ops.status("meta").compiled, reason="the compiled ops' meta kernels need the CPU library"
)


@pytest.fixture(scope="module")
def footprints():
    return city_footprints(rows=20_000, share=0.045, views=8 * RANKS, seed=0)


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
@pytest.mark.parametrize("mode", ["quality-first", "throughput-first"])
def test_sync_count_of_a_steady_state_step(footprints, layout, mode):
    make = RANKS_UNDER_TEST[layout]
    counts, double, rank = device_reads_per_step(make, footprints, RANKS, mode, 0, WARMUP, STEPS)
    where = "; ".join(f"{n} x {op} at {line}" for (op, line), n in double.reads.most_common())
    assert max(counts) <= MAX_READS_PER_STEP, f"reads per step {counts}: {where}"
    if mode == "quality-first":  # the step's id lists in one copy, and each apply's mask
        uploads = sum(double.uploads.values()) / STEPS  # (13 and 6.9 a step before 2026-12-06)
        assert uploads <= MAX_UPLOADS_PER_STEP, dict(double.uploads)
    # one dispatch of device work per need, not per peer: an apply accumulates every
    # writer's part in one operation, a step packs every owner's gradient rows in one, the
    # pushes an apply made current are packed in one and the pushes one look took in are
    # written in one (before 2026-12-06: one accumulate per part, one pack per owner and
    # per push, one scatter per push)
    ops_run = double.device_ops
    assert ops_run["accumulate_ready_rows"] == ops_run["apply_ready_rows"] > 0, dict(ops_run)
    assert ops_run["pack_rows"] <= STEPS + ops_run["apply_ready_rows"], dict(ops_run)
    assert ops_run["scatter_rows"] <= STEPS, dict(ops_run)  # (none where nothing is pushed)
    if mode == "throughput-first":  # the peers' lag gave the rule something to decide
        summary = rank.engine.summary()
        assert summary["decisions"] > 0, summary
        # the evidence of the pushes one look took in is recorded in one operation per
        # layer (every owner's first push, then its second ...; two layers at most in one
        # look here), not one per push (7df2a92 and before: 27 for 9 looks, sharded); each
        # recording writes two tables
        records = ops_run["index_put_"] / 2
        assert records <= 2 * ops_run["scatter_rows"], dict(ops_run)
        # an apply's evidence in one operation (before: a norm, a compare, two gathers, two
        # selects and two writes)
        assert ops_run["record_row_norms"] == ops_run["apply_ready_rows"], dict(ops_run)
    else:
        assert ops_run["record_row_norms"] == 0, dict(ops_run)


def test_sync_count_double_sees_what_a_gpu_waits_for():
    """Each kind of read of a device tensor is counted (with its line), host reads are not,
    and the step goes on with zeros."""
    double = DeviceReads()
    dev = torch.ones(4, device="meta")
    host = torch.ones(4)
    with double:
        assert int(dev.sum()) == 0  # .item(): a scalar read, answered with 0
        assert dev[dev > 0].numel() == 0  # a boolean mask: size from values
        assert torch.nonzero(dev).shape == (0, 1)
        assert dev.cpu().device.type == "cpu"  # a copy to the host
        assert host.to("meta").device.type == "meta"  # a blocking upload: torch waits after it
        host.to("meta", non_blocking=True)  # not counted
        assert int(host.sum()) == 4 and host[host > 0].numel() == 4  # host: not counted
        dev.add_(1)  # a kernel the host only launches: not a read, a device operation
        dev[1:].view(3, 1)  # views: neither
    by_op: dict[str, int] = {}
    for (op, _), n in double.reads.items():
        by_op[op] = by_op.get(op, 0) + n
    assert by_op == {"_local_scalar_dense": 1, "index": 1, "nonzero": 1, "_to_copy": 2}
    # the reads and the add are device work (the copy to the host too); the views and the
    # uploads are not counted there
    assert double.device_ops == {"sum": 1, "_local_scalar_dense": 1, "gt": 1, "index": 1,
                                 "nonzero": 1, "_to_copy": 1, "add_": 1}  # fmt: skip
    # not counting (set-up, or a step timed through it): the reads answered, nothing counted
    double.counting = False
    reads, ops_run = double.total, sum(double.device_ops.values())
    with double:
        assert int(dev.sum()) == 0 and dev[dev > 0].numel() == 0
        assert torch.nonzero(dev).shape == (0, 1) and dev.cpu().device.type == "cpu"
        dev.add_(1)
    assert double.total == reads and sum(double.device_ops.values()) == ops_run


def test_sync_count_upload_together_is_one_copy():
    """A step's id lists move to the device in one copy that does not block (the double
    counts it as an upload, not as a read), as views of one buffer; on the CPU they are the
    host tensors themselves."""
    parts = [torch.arange(5), torch.arange(3) + 7, torch.empty(0, dtype=torch.int64)]
    assert all(a is b for a, b in zip(upload_together(parts, "cpu"), parts, strict=True))
    double = DeviceReads()
    with double:
        moved = upload_together(parts, "meta")
    assert [t.shape for t in moved] == [p.shape for p in parts]
    assert all(t.device.type == "meta" for t in moved)
    assert len({id(t._base) for t in moved}) == 1 and moved[0]._base is not None  # one buffer
    assert double.total == 0 and sum(double.uploads.values()) == 1, (double.reads, double.uploads)


def test_sync_count_of_a_views_densification_statistics_is_zero():
    """The statistics a view adds for the default strategy's refine (every step until
    ``refine_stop_iter``, after the engine has queued the step's applies) read nothing of
    the device: gsplat's selection of the visible rows made three reads a view, each a wait
    for everything queued (their bits are the same: ``tests/test_densify.py``)."""
    from gsplat.strategy import DefaultStrategy

    from odin_ns.distributed.densify import ReplicatedDensifier

    n, m = 50, 20
    strategy = DefaultStrategy(refine_scale2d_stop_iter=1000, verbose=False)
    densifier = ReplicatedDensifier(strategy, strategy.initialize_state(), seed=0)
    densifier.ensure_state(n, torch.device("meta"))
    means2d = torch.zeros(1, m, 2, device="meta")
    means2d.grad = torch.zeros(1, m, 2, device="meta")
    info = {"means2d": means2d, "radii": torch.zeros(1, m, dtype=torch.int32, device="meta"),
            "width": 64, "height": 48, "n_cameras": 1}  # fmt: skip
    rows = torch.arange(m, device="meta")
    double = DeviceReads()
    with double:
        densifier.accumulate(1, info, rows, n)
    assert double.total == 0, dict(double.reads)
