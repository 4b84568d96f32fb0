"""Replicated densification: gsplat's ``DefaultStrategy`` applied identically on every replica.

This is the only module that calls gsplat's private strategy functions (``_grow_gs``,
``_prune_gs``), pinned to gsplat 1.4.0 by ``tests/test_densify.py``. Why private: the public
``step_post_backward`` accumulates the step's statistics *and* refines in one call, but in a
distributed run the statistics of a refine step must first be summed across ranks.

Per step each rank accumulates its own view's statistics over the rows it rendered
(``accumulate``). At a structural step (refine or opacity reset), after the runtime has
drained, ``apply`` sums the statistics across ranks (one fixed sequence of collectives,
issued by every rank whatever its local state), then grows, prunes and resets with the same
random stream on every replica, so every replica makes the same structural change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from gsplat.strategy import DefaultStrategy
from gsplat.strategy.ops import reset_opa
from torch import Tensor

# (state key, how ranks combine it) in the fixed order every rank issues the collectives.
_REDUCTIONS = (
    ("grad2d", dist.ReduceOp.SUM),
    ("count", dist.ReduceOp.SUM),
    ("radii", dist.ReduceOp.MAX),
)


class ReplicatedDensifier:
    """gsplat's DefaultStrategy for replicas that each see a subset of the rows per step.

    Args:
        strategy: the model's ``DefaultStrategy`` (its thresholds and schedule).
        state: the model's strategy state dict (``grad2d``, ``count``, ``radii``), updated in
            place; allocated here eagerly so every rank holds the same tensors.
        seed: the run's seed; structural step ``s`` draws from a generator seeded by
            ``(seed, s)`` on every replica.
    """

    def __init__(self, strategy: DefaultStrategy, state: dict, seed: int):
        self.strategy = strategy
        self.state = state
        self.seed = int(seed)

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
        """Whether ``step`` changes the primitive set or resets opacities (a phase boundary)."""
        return self.is_refine_step(step) or self.is_reset_step(step)

    def next_structural_step(self, start: int, stop: int) -> int | None:
        """The first structural step in ``[start, stop)``, or None."""
        for step in range(start, min(stop, self.strategy.refine_stop_iter)):
            if self.is_structural(step):
                return step
        return None

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
        ids = rows[torch.where(sel)[1]]  # [nnz] global ids, ordered as gsplat's
        self.state["grad2d"].index_add_(0, ids, grads[sel].norm(dim=-1))
        self.state["count"].index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
        if self.strategy.refine_scale2d_stop_iter > 0:
            normalized = radii[sel] / float(max(info["width"], info["height"]))
            self.state["radii"][ids] = torch.maximum(self.state["radii"][ids], normalized)

    # --------------------------------------------------------------- apply
    @torch.no_grad()
    def apply(
        self,
        step: int,
        params: torch.nn.ParameterDict,
        optimizers: Mapping[str, torch.optim.Optimizer],
    ) -> None:
        """Sum the statistics across ranks and make step ``step``'s structural change.

        Call on every rank after the runtime has drained, at a step where ``is_structural``
        holds. The collectives are the same on every rank in the same order (a rank that
        rendered nothing contributes zeros), so no rank can wait on a collective its peers
        never issue.
        """
        num_rows = params["means"].shape[0]
        self.ensure_state(num_rows, params["means"].device)
        if dist.is_initialized():
            for key, op in _REDUCTIONS:
                if key in self.state:  # the same keys on every rank (ensure_state)
                    dist.all_reduce(self.state[key], op=op)
        refine, reset = self.is_refine_step(step), self.is_reset_step(step)
        with seeded_global_rng(self.seed * 1_000_003 + step):
            if refine:
                self.strategy._grow_gs(params, optimizers, self.state, step)
                self.strategy._prune_gs(params, optimizers, self.state, step)
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
