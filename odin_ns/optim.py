"""Visibility-masked ("selective") Adam.

Selective Adam moves only the primitives visible in the step's views: an invisible
primitive keeps its parameters *and* its Adam moments bit-identical. This is what makes
primitive-level synchronization exact (DESIGN 3.2): a primitive's state depends only on
the steps that touched it, so ranks can apply updates per primitive, in any interleaving
across primitives, and still agree with barrier-synchronous training.

Semantics follow gsplat's ``SelectiveAdam`` (and Taming-3DGS): the bias-correction step
count is the optimizer's global step count, shared by all rows of a parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from nerfstudio.engine.optimizers import AdamOptimizerConfig
from torch import Tensor


@torch.no_grad()
def selective_adam_update_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    rows: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
) -> None:
    """Adam-update ``rows`` of ``param`` in place; every other row is left untouched.

    Args:
        param: [N, ...] parameter tensor (updated in place).
        grad: [N, ...] gradient, or [len(rows), ...] rows already gathered.
        exp_avg, exp_avg_sq: [N, ...] Adam moments (updated in place).
        rows: [M] int64 row ids to update (unique), or [N] bool mask.
        lr, beta1, beta2, eps: Adam hyper-parameters.
        step: 1-based bias-correction step count.
    """
    if rows.dtype == torch.bool:
        rows = rows.nonzero().squeeze(-1)
    if rows.numel() == 0:
        return
    g = grad if grad.shape[0] == rows.shape[0] and grad.shape[0] != param.shape[0] else grad[rows]
    # Same arithmetic as torch.optim.Adam's single-tensor path, on the gathered rows.
    m = exp_avg[rows].lerp_(g, 1.0 - beta1)
    v = exp_avg_sq[rows].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    bias1 = 1.0 - beta1**step
    bias2_sqrt = (1.0 - beta2**step) ** 0.5
    denom = (v.sqrt() / bias2_sqrt).add_(eps)
    param[rows] = param[rows].addcdiv_(m, denom, value=-lr / bias1)
    exp_avg[rows] = m
    exp_avg_sq[rows] = v


def check_mask_rows(mask: Tensor, num_rows: int) -> None:
    """A [N] bool visibility mask covers ``num_rows`` rows: else it was made before a
    densification changed them (``ValueError``)."""
    if mask.shape[0] != num_rows:
        raise ValueError(
            f"visibility mask has {mask.shape[0]} rows but the parameters have {num_rows}; "
            "was the mask computed before densification?"
        )


class SelectiveAdam(torch.optim.Adam):
    """``torch.optim.Adam`` that updates only visible rows.

    It keeps Adam's state layout (``exp_avg``, ``exp_avg_sq``, ``step``) so gsplat's
    densification ops, which resize optimizer state, work unchanged. The visible rows come
    from ``visibility_source``, a callable set by the model that returns a [N] bool mask
    or the [K] int64 ids of the visible rows for the current step (or None: every row is
    visible, i.e. plain Adam).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, **kwargs):
        if kwargs.pop("weight_decay", 0.0):
            raise ValueError("SelectiveAdam has no weight decay; set weight_decay=0")
        super().__init__(params, lr=lr, betas=betas, eps=eps, **kwargs)
        self.visibility_source: Callable[[], Tensor | None] | None = None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        visible = self.visibility_source() if self.visibility_source is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                rows = (
                    visible
                    if visible is not None
                    else torch.ones(param.shape[0], dtype=torch.bool, device=param.device)
                )
                if rows.dtype == torch.bool:
                    check_mask_rows(rows, param.shape[0])
                selective_adam_update_(
                    param,
                    param.grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    rows,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    step=int(state["step"].item()),
                )
        return loss


@dataclass
class SelectiveAdamOptimizerConfig(AdamOptimizerConfig):
    """nerfstudio optimizer config that builds :class:`SelectiveAdam`."""

    _target: type = SelectiveAdam
