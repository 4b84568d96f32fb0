"""MCMC position noise without communication: a counter-based draw, applied lazily.

gsplat's ``MCMCStrategy`` perturbs every Gaussian's mean after every optimizer step
(``inject_noise_to_position``)::

    noise_s(p) = Sigma_p @ (z_s(p) * gate(opacity_p)) * lr_s * noise_lr
    gate(a)    = 1 / (1 + exp(-100 * ((1 - a) - 0.995)))
    Sigma_p    = R(q_p) diag(exp(scales_p))^2 R(q_p)^T

where ``z_s(p)`` is a standard normal [3] and ``lr_s`` the means' learning rate gsplat passes
at step s (``get_last_lr()`` after the scheduler step, i.e. nerfstudio's schedule at s + 1).
The noise of step s reads p's opacity, scales and quats as they are after step s's Adam
update, and never reads the means, so between two writes of p every noise step reads the
same state. Here:

- ``z_s(p)`` is a counter-based function of (seed, step, global primitive id): a splitmix64
  hash of the int64 counters, two 32-bit uniforms, Box-Muller. Every replica draws the same
  number for the same (step, primitive), on any device, with no communication.
- Every transcendental (log, cos, exp) is evaluated in float64 with +, -, *, / and sqrt
  only (range reduction + polynomials), which IEEE rounds exactly and which torch computes
  the same way in its vectorized and scalar loops and on CUDA. So the noise of a row does
  not depend on which other rows share the call: eager (every row every step) and lazy
  (a row catches up later) give the same bits. The final noise is cast to float32 and
  added to the float32 means one step at a time, in step order, as gsplat adds it.
- ``noise_version[p]`` is the last step whose noise p has received. ``catch_up_noise_``
  brings rows up to a step; ``MCMCNoise`` is the stateful wrapper the runtime's update log
  calls around each update (``before_apply`` / ``after_apply``), the session calls before a
  rank renders and at drains, and the single-process model calls every step.

docs/architecture.md ("MCMC noise") states the order in which this composes with updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from odin_ns.runtime.uploads import upload

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_LN2 = math.log(2.0)
_TWO_PI = 2.0 * math.pi
_INV_2_32 = 1.0 / 4294967296.0
# Pairs (row, step) computed at once; bounds the float64 temporaries of one call.
_CHUNK_PAIRS = 1 << 17


def _signed(x: int) -> int:
    """A uint64 bit pattern as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _srl(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 tensors read as uint64 bit patterns."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: Tensor) -> Tensor:
    """splitmix64's finalizer, elementwise on int64 (wrapping, uint64 bit patterns)."""
    x = x ^ _srl(x, 30)
    x = x * _signed(_MIX1)
    x = x ^ _srl(x, 27)
    x = x * _signed(_MIX2)
    return x ^ _srl(x, 31)


def counter_hash(seed: int, steps: Tensor, ids: Tensor, component: int) -> Tensor:
    """[P] int64 (uint64 bits): hash of (seed, step, id, component), elementwise.

    Args:
        seed: the run's noise seed.
        steps: [P] int64 global steps.
        ids: [P] int64 global primitive ids (same device as ``steps``).
        component: 0, 1 or 2 (the coordinate of the draw).
    """
    key = _signed(seed * _GOLDEN + 0x632BE59BD9B4E019)
    h = mix64((steps * 4 + component) ^ key)
    return mix64(h + ids * _signed(_GOLDEN))


def _log64(u: Tensor) -> Tensor:
    """ln(u) for float64 u > 0 with +, -, *, / only (exact-rounding ops)."""
    m, e = torch.frexp(u)  # u = m * 2^e, m in [0.5, 1)
    small = m < math.sqrt(0.5)
    m = torch.where(small, m * 2.0, m)  # m in [sqrt(1/2), sqrt(2))
    e = torch.where(small, e - 1, e).to(torch.float64)
    z = (m - 1.0) / (m + 1.0)  # |z| <= 0.1716
    w = z * z
    p = torch.full_like(w, 1.0 / 23.0)
    for k in range(21, 0, -2):  # atanh series: ln m = 2 z (1 + w/3 + w^2/5 + ...)
        p = p * w + 1.0 / k
    return 2.0 * z * p + e * _LN2


def _cos_2pi64(v: Tensor) -> Tensor:
    """cos(2 pi v) for float64 v with +, -, *, / only."""
    a = (v - torch.round(v)).abs()  # [0, 0.5]
    flip = a > 0.25
    b = torch.where(flip, 0.5 - a, a)  # [0, 0.25]
    x = b * _TWO_PI
    y = x * x  # <= (pi/2)^2
    c = torch.full_like(y, 1.0 / math.factorial(22))
    for k in range(10, -1, -1):  # Taylor series of cos to x^22
        c = c * y * -1.0 + 1.0 / math.factorial(2 * k)
    return torch.where(flip, -c, c)


def _exp64(x: Tensor) -> Tensor:
    """exp(x) for float64 x in [-700, 700] with +, -, *, / and integer bit assembly."""
    x = x.clamp(-700.0, 700.0)
    k = torch.round(x / _LN2)
    r = x - k * _LN2  # |r| <~ 0.35
    p = torch.full_like(r, 1.0 / math.factorial(14))
    for n in range(13, -1, -1):  # Taylor series to r^14
        p = p * r + 1.0 / math.factorial(n)
    two_k = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)  # exactly 2^k
    return p * two_k


def counter_normal(seed: int, steps: Tensor, ids: Tensor) -> Tensor:
    """[P, 3] float64 standard normals, a pure function of (seed, step, id): every replica
    and every device draws the same numbers, whatever else is in the call.

    Args:
        seed: the run's noise seed.
        steps: [P] int64 global steps.
        ids: [P] int64 global primitive ids.
    """
    cols = []
    for c in range(3):
        h = counter_hash(seed, steps, ids, c)
        u1 = (_srl(h, 32).to(torch.float64) + 0.5) * _INV_2_32  # (0, 1)
        u2 = ((h & 0xFFFFFFFF).to(torch.float64) + 0.5) * _INV_2_32
        cols.append(torch.sqrt(-2.0 * _log64(u1)) * _cos_2pi64(u2))
    return torch.stack(cols, dim=1)


def noise_basis(scales: Tensor, quats: Tensor, opacities: Tensor) -> Tensor:
    """[K, 10] float64: per row the covariance Sigma (row-major, 9) and the opacity gate.

    Args:
        scales: [K, 3] log-scales (the parameter).
        quats: [K, 4] unnormalized (w, x, y, z) quaternions (the parameter).
        opacities: [K] or [K, 1] opacity logits (the parameter).
    """
    s = _exp64(scales.to(torch.float64))  # [K, 3]
    q = quats.to(torch.float64)
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    norm = torch.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    rot = [
        [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)],
        [2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)],
        [2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)],
    ]
    m = [[rot[i][j] * s[:, j] for j in range(3)] for i in range(3)]  # R diag(s)
    sigma = [
        m[i][0] * m[k][0] + m[i][1] * m[k][1] + m[i][2] * m[k][2]
        for i in range(3)
        for k in range(3)
    ]
    logit = opacities.reshape(-1).to(torch.float64)
    alpha = 1.0 / (1.0 + _exp64(-logit))
    gate = 1.0 / (1.0 + _exp64(-100.0 * ((1.0 - alpha) - 0.995)))
    return torch.stack([*sigma, gate], dim=1)


def noise_from_basis(basis: Tensor, normal: Tensor, scaler: Tensor) -> Tensor:
    """[P, 3] float32 noise: Sigma @ (z * gate * scaler), gsplat's formula.

    Args:
        basis: [P, 10] float64 (``noise_basis`` rows).
        normal: [P, 3] float64 standard normals.
        scaler: [P] float64 ``lr * noise_lr`` of each pair's step.
    """
    v = normal * (basis[:, 9] * scaler).unsqueeze(1)  # [P, 3]
    out = [
        basis[:, 3 * i] * v[:, 0] + basis[:, 3 * i + 1] * v[:, 1] + basis[:, 3 * i + 2] * v[:, 2]
        for i in range(3)
    ]
    return torch.stack(out, dim=1).to(torch.float32)


@torch.no_grad()
def catch_up_noise_(
    params: Mapping[str, Tensor],
    noise_version: Tensor,
    rows: Tensor,
    through: int,
    scaler_at: Callable[[int], float],
    seed: int,
) -> int:
    """Add to ``rows`` the noise of every step in ``(noise_version[row], through]``, in step
    order, and set their noise version to ``through`` (rows already there are untouched).

    Exact only if no row changes state (opacity, scales, quats) inside its catch-up range,
    i.e. ``through`` is before the row's next unapplied write: the caller's contract.

    Args:
        params: ``means`` [N, 3] (updated in place), ``scales`` [N, 3], ``quats`` [N, 4],
            ``opacities`` [N, 1] or [N], all on one device.
        noise_version: [N] int64 host tensor, updated in place.
        rows: [K] int64 host tensor of unique primitive ids.
        through: the last step whose noise the rows must carry.
        scaler_at: step s -> gsplat's ``lr * noise_lr`` of step s.
        seed: the noise seed (the same on every replica).

    Returns:
        the number of (row, step) noise terms added.
    """
    rows = rows.to(torch.int64).cpu()
    gaps = (through - noise_version[rows]).clamp_min(0)
    keep = gaps > 0
    if not bool(keep.any()):
        return 0
    rows, gaps = rows[keep], gaps[keep]
    lag = int(gaps.max())
    first = through - lag + 1
    scalers = torch.tensor([scaler_at(s) for s in range(first, through + 1)], dtype=torch.float64)
    # Pairs (row, step) in step order; within one step every row appears at most once, in
    # the order of ``rows``.
    k = rows.numel()
    if int(gaps.min()) == lag:  # every row as far behind (eager noise, an apply's rows)
        pair_row = torch.arange(k).repeat(lag)
        pair_step = torch.arange(first, through + 1).repeat_interleave(k)
        per_step = [k] * lag
    else:  # row by row, then a stable sort by step (the sort alone: 30 ms at 1M rows)
        pair_row = torch.repeat_interleave(torch.arange(k), gaps)
        pair_step = torch.repeat_interleave(noise_version[rows] + 1, gaps)
        pair_step += torch.arange(pair_row.numel()) - torch.repeat_interleave(
            torch.cumsum(gaps, 0) - gaps, gaps
        )
        order = torch.argsort(pair_step, stable=True)
        pair_row, pair_step = pair_row[order], pair_step[order]
        per_step = torch.bincount(pair_step - first, minlength=lag).tolist()

    means = params["means"]
    device = means.device
    # (host lists go up without the host waiting for the device's queued work: ``upload``)
    rows_dev = upload(rows, device)
    scalers_dev = upload(scalers, device)
    basis = noise_basis(
        params["scales"][rows_dev], params["quats"][rows_dev], params["opacities"][rows_dev]
    )
    start = 0
    while start < pair_row.numel():
        # whole steps per chunk, at least one
        stop, n = start, 0
        while n < len(per_step) and (stop == start or stop - start + per_step[n] <= _CHUNK_PAIRS):
            stop += per_step[n]
            n += 1
        per_step = per_step[n:]
        pr = upload(pair_row[start:stop], device)
        ps = upload(pair_step[start:stop], device)
        noise = noise_from_basis(
            basis[pr], counter_normal(seed, ps, rows_dev[pr]), scalers_dev[ps - first]
        )
        ids = rows_dev[pr]
        # sequential adds, one step at a time (float addition is not associative); the
        # steps' bounds from the host's copy
        bounds = torch.unique_consecutive(pair_step[start:stop], return_counts=True)[1].tolist()
        offset = 0
        for count in bounds:
            sel = slice(offset, offset + count)
            means.data[ids[sel]] = means.data[ids[sel]] + noise[sel]
            offset += count
        start = stop
    noise_version[rows] = through
    return int(pair_row.numel())


class MCMCNoise:
    """Per-row noise versions and the calls that keep them, for one replica.

    Args:
        params: the model's Gaussian parameters (``means``, ``scales``, ``quats``,
            ``opacities``), read at every call (gsplat's structural ops replace entries).
        noise_lr: gsplat's ``MCMCStrategy.noise_lr``.
        seed: the noise seed (identical on every replica).
        num_rows: N at construction; every row starts at ``start_step - 1``.
        start_step: the first step that has not been trained yet.
        skip_step: steps whose noise the runtime must not add after the update (structural
            steps: the densifier adds it after relocation, as gsplat does).

    ``lr_at`` (step -> the means' learning rate, nerfstudio's schedule) must be set before
    the first catch-up; the noise of step s uses ``lr_at(s + 1)``, the rate gsplat reads
    after the scheduler step.
    """

    def __init__(
        self,
        params: Mapping[str, Tensor],
        noise_lr: float,
        seed: int,
        num_rows: int,
        start_step: int = 0,
        skip_step: Callable[[int], bool] | None = None,
    ):
        self.params = params
        self.noise_lr = float(noise_lr)
        self.seed = int(seed)
        self.version = torch.full((num_rows,), start_step - 1, dtype=torch.int64)  # [N] host
        self.skip_step = skip_step
        self.lr_at: Callable[[int], float] | None = None
        self.terms = 0  # (row, step) noise terms added so far

    def scaler_at(self, step: int) -> float:
        if self.lr_at is None:
            raise RuntimeError("MCMCNoise.lr_at (the means' learning-rate schedule) is not set")
        return float(self.lr_at(step + 1)) * self.noise_lr

    def catch_up(self, rows: Tensor, through: int) -> None:
        """Rows [K] int64 (host or device) carry the noise of every step <= ``through``."""
        self.terms += catch_up_noise_(
            self.params, self.version, rows.cpu(), int(through), self.scaler_at, self.seed
        )

    def catch_up_all(self, through: int) -> None:
        """Every row carries the noise of every step <= ``through`` (drains)."""
        self.catch_up(torch.arange(self.version.numel()), through)

    def resize(self, num_rows: int, version: int) -> None:
        """After a structural change: N rows, all at noise version ``version`` (call with
        every row caught up; relocated rows keep their index)."""
        self.version = torch.full((num_rows,), int(version), dtype=torch.int64)

    # ------------------------------------------------ the update log's apply hook
    def before_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` [K] (host int64) are about to get step ``step``'s Adam update."""
        if bool((self.version[ids] >= step).any()):
            raise RuntimeError(
                f"noise of step >= {step} was added before step {step}'s update (a bug)"
            )
        self.catch_up(ids, step - 1)

    def after_apply(self, step: int, ids: Tensor) -> None:
        """Rows ``ids`` [K] (host int64) got step ``step``'s Adam update: add noise ``step``."""
        if self.skip_step is None or not self.skip_step(step):
            self.catch_up(ids, step)


__all__ = [
    "MCMCNoise",
    "catch_up_noise_",
    "counter_hash",
    "counter_normal",
    "mix64",
    "noise_basis",
    "noise_from_basis",
]
