"""GPU check: every CUDA op against its CPU op on random inputs, with timings.

``python -m odin_ns.cuda.gpu_check --out gpu_check.json [--sizes 1000,100000,1000000]``

Builds the CUDA library (JIT, cached), then for each op and size runs the same random
inputs through the CPU op and the CUDA op, compares the results, and times the CPU op,
the CUDA op and the torch reference on the GPU. Prints a table and writes JSON. Every case
is isolated (an error is recorded, the run goes on) and a time budget skips what is left
near the limit, so one blind run always produces a report. Exit status 0 only when every
case matched.

Expected differences (checked with a tolerance, everything else must be bit-exact):
selective_adam_apply's parameter update uses the IEEE square root on the GPU but torch's
MKL square root on the CPU (1 ulp apart now and then); unpack_accumulate sums repeated ids
in atomic order on the GPU.

The input generators here are shared with ``tests/test_cuda_ext.py`` and
``odin_ns.bench.ops``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# splatfacto's per-primitive parameter groups: name -> shape of one row (59 floats in all).
SPLATFACTO_ROWS: dict[str, tuple[int, ...]] = {
    "means": (3,),
    "scales": (3,),
    "quats": (4,),
    "features_dc": (3,),
    "features_rest": (15, 3),
    "opacities": (1,),
}
SPLATFACTO_COLS = 59
# Outputs each op is compared on: returned tensors, or the in-place arguments it updates.
INPLACE_OUTPUTS = {
    "unpack_accumulate": ("accum", "arrivals"),
    "selective_adam_apply": ("param", "exp_avg", "exp_avg_sq", "versions"),
}
OUTPUT_NAMES = {
    "footprint_cull": ("indptr", "indices"),
    "pack_rows": ("buffer",),
    "ready_mask": ("ready",),
    "validate_reads": ("stale_ids",),
}
# (rtol, atol) of outputs allowed to differ between CPU and CUDA; the rest must be exact.
TOLERANCES = {
    ("selective_adam_apply", "param"): (1e-5, 1e-7),
    ("unpack_accumulate", "accum"): (1e-5, 1e-6),
}


def subset_ids(n: int, fraction: float, gen: torch.Generator, duplicates: bool = False) -> Tensor:
    """[M] int64 sorted ids of about ``fraction * n`` primitives (a footprint / publication)."""
    m = int(round(n * fraction))
    if duplicates:
        return (
            torch.randint(0, max(n, 1), (m,), generator=gen)
            if n > 0
            else torch.zeros(0, dtype=torch.int64)
        )
    return torch.randperm(n, generator=gen)[:m].sort().values


def make_inputs(
    op: str,
    n: int,
    gen: torch.Generator,
    fraction: float = 0.2,
    duplicates: bool = False,
    param_shape: tuple[int, ...] = (15, 3),
) -> dict[str, Any]:
    """Keyword arguments of ``op`` for ``n`` primitives (CPU tensors, realistic shapes).

    ``fraction``: share of primitives in the id lists (footprint / publication size);
    ``duplicates``: draw ids with repetition; ``param_shape``: row shape of the Adam param.
    """
    if op == "footprint_cull":
        views, width, height = 4, 640, 480
        # Centres over twice the image extent: about a quarter land inside.
        xy = torch.rand(views, n, 2, generator=gen) * 2.0 - 0.5
        means2d = xy * torch.tensor([width, height], dtype=torch.float32)
        radii = torch.rand(views, n, generator=gen) * 24.0 - 1.0  # ~4% culled (<= 0)
        depths = torch.rand(views, n, generator=gen) * 10.0 - 0.5
        opacities = torch.rand(n, generator=gen)
        return dict(
            means2d=means2d,
            radii=radii,
            depths=depths,
            opacities=opacities,
            width=width,
            height=height,
            margin_px=2.0,
            near_plane=0.01,
            opacity_threshold=1.0 / 255.0,
        )
    if op == "pack_rows":
        tensors = [torch.randn(n, *shape, generator=gen) for shape in SPLATFACTO_ROWS.values()]
        return dict(ids=subset_ids(n, fraction, gen, duplicates), tensors=tensors)
    if op == "unpack_accumulate":
        ids = subset_ids(n, fraction, gen, duplicates)
        return dict(
            buffer=torch.randn(len(ids), SPLATFACTO_COLS, generator=gen),
            ids=ids,
            accum=torch.randn(n, SPLATFACTO_COLS, generator=gen),
            arrivals=torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32),
        )
    if op == "ready_mask":
        return dict(
            arrivals=torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32),
            expected=torch.randint(0, 3, (n,), generator=gen, dtype=torch.int32),
            blocked=torch.rand(n, generator=gen) < 0.1,
        )
    if op == "selective_adam_apply":
        shape = (n, *param_shape)
        return dict(
            param=torch.randn(shape, generator=gen),
            grad=torch.randn(shape, generator=gen) * 1e-2,
            exp_avg=torch.randn(shape, generator=gen) * 1e-3,
            exp_avg_sq=torch.rand(shape, generator=gen) * 1e-5,
            mask=torch.rand(n, generator=gen) < fraction,
            versions=torch.randint(0, 100, (n,), generator=gen),
            lr=1.6e-4,
            beta1=0.9,
            beta2=0.999,
            eps=1e-15,
            step=int(torch.randint(1, 30000, (1,), generator=gen)),
            new_version=100,
        )
    if op == "validate_reads":
        read_ids = subset_ids(n, fraction, gen, duplicates)
        return dict(
            read_ids=read_ids,
            versions=torch.randint(0, 10, (n,), generator=gen),
            required=torch.randint(0, 10, (len(read_ids),), generator=gen),
        )
    raise ValueError(f"unknown op {op!r}")


def copy_inputs(inputs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """Fresh copies on ``device`` (in-place ops must not share storage between runs)."""

    def copy(x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.to(device, copy=True)
        if isinstance(x, list):
            return [copy(t) for t in x]
        return x

    return {k: copy(v) for k, v in inputs.items()}


def run_op(fn: Callable, op: str, inputs: dict[str, Any]) -> dict[str, Tensor]:
    """Run ``fn`` (an op with ``op``'s signature) on ``inputs``; its outputs by name."""
    out = fn(**inputs)
    if op in INPLACE_OUTPUTS:
        return {name: inputs[name] for name in INPLACE_OUTPUTS[op]}
    out = out if isinstance(out, tuple) else (out,)
    return dict(zip(OUTPUT_NAMES[op], out, strict=True))


def compare(op: str, expected: dict[str, Tensor], actual: dict[str, Tensor]) -> dict[str, Any]:
    """Exact comparison, or within TOLERANCES for the outputs listed there."""
    report: dict[str, Any] = {"match": True, "exact": True, "max_abs_diff": 0.0}
    for name, want in expected.items():
        got = actual[name].cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            report.update(match=False, exact=False, detail=f"{name}: {got.shape} {got.dtype}")
            return report
        if torch.equal(got, want):
            continue
        report["exact"] = False
        if want.is_floating_point():
            diff = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
            report["max_abs_diff"] = max(report["max_abs_diff"], diff)
            rtol, atol = TOLERANCES.get((op, name), (0.0, 0.0))
            if (rtol or atol) and torch.allclose(got, want, rtol=rtol, atol=atol):
                continue
        report.update(match=False, detail=f"{name} differs")
    return report


def timed(fn: Callable[[], Any], repeats: int, sync: bool) -> float:
    """Median wall seconds of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check_case(
    op: str,
    n: int,
    gen: torch.Generator,
    duplicates: bool = False,
    fraction: float = 0.2,
    repeats: int = 0,
    device: str = "cuda",
) -> dict[str, Any]:
    """The op on ``device`` vs the CPU op on one random case; with ``repeats`` also timings.

    ``device="cpu"`` is a dry run of the harness (CPU op against itself).
    """
    from odin_ns.cuda import reference

    sync = device != "cpu"
    compiled = getattr(torch.ops.odin, op)
    inputs = make_inputs(op, n, gen, fraction=fraction, duplicates=duplicates)
    expected = run_op(compiled, op, copy_inputs(inputs, "cpu"))
    actual = run_op(compiled, op, copy_inputs(inputs, device))
    if sync:
        torch.cuda.synchronize()
    result = {"op": op, "n": n, "duplicates": duplicates, **compare(op, expected, actual)}
    if repeats > 0:
        cpu_in, dev_in = copy_inputs(inputs, "cpu"), copy_inputs(inputs, device)
        ref_op = getattr(reference, op)
        result["cpu_s"] = timed(lambda: run_op(compiled, op, cpu_in), repeats, sync=False)
        result["cuda_s"] = timed(lambda: run_op(compiled, op, dev_in), repeats, sync=sync)
        result["cuda_reference_s"] = timed(lambda: run_op(ref_op, op, dev_in), repeats, sync=sync)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report path")
    parser.add_argument("--sizes", default="1000,100000,1000000", help="primitive counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip cases after this")
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: dry run of the harness"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    seed = args.seed if args.seed is not None else int(torch.randint(0, 2**31 - 1, (1,)))
    start = time.perf_counter()
    report: dict[str, Any] = {
        "seed": seed,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
        "results": [],
        "errors": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        report["elapsed_s"] = round(time.perf_counter() - start, 2)
        args.out.write_text(json.dumps(report, indent=2))

    print(f"seed={seed} torch={torch.__version__} cuda={torch.version.cuda}", flush=True)
    report["device"] = args.device
    if args.device == "cuda":
        if not torch.cuda.is_available():
            report["errors"].append("no GPU: torch.cuda.is_available() is False")
            write()
            print(report["errors"][-1])
            return 1
        report["gpu"] = torch.cuda.get_device_name(0)
        report["gpu_capability"] = list(torch.cuda.get_device_capability(0))
    try:
        from odin_ns.cuda import build

        built = build.load_variant(args.device)
        report["build_s"] = round(built.seconds, 2)
        report["build_compiled"] = built.compiled
        report["cuda_arch_list"] = build.cuda_arch_list()
        print(
            f"built {built.name} in {built.seconds:.1f} s (compiled={built.compiled})", flush=True
        )
    except Exception as error:  # noqa: BLE001 - report the failure, nothing else can run
        report["errors"].append(f"build failed: {error}")
        write()
        print(f"build failed: {error}")
        return 1

    gen = torch.Generator().manual_seed(seed)
    ops = list(OUTPUT_NAMES) + list(INPLACE_OUTPUTS)
    # Edge cases first (small, fast), then the timed sizes.
    cases = [
        (op, 1000, True, 0.5, 0) for op in ("pack_rows", "unpack_accumulate", "validate_reads")
    ]
    cases += [(op, 0, False, 0.2, 0) for op in ops]
    cases += [(op, 1000, False, 0.0, 0) for op in ops]
    cases += [(op, n, False, 0.2, args.repeats) for n in sizes for op in ops]
    for op, n, dup, fraction, repeats in cases:
        if time.perf_counter() - start > args.budget_s:
            report["errors"].append(f"time budget reached: skipped {op} n={n}")
            continue
        try:
            result = check_case(op, n, gen, dup, fraction, repeats, device=args.device)
            result["fraction"] = fraction
        except Exception as error:  # noqa: BLE001 - record and go on
            result = {"op": op, "n": n, "duplicates": dup, "match": False, "error": repr(error)}
            traceback.print_exc()
        report["results"].append(result)
        write()
        times = ""
        if "cuda_s" in result:
            times = (
                f" cpu {result['cpu_s'] * 1e3:9.3f} ms  cuda {result['cuda_s'] * 1e3:8.3f} ms"
                f"  cuda-ref {result['cuda_reference_s'] * 1e3:8.3f} ms"
            )
        state = "exact" if result.get("exact") else ("close" if result["match"] else "MISMATCH")
        label = (
            f"{op} n={n}"
            + (" dup" if dup else "")
            + (f" frac={fraction}" if fraction != 0.2 else "")
        )
        print(f"{label:<42} {state:<9}{times}", flush=True)
    report["all_match"] = all(r["match"] for r in report["results"]) and not report["errors"]
    write()
    print(f"all_match={report['all_match']} elapsed={report['elapsed_s']} s -> {args.out}")
    return 0 if report["all_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
