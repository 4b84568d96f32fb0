"""``python -m odin_ns.cuda.gpu_check`` (the lent-GPU check): its CLI here, without CUDA,
and the launcher rule it relies on (ranks share GPUs round-robin, gloo when they must)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from odin_ns import launch


def _gpu_check(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "odin_ns.cuda.gpu_check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_help_lists_the_options():
    proc = _gpu_check("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--out", "--budget-s", "--train-steps", "--dist-steps", "--device"):
        assert option in proc.stdout


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
