"""``python -m odin_ns.cuda build [--cpu-only] [--verbose]`` and ``python -m odin_ns.cuda check``.

``build`` compiles the CPU library, and the CUDA library when torch is a CUDA build and a
CUDA toolkit is found (no GPU needed), into the cache (``$ODIN_NS_EXT_DIR``); it exits
non-zero when a build it attempted failed. ``check`` loads what can be loaded (building if
needed) and prints which ops are compiled for which device, or why the references are used.
"""

from __future__ import annotations

import argparse
import sys

import torch


def _build(cpu_only: bool, verbose: bool) -> int:
    from odin_ns.cuda import build

    print(f"cache: {build.ext_dir()}")
    failed = False
    variants = ["cpu"]
    if cpu_only:
        print("cuda: skipped (--cpu-only)")
    else:
        toolkit, reason = build.find_cuda_toolkit()
        if toolkit is None:
            print(f"cuda: skipped ({reason})")
        else:
            variants.append("cuda")
            print(f"cuda: toolkit {toolkit.home}, TORCH_CUDA_ARCH_LIST={build.cuda_arch_list()}")
    for variant in variants:
        try:
            result = build.load_variant(variant, verbose=verbose)
        except Exception as error:  # noqa: BLE001 - report and continue with the next variant
            print(f"{variant}: FAILED: {build.summarize_error(error, max_lines=20)}")
            failed = True
            continue
        state = "compiled" if result.compiled else "up to date"
        print(f"{variant}: {state} in {result.seconds:.1f} s -> {result.library}")
    return 1 if failed else 0


def _check() -> int:
    from odin_ns.cuda import build, ops

    gpu = torch.cuda.is_available()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); GPU present: {gpu}")
    print(f"cache: {build.ext_dir()}")
    statuses = {d: ops.status(d) for d in ("cpu", "cuda")}
    header = f"{'op':<22} {'cpu':<12} {'cuda':<12}"
    print(header)
    print("-" * len(header))
    for name in ops.OPS:
        cells = []
        for device_type, st in statuses.items():
            registered = st.compiled and _has_kernel(name, device_type)
            cells.append("compiled" if registered else "reference")
        print(f"{name:<22} {cells[0]:<12} {cells[1]:<12}")
    for device_type, st in statuses.items():
        if st.compiled:
            note = "" if device_type == "cpu" or gpu else " (no GPU here to run them)"
            print(f"{device_type}: compiled kernels in use{note}")
        else:
            print(f"{device_type}: torch references in use: {st.reason}")
    return 0


def _has_kernel(name: str, device_type: str) -> bool:
    key = {"cpu": "CPU", "cuda": "CUDA"}[device_type]
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"odin::{name}", key))
    except (AttributeError, RuntimeError):
        return hasattr(torch.ops.odin, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m odin_ns.cuda", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="compile the extension into the cache")
    p_build.add_argument("--cpu-only", action="store_true", help="skip the CUDA library")
    p_build.add_argument("--verbose", action="store_true", help="show compiler commands")
    sub.add_parser("check", help="print which ops are compiled for which devices")
    args = parser.parse_args(argv)
    if args.command == "build":
        return _build(args.cpu_only, args.verbose)
    return _check()


if __name__ == "__main__":
    sys.exit(main())
