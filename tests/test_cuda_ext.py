"""Primitive-sync extension (odin_ns.cuda): compiled ops against their torch references.

Every op's compiled CPU kernel must equal its pure-torch reference bit for bit (random
sizes, repeated ids where defined, empty lists), and bad input must raise ValueError before
anything is written, in both. ``apply_ready_rows`` must also equal selective Adam /
torch.optim.Adam(foreach=False). The CPU library is built once per session (cached across
runs in $ODIN_NS_EXT_DIR, default ~/.cache/odin_ns/ext). Inputs are random and fresh each
run; the seed is printed (shown on failure) and can be fixed with ODIN_NS_TEST_SEED.
"""

from __future__ import annotations

import math
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

from odin_ns.cuda import build, cases, ops, reference
from odin_ns.optim import selective_adam_update_

OPS = ops.OPS
ID_OPS = (
    "pack_rows",
    "scatter_rows",
    "accumulate_ready_rows",
    "apply_ready_rows",
    "record_row_norms",
    "validate_reads",
)
ID_ARG = {
    "pack_rows": "ids",
    "scatter_rows": "ids",
    "accumulate_ready_rows": "positions",
    "apply_ready_rows": "ids",
    "record_row_norms": "ids",
    "validate_reads": "read_ids",
}


@pytest.fixture(scope="session")
def odin_ops():
    """torch.ops.odin with the CPU kernels loaded (one build for the whole session)."""
    compiler, reason = build.find_cxx_compiler()
    if compiler is None:
        pytest.skip(reason)
    result = build.load_cpu()
    state = "compiled" if result.compiled else "cached"
    print(f"CPU extension {state} in {result.seconds:.1f} s")
    assert ops.status("cpu").compiled
    return torch.ops.odin


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(os.environ.get("ODIN_NS_TEST_SEED") or secrets.randbelow(2**31))
    print(f"seed={seed} (rerun with ODIN_NS_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def compiled(op: str) -> Callable:
    """The compiled CPU op with the reference's Python signature."""
    fn = ops._compiled(op, "cpu")
    assert fn is not None, f"{op} has no compiled CPU kernel"
    return fn


def run_both(op: str, inputs: dict) -> tuple[dict, dict]:
    """Outputs of the compiled CPU op and of the reference on copies of ``inputs``."""
    ours = cases.run_op(compiled(op), op, cases.copy_inputs(inputs, "cpu"))
    ref = cases.run_op(getattr(reference, op), op, cases.copy_inputs(inputs, "cpu"))
    return ours, ref


def id_list(inputs: dict, op: str) -> torch.Tensor:
    """The id list of ``op``'s inputs a test inspects or corrupts (of accumulate's parts, the
    last: every part is checked before any is added)."""
    ids = inputs[ID_ARG[op]]
    return ids[-1] if isinstance(ids, list) else ids


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


def test_every_op_is_compiled(odin_ops):
    for op in OPS:
        assert ops.has_kernel(op, "cpu"), op
        assert ops.implementation(op, "cpu") is compiled(op), op


# ---- every op, random inputs ---------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [0, 1, 3000])
def test_op_matches_reference(odin_ops, gen, op, n):
    inputs = cases.make_inputs(op, n, gen)
    ours, ref = run_both(op, inputs)
    assert_equal_outputs(ours, ref)


@pytest.mark.parametrize("op", OPS)
def test_random_sizes_match_reference(odin_ops, gen, op):
    for _ in range(4):
        n = int(torch.randint(0, 5000, (1,), generator=gen))
        fraction = float(torch.rand(1, generator=gen)) * 1.5
        inputs = cases.make_inputs(op, n, gen, fraction=fraction)
        ours, ref = run_both(op, inputs)
        assert_equal_outputs(ours, ref)


@pytest.mark.parametrize("op", list(cases.DUPLICATES_DEFINED))
def test_duplicate_ids(odin_ops, gen, op):
    # pack copies a repeated row each time; accumulate adds it each time, in list order.
    inputs = cases.make_inputs(op, 200, gen, fraction=2.0, duplicates=True)
    ids = id_list(inputs, op)
    assert ids.unique().numel() < ids.numel()
    ours, ref = run_both(op, inputs)
    assert_equal_outputs(ours, ref)


@pytest.mark.parametrize("op", ID_OPS)
def test_empty_ids(odin_ops, gen, op):
    inputs = cases.make_inputs(op, 100, gen, fraction=0.0)
    ours, ref = run_both(op, inputs)
    assert_equal_outputs(ours, ref)
    if op in cases.INPLACE_OUTPUTS:  # nothing moved
        assert_equal_outputs(ours, cases.run_op(lambda **_: None, op, inputs))
    else:
        assert next(iter(ours.values())).shape[0] == 0


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("op", ID_OPS)
@pytest.mark.parametrize("bad", [-1, 100])
def test_out_of_range_ids_raise_before_writing(odin_ops, gen, impl, op, bad):
    inputs = cases.make_inputs(op, 100, gen, fraction=0.3)
    ids = id_list(inputs, op)
    if op in ("apply_ready_rows", "record_row_norms", "scatter_rows"):  # keep ids increasing:
        ids[0 if bad < 0 else -1] = bad  # corrupt an end
        if op != "scatter_rows":
            inputs["ready"][:] = True
    else:
        ids[len(ids) // 2] = bad
    fn = compiled(op) if impl == "compiled" else getattr(reference, op)
    run = cases.copy_inputs(inputs, "cpu")
    with pytest.raises(ValueError, match="out of range"):
        fn(**run)
    if op in cases.INPLACE_OUTPUTS:
        assert_equal_outputs(
            cases.run_op(lambda **_: None, op, run), cases.run_op(lambda **_: None, op, inputs)
        )


# ---- op-specific cases ---------------------------------------------------------------------


def test_footprint_cull_edges(odin_ops, gen):
    """Boundaries, non-finite centres, thresholds hit exactly, integer radii."""
    inputs = cases.make_inputs("footprint_cull", 2000, gen)
    w, h, margin = inputs["width"], inputs["height"], inputs["margin_px"]
    xy, radii, depths = inputs["means2d"], inputs["radii"], inputs["depths"]
    # Squares that exactly touch the image from outside (culled: gsplat's strict test).
    xy[0, :4] = torch.tensor([[-5.0, 10.0], [w + 5.0, 10.0], [10.0, -5.0], [10.0, h + 5.0]])
    radii[0, :4] = 5.0 - margin
    xy[0, 4:8] = torch.tensor(
        [[float("nan"), 1.0], [1.0, float("inf")], [-float("inf"), 1.0], [0.0, 0.0]]
    )
    radii[0, 4:8] = float("inf")
    depths[0, 4:8] = 1.0  # in front of the camera: only the centres decide these four
    depths[1, :10] = inputs["near_plane"]  # kept: depth >= near_plane, as in gsplat (float32)
    inputs["opacities"][:10] = torch.tensor(inputs["opacity_threshold"], dtype=torch.float32)
    ours, ref = run_both("footprint_cull", inputs)
    assert_equal_outputs(ours, ref)
    indptr, indices = ours["indptr"], ours["indices"]
    nnz_per_view = indptr.diff()
    assert (nnz_per_view > 0).all() and (nnz_per_view < 2000).all()  # the test is not vacuous
    assert 7 in indices[: indptr[1]].tolist() and 4 not in indices[: indptr[1]].tolist()
    inputs["radii"] = radii.round().to(torch.int32)  # gsplat's integer radii
    ours, ref = run_both("footprint_cull", inputs)
    assert_equal_outputs(ours, ref)


def test_pack_rows_dtypes_and_layouts(odin_ops, gen):
    n = 300
    ids = torch.randint(0, n, (120,), generator=gen)
    columns = [
        torch.randn(n, 3, generator=gen, dtype=torch.float64),
        torch.randn(3, n, generator=gen).t(),  # non-contiguous
        torch.randn(n, generator=gen, dtype=torch.float16),  # 1-D
    ]
    out = ops.pack_rows(ids, columns)
    assert out.shape == (120, 7) and out.dtype == torch.float32
    assert torch.equal(out, reference.pack_rows(ids, columns))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_scatter_rows_inverts_pack_rows(odin_ops, gen, impl):
    """The sharded engine's pushes into its cache, part after part: rows written back where
    pack_rows took them (a row two parts name holds the later part's), the buffers' trailing
    column (the push's evidence) unread, other rows untouched; ids not strictly increasing
    in any part raise before anything is written."""
    fn = compiled("scatter_rows") if impl == "compiled" else reference.scatter_rows
    inputs = cases.make_inputs("scatter_rows", 400, gen, fraction=0.3)
    before = cases.copy_inputs(inputs, "cpu")
    fn(**inputs)
    ids, buffers, columns = inputs["ids"], inputs["buffers"], inputs["columns"]
    width = sum(math.prod(c.shape[1:]) for c in columns)
    named_later = torch.zeros(400, dtype=torch.bool)
    for part, buffer in reversed(list(zip(ids, buffers, strict=True))):
        mine = ~named_later[part]
        assert torch.equal(ops.pack_rows(part[mine], columns), buffer[mine][:, :width])
        named_later[part] = True
    assert named_later.sum() < sum(len(part) for part in ids)  # parts overlapped
    for old, new in zip(before["columns"], columns, strict=True):
        assert torch.equal(old[~named_later], new[~named_later])
    run = cases.copy_inputs(before, "cpu")
    run["ids"][-1][[0, 1]] = run["ids"][-1][[1, 0]]
    with pytest.raises(ValueError, match=r"ids\[2\] must be strictly increasing"):
        fn(**run)
    for old, new in zip(before["columns"], run["columns"], strict=True):
        assert torch.equal(old, new)


def test_accumulate_ready_rows_in_rank_order(odin_ops, gen):
    """The engine's use: zeroed acc, every rank's part in one call, in rank order; equals
    the per-row sum in rank order, one call per part too, and rows not ready stay zero."""
    u, width = 500, cases.WIDTH
    ready = torch.rand(u, generator=gen) < 0.7
    positions = [cases.subset_ids(u, 300, gen) for _rank in range(3)]
    contribs = [cases.publication(len(p), gen) for p in positions]
    acc, by_part, want = torch.zeros(u, width), torch.zeros(u, width), torch.zeros(u, width)
    ops.accumulate_ready_rows(acc, ready, positions, contribs)
    for p, contrib in zip(positions, contribs, strict=True):
        ops.accumulate_ready_rows(by_part, ready, [p], [contrib])
        sel = ready[p]
        want[p[sel]] = want[p[sel]] + contrib[sel]
    assert torch.equal(bits(acc), bits(want))
    assert torch.equal(bits(by_part), bits(want))
    assert not acc[~ready].any()


def _adam_groups(gen, n, shapes, dtype):
    return dict(
        params=[torch.randn(n, *s, generator=gen, dtype=dtype) for s in shapes],
        exp_avgs=[torch.zeros(n, *s, dtype=dtype) for s in shapes],
        exp_avg_sqs=[torch.zeros(n, *s, dtype=dtype) for s in shapes],
    )


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.3, 0.99)])
def test_apply_ready_rows_matches_selective_adam(odin_ops, gen, impl, dtype, betas):
    """Several steps, fresh unions and masks: ready visible rows equal selective_adam_update_
    bit for bit, every other row keeps its bits, versions of ready rows become the step."""
    fn = compiled("apply_ready_rows") if impl == "compiled" else reference.apply_ready_rows
    n, shapes = 700, [(), (3,), (15, 3)]
    lrs, eps = [1e-2, 3e-3, 1e-4], [1e-15, 1e-8, 1e-15]
    ours = _adam_groups(gen, n, shapes, dtype)
    theirs = {k: [t.clone() for t in v] for k, v in ours.items()}
    versions = torch.full((n,), -1, dtype=torch.int64)
    want_versions = versions.clone()
    width = 1 + 1 + 3 + 45
    for step in range(6):
        ids = cases.subset_ids(n, 400, gen)
        ready = torch.rand(len(ids), generator=gen) < 0.8
        acc = torch.randn(len(ids), width, generator=gen) * 1e-2
        acc[:, -1] = torch.randint(0, 3, (len(ids),), generator=gen).float()
        before = {k: [t.clone() for t in v] for k, v in ours.items()}
        fn(**ours, ids=ids, acc=acc, ready=ready, lrs=lrs, betas=[betas] * 3, eps=eps,
           step=step, versions=versions)  # fmt: skip
        move = ready & (acc[:, -1] > 0)
        rows, off = ids[move], 0
        for g, s in enumerate(shapes):
            d = math.prod(s)
            grad = acc[move][:, off : off + d].reshape(len(rows), *s).to(dtype)
            off += d
            selective_adam_update_(
                theirs["params"][g], grad, theirs["exp_avgs"][g], theirs["exp_avg_sqs"][g],
                rows, lrs[g], betas[0], betas[1], eps[g], step + 1,
            )  # fmt: skip
        want_versions[ids[ready]] = step
        still = torch.ones(n, dtype=torch.bool)
        still[rows] = False
        for name in ours:
            for g in range(len(shapes)):
                a, b = ours[name][g], theirs[name][g]
                assert torch.equal(bits(a), bits(b)), f"{name}[{g}] differs at step {step}"
                assert torch.equal(bits(a[still]), bits(before[name][g][still])), f"{name} moved"
        assert torch.equal(versions, want_versions)
        assert rows.numel() > 0 and not torch.equal(
            ours["params"][2][rows], before["params"][2][rows]
        )


def test_apply_ready_rows_equals_torch_adam(odin_ops, gen):
    """Rows visible at every step follow torch.optim.Adam(foreach=False) bit for bit."""
    n = 64
    params = [torch.randn(n, 3, generator=gen), torch.randn(n, generator=gen)]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    adam = torch.optim.Adam(
        [{"params": [torch_params[0]], "lr": 1e-2}, {"params": [torch_params[1]], "lr": 3e-3}],
        betas=(0.9, 0.999),
        eps=1e-15,
        foreach=False,
    )
    ids, versions = torch.arange(n), torch.zeros(n, dtype=torch.int64)
    for step in range(5):
        acc = torch.randn(n, 5, generator=gen)
        acc[:, -1] = 1.0
        ops.apply_ready_rows(params, exp_avgs, exp_avg_sqs, ids, acc, torch.ones(n, dtype=torch.bool),
                             [1e-2, 3e-3], [(0.9, 0.999)] * 2, [1e-15] * 2, step, versions)  # fmt: skip
        torch_params[0].grad, torch_params[1].grad = acc[:, :3].clone(), acc[:, 3].clone()
        adam.step()
        for ours, theirs in zip(params, torch_params, strict=True):
            assert torch.equal(bits(ours), bits(theirs.detach())), f"step {step}"
    assert (versions == 4).all()


def test_apply_ready_rows_default_cpu_kernels_and_cached_load(odin_ops):
    """With torch's DEFAULT (non-FMA) kernels the op still matches; a second process loads
    the cached library without compiling."""
    script = textwrap.dedent(
        """
        import torch
        from odin_ns.cuda import build, cases, ops, reference
        assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
        result = build.load_cpu()
        g = torch.Generator().manual_seed(0)
        for beta1 in (0.9, 0.3):
            inputs = cases.make_inputs("apply_ready_rows", 5000, g)
            inputs["betas"] = [(beta1, 0.999)] * len(inputs["betas"])
            runs = [cases.copy_inputs(inputs, "cpu") for _ in range(2)]
            a = cases.run_op(ops._compiled("apply_ready_rows", "cpu"), "apply_ready_rows", runs[0])
            b = cases.run_op(reference.apply_ready_rows, "apply_ready_rows", runs[1])
            for name in a:
                assert torch.equal(a[name], b[name]), name
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


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_record_row_norms_is_the_gradient_norm(odin_ops, gen, impl):
    """An apply's evidence: each ready row's L2 norm over its gradient columns (torch's norm,
    up to float rounding) and its visible flag; rows not ready, and rows outside the union,
    keep theirs bit for bit (NaN too)."""
    inputs = cases.make_inputs("record_row_norms", 2000, gen, fraction=0.4)
    run = cases.copy_inputs(inputs, "cpu")
    (compiled("record_row_norms") if impl == "compiled" else reference.record_row_norms)(**run)
    ids, acc, ready = inputs["ids"], inputs["acc"], inputs["ready"]
    assert ready.any() and (~ready).any() and (acc[ready, -1] == 0).any()
    want = acc[ready, :-1].norm(dim=1)
    torch.testing.assert_close(run["norms"][ids[ready]], want, rtol=1e-6, atol=0.0)
    assert torch.equal(run["active"][ids[ready]], acc[ready, -1] > 0)
    kept = torch.ones(inputs["norms"].shape[0], dtype=torch.bool)
    kept[ids[ready]] = False
    assert torch.equal(bits(run["norms"][kept]), bits(inputs["norms"][kept]))
    assert torch.equal(run["active"][kept], inputs["active"][kept])


# ---- bad input ---------------------------------------------------------------------------------


def _bad_cases(gen) -> list[tuple[str, dict, str]]:
    """(op, inputs, message) triples, each input set wrong in one way."""
    out = []
    out.append(("pack_rows", {"ids": torch.arange(4), "columns": []}, "empty"))
    acc_in = cases.make_inputs("accumulate_ready_rows", 50, gen, fraction=0.5)
    narrow = [*acc_in["contribs"][:-1], acc_in["contribs"][-1][:, :7]]  # the last part wrong
    out.append(("accumulate_ready_rows", {**acc_in, "contribs": narrow}, r"contribs\[2\].*shape"))
    out.append(("accumulate_ready_rows", {**acc_in, "contribs": acc_in["contribs"][:-1]},
                "2 contributions"))  # fmt: skip
    out.append(("accumulate_ready_rows", {**acc_in, "ready": acc_in["ready"].int()}, "bool"))
    out.append(("accumulate_ready_rows", {**acc_in, "acc": acc_in["acc"].t().contiguous().t()},
                "contiguous"))  # fmt: skip
    ap = cases.make_inputs("apply_ready_rows", 50, gen, fraction=0.5)
    out.append(("apply_ready_rows", {**ap, "step": -1}, "step"))
    out.append(("apply_ready_rows", {**ap, "acc": ap["acc"][:, :-1].contiguous()}, "columns"))
    out.append(("apply_ready_rows", {**ap, "ids": ap["ids"].flip(0)}, "increasing"))
    out.append(("apply_ready_rows", {**ap, "lrs": ap["lrs"][:-1]}, "groups"))
    out.append(("apply_ready_rows", {**ap, "betas": [(1.0, 0.999)] * 6}, "betas"))
    out.append(("apply_ready_rows", {**ap, "versions": ap["versions"].int()}, "int64"))
    params = list(ap["params"])
    params[4] = params[4].double()
    out.append(("apply_ready_rows", {**ap, "params": params}, "exp_avgs"))
    rec = cases.make_inputs("record_row_norms", 50, gen, fraction=0.5)
    out.append(("record_row_norms", {**rec, "ids": rec["ids"].flip(0)}, "increasing"))
    out.append(("record_row_norms", {**rec, "active": rec["active"][:-1]}, "active"))
    out.append(("record_row_norms", {**rec, "norms": rec["norms"].double()}, "float32"))
    out.append(("record_row_norms", {**rec, "ready": rec["ready"][:-1]}, "ready"))
    cull = cases.make_inputs("footprint_cull", 10, gen)
    out.append(("footprint_cull", {**cull, "means2d": torch.zeros(4, 10, 3)}, "means2d"))
    vr = cases.make_inputs("validate_reads", 50, gen)
    out.append(("validate_reads", {**vr, "required": vr["required"][:-1]}, "shape"))
    return out


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_bad_input_raises_value_error_before_writing(odin_ops, gen, impl):
    for op, inputs, message in _bad_cases(gen):
        fn = compiled(op) if impl == "compiled" else getattr(reference, op)
        run = cases.copy_inputs(inputs, "cpu")
        with pytest.raises(ValueError, match=message):
            fn(**run)
        if op in cases.INPLACE_OUTPUTS:
            untouched = cases.run_op(lambda **_: None, op, inputs)
            assert_equal_outputs(cases.run_op(lambda **_: None, op, run), untouched)


# ---- dispatcher ---------------------------------------------------------------------------------


def test_dispatcher_routes_and_env_override(odin_ops, gen, monkeypatch):
    inputs = cases.make_inputs("pack_rows", 500, gen)
    assert ops.implementation("pack_rows", "cpu") is odin_ops.pack_rows
    ours = ops.pack_rows(**inputs)
    monkeypatch.setenv("ODIN_NS_EXT", "0")
    assert not ops.status("cpu").compiled
    assert ops.implementation("pack_rows", "cpu") is reference.pack_rows
    assert torch.equal(ops.pack_rows(**inputs), ours)


def test_failed_build_falls_back_to_reference(gen, monkeypatch):
    def broken(verbose: bool = False):
        raise RuntimeError("Error building extension: error: simulated compiler failure")

    monkeypatch.setattr(build, "load_cpu", broken)
    ops._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="simulated compiler failure"):
            st = ops.status("cpu")
        assert not st.compiled and "simulated" in st.reason
        inputs = cases.make_inputs("validate_reads", 300, gen)
        assert torch.equal(ops.validate_reads(**inputs), reference.validate_reads(**inputs))
    finally:
        ops._load.cache_clear()


def test_missing_or_stale_op_falls_back_per_op(odin_ops, gen, monkeypatch):
    """An op the library lacks, or registers with another signature, runs its reference."""
    monkeypatch.setattr(ops, "has_kernel", lambda name, device_type: name != "pack_rows")
    ops._compiled.cache_clear()
    try:
        assert ops.implementation("pack_rows", "cpu") is reference.pack_rows
        assert ops.implementation("validate_reads", "cpu") is odin_ops.validate_reads
    finally:
        ops._compiled.cache_clear()

    def renamed_args(ids, versions, required):  # a signature the library does not have
        raise AssertionError("must not be called")

    monkeypatch.setattr(reference, "validate_reads", renamed_args)
    try:
        with pytest.warns(RuntimeWarning, match="rebuild"):
            assert ops._compiled("validate_reads", "cpu") is None
    finally:
        ops._compiled.cache_clear()


def test_dispatcher_runs_in_place_on_parameters(odin_ops, gen):
    """nn.Parameter rows update in place without autograd complaints (ops run no_grad)."""
    inputs = cases.make_inputs("apply_ready_rows", 200, gen)
    inputs["params"] = [torch.nn.Parameter(p) for p in inputs["params"]]
    before = inputs["params"][0].detach().clone()
    ops.apply_ready_rows(**inputs)
    assert not torch.equal(inputs["params"][0].detach(), before)


@pytest.mark.parametrize("ext", ["compiled", "reference"])
def test_row_ops_resolved_once_equal_the_module_functions(odin_ops, gen, monkeypatch, ext):
    """``RowOps`` (the engine's ops, resolved when it binds) holds the compiled ops as they
    are, or with ``ODIN_NS_EXT=0`` the twins under no_grad; either way its results on
    parameters that require grad are the module functions' bit for bit."""
    if ext == "reference":
        monkeypatch.setenv("ODIN_NS_EXT", "0")
    row_ops = ops.RowOps("cpu")
    if ext == "compiled":
        assert row_ops.pack_rows is odin_ops.pack_rows
        assert row_ops.scatter_rows is odin_ops.scatter_rows

    def leaf_parameters(inputs: dict) -> dict:
        inputs = cases.copy_inputs(inputs, "cpu")
        for key in ("params", "columns"):  # written in place by scatter and apply
            if key in inputs:
                inputs[key] = [torch.nn.Parameter(t) for t in inputs[key]]
        return inputs

    for op in (
        "pack_rows", "scatter_rows", "accumulate_ready_rows", "apply_ready_rows", "record_row_norms"
    ):  # fmt: skip
        inputs = cases.make_inputs(op, 300, gen)
        theirs = cases.run_op(getattr(ops, op), op, leaf_parameters(inputs))
        ours = cases.run_op(getattr(row_ops, op), op, leaf_parameters(inputs))
        assert_equal_outputs(
            {k: v.detach() for k, v in ours.items()}, {k: v.detach() for k, v in theirs.items()}
        )


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
        if dup and op not in cases.DUPLICATES_DEFINED:
            continue
        inputs = cases.make_inputs(op, n, gen, fraction=fraction, duplicates=dup)
        fn = ops._compiled(op, "cpu")
        want = cases.run_op(fn, op, cases.copy_inputs(inputs, "cpu"))
        got = cases.run_op(ops._compiled(op, "cuda"), op, cases.copy_inputs(inputs, "cuda"))
        result = cases.compare(op, want, got)
        assert result["match"], result


# ---- production caller: footprints ------------------------------------------------------------


def test_compute_footprints_culls_through_the_op(odin_ops, monkeypatch):
    """compute_footprints' final per-pair test is ops.footprint_cull: the compiled kernel and
    the reference give the same CSR."""
    from odin_ns.schedule import compute_footprints
    from odin_ns.schedule import footprint as fp_module

    g = torch.Generator().manual_seed(0)
    n, v = 3000, 5
    means = torch.randn(n, 3, generator=g) * 2.0
    scales = torch.rand(n, 3, generator=g) * 0.3 + 0.01
    quats = torch.randn(n, 4, generator=g)
    opac = torch.rand(n, generator=g)
    viewmats = torch.eye(4).repeat(v, 1, 1)
    viewmats[:, 0, 3] = torch.linspace(-2, 2, v)
    viewmats[:, 2, 3] = 6.0
    Ks = torch.tensor([[60.0, 0, 32], [0, 60.0, 24], [0, 0, 1]]).expand(v, 3, 3).clone()
    calls = []
    real = fp_module.ext_ops.footprint_cull

    def spy(*args):
        calls.append(ops.implementation("footprint_cull", args[0].device))
        return real(*args)

    monkeypatch.setattr(fp_module.ext_ops, "footprint_cull", spy)
    F = compute_footprints(means, scales, quats, opac, viewmats, Ks, 64, [48, 48, 40, 48, 48])
    assert calls and all(c is odin_ops.footprint_cull for c in calls)
    assert len(calls) == 2  # one call per distinct image size
    monkeypatch.setenv("ODIN_NS_EXT", "0")
    F_ref = compute_footprints(means, scales, quats, opac, viewmats, Ks, 64, [48, 48, 40, 48, 48])
    assert calls[-1] is reference.footprint_cull
    assert F.nnz > 100 and (F != F_ref).nnz == 0


def test_value_reading_checks_run_on_host_tensors_or_when_debugging(monkeypatch):
    """Range and order checks read values: always on the host, on an accelerator only with
    ODIN_NS_DEBUG_CHECKS=1 (a read there waits for the stream)."""
    from odin_ns.cuda.reference import reads_values

    host, device = torch.zeros(2), torch.zeros(2, device="meta")
    monkeypatch.delenv("ODIN_NS_DEBUG_CHECKS", raising=False)
    assert reads_values(host) and not reads_values(device)
    with pytest.raises(ValueError, match="out of range"):
        reference.pack_rows(torch.tensor([5]), [torch.zeros(3, 2)])
    rows = reference.pack_rows(torch.tensor([5], device="meta"), [torch.zeros(3, 2, device="meta")])
    assert rows.shape == (1, 2)  # not read back on the device
    monkeypatch.setenv("ODIN_NS_DEBUG_CHECKS", "1")
    assert reads_values(device)
