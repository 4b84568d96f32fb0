"""bench.convergence's summary: times and gaps against the one-process final and best PSNR."""

import json

import pytest

from odin_ns.bench import convergence


def _curve(psnrs: list[float], views_per_point: int, seconds_per_point: float) -> list[dict]:
    return [
        {
            "step": i,
            "views": (i + 1) * views_per_point,
            "wall_s": (i + 1) * seconds_per_point,
            "checkpoint_s": 0.0,
            "psnr": p,
            "ssim": 0.5,
            "num_gaussians": 1000,
        }
        for i, p in enumerate(psnrs)
    ]


def _results(single: list[float], two: list[float]) -> dict[str, dict]:
    return {
        "1x1": {"ranks": 1, "views_per_rank": 1, "batch_scaling": "sqrt", "run": "a",
                "eval_s": 1.0, "curve": _curve(single, 100, 10.0)},
        "2x1:sqrt": {"ranks": 2, "views_per_rank": 1, "batch_scaling": "sqrt", "run": "b",
                     "eval_s": 1.0, "curve": _curve(two, 100, 5.0)},
    }  # fmt: skip


def test_summary_against_final_and_best_psnr():
    # one process peaks at 200 views (21 dB) and ends 1 dB lower: the budget overfits
    results = _results([20.0, 21.0, 20.5, 20.0], [19.0, 20.0, 20.5, 19.0])
    head = convergence.summarize(results, convergence.default_targets(results))
    assert head["peaked_early"]
    assert (head["single_best_psnr"], head["single_best_views"]) == (21.0, 200)
    two = results["2x1:sqrt"]
    assert (two["best_psnr"], two["best_views"]) == (20.5, 300)
    assert head["psnr_gap_best_2ranks_vs_1"] == pytest.approx(0.5)
    # 20.0 dB (the one-process final) is reached at the second point, 10 s of 40 s
    assert head["time_ratio_to_final_psnr_2ranks_vs_1"] == pytest.approx(10.0 / 40.0)
    # 21.0 dB (the one-process best) is never reached by 2 ranks
    assert head["time_ratio_to_best_psnr_2ranks_vs_1"] is None
    assert two["views_to_psnr"]["20.50"] == pytest.approx(300.0)


def test_a_rising_curve_is_not_flagged_and_best_is_final():
    results = _results([18.0, 19.0, 20.0, 20.3], [18.5, 19.5, 20.3, 20.6])
    head = convergence.summarize(results, convergence.default_targets(results))
    assert not head["peaked_early"]
    assert head["single_best_psnr"] == head["single_final_psnr"] == 20.3
    # 2 ranks reach 20.3 dB at their third point (15 s) against one process's 40 s
    assert head["time_ratio_to_best_psnr_2ranks_vs_1"] == pytest.approx(15.0 / 40.0)
    assert head["psnr_gap_best_2ranks_vs_1"] == pytest.approx(20.3 - 20.6)


def test_from_json_summarizes_again_without_training(tmp_path):
    results = _results([20.0, 21.0, 20.5, 20.0], [19.0, 20.0, 20.5, 19.0])
    saved = {"scene": "s", "views": 400, "eval_every_views": 100, "seed": 1,
             "downscale_factor": None, "training_args": [], "cpu_count": 2,
             "targets_psnr": [1.0], "settings": results}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(saved))
    out = tmp_path / "new.json"
    convergence.main(["--from-json", str(tmp_path / "old.json"), "--out", str(out)])
    new = json.loads(out.read_text())
    assert new["peaked_early"] and new["targets_psnr"][-1] == 21.0
    assert new["scene"] == "s" and out.with_suffix(".png").exists()
    with pytest.raises(SystemExit):
        convergence.main(["--out", str(out)])  # neither --data nor --from-json
