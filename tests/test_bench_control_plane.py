"""``bench.control_plane``: its instruments and a tiny run's report (no figure asserted)."""

from __future__ import annotations

import json
import os

import torch

from odin_ns.bench import control_plane
from odin_ns.runtime.step_tables import TABLES_AHEAD


def test_op_timer_splits_row_data_from_control_and_counts_syncs():
    ids = torch.tensor([0, 2, 3])
    rows = torch.randn(5, 4)
    timer = control_plane.OpTimer()
    with timer:
        picked = rows.index_select(0, ids)  # row data
        mask = ids > 1  # control
        int(mask.sum())  # a read back: would sync a stream
        ids[mask]  # boolean-mask indexing: would sync
        torch.zeros(3, 4)  # an allocation of row data (no tensor input)
    assert picked.shape == (3, 4)
    assert timer.ops >= 5 and timer.data_s > 0 and timer.control_s > 0
    assert timer.syncs["_local_scalar_dense"] == 1 and timer.syncs["index"] == 1
    assert timer.data_syncs == 0


def test_device_op_timer_times_only_the_devices_operations():
    """The meta step's data plane: operations with a meta tensor among their inputs or
    outputs (a list of them too, an allocation on the device too), not the host's."""
    ids = torch.tensor([0, 2, 3])
    rows = torch.empty(5, 4, device="meta")
    timer = control_plane.DeviceOpTimer()
    with timer:
        ids.add_(1)  # host control: not timed
        picked = rows.index_select(0, ids.to("meta"))  # an upload, then a gather
        torch.cat([picked, rows])  # a list of device tensors
        torch.zeros(3, device="meta")  # an allocation on the device (no tensor input)
    assert picked.shape == (3, 4)
    assert timer.ops == 4 and timer.device_s > 0


def test_tiny_run_reports_every_key(tmp_path):
    cores = os.sched_getaffinity(0)
    out = tmp_path / "cp.json"
    argv = ["--rows", "20000", "--ranks", "2", "--steps", "3", "--warmup", "1"]
    argv += ["--calibration-steps", "4"]
    control_plane.main([*argv, "--profile-steps", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["variants"] == ["r2_replicated", "r2_sharded"]
    for key in result["variants"]:
        engine, host = result[f"engine_ms_per_step_{key}"], result[f"host_ms_per_step_{key}"]
        # (host_ms is engine - data - ops x the timer's price, an estimate: at this size
        # within its noise of zero, either side; the integer operations are timed directly)
        assert host < engine and 0 < result[f"control_ms_per_step_{key}"] < engine
        # the phase start (the step tables of a layout with pushes) priced per plan step too
        assert result[f"host_and_phase_start_ms_per_step_{key}"] >= host
        assert result[f"tables_mb_per_step_{key}"] > 0 and result[f"tables_ms_per_step_{key}"] > 0
        # both layouts: made ahead on their own thread, as beside an accelerator (a layout
        # with pushes no longer makes every step's at its phase start)
        assert result[f"tables_ahead_{key}"] == TABLES_AHEAD
        assert 0 < result[f"meta_ms_per_step_{key}"] < engine  # no data-plane work on meta
        # the same, each step after an idle gap (as beside a GPU's step), in its own pass
        # (after the gap a step runs slower than back to back: no bound against engine_ms)
        assert result[f"meta_paced_ms_per_step_{key}"] > 0
        assert len(result[f"series_meta_paced_ms_{key}"]) == 3 and result["gap_ms"] == 20
        # the meta steps less their data-plane operations' time (a twin's, the same work),
        # back to back and paced: below the wall time, which they are taken from
        assert result[f"meta_data_ms_per_step_{key}"] > 0
        assert result[f"meta_host_ms_per_step_{key}"] < result[f"meta_ms_per_step_{key}"]
        assert result[f"meta_paced_data_ms_per_step_{key}"] > 0
        assert len(result[f"series_meta_paced_host_ms_{key}"]) == 3
        paced_host = result[f"meta_paced_host_ms_per_step_{key}"]
        assert paced_host < result[f"meta_paced_ms_per_step_{key}"]
        assert 0 < result[f"meta_cpu_ms_per_step_{key}"]
        # the twin's host time (no instrument in it; an estimate too: either side of zero)
        assert result[f"host_twin_ms_per_step_{key}"] < engine
        # the step's host-to-device copies, counted on the device without values
        assert 0 < result[f"uploads_per_step_{key}_quality"] <= 3
        assert result[f"device_ops_per_step_{key}_quality"] > 0  # (not views, not uploads)
        # the timer priced per operation on the rank's own step, and the former pricing
        assert result[f"instrument_overhead_us_{key}"] >= 0
        assert result[f"host_trivial_calibration_ms_per_step_{key}"] < engine
        # sync-like operations (the instrument: above) only on host control tensors, if any
        assert result[f"data_syncs_per_step_{key}_max"] == 0
        for mode in ("quality", "throughput"):
            assert 0 <= result[f"device_reads_per_step_{key}_{mode}_max"] <= 2
        assert result[f"split_{key}"] and result[f"control_lines_{key}"]
    # the host's own slowdown after the paced steps' gap, priced on work without the engine
    assert result["host_reference_paced_ms"] > 0 and result["host_reference_warm_ms"] > 0
    assert result["host_wake_factor"] == (
        result["host_reference_paced_ms"] / result["host_reference_warm_ms"]
    )
    assert 0 <= result["syncs_per_step_max"] <= 2
    assert 0 < result["share_per_view"] <= 0.05
    # the paced steps' thread had a core of its own and the tables' threads the others
    # (where there are two cores), and the caller's thread has every core back after
    apart = result["paced_threads_apart"]
    if len(cores) > 1:
        assert apart["step_core"] not in apart["helper_cores"] and apart["helpers"] >= 2
    else:
        assert apart is None
    assert os.sched_getaffinity(0) == cores
    assert out.with_suffix(".png").exists()


def test_late_peers_run_throughput_first_decisions_on_the_meta_twin_too(tmp_path):
    """``--late-peers``: the peers run one step behind, so throughput-first decides at every
    step; the meta twin's decisions read the device, answered by the read double."""
    out = tmp_path / "late.json"
    argv = ["--rows", "20000", "--ranks", "2", "--layouts", "sharded", "--steps", "3"]
    argv += ["--warmup", "1", "--calibration-steps", "4", "--profile-steps", "1", "--no-twin"]
    control_plane.main([*argv, "--mode", "throughput-first", "--late-peers", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["late_peers"] is True and result["mode"] == "throughput-first"
    # (the meta twin's every operation goes through the read double here: at this size its
    # step can take longer than the CPU rank's)
    assert result["meta_ms_per_step_r2_sharded"] > 0
    assert result["host_ms_per_step_r2_sharded"] < result["engine_ms_per_step_r2_sharded"]
