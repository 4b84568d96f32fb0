"""JIT build of the primitive-sync extension with ``torch.utils.cpp_extension`` (ninja).

Two shared libraries, so a machine without a GPU never compiles CUDA code it cannot run,
and tests can build and check each on its own:

- ``odin_ns_ops_cpu``: the ``torch.ops.odin`` schemas and their CPU kernels (g++, OpenMP);
- ``odin_ns_ops_cuda``: the CUDA kernels only (``TORCH_LIBRARY_IMPL(odin, CUDA)``), loaded
  after the CPU library. Built only when torch is a CUDA build and a CUDA toolkit (nvcc and
  headers) is found; whether a GPU is present does not matter for compiling.

Builds go to ``$ODIN_NS_EXT_DIR`` (default ``~/.cache/odin_ns/ext``), one folder per torch
and Python version and per checkout (``ext_dir``). ninja rebuilds only what changed, so loading an unchanged extension
costs one no-op ninja run plus ``dlopen``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

CPU_EXTENSION = "odin_ns_ops_cpu"
CUDA_EXTENSION = "odin_ns_ops_cuda"
DEFAULT_CUDA_ARCH_LIST = "9.0"  # H100 / H200; override with TORCH_CUDA_ARCH_LIST
VARIANTS = ("cpu", "cuda")

CPU_SOURCES = ("ops_cpu.cpp", "plan_cpu.cpp", "step_cpu.cpp", "tables_cpu.cpp")
CUDA_SOURCES = ("ops_cuda.cpp", "kernels.cu")
HEADERS = ("common.h", "host.h", "kernels.h")


@dataclass(frozen=True)
class CudaToolkit:
    """Where the CUDA compiler, headers and runtime library are."""

    home: Path  # torch's CUDA_HOME (has bin/nvcc)
    include_dir: Path  # holds cuda_runtime.h
    lib_dir: Path  # holds libcudart.so


@dataclass(frozen=True)
class BuildResult:
    """One extension library built (or found up to date) and loaded into this process."""

    name: str
    library: Path
    seconds: float  # wall time of the build-and-load call
    compiled: bool  # False when the cached library was up to date


def csrc_dir() -> Path:
    return Path(__file__).resolve().parent / "csrc"


def ext_dir() -> Path:
    """Build cache root: ``$ODIN_NS_EXT_DIR`` or ``~/.cache/odin_ns/ext``, per torch/Python
    and per checkout (a hash of the sources' folder): torch's build files name the source
    paths, so two checkouts sharing one folder would rebuild each other's libraries."""
    root = os.environ.get("ODIN_NS_EXT_DIR") or Path.home() / ".cache" / "odin_ns" / "ext"
    checkout = hashlib.sha1(str(csrc_dir()).encode()).hexdigest()[:8]
    tag = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root).expanduser() / f"{tag.replace('+', '_')}-{checkout}"


def find_cxx_compiler() -> tuple[str | None, str]:
    """The C++ compiler cpp_extension will use, or None and why not."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        return None, f"no C++ compiler: {cxx!r} is not on PATH"
    return path, ""


def find_cuda_toolkit() -> tuple[CudaToolkit | None, str]:
    """The CUDA toolkit to build with, or None and why the CUDA variant cannot be built."""
    if torch.version.cuda is None:
        return None, "torch is a CPU-only build (torch.version.cuda is None)"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return None, "no CUDA toolkit: torch found no CUDA_HOME (set it, or put nvcc on PATH)"
    home = Path(CUDA_HOME)
    if not (home / "bin" / "nvcc").exists():
        return None, f"no nvcc at {home / 'bin' / 'nvcc'} (CUDA_HOME={home})"
    # CUDA_HOME may be a prefix whose bin/nvcc is a wrapper (e.g. /usr/local): look for the
    # headers and runtime there first, then in the usual toolkit location.
    roots = [home, Path("/usr/local/cuda"), home / "cuda"]
    roots += [Path(p) for p in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")) if p]
    for root in roots:
        include = root / "include"
        if not (include / "cuda_runtime.h").exists():
            continue
        for lib in (root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"):
            if (lib / "libcudart.so").exists():
                return CudaToolkit(home, include, lib), ""
    return None, f"nvcc found under {home} but no include/cuda_runtime.h with lib/libcudart.so"


def cuda_arch_list() -> str:
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_CUDA_ARCH_LIST


@contextlib.contextmanager
def _arch_list_env() -> Iterator[None]:
    """Set TORCH_CUDA_ARCH_LIST to the default while building, when the user did not."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        yield
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCH_LIST
    try:
        yield
    finally:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)


def library_path(name: str) -> Path:
    return ext_dir() / name / f"{name}.so"


def _load(name: str, sources: tuple[str, ...], verbose: bool, **kwargs) -> BuildResult:
    """Build ``name`` if its sources changed, and load it (registers its torch.ops)."""
    from torch.utils.cpp_extension import load

    build_dir = ext_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    library = library_path(name)
    before = library.stat().st_mtime_ns if library.exists() else None
    start = time.perf_counter()
    load(
        name=name,
        sources=[str(csrc_dir() / s) for s in sources],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=verbose,
        **kwargs,
    )
    seconds = time.perf_counter() - start
    after = library.stat().st_mtime_ns if library.exists() else None
    return BuildResult(name, library, seconds, compiled=after != before)


def load_cpu(verbose: bool = False) -> BuildResult:
    """Build (if needed) and load the CPU library: ``torch.ops.odin.*`` with CPU kernels."""
    compiler, reason = find_cxx_compiler()
    if compiler is None:
        raise RuntimeError(reason)
    return _load(
        CPU_EXTENSION,
        CPU_SOURCES,
        verbose,
        extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
        with_cuda=False,
    )


def load_cuda(verbose: bool = False) -> BuildResult:
    """Build (if needed) and load the CUDA kernels (loads the CPU library first)."""
    toolkit, reason = find_cuda_toolkit()
    if toolkit is None:
        raise RuntimeError(reason)
    load_cpu(verbose)
    with _arch_list_env():
        return _load(
            CUDA_EXTENSION,
            CUDA_SOURCES,
            verbose,
            extra_cflags=["-O3", "-ffp-contract=off"],
            extra_cuda_cflags=["-O3", "--fmad=false"],
            extra_include_paths=[str(toolkit.include_dir)],
            extra_ldflags=[f"-L{toolkit.lib_dir}"],
            with_cuda=True,
        )


def load_variant(variant: str, verbose: bool = False) -> BuildResult:
    """``"cpu"``: the CPU library; ``"cuda"``: CPU + CUDA libraries (returns the CUDA one)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return load_cpu(verbose) if variant == "cpu" else load_cuda(verbose)


def summarize_error(error: BaseException, max_lines: int = 6) -> str:
    """The first compiler error lines of a failed build (cpp_extension's message is long)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    picked = (errors or lines)[:max_lines]
    return f"{type(error).__name__}: " + " | ".join(picked)
