"""bench.phase_ab: rounds alternate the versions (ABBA), and the summary's medians and
same-round ratios are those of the runs (each run faked: no training here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from odin_ns.bench import phase_ab


def test_rounds_alternate_the_versions():
    assert phase_ab.round_orders(4) == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]


def test_summary_is_medians_and_same_round_ratios(tmp_path, monkeypatch):
    shares = {("a", 0): 0.030, ("b", 0): 0.020, ("b", 1): 0.024, ("a", 1): 0.032,
              ("a", 2): 0.031, ("b", 2): 0.021}  # fmt: skip
    calls = []

    def fake_run(checkout: Path, args, name: str, extra: list[str]) -> dict:
        key, i = name.split("_")
        calls.append(name)
        split = {k: 0.01 for k in phase_ab.SPLIT}
        digest = {0: "same", 1: key, 2: None}[int(i)]  # equal, different, no checkpoint
        return {"phase_start_share": shares[key, int(i)], "phase_start_seconds": 0.5,
                "views_per_second": 18.0 if key == "a" else 20.0, "phase_starts": 5,
                "gaussians_sha256": digest, **split}  # fmt: skip

    monkeypatch.setattr(phase_ab, "run_once", fake_run)
    monkeypatch.setattr(phase_ab, "build_extension", lambda path, work: None)
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "ab.json"
    phase_ab.main(["--a", str(repo), "--b", str(repo), "--data", "tests", "--rounds", "3",
                   "--work", str(tmp_path / "work"), "--out", str(out)])  # fmt: skip
    assert calls == ["a_0", "b_0", "b_1", "a_1", "a_2", "b_2"]
    result = json.loads(out.read_text())
    assert result["a"]["phase_start_share"] == pytest.approx(0.031)
    assert result["b"]["phase_start_share"] == pytest.approx(0.021)
    assert result["b"]["phase_start_share_max"] == pytest.approx(0.024)
    ratios = sorted([0.020 / 0.030, 0.024 / 0.032, 0.021 / 0.031])
    assert result["share_ratio_b_vs_a"] == pytest.approx(ratios[1])
    assert result["share_ratio_b_vs_a_min"] == pytest.approx(ratios[0])
    assert result["views_ratio_b_vs_a"] == pytest.approx(20.0 / 18.0)
    assert result["gaussians_equal_b_vs_a"] == [True, False, False]
    assert out.with_suffix(".png").stat().st_size > 0


def test_gaussians_digest_is_of_the_last_checkpoints_gaussians(tmp_path):
    import torch

    def save(run: str, step: int, means: torch.Tensor) -> None:
        folder = tmp_path / run / "bench" / "qf" / "nerfstudio_models"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"_model.gauss_params.means": means, "_model.other": torch.rand(2)}
        torch.save({"pipeline": state}, folder / f"step-{step:09d}.ckpt")

    save("a", 1, torch.zeros(3, 3))
    save("a", 9, torch.ones(3, 3))  # the last checkpoint counts
    save("b", 9, torch.ones(3, 3))
    save("c", 9, torch.ones(3, 3).nextafter(torch.full((3, 3), 2.0)))  # one ulp apart
    digest = phase_ab.gaussians_digest
    assert digest(tmp_path / "a") == digest(tmp_path / "b") != digest(tmp_path / "c")
    assert digest(tmp_path / "none") is None
    # another run's checkpoints in the same folder (a mode run there before): refused
    (tmp_path / "a" / "bench" / "tf" / "nerfstudio_models").mkdir(parents=True)
    shutil.copy(
        tmp_path / "c" / "bench" / "qf" / "nerfstudio_models" / "step-000000009.ckpt",
        tmp_path / "a" / "bench" / "tf" / "nerfstudio_models",
    )
    with pytest.raises(ValueError, match="checkpoints of 2 runs"):
        digest(tmp_path / "a")


def test_a_checkout_that_is_not_odin_ns_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not an odin-ns checkout"):
        phase_ab.main(["--a", str(tmp_path), "--b", str(tmp_path), "--data", "x"])
