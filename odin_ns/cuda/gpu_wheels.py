"""The wheels the GPU check needs on a bare GPU machine: fetched here, installed there.

The GPU machine that may be lent has Python 3.12, torch (CUDA), numpy, scipy, matplotlib,
rich, jaxtyping, ninja, pytest, tensorboard, torchmetrics, OpenCV and imageio, no network,
and room for 64 MiB of extra files per call. It lacks gsplat, nerfstudio and the rest of
what ``ns-train odin-splatfacto`` and ``ns-eval`` import. nerfstudio's full requirements
cannot travel (open3d alone is hundreds of MB), but what its training and evaluation
*import* can: :data:`REQUIREMENTS` is that import closure less what the machine holds,
about 24 MiB as wheels (``tests/test_gpu_check.py`` recomputes the closure and pins it).

    python -m odin_ns.cuda.gpu_check --prepare gpu_wheels   # here: the registries are reachable
    # on the GPU machine, with gpu_wheels carried beside the working tree:
    python -m odin_ns.cuda.gpu_check --wheels gpu_wheels --out gpu_check.json

``install`` puts the wheels and this checkout (built as a package, so nerfstudio finds the
``odin-splatfacto`` entry point and ``odin-ns-train`` is a script) into one folder with
``pip --no-index --no-deps --target``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

# What the GPU machine is: CPython 3.12 on x86-64 with glibc 2.35 or newer. pip matches each
# manylinux tag exactly, so every tag a wheel of REQUIREMENTS is published under is listed.
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 24, 17, 12, 5)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# The distributions `ns-train odin-splatfacto`, `odin-ns-train` and `ns-eval` import (their
# import closure in this project's venv) that the machine's image lacks, at the versions
# nerfstudio 1.1.5 resolves to here. fpsample: 1.0.2 has no CPython 3.12 wheel; nerfstudio
# only imports it (its "fps" camera sampling, unused here), and 0.3.3 has the same function.
REQUIREMENTS = (
    "appdirs==1.4.4",
    "defusedxml==0.7.1",
    "dill==0.4.1",
    "docstring_parser==0.18.0",
    "fpsample==0.3.3",
    "gsplat==1.4.0",
    "msgspec==0.23.0",
    "multiprocess==0.70.19",
    "nerfacc==0.5.2",
    "nerfstudio==1.1.5",
    "pathos==0.3.5",
    "ppft==1.7.8",
    "PySocks==1.7.1",
    "pyquaternion==0.9.9",
    "pytorch-msssim==1.0.0",
    "rawpy==0.28.0",
    "splines==0.3.0",
    "tensorly==0.10.0",
    "typeguard==4.6.1",
    "tyro==1.0.17",
    "viser==0.2.7",
    "websockets==17.4",
)
# What the lent machine's image holds (the device tool's KINDS.md, 2026-11-17), for the
# distributions of the closure: the test that pins REQUIREMENTS checks closure = both.
MACHINE_HAS = frozenset(
    "absl-py certifi charset-normalizer cuda-bindings cuda-pathfinder cycler filelock fsspec "
    "idna imageio jaxtyping jinja2 kiwisolver markupsafe matplotlib mpmath networkx numpy "
    "nvidia-nccl-cu13 opencv-python-headless packaging pillow protobuf pyparsing "
    "python-dateutil pyyaml requests rich scipy setuptools simplejson six sympy tensorboard "
    "threadpoolctl torch torchmetrics torchvision tqdm triton typing-extensions urllib3 "
    "scikit-image lazy-loader tifffile psutil msgpack".split()
)
# What one call may carry to the lent machine: the working tree (tracked files and untracked
# ones git does not ignore) and the wheels, together (the device tool's limit).
TRAVEL_BYTES = 64 << 20
# The wheels of REQUIREMENTS took 22.6 MiB (2026-12-04); the room the tree must leave them.
WHEELS_BYTES = 24 << 20


def project_root() -> Path:
    """This checkout's root (the folder with ``pyproject.toml`` above ``odin_ns``)."""
    return Path(__file__).resolve().parents[2]


def tree_bytes(root: Path) -> int | None:
    """Bytes of the working tree that travels with a call: the files git tracks or does
    not ignore under ``root`` (None: ``root`` is not a git checkout, or there is no git)."""
    try:
        proc = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
        )
    except OSError:  # no git here
        return None
    if proc.returncode != 0:
        return None
    paths = (root / name for name in proc.stdout.decode().split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file())


def download_command(
    dest: Path, requirements: tuple[str, ...] = REQUIREMENTS, python: str = TARGET_PYTHON
) -> list[str]:
    """``pip download`` of ``requirements`` as wheels for the GPU machine, without deps."""
    platforms = [arg for tag in TARGET_PLATFORMS for arg in ("--platform", tag)]
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", *platforms,
        "--dest", str(dest), *requirements,
    ]  # fmt: skip


def prepare(dest: Path, python: str = TARGET_PYTHON) -> dict:
    """Download the wheels into ``dest`` and write ``dest/manifest.json``. ``python``: the
    target's CPython version (3.12 for the lent machine; this machine's own to rehearse).

    Raises:
        RuntimeError: pip failed, or the checkout's working tree and the wheels together
            exceed ``TRAVEL_BYTES``, what a call may carry to the GPU machine.
    """
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(download_command(dest, python=python), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes(project_root()) or 0
    if tree + size > TRAVEL_BYTES:
        raise RuntimeError(
            f"the working tree ({tree / 2**20:.1f} MiB) and the wheels ({size / 2**20:.1f} MiB) "
            f"take more than the {TRAVEL_BYTES >> 20} MiB a call carries to the GPU machine"
        )
    manifest = {
        "requirements": list(REQUIREMENTS),
        "python": python,
        "platforms": list(TARGET_PLATFORMS),
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "bytes": size,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _pip_install(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")


def install(source: Path, target: Path, project: Path | None = None) -> dict:
    """Install every wheel in ``source`` into ``target`` (no index, no deps), and
    ``project`` (a checkout of odin-ns, built with the machine's setuptools) beside them;
    put ``target`` first on this process's and its children's import path.

    Raises:
        FileNotFoundError: ``source`` holds no wheel.
        RuntimeError: pip failed.
    """
    wheels = sorted(Path(source).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheel in '{source}' (make it with --prepare)")
    # One pip call: a second one into the same --target would not merge its bin/ folder.
    extra = ["--no-build-isolation", str(project)] if project is not None else []
    _pip_install(["--target", str(target), *map(str, wheels), *extra])
    sys.path.insert(0, str(target))
    paths = [str(target), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    importlib.invalidate_caches()
    return {
        "installed": [w.name for w in wheels] + ([str(project)] if project else []),
        "target": str(target),
        "bin": str(Path(target) / "bin"),
    }


__all__ = [
    "MACHINE_HAS",
    "REQUIREMENTS",
    "TRAVEL_BYTES",
    "WHEELS_BYTES",
    "download_command",
    "install",
    "prepare",
    "project_root",
    "tree_bytes",
]
