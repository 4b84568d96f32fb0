"""Primitive-sync extension (odin_ns.cuda): compiled ops against their torch references.

The CPU library is built once per session (and cached across runs in $ODIN_NS_EXT_DIR,
default ~/.cache/odin_ns/ext). Inputs are random and fresh each run; the seed is printed
(shown on failure) and can be fixed with ODIN_NS_TEST_SEED.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap

import pytest
import torch

from odin_ns.cuda import build, gpu_check, ops, reference
from odin_ns.optim import selective_adam_update_

OPS = ops.OPS


@pytest.fixture(scope="session")
def odin_ops():
    """torch.ops.odin with the CPU kernels loaded (one build for the whole session)."""
    compiler, reason = build.find_cxx_compiler()
    if compiler is None:
        pytest.skip(reason)
    result = build.load_cpu()
    state = "compiled" if result.compiled else "cached"
    print(f"CPU extension {state} in {result.seconds:.1f} s")
    return torch.ops.odin


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(os.environ.get("ODIN_NS_TEST_SEED") or secrets.randbelow(2**31))
    print(f"seed={seed} (rerun with ODIN_NS_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def run_both(odin_ops, op: str, inputs: dict):
    """Outputs of the compiled CPU op and of the reference on copies of ``inputs``."""
    compiled = gpu_check.run_op(getattr(odin_ops, op), op, gpu_check.copy_inputs(inputs, "cpu"))
    ref = gpu_check.run_op(getattr(reference, op), op, gpu_check.copy_inputs(inputs, "cpu"))
    return compiled, ref


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a float tensor: equality of bits (tells -0.0 from 0.0, NaN == NaN)."""
    ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def assert_equal_outputs(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert torch.equal(bits(a[name]), bits(b[name])), f"{name} differs"


# ---- every op, realistic random inputs ---------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [0, 1, 3000])
def test_op_matches_reference(odin_ops, gen, op, n):
    inputs = gpu_check.make_inputs(op, n, gen)
    compiled, ref = run_both(odin_ops, op, inputs)
    assert_equal_outputs(compiled, ref)


@pytest.mark.parametrize("op", ["pack_rows", "unpack_accumulate", "validate_reads"])
def test_duplicate_ids(odin_ops, gen, op):
    # pack copies a repeated row each time; accumulate adds it each time, in list order.
    inputs = gpu_check.make_inputs(op, 200, gen, fraction=2.0, duplicates=True)
    ids = inputs.get("ids", inputs.get("read_ids"))
    assert ids.unique().numel() < ids.numel()
    compiled, ref = run_both(odin_ops, op, inputs)
    assert_equal_outputs(compiled, ref)


@pytest.mark.parametrize("op", ["pack_rows", "unpack_accumulate", "validate_reads"])
def test_empty_ids(odin_ops, gen, op):
    inputs = gpu_check.make_inputs(op, 100, gen, fraction=0.0)
    compiled, ref = run_both(odin_ops, op, inputs)
    assert_equal_outputs(compiled, ref)
    if op == "unpack_accumulate":
        assert torch.equal(compiled["accum"], inputs["accum"])
        assert torch.equal(compiled["arrivals"], inputs["arrivals"])
    else:
        assert next(iter(compiled.values())).shape[0] == 0


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("op", ["pack_rows", "unpack_accumulate", "validate_reads"])
@pytest.mark.parametrize("bad", [-1, 100])
def test_out_of_range_ids_raise_before_writing(odin_ops, gen, impl, op, bad):
    inputs = gpu_check.make_inputs(op, 100, gen, fraction=0.3)
    key = "read_ids" if op == "validate_reads" else "ids"
    inputs[key][len(inputs[key]) // 2] = bad
    fn = getattr(odin_ops if impl == "compiled" else reference, op)
    run = gpu_check.copy_inputs(inputs, "cpu")
    with pytest.raises(ValueError, match="out of range"):
        fn(**run)
    if op == "unpack_accumulate":
        assert torch.equal(run["accum"], inputs["accum"])
        assert torch.equal(run["arrivals"], inputs["arrivals"])


# ---- op-specific cases ---------------------------------------------------------------------


def test_footprint_cull_edges(odin_ops, gen):
    """Boundaries, non-finite centres, thresholds hit exactly, integer radii."""
    inputs = gpu_check.make_inputs("footprint_cull", 2000, gen)
    w, h, margin = inputs["width"], inputs["height"], inputs["margin_px"]
    xy, radii, depths = inputs["means2d"], inputs["radii"], inputs["depths"]
    # Discs that exactly touch the image from outside (culled: distance == r).
    xy[0, :4] = torch.tensor([[-5.0, 10.0], [w + 5.0, 10.0], [10.0, -5.0], [10.0, h + 5.0]])
    radii[0, :4] = 5.0 - margin
    xy[0, 4:8] = torch.tensor(
        [[float("nan"), 1.0], [1.0, float("inf")], [-float("inf"), 1.0], [0.0, 0.0]]
    )
    radii[0, 4:8] = float("inf")
    depths[1, :10] = inputs["near_plane"]  # culled: depth must exceed near_plane (float32)
    inputs["opacities"][:10] = torch.tensor(inputs["opacity_threshold"], dtype=torch.float32)
    compiled, ref = run_both(odin_ops, "footprint_cull", inputs)
    assert_equal_outputs(compiled, ref)
    indptr, indices = compiled["indptr"], compiled["indices"]
    nnz_per_view = indptr.diff()
    assert (nnz_per_view > 0).all() and (nnz_per_view < 2000).all()  # the test is not vacuous
    assert 7 in indices[: indptr[1]].tolist() and 4 not in indices[: indptr[1]].tolist()
    inputs["radii"] = radii.round().to(torch.int32)  # gsplat's integer radii
    compiled, ref = run_both(odin_ops, "footprint_cull", inputs)
    assert_equal_outputs(compiled, ref)


def test_pack_rows_dtypes_and_layouts(odin_ops, gen):
    n = 300
    ids = torch.randint(0, n, (120,), generator=gen)
    tensors = [
        torch.randn(n, 3, generator=gen, dtype=torch.float64),
        torch.randn(3, n, generator=gen).t(),  # non-contiguous
        torch.randn(n, generator=gen, dtype=torch.float16),  # 1-D
    ]
    out = odin_ops.pack_rows(ids, tensors)
    assert out.shape == (120, 7) and out.dtype == torch.float32
    assert torch.equal(out, reference.pack_rows(ids, tensors))


def _adam_case(gen, n, shape, dtype):
    full = (n, *shape)
    return dict(
        param=torch.randn(full, generator=gen, dtype=dtype),
        exp_avg=torch.zeros(full, dtype=dtype),
        exp_avg_sq=torch.zeros(full, dtype=dtype),
        versions=torch.zeros(n, dtype=torch.int64),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (3,), (15, 3)])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.3, 0.99)])
def test_selective_adam_matches_optim(odin_ops, gen, dtype, shape, betas):
    """Several steps, fresh masks: masked rows equal selective_adam_update_ bit for bit,
    unmasked rows keep their bits, versions of masked rows advance."""
    n, lr, eps = 700, 1e-2, 1e-15
    ours = _adam_case(gen, n, shape, dtype)
    theirs = {k: v.clone() for k, v in ours.items()}
    for step in range(1, 5):
        grad = torch.randn((n, *shape), generator=gen, dtype=dtype)
        mask = torch.rand(n, generator=gen) < 0.4
        before = {k: v.clone() for k, v in ours.items()}
        odin_ops.selective_adam_apply(
            ours["param"], grad, ours["exp_avg"], ours["exp_avg_sq"], mask, ours["versions"],
            lr, betas[0], betas[1], eps, step, step,
        )  # fmt: skip
        selective_adam_update_(
            theirs["param"], grad, theirs["exp_avg"], theirs["exp_avg_sq"], mask,
            lr, betas[0], betas[1], eps, step,
        )  # fmt: skip
        theirs["versions"][mask] = step
        for name in ("param", "exp_avg", "exp_avg_sq", "versions"):
            assert torch.equal(bits(ours[name]), bits(theirs[name])), f"{name} differs, step {step}"
            assert torch.equal(bits(ours[name][~mask]), bits(before[name][~mask])), f"{name} moved"
        assert not torch.equal(ours["param"][mask], before["param"][mask])


def test_selective_adam_default_cpu_kernels_and_cached_load(odin_ops):
    """With torch's DEFAULT (non-FMA) kernels the op still matches; a second process loads
    the cached library without compiling."""
    script = textwrap.dedent(
        """
        import torch
        from odin_ns.cuda import build, gpu_check, reference
        assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
        result = build.load_cpu()
        g = torch.Generator().manual_seed(0)
        for beta1 in (0.9, 0.3):
            inputs = gpu_check.make_inputs("selective_adam_apply", 5000, g)
            inputs["beta1"] = beta1
            runs = [gpu_check.copy_inputs(inputs, "cpu") for _ in range(2)]
            torch.ops.odin.selective_adam_apply(**runs[0])
            reference.selective_adam_apply(**runs[1])
            for name in ("param", "exp_avg", "exp_avg_sq", "versions"):
                assert torch.equal(runs[0][name], runs[1][name]), name
        print("compiled", result.compiled, "seconds", result.seconds)
        """
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[words.index("compiled") + 1] == "False"
    assert float(words[words.index("seconds") + 1]) < 5.0


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_bad_input_raises_value_error(odin_ops, gen, impl):
    lib = odin_ops if impl == "compiled" else reference
    n = 10
    ids = torch.arange(4)
    with pytest.raises(ValueError, match="int32"):
        lib.ready_mask(torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int32),
                       torch.zeros(n, dtype=torch.bool))  # fmt: skip
    with pytest.raises(ValueError, match="shape"):
        lib.unpack_accumulate(torch.zeros(4, 3), ids, torch.zeros(n, 2),
                              torch.zeros(n, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match="empty"):
        lib.pack_rows(ids, [])
    with pytest.raises(ValueError, match="step"):
        t = torch.zeros(n, 2)
        lib.selective_adam_apply(t, t.clone(), t.clone(), t.clone(),
                                 torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.int64),
                                 1e-3, 0.9, 0.999, 1e-15, 0, 1)  # fmt: skip
    with pytest.raises(ValueError, match="means2d"):
        lib.footprint_cull(torch.zeros(2, n, 3), torch.zeros(2, n), torch.zeros(2, n),
                           torch.zeros(n), 64, 48, 0.0, 0.01, 0.0)  # fmt: skip
    with pytest.raises(ValueError, match="contiguous"):
        lib.unpack_accumulate(torch.zeros(4, 3), ids, torch.zeros(3, n).t(),
                              torch.zeros(n, dtype=torch.int32))  # fmt: skip


# ---- dispatcher ---------------------------------------------------------------------------------


def test_dispatcher_routes_and_env_override(odin_ops, gen, monkeypatch):
    inputs = gpu_check.make_inputs("pack_rows", 500, gen)
    assert ops.status("cpu").compiled
    assert ops.implementation("pack_rows", "cpu") is odin_ops.pack_rows
    compiled = ops.pack_rows(**inputs)
    monkeypatch.setenv("ODIN_NS_EXT", "0")
    assert not ops.status("cpu").compiled
    assert ops.implementation("pack_rows", "cpu") is reference.pack_rows
    assert torch.equal(ops.pack_rows(**inputs), compiled)


def test_failed_build_falls_back_to_reference(gen, monkeypatch):
    def broken(verbose: bool = False):
        raise RuntimeError("Error building extension: error: simulated compiler failure")

    monkeypatch.setattr(build, "load_cpu", broken)
    ops._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="simulated compiler failure"):
            st = ops.status("cpu")
        assert not st.compiled and "simulated" in st.reason
        inputs = gpu_check.make_inputs("validate_reads", 300, gen)
        assert torch.equal(ops.validate_reads(**inputs), reference.validate_reads(**inputs))
    finally:
        ops._load.cache_clear()


def test_dispatcher_runs_in_place_on_parameters(odin_ops, gen):
    """nn.Parameter rows update in place without autograd complaints (ops run no_grad)."""
    inputs = gpu_check.make_inputs("selective_adam_apply", 200, gen)
    inputs["param"] = torch.nn.Parameter(inputs["param"])
    before = inputs["param"].detach().clone()
    ops.selective_adam_apply(**inputs)
    assert not torch.equal(inputs["param"].detach(), before)


# ---- CUDA --------------------------------------------------------------------------------------


def test_cuda_variant_compiles_and_registers():
    """Compile + link the CUDA library (no GPU needed) and check it registers CUDA kernels."""
    toolkit, reason = build.find_cuda_toolkit()
    if toolkit is None:
        pytest.skip(f"CUDA variant not buildable here: {reason}")
    result = build.load_cuda()
    state = "compiled" if result.compiled else "cached"
    print(f"CUDA extension {state} in {result.seconds:.1f} s (arch {build.cuda_arch_list()})")
    assert result.library.exists()
    for name in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"odin::{name}", "CUDA"), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: CUDA ops cannot run here")
@pytest.mark.parametrize("op", OPS)
def test_cuda_ops_match_cpu(gen, op):
    build.load_cuda()
    for n, dup, fraction in ((0, False, 0.2), (1000, True, 0.5), (20000, False, 0.2)):
        if dup and op not in ("pack_rows", "unpack_accumulate", "validate_reads"):
            continue
        result = gpu_check.check_case(op, n, gen, duplicates=dup, fraction=fraction)
        assert result["match"], result
