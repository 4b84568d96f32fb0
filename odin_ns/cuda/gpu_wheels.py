"""The wheels the GPU check needs on a bare GPU machine: fetched here, installed there.

The GPU machine that may be lent has Python 3.12, torch (CUDA), numpy, scipy, matplotlib,
rich, jaxtyping, ninja and pytest, no network, and room for 64 MiB of extra files per call.
It lacks gsplat, whose wheel (pure Python; its CUDA code is compiled on first use) is 6.5
MB; nerfstudio's import closure (open3d alone is hundreds of MB) cannot travel, so the
checks that train through nerfstudio fail there with the import error and the others run.

    python -m odin_ns.cuda.gpu_check --prepare gpu_wheels   # here: the registries are reachable
    # on the GPU machine, with gpu_wheels carried beside the working tree:
    python -m odin_ns.cuda.gpu_check --wheels gpu_wheels --out gpu_check.json
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

# What the GPU machine is (CPython 3.12, manylinux x86-64) and what it lacks (gsplat as
# nerfstudio 1.1.5 pins it).
TARGET_PYTHON = "3.12"
TARGET_PLATFORM = "manylinux2014_x86_64"
REQUIREMENTS = ("gsplat==1.4.0",)
MAX_BYTES = 50 << 20


def download_command(dest: Path, requirements: tuple[str, ...] = REQUIREMENTS) -> list[str]:
    """``pip download`` of ``requirements`` as wheels for the GPU machine, without deps."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", TARGET_PYTHON, "--platform", TARGET_PLATFORM,
        "--dest", str(dest), *requirements,
    ]  # fmt: skip


def prepare(dest: Path) -> dict:
    """Download the wheels into ``dest`` and write ``dest/manifest.json``.

    Raises:
        RuntimeError: pip failed, or the wheels exceed ``MAX_BYTES``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(download_command(dest), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    if size > MAX_BYTES:
        raise RuntimeError(f"the wheels take {size / 2**20:.1f} MiB, more than 50 MiB")
    manifest = {
        "requirements": list(REQUIREMENTS),
        "python": TARGET_PYTHON,
        "platform": TARGET_PLATFORM,
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "bytes": size,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def install(source: Path, target: Path) -> dict:
    """Install every wheel in ``source`` into ``target`` (no index, no deps) and put
    ``target`` first on this process's and its children's import path.

    Raises:
        FileNotFoundError: ``source`` holds no wheel.
        RuntimeError: pip failed.
    """
    wheels = sorted(Path(source).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheel in '{source}' (make it with --prepare)")
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    cmd += ["--target", str(target), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    sys.path.insert(0, str(target))
    paths = [str(target), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    importlib.invalidate_caches()
    return {"installed": [w.name for w in wheels], "target": str(target)}


__all__ = ["MAX_BYTES", "REQUIREMENTS", "download_command", "install", "prepare"]
