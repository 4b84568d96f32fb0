"""bench.shard_io and bench.shard_scaling on small inputs.

- shard_io: both variants on 2 spawned ranks write a checkpoint whose rows the bench checks,
  rank 0 adds less memory writing it streamed than gathered (a 200k-Gaussian model: one
  65536-row message against the whole model), and the summary keys are the runs' medians;
- shard_scaling: on a small city, locality owners are balanced (owned rows within 1.1 x N/R),
  sharded bytes per rank stay below random owners' and replicated's, and the issue's ratios
  are computed from the series.
"""

from __future__ import annotations

import numpy as np
import pytest

from odin_ns.bench import shard_io, shard_scaling


@pytest.mark.slow
def test_shard_io_streamed_write_holds_less_than_the_model():
    n = 200_000
    runs = {2: {v: [shard_io.run_once(2, n, v)] for v in shard_io.VARIANTS}}
    result = shard_io.summarize(runs, n)
    model_mb = result["model_mb"]
    by = result["by_ranks"]["2"]
    streamed = by["streamed"]["save_peak_mb_rank0"]["median"]
    gathered = by["gathered"]["save_peak_mb_rank0"]["median"]
    assert streamed < 0.5 * model_mb < model_mb <= gathered  # one message vs the model
    assert by["streamed"]["load_peak_mb_max"]["median"] < 0.75 * model_mb  # half the rows
    assert result["save_peak_over_model_streamed_2"] == pytest.approx(streamed / model_mb)


def test_row_values_depend_on_row_group_and_part():
    values = shard_io.row_values(np.array([0, 1, 4097], dtype=np.int64))
    means, m, v = values["means"]
    assert means.shape == (3, 3) and not means[0].equal(means[1]) and not means[0].equal(m[0])
    assert not m[0].equal(v[0])
    assert values["features_rest"][0].shape == (3, 15, 3)


def test_shard_scaling_counts_from_a_small_city():
    F = shard_scaling.city_footprints(480)
    rows = [shard_scaling.ownership_figures(F, r) for r in (2, 4)]
    for row in rows:
        loc, rnd = row["locality"], row["random"]
        assert loc["owned_rows_max_over_fair"] <= 1.1
        assert loc["resident_rows_max"] >= row["gaussians"] / row["ranks"]
        assert loc["bytes_per_rank_step"] < rnd["bytes_per_rank_step"]
        assert loc["bytes_per_rank_step"] < row["bytes_per_rank_step_replicated"]
        assert loc["remote_read_fraction"] < rnd["remote_read_fraction"]
    keys = shard_scaling.growth_keys(rows, "fixed")
    two, four = (
        rows[0]["locality"]["bytes_per_rank_step"],
        rows[1]["locality"]["bytes_per_rank_step"],
    )
    assert keys["bytes_growth_2_to_4_fixed"] == pytest.approx(four / two - 1.0)
    assert keys["bytes_ratio_sharded_vs_replicated_4_fixed"] == pytest.approx(
        four / rows[1]["bytes_per_rank_step_replicated"]
    )
