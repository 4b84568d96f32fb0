"""bench.methods without training: run order, the ns-train command it builds (parsed by
nerfstudio's own CLI), and the JSON summary (medians, spread, same-round deltas)."""

from __future__ import annotations

from pathlib import Path

import pytest

from odin_ns.bench import methods as bench


def _args(tmp_path: Path, *extra: str):
    (tmp_path / "scene").mkdir(exist_ok=True)
    return bench.parse_args(["--data", str(tmp_path / "scene"), "--out", "x.json", *extra])


def test_runs_are_interleaved_with_one_seed_per_round():
    runs = bench.interleaved_runs(["a", "b"], repeats=3, seed=7)
    assert [(r.method, r.round, r.seed) for r in runs] == [
        ("a", 0, 7), ("b", 0, 7), ("a", 1, 8), ("b", 1, 8), ("a", 2, 9), ("b", 2, 9),
    ]  # fmt: skip
    assert runs[3].name == "b-r1"


def test_parse_args_rejects_what_cannot_run(tmp_path):
    with pytest.raises(SystemExit):
        _args(tmp_path, "--methods", "odin-splatfacto,splatfacto")  # not an Odin method
    with pytest.raises(SystemExit):
        _args(tmp_path, "--dataparser", "blender-data", "--downscale-factor", "8")
    with pytest.raises(SystemExit):
        bench.parse_args(["--data", str(tmp_path / "missing"), "--out", "x.json"])


@pytest.mark.parametrize("dataparser", ["nerfstudio-data", "blender-data"])
def test_train_command_is_the_intended_ns_train_config(tmp_path, dataparser):
    """nerfstudio's CLI parses the built arguments into the config the benchmark means:
    the method, steps, seed, compressed schedule, extra options, dataparser and its options."""
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion
    from nerfstudio.data.dataparsers.blender_dataparser import BlenderDataParserConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    options = ["--steps", "120", "--warmup", "30", "--refine-every", "20", "--seed", "5"]
    options += ["--dataparser", dataparser]
    if dataparser == "nerfstudio-data":
        options += ["--downscale-factor", "8"]
    extra = ["--", "--pipeline.datamanager.camera-res-scale-factor", "0.5"]
    args = _args(tmp_path, *options, *extra)
    run = bench.interleaved_runs(["odin-splatfacto-mcmc"], repeats=2, seed=args.seed)[1]
    config = tyro.cli(AnnotatedBaseConfigUnion, args=bench.train_args(args, run, tmp_path / "w"))

    assert config.method_name == "odin-splatfacto-mcmc"
    assert config.pipeline.model.strategy == "mcmc"
    assert config.max_num_iterations == 120
    assert config.machine.seed == 6  # round 1: seed + 1
    assert config.steps_per_save > 120  # no checkpoint during the timed steps
    assert config.steps_per_eval_image == config.steps_per_eval_all_images == 0
    assert config.pipeline.model.warmup_length == 30
    assert config.pipeline.model.refine_every == 20
    assert config.pipeline.model.num_downscales == 0
    assert config.pipeline.datamanager.camera_res_scale_factor == 0.5
    assert config.data == args.data  # ns-train hands it to the data manager
    assert config.get_base_dir() == bench.run_dir(tmp_path / "w", run)
    parser = config.pipeline.datamanager.dataparser
    if dataparser == "blender-data":
        assert isinstance(parser, BlenderDataParserConfig)
    else:
        assert isinstance(parser, NerfstudioDataParserConfig) and parser.downscale_factor == 8
        assert parser.load_3D_points  # the method's own dataparser settings are kept


def _record(method: str, round_: int, psnr: float, lpips: float | None = 0.2) -> dict:
    return {
        "method": method,
        "round": round_,
        "psnr": psnr,
        "ssim": psnr / 100.0,
        "lpips": lpips,
        "num_gaussians": 1000 + round_,
        "train_s": 10.0 + round_,
        "process_s": 20.0 + round_,
    }


def test_summary_medians_spread_and_same_round_deltas(tmp_path):
    runs = bench.interleaved_runs(["odin-splatfacto", "odin-splatfacto-mcmc"], 3, seed=0)
    psnr = {"odin-splatfacto": [20.0, 25.0, 21.0], "odin-splatfacto-mcmc": [21.0, 25.5, 24.0]}
    records = [_record(r.method, r.round, psnr[r.method][r.round], lpips=None) for r in runs]
    summary = bench.summarize(runs, records)

    default, mcmc = (
        summary["methods"]["odin-splatfacto"],
        summary["methods"]["odin-splatfacto-mcmc"],
    )
    assert [r["psnr"] for r in default["runs"]] == psnr["odin-splatfacto"]
    assert (default["psnr"], default["psnr_min"], default["psnr_max"]) == (21.0, 20.0, 25.0)
    assert (mcmc["psnr"], mcmc["psnr_min"], mcmc["psnr_max"]) == (24.0, 21.0, 25.5)
    assert mcmc["train_s"] == 11.0 and mcmc["num_gaussians_max"] == 1002
    assert mcmc["lpips"] is None  # not measured (no cached AlexNet weights): not invented
    # the median of the same-round differences (1.0, 0.5, 3.0), not 24.0 - 21.0
    assert summary["psnr_delta_mcmc_vs_default"] == 1.0
    assert summary["psnr_delta_mcmc_vs_default_min"] == 0.5
    assert summary["psnr_delta_mcmc_vs_default_max"] == 3.0
    assert summary["ssim_delta_mcmc_vs_default"] == pytest.approx(0.01)

    png = tmp_path / "methods.png"
    bench.plot(summary, png, "test")
    assert png.stat().st_size > 1000
