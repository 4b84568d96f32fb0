"""``python -m odin_ns.cuda.gpu_check`` (the lent-GPU check): its CLI here, without CUDA,
and the launcher rule it relies on (ranks share GPUs round-robin, gloo when they must)."""

from __future__ import annotations

import importlib.metadata as md
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from odin_ns import launch

LAYOUTS = ("replicated", "sharded")  # the control plane checks'


def _gpu_check(*args: str, tmp: Path | None = None) -> subprocess.CompletedProcess:
    """The script with ``args``; its work folder (kept for reading a run) under ``tmp``."""
    cmd = [sys.executable, "-m", "odin_ns.cuda.gpu_check", *args]
    env = None if tmp is None else dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_help_lists_the_options():
    proc = _gpu_check("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--out", "--budget-s", "--train-steps", "--dist-steps", "--device"):
        assert option in proc.stdout


def test_cpu_dry_run_of_the_script(tmp_path):
    """The same script on the CPU (``--device cpu``), the checks that need no training run
    (the suite trains elsewhere) and the step-sync count's harness (a warm-up step and 3
    counted, timed only: no stream on a CPU): the ops against their references and the
    control plane at 20k rows (quality-first, throughput-first with late peers, and R = 64
    sharded); the report's shape, and a clean end before its self-deadline."""
    import json

    out = tmp_path / "dry.json"
    proc = _gpu_check(
        "--device", "cpu",
        "--checks", "ops,control_plane,step_syncs,control_plane_late,control_plane_r64",
        "--sizes", "1000", "--repeats", "1",
        "--budget-s", "140", "--seed", "0", "--out", str(out), tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["all_ok"] and "watchdog" not in report
    assert report["environment"] and report["seed"] == 0
    planes = ["control_plane", "control_plane_late", "control_plane_r64"]
    assert set(report["checks"]) == {"ops", "step_syncs", *planes}
    assert report["checks"]["ops"]["cases"]
    syncs = report["checks"]["step_syncs"]
    assert (syncs["rasterizer"], syncs["steps"], syncs["syncs_per_step"]) == ("torch", 3, None)
    assert syncs["seconds_per_step"] > 0 and Path(syncs["json"]).with_suffix(".png").exists()
    qf, late, r64 = (report["checks"][name] for name in planes)
    assert (qf["mode"], qf["late_peers"], qf["ranks"]) == ("quality-first", False, 8)
    assert (late["mode"], late["late_peers"], late["ranks"]) == ("throughput-first", True, 8)
    assert (r64["mode"], r64["ranks"], "replicated" in r64) == ("quality-first", 64, False)
    for plane, layout in [*itertools.product((qf, late), LAYOUTS), (r64, "sharded")]:
        assert 0 <= plane["device_reads_per_step_max"] <= 2
        figures = plane[layout]
        # (host_ms is engine - data - ops x the timer's price, an estimate: at 20k rows
        # within its noise of zero, either side, as in test_bench_control_plane; the integer
        # operations are timed directly)
        assert figures["host_ms_per_step"] < figures["engine_ms_per_step"]
        assert 0 < figures["control_ms_per_step"] < figures["engine_ms_per_step"]
        assert figures["meta_host_ms_per_step"] < figures["meta_ms_per_step"]
        assert "meta_paced_host_ms_per_step" in figures
        assert 0 < figures["uploads_per_step"] <= 3 and figures["upload_mb_per_step"] > 0
        assert 0 < figures["device_ops_per_step"] < figures["device_ops_per_step_throughput_first"]
        assert "cuda_syncs_per_step_max" not in figures
    assert out.with_suffix(".png").stat().st_size > 0
    refused = _gpu_check("--device", "cpu", "--checks", "ops,nope", "--out", str(out))
    assert refused.returncode == 2 and "unknown ['nope']" in refused.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_one_line_and_exit_2(tmp_path):
    out = tmp_path / "report.json"
    proc = _gpu_check("--out", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize(
    ("gpus", "local_rank", "ranks", "device", "backend", "device_type"),
    [
        (1, 1, 2, 0, "gloo", "cuda:0"),  # the lent machine: two ranks on cuda:0
        (2, 3, 4, 1, "gloo", "cuda:1"),
        (4, 3, 4, 3, "nccl", "cuda"),  # one GPU per rank: as before
    ],
)
def test_ranks_share_gpus_round_robin(
    monkeypatch, gpus, local_rank, ranks, device, backend, device_type
):
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    config = SimpleNamespace(machine=SimpleNamespace(device_type="cuda"))
    assert launch._bind_cuda_device(config, local_rank, ranks) == backend
    assert chosen == [device]
    assert config.machine.device_type == device_type


def test_prepare_fetches_wheels_for_the_gpu_machine(tmp_path):
    """``--prepare``'s pip command: binary wheels for CPython 3.12 / manylinux x86-64 only,
    without their dependencies (the machine has them), into the folder given."""
    from odin_ns.cuda import gpu_wheels

    cmd = gpu_wheels.download_command(tmp_path)
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--python-version") + 1] == "3.12"
    assert cmd[cmd.index("--implementation") + 1] == "cp"
    platforms = {cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_28_x86_64"} <= platforms
    assert all(p.endswith("_x86_64") for p in platforms)
    assert cmd[cmd.index("--dest") + 1] == str(tmp_path)
    assert {"gsplat==1.4.0", "nerfstudio==1.1.5"} <= set(cmd)
    proc = _gpu_check("--device", "cpu")  # neither --out nor --prepare: a usage error
    assert proc.returncode == 2 and "--out is required" in proc.stderr


def test_the_tree_leaves_room_for_the_wheels_on_a_call_to_the_gpu_machine(tmp_path):
    """What travels to the GPU machine in one call (the working tree and the wheels) stays
    under its 64 MiB: the tree leaves ``WHEELS_BYTES`` (bench/'s figures once grew it to
    45 MiB, which with the 22.6 MiB of wheels would have had the call refused). A folder
    that is no git checkout has no tree to count."""
    from odin_ns.cuda import gpu_wheels

    tree = gpu_wheels.tree_bytes(gpu_wheels.project_root())
    assert tree is not None
    assert tree + gpu_wheels.WHEELS_BYTES <= gpu_wheels.TRAVEL_BYTES, f"{tree / 2**20:.1f} MiB"
    assert gpu_wheels.tree_bytes(tmp_path) is None


def test_wheels_install_offline_and_import(tmp_path, monkeypatch):
    """``--wheels``: every wheel of the folder installed with no index, importable here and
    in child processes."""
    import importlib
    import zipfile

    from odin_ns.cuda import gpu_wheels

    with pytest.raises(FileNotFoundError, match="no wheel"):
        gpu_wheels.install(tmp_path, tmp_path / "site")
    info = "odin_tiny_pkg-0.1.dist-info"
    files = {
        "odin_tiny_pkg/__init__.py": "VALUE = 7\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: odin-tiny-pkg\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(tmp_path / "odin_tiny_pkg-0.1-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    result = gpu_wheels.install(tmp_path, tmp_path / "site")
    assert result["installed"] == ["odin_tiny_pkg-0.1-py3-none-any.whl"]
    assert importlib.import_module("odin_tiny_pkg").VALUE == 7
    child = subprocess.run(
        [sys.executable, "-c", "import odin_tiny_pkg; print(odin_tiny_pkg.VALUE)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.stdout.strip() == "7", child.stderr
    sys.modules.pop("odin_tiny_pkg", None)


CLOSURE = """
import importlib, importlib.metadata as md, sys
for name in ("odin_ns.launch", "nerfstudio.scripts.train", "nerfstudio.scripts.eval",
             "odin_ns.method_configs.odin_splatfacto", "odin_ns.viewer_ext"):
    importlib.import_module(name)
from nerfstudio.configs.method_configs import all_methods  # the plugin entry points
packages = md.packages_distributions()
print(" ".join(sorted({d for m in list(sys.modules) for d in packages.get(m.split(".")[0], [])})))
"""


def test_wheels_are_what_training_imports_less_what_the_machine_has():
    """``gpu_wheels.REQUIREMENTS`` is the import closure of ``ns-train odin-splatfacto``,
    ``odin-ns-train`` and ``ns-eval`` (their modules and the method entry points, imported
    here) less the GPU machine's packages: nothing missing there, nothing carried for
    nothing. (Imports made only inside functions are not seen: scikit-learn, which the
    machine has, and open3d, which the check does without: ``street_scene``.)"""
    from odin_ns.cuda import gpu_wheels

    def norm(name: str) -> str:
        return name.split("==")[0].lower().replace("_", "-")

    proc = subprocess.run(
        [sys.executable, "-c", CLOSURE], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    closure = {norm(d) for d in proc.stdout.split()} - {"odin-ns"}
    carried = {norm(r) for r in gpu_wheels.REQUIREMENTS}
    has = {norm(d) for d in gpu_wheels.MACHINE_HAS}
    assert closure - has - carried == set(), "imported, but neither carried nor on the machine"
    # Carried without being imported here: only what a carried package requires and imports
    # on use (tyro's typeguard).
    required = {
        norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0])
        for d in carried
        for r in md.requires(d) or []
        if "extra ==" not in r
    }
    assert carried - closure <= required, "carried, but neither imported nor required"


def test_deterministic_reaches_every_rank_command():
    """``odin-ns-train --deterministic`` (the check's bitwise runs) is a launcher option that
    torchrun passes on to each rank's command line, where ``_train_rank`` applies it; the
    3-rank family of the suite trains with it (tests/harness/street_runs.py)."""
    args, rest = launch._split_launcher_args(["--deterministic", "odin-splatfacto", "--data", "d"])
    assert args.deterministic and rest == ["odin-splatfacto", "--data", "d"]
    ranks = launch._torchrun_args(args, rest, "odin_ns.launch", "fork")
    assert ranks[ranks.index("odin_ns.launch") + 1 :].count("--deterministic") == 1
    plain, rest = launch._split_launcher_args(["odin-splatfacto"])
    assert "--deterministic" not in launch._torchrun_args(plain, rest, "odin_ns.launch", "fork")


def test_parameter_differences_name_shape_mismatches():
    from odin_ns.cuda.gpu_check import param_diffs

    want = {"means": torch.zeros(3, 3), "scales": torch.zeros(2, 3), "empty": torch.zeros(0, 4)}
    got = {"means": torch.zeros(3, 3), "scales": torch.ones(4, 3), "empty": torch.zeros(0, 4)}
    got["means"][1, 2] = -0.25
    assert param_diffs(got, want) == {
        "means": 0.25, "scales": "shape [4, 3] != [2, 3]", "empty": 0.0,
    }  # fmt: skip
    assert param_diffs({}, want)["means"] == "shape None != [3, 3]"
