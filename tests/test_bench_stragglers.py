"""bench.stragglers: the shares it sweeps and the figures it takes from bench.sync."""

import numpy as np
import pytest

from odin_ns.bench import stragglers


def test_shares_start_at_zero_and_increase():
    assert stragglers.parse_shares("0,0.25,0.5") == [0.0, 0.25, 0.5]
    for bad in ("0.25,0.5", "0,0.5,0.25", "0,0.5,0.5", ""):
        with pytest.raises(ValueError, match="start at 0"):
            stragglers.parse_shares(bad)


def test_step_seconds_is_one_ranks_busy_time_per_step():
    # 2 ranks at 20 ideal views/s together: each rank computes a step in 0.1 s
    results = {"modes": {"barrier": {"ideal_views_per_second": 20.0}}}
    assert stragglers.step_seconds(results, 2) == pytest.approx(0.1)


def test_share_figures_take_same_round_spreads_against_barrier():
    barrier = {
        "critical_path_wait_s": 3.0,
        "critical_path_wait_s_min": 2.0,
        "critical_path_wait_s_max": 4.0,
        "ideal_share": 0.8,
    }
    results = {"modes": {"barrier": barrier}}
    keys = stragglers.hiders(["barrier", "quality-first", "throughput-first"])
    assert keys == ["qf", "tf", "again"]
    for i, key in enumerate(keys):
        for suffix, offset in (("", 0.0), ("_min", -0.1), ("_max", 0.1)):
            results[f"wait_hidden_{key}_vs_barrier{suffix}"] = 0.1 * i + offset
            results[f"throughput_ratio_{key}_vs_barrier{suffix}"] = 1.0 + 0.1 * i + offset
    for suffix, delta in (("", -0.1), ("_min", -0.3), ("_max", 0.05)):  # tf evaluated only
        results[f"psnr_delta_tf_vs_barrier{suffix}"] = delta
    row = stragglers.share_figures(0.25, 26.0, results, keys)
    assert row["psnr_delta_tf_vs_barrier_min"] == -0.3 and "psnr_delta_qf_vs_barrier" not in row
    assert row["barrier_wait_s"] == 3.0 and row["barrier_wait_s_max"] == 4.0
    assert row["wait_hidden_tf"] == pytest.approx(0.1)
    assert row["wait_hidden_again_min"] == pytest.approx(0.1)
    assert row["throughput_ratio_qf_max"] == pytest.approx(1.1)
    assert row["jitter_ms"] == 26.0 and row["share"] == 0.25
    # throughput-first against quality-first (same rounds) and the names per share
    for suffix, ratio in (("", 1.2), ("_min", 1.1), ("_max", 1.3)):
        results[f"throughput_ratio_tf_vs_qf{suffix}"] = ratio
        results[f"wait_hidden_tf_vs_qf{suffix}"] = ratio - 1.0
        results[f"psnr_delta_tf_vs_qf{suffix}"] = ratio - 1.25
    row = stragglers.share_figures(0.5, 52.0, results, keys)
    assert row["throughput_ratio_tf_vs_qf_max"] == 1.3 and "throughput_ratio_qf_vs_qf" not in row
    named = stragglers.headline_keys([row], keys)
    assert named == {
        "wait_hidden_qf_jitter50": pytest.approx(0.0),
        "wait_hidden_tf_jitter50": pytest.approx(0.1),
        "wait_hidden_again_jitter50": pytest.approx(0.2),
        "throughput_ratio_tf_vs_qf_jitter50": 1.2,
        "psnr_delta_tf_vs_qf_jitter50": pytest.approx(-0.05),
    }
    # the impact rule's mode gets the same names (no overlap-rule run needed)
    impact_keys = stragglers.hiders(["barrier", "quality-first", "throughput-first-impact"])
    impact = {k.replace("_tf_", "_tfi_"): v for k, v in results.items()}
    named = stragglers.headline_keys(
        [stragglers.share_figures(0.5, 52.0, impact, impact_keys)], impact_keys
    )
    assert named["psnr_delta_tfi_vs_qf_jitter50"] == pytest.approx(-0.05)
    assert named["throughput_ratio_tfi_vs_qf_jitter50"] == 1.2


def test_a_rank_that_ran_ahead_waits_at_the_drain_off_the_critical_path():
    """bench.sync counts a drain's wait (``drain_wait_s``) as the rank's wait, not its work;
    the rank that ran ahead and waited there ends no later than the one it waited for, so
    the critical-path wait does not count it, and the most any rank waited does."""
    from odin_ns.bench.sync import waits_and_busy
    from odin_ns.bench.trace import critical_path_wait

    def step(start, end, wait_s, drain_wait_s=0.0):
        return {"start": start, "end": end, "wait_s": wait_s, "drain_wait_s": drain_wait_s}

    behind = [step(0.0, 1.0, 0.0), step(1.0, 2.0, 0.0)]  # rank 0: never waits
    ahead = [step(0.0, 0.6, 0.0), step(0.6, 2.0, 0.01, drain_wait_s=0.8)]  # rank 1
    old = [{k: v for k, v in x.items() if k != "drain_wait_s"} for x in ahead]  # older logs
    waits, busy = waits_and_busy([behind, ahead])
    assert waits == pytest.approx([0.0, 0.81]) and busy == pytest.approx([2.0, 1.19])
    assert waits_and_busy([behind, old])[0] == pytest.approx([0.0, 0.01])
    ends = np.array([2.0, 2.0])
    assert critical_path_wait(ends, np.array(waits)) == 0.0
    assert max(waits) == pytest.approx(0.81)
