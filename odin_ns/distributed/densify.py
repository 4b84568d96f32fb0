"""Replicated densification: gsplat's strategies applied identically on every replica.

This is the only module that calls gsplat's private strategy functions (``_grow_gs``,
``_prune_gs`` of ``DefaultStrategy``; ``_relocate_gs``, ``_add_new_gs`` of
``MCMCStrategy``), pinned to gsplat 1.4.0 by ``tests/test_densify.py``. Why private: the public
``step_post_backward`` accumulates the step's statistics *and* refines in one call, but in a
distributed run the statistics of a refine step must first be summed across ranks.

Per step each rank accumulates its own view's statistics over the rows it rendered
(``accumulate``). At a structural step (refine or opacity reset), after the runtime has
drained, ``apply`` sums the statistics across ranks (one fixed sequence of collectives,
issued by every rank whatever its local state), then grows, prunes and resets with the same
random stream on every replica, so every replica makes the same structural change.

``MCMCDensifier`` is the same interface over ``MCMCStrategy``: its refine steps relocate dead
Gaussians and sample new ones (seeded the same way on every replica); it keeps no per-step
statistics (relocation reads only the replicated opacities and scales, identical on every
replica after the drain), and it orders the strategy's position noise around the structural
change as gsplat does (``odin_ns.distributed.mcmc_noise``). ``make_densifier`` picks the
adapter from the strategy's type.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
from gsplat.strategy import DefaultStrategy, MCMCStrategy
from gsplat.strategy import ops as gsplat_ops
from gsplat.strategy.ops import reset_opa
from torch import Tensor

from odin_ns.distributed.mcmc_noise import MCMCNoise

_PARENT_KEY = "odin_parent_row"  # held in the strategy state only during a refine

# (state key, how ranks combine it) in the fixed order every rank issues the collectives.
_REDUCTIONS = (
    ("grad2d", dist.ReduceOp.SUM),
    ("count", dist.ReduceOp.SUM),
    ("radii", dist.ReduceOp.MAX),
)


def all_reduce_statistics(state: dict, group=None) -> None:
    """Sum (max for radii) the [N] statistics over ``group``'s ranks in place, the same keys
    in the same order on every rank (``ensure_state``)."""
    for key, op in _REDUCTIONS:
        if key in state and state[key] is not None:
            dist.all_reduce(state[key], op=op, group=group)


class ReplicatedDensifier:
    """gsplat's DefaultStrategy for replicas that each see a subset of the rows per step.

    Args:
        strategy: the model's ``DefaultStrategy`` (its thresholds and schedule).
        state: the model's strategy state dict (``grad2d``, ``count``, ``radii``), updated in
            place; allocated here eagerly so every rank holds the same tensors.
        seed: the run's seed; structural step ``s`` draws from a generator seeded by
            ``(seed, s)`` on every replica.
        group: the process group that sums the statistics at a refine (the session's gloo
            group, as the sharded layout's: on GPUs the default group is NCCL, whose sums
            of three or more ranks' floats come in another order, and the two layouts'
            refines would part in their last bits); None: the default group.
    """

    returns_parents = True  # ``apply`` says where each row came from

    def __init__(self, strategy: DefaultStrategy, state: dict, seed: int, group=None):
        self.strategy = strategy
        self.state = state
        self.seed = int(seed)
        self.group = group

    # ---------------------------------------------------------------- schedule
    def is_refine_step(self, step: int) -> bool:
        """gsplat's grow/prune condition of ``DefaultStrategy.step_post_backward``."""
        s = self.strategy
        return (
            step < s.refine_stop_iter
            and step > s.refine_start_iter
            and step % s.refine_every == 0
            and step % s.reset_every >= s.pause_refine_after_reset
        )

    def is_reset_step(self, step: int) -> bool:
        """gsplat's opacity-reset condition (only before ``refine_stop_iter``)."""
        s = self.strategy
        return step < s.refine_stop_iter and step % s.reset_every == 0

    def is_structural(self, step: int) -> bool:
        """Whether ``step`` changes the primitive set or resets opacities."""
        return self.is_refine_step(step) or self.is_reset_step(step)

    def ends_phase(self, step: int) -> bool:
        """Whether ``step``'s structural change ends the phase: a refine changes the
        primitive set; an opacity reset alone only lowers opacities, in place
        (``reset_in_place``), so every footprint stays a superset and the plan runs on."""
        return self.is_refine_step(step)

    def reset_in_place(
        self, params: Mapping[str, Tensor], optimizers: Mapping[str, torch.optim.Optimizer]
    ) -> None:
        """gsplat's ``reset_opa`` at a reset-only step, on the same tensors (the runtime's
        bound parameter groups keep theirs): ``reset_opacities_in_place`` on the opacities
        and their Adam moments. Call on every replica after a drain, before anything later
        is applied."""
        opacities = params["opacities"]
        state = optimizers["opacities"].state.get(opacities, {})
        moments = [v for k, v in state.items() if k != "step" and isinstance(v, Tensor)]
        reset_opacities_in_place(opacities.data, moments, self.strategy.prune_opa)

    # ------------------------------------------------------------ statistics
    def ensure_state(self, num_rows: int, device: torch.device) -> None:
        """Allocate the running statistics (zeros) if they are missing or mis-sized."""
        keys = ["grad2d", "count"] + (
            ["radii"] if self.strategy.refine_scale2d_stop_iter > 0 else []
        )
        for key in keys:
            value = self.state.get(key)
            if value is None or value.shape[0] != num_rows or value.device != device:
                self.state[key] = torch.zeros(num_rows, device=device)

    @torch.no_grad()
    def accumulate(self, step: int, info: Mapping, rows: Tensor, num_rows: int) -> None:
        """Add this rank's view statistics, as gsplat's ``_update_state`` does, for a render
        restricted to ``rows``.

        Args:
            step: the global step (nothing accumulates from ``refine_stop_iter`` on).
            info: the rasterizer's info of the step: ``means2d`` [C, M, 2] with ``grad`` /
                ``absgrad`` set by backward, ``radii`` [C, M], ``width``, ``height``,
                ``n_cameras``.
            rows: [M] int64 sorted global ids of the rendered primitives.
            num_rows: N, the model's primitive count.
        """
        if step >= self.strategy.refine_stop_iter:
            return
        means2d = info["means2d"]
        grads = means2d.absgrad if self.strategy.absgrad else means2d.grad
        if grads is None:
            return
        self.ensure_state(num_rows, grads.device)
        grads = grads.clone()
        grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
        grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
        radii = info["radii"]
        sel = radii > 0.0  # [C, M]
        scale2d = self.strategy.refine_scale2d_stop_iter > 0
        if sel.shape[0] == 1:
            # One camera (every render here): every drawn row once, adding 0 where it is not
            # visible (the sums are >= +0, so x + 0 = x and max(x, 0) = x: gsplat's bits,
            # without the three reads of the device its selection makes, each a wait for
            # the step's queued kernels)
            seen = sel[0]
            zero = grads.new_zeros(())
            self.state["grad2d"].index_add_(0, rows, torch.where(seen, grads[0].norm(dim=-1), zero))
            self.state["count"].index_add_(0, rows, seen.to(torch.float32))
            if scale2d:
                normalized = radii[0] / float(max(info["width"], info["height"]))
                held = self.state["radii"].index_select(0, rows)
                self.state["radii"].index_copy_(
                    0, rows, torch.maximum(held, torch.where(seen, normalized, zero))
                )
            return
        ids = rows[torch.where(sel)[1]]  # [nnz] global ids, ordered as gsplat's
        self.state["grad2d"].index_add_(0, ids, grads[sel].norm(dim=-1))
        self.state["count"].index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
        if scale2d:
            normalized = radii[sel] / float(max(info["width"], info["height"]))
            self.state["radii"][ids] = torch.maximum(self.state["radii"][ids], normalized)

    # --------------------------------------------------------------- apply
    @torch.no_grad()
    def apply(
        self,
        step: int,
        params: torch.nn.ParameterDict,
        optimizers: Mapping[str, torch.optim.Optimizer],
    ) -> np.ndarray:
        """Make step ``step``'s structural change (a refine first sums the statistics
        across ranks).

        Call on every rank after the runtime has drained, at a step where ``is_structural``
        holds. The collectives are the same on every rank in the same order (a rank that
        rendered nothing contributes zeros), so no rank can wait on a collective its peers
        never issue.

        Returns:
            [N_after] int64: each row's parent row before the change (itself, the original
            of a duplicate, the parent of a split child).
        """
        num_rows = params["means"].shape[0]
        device = params["means"].device
        self.ensure_state(num_rows, device)
        refine, reset = self.is_refine_step(step), self.is_reset_step(step)
        # Only a refine reads the statistics (and zeroes them): summed there, once. Summed
        # at a reset-only step too, every rank would keep the sum and the next refine would
        # count the steps before the reset R times (every rank knows which step is which,
        # so all issue the same collectives).
        if refine and dist.is_initialized():
            all_reduce_statistics(self.state, self.group)
        parents = torch.arange(num_rows, device=device)
        with seeded_global_rng(self.seed * 1_000_003 + step):
            if refine:
                # gsplat's grow and prune carry every [N] tensor of the state with the rows
                # (copied for duplicates and children, dropped when pruned): a row counter
                # among them comes out as each row's parent.
                self.state[_PARENT_KEY] = parents
                try:
                    self.strategy._grow_gs(params, optimizers, self.state, step)
                    self.strategy._prune_gs(params, optimizers, self.state, step)
                finally:
                    parents = self.state.pop(_PARENT_KEY)
                self.state["grad2d"].zero_()
                self.state["count"].zero_()
                if "radii" in self.state and self.state["radii"] is not None:
                    self.state["radii"].zero_()
            if reset:
                reset_opa(
                    params=params,
                    optimizers=optimizers,
                    state=self.state,
                    value=self.strategy.prune_opa * 2.0,
                )
        return parents.cpu().numpy().astype(np.int64)


def next_phase_end(
    densifier: ReplicatedDensifier | MCMCDensifier, start: int, stop: int
) -> int | None:
    """The first step in ``[start, stop)`` whose structural change ends the phase
    (``densifier.ends_phase``); None if there is none before ``stop``."""
    for step in range(start, min(stop, densifier.strategy.refine_stop_iter)):
        if densifier.ends_phase(step):
            return step
    return None


@torch.no_grad()
def reset_opacities_in_place(opacities: Tensor, moments: list[Tensor], prune_opa: float) -> None:
    """gsplat's ``reset_opa`` (``DefaultStrategy``: value 2 x ``prune_opa``) in place, bitwise
    its values: logit opacities [N, ...] clamped to logit(value), ``moments`` zeroed."""
    opacities.clamp_(max=torch.logit(torch.tensor(prune_opa * 2.0)).item())
    for moment in moments:
        moment.zero_()


class MCMCDensifier:
    """gsplat's MCMCStrategy (relocation and sampling of new Gaussians) on every replica.

    Same public interface as ``ReplicatedDensifier``.

    Args:
        strategy: the model's ``MCMCStrategy`` (cap_max, min_opacity, schedule).
        state: the model's strategy state (gsplat's ``binoms``); the densifier keeps its own
            copy of the binomial table, so a resumed state cannot change it.
        seed: structural step ``s`` draws from torch's global generators seeded by
            ``(seed, s)`` on every replica.
        noise: the model's ``MCMCNoise``: at a refine step s every row first carries the
            noise up to s - 1, then relocation and sampling, then every row (new ones too)
            gets noise s, gsplat's order (optimizer step, relocate, add, inject noise).
    """

    returns_parents = False  # ``apply`` returns None: rows are matched by geometry

    def __init__(
        self, strategy: MCMCStrategy, state: dict, seed: int, noise: MCMCNoise | None = None
    ):
        self.strategy = strategy
        self.state = state
        self.seed = int(seed)
        self.noise = noise
        self.binoms = strategy.initialize_state()["binoms"]
        self.last_change: tuple[int, int] = (0, 0)  # (relocated, added) at the last apply

    def is_structural(self, step: int) -> bool:
        """gsplat's relocate/add condition of ``MCMCStrategy.step_post_backward``."""
        s = self.strategy
        return s.refine_start_iter < step < s.refine_stop_iter and step % s.refine_every == 0

    def ends_phase(self, step: int) -> bool:
        """Every MCMC structural step (relocation, sampling) ends the phase."""
        return self.is_structural(step)

    def ensure_state(self, num_rows: int, device: torch.device) -> None:
        """The binomial table on the parameters' device (MCMC keeps no per-row statistics)."""
        self.binoms = self.binoms.to(device)
        self.state["binoms"] = self.binoms

    def accumulate(self, step: int, info: Mapping, rows: Tensor, num_rows: int) -> None:
        """Nothing: relocation and sampling read no per-step statistics."""

    @torch.no_grad()
    def apply(
        self,
        step: int,
        params: torch.nn.ParameterDict,
        optimizers: Mapping[str, torch.optim.Optimizer],
    ) -> None:
        """Relocate dead Gaussians and add new ones (up to ``cap_max``) at refine step ``step``.

        Call on every replica after the runtime has drained (single process: after the
        optimizer step). Issues no collective: the inputs are replicated. Returns None:
        relocated rows have no parent whose footprint holds (the session matches rows by
        geometry instead).
        """
        self.ensure_state(params["means"].shape[0], params["means"].device)
        if self.noise is not None:
            self.noise.catch_up_all(step - 1)
        with seeded_global_rng(self.seed * 1_000_003 + step), _relocation_on(params["means"]):
            relocated = self.strategy._relocate_gs(params, optimizers, self.binoms)
            added = self.strategy._add_new_gs(params, optimizers, self.binoms)
        self.last_change = (int(relocated), int(added))
        if self.noise is not None:
            self.noise.resize(params["means"].shape[0], step - 1)
            self.noise.catch_up_all(step)


def compute_relocation_torch(
    opacities: Tensor, scales: Tensor, ratios: Tensor, binoms: Tensor
) -> tuple[Tensor, Tensor]:
    """Torch twin of gsplat's CUDA ``compute_relocation`` (Eq. 9 of 3DGS-as-MCMC), for CPU.

    Args:
        opacities: [K] or [K, 1] activated opacities of the sampled Gaussians.
        scales: [K, 3] activated scales.
        ratios: [K] int: how many Gaussians share each sample (clamped to [1, n_max]).
        binoms: [n_max, n_max] binomial table.

    Returns:
        new opacities (shape of ``opacities``) and new scales [K, 3].
    """
    n_max = binoms.shape[0]
    ratios = ratios.clamp(1, n_max).to(torch.int64)
    op = opacities.reshape(-1)
    new_op = 1.0 - torch.pow(1.0 - op, 1.0 / ratios.to(op.dtype))
    denom = torch.zeros_like(op)
    for i in range(1, int(ratios.max()) + 1 if ratios.numel() else 1):
        active = ratios >= i
        for k in range(i):
            term = ((-1.0) ** k / math.sqrt(k + 1)) * new_op ** (k + 1)
            denom = torch.where(active, denom + binoms[i - 1, k] * term, denom)
    coeff = op / denom
    return new_op.reshape(opacities.shape), coeff.unsqueeze(-1) * scales


@contextlib.contextmanager
def _relocation_on(means: Tensor) -> Iterator[None]:
    """gsplat's relocation ops call a CUDA kernel; on CPU they use the torch twin."""
    if means.is_cuda:
        yield
        return
    saved = gsplat_ops.compute_relocation
    gsplat_ops.compute_relocation = compute_relocation_torch
    try:
        yield
    finally:
        gsplat_ops.compute_relocation = saved


def make_densifier(
    strategy, state: dict, seed: int, noise: MCMCNoise | None = None, group=None
) -> ReplicatedDensifier | MCMCDensifier:
    """The adapter for the model's strategy (``DefaultStrategy`` or ``MCMCStrategy``;
    ``group``: the one that sums a refine's statistics)."""
    if isinstance(strategy, MCMCStrategy):
        return MCMCDensifier(strategy, state, seed, noise)
    if isinstance(strategy, DefaultStrategy):
        return ReplicatedDensifier(strategy, state, seed, group)
    raise TypeError(f"no replicated densifier for {type(strategy).__name__}")


@contextlib.contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """Run a block with torch's global generators seeded, then restore every one of them.

    gsplat's split draws from torch's global generators (it takes no ``Generator``), so the
    structural step seeds them and restores the CPU generator and every CUDA generator
    afterwards: the rest of the run's random stream is untouched, on GPU too.
    """
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield
