"""How the runtime uses nerfstudio's optimizers: moment tensors, learning rates, step counts.

In a distributed run the runtime, not ``optimizer.step()``, applies each Gaussian group's
selective Adam update. It needs, per group, the optimizer's own moment tensors (so
checkpoints and densification see them), the learning rate nerfstudio's scheduler gives at
a global step, and Adam's betas and eps. This is the only module that reads PyTorch
scheduler internals (``base_lrs``, ``lr_lambdas``, ``_last_lr``).

It also adapts the optimizers to the effective batch ``E = R x B`` (views per optimizer
step, ``--pipeline.batch-scaling``): ``adam_batch_scaling`` holds the published rules,
``apply_batch_scaling`` applies one to built optimizers and their schedulers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from nerfstudio.engine.optimizers import Optimizers

from odin_ns.runtime import ParamGroupState

BatchScalingRule = Literal["none", "sqrt", "linear"]
BATCH_SCALING_RULES: tuple[str, ...] = ("none", "sqrt", "linear")


def learning_rate_at(optimizers: Optimizers, name: str) -> Callable[[int], float]:
    """``s -> lr`` of group ``name`` at global step ``s``, as nerfstudio's scheduler sets it.

    The runtime may apply step ``s``'s update after the local scheduler has moved on, so it
    evaluates the schedule at ``s`` instead of reading the optimizer's current lr.
    """
    scheduler = optimizers.schedulers.get(name)
    base_lr = float(optimizers.optimizers[name].param_groups[0]["lr"])
    if scheduler is None:
        return lambda s: base_lr
    base = float(scheduler.base_lrs[0])
    fn = scheduler.lr_lambdas[0]
    return lambda s: base * float(fn(s))


def bind_param_groups(
    params: Mapping[str, torch.nn.Parameter], optimizers: Optimizers, names: Sequence[str]
) -> list[ParamGroupState]:
    """The runtime's view of groups ``names``: the model's parameters and the optimizers'
    own Adam moments (created as zeros if the optimizer has not stepped yet)."""
    groups = []
    for name in names:
        param = params[name]
        opt = optimizers.optimizers[name]
        state = opt.state[param]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        group = opt.param_groups[0]
        groups.append(
            ParamGroupState(
                name=name,
                param=param,
                exp_avg=state["exp_avg"],
                exp_avg_sq=state["exp_avg_sq"],
                lr_at=learning_rate_at(optimizers, name),
                betas=tuple(group["betas"]),
                eps=float(group["eps"]),
            )
        )
    return groups


def rebind_optimizer_params(
    optimizers: Optimizers, params: Mapping[str, torch.nn.Parameter], names: Sequence[str]
) -> None:
    """Point groups ``names`` at the model's current parameter objects, state cleared.

    splatfacto's ``load_state_dict`` replaces every Gaussian parameter by a new
    ``Parameter`` sized to the checkpoint, so the optimizers (built before the checkpoint
    was loaded) would keep stepping the old, detached tensors. Call before loading the
    optimizers' saved state, which then attaches to the new parameters by position.
    """
    for name in names:
        opt = optimizers.optimizers[name]
        (group,) = opt.param_groups
        group["params"] = [params[name]]
        opt.state.clear()


def set_step_counts(optimizers: Optimizers, names: Sequence[str], applied_steps: int) -> None:
    """Give groups ``names`` the Adam step count of ``applied_steps`` applied updates (after a
    drain), so a checkpoint resumes single-process training with the right bias correction."""
    for name in names:
        for state in optimizers.optimizers[name].state.values():
            state["step"] = torch.tensor(float(applied_steps))


def store_plain_float_learning_rates(optimizers: Optimizers) -> None:
    """Replace numpy floats in learning rates by Python floats, in place.

    nerfstudio's exponential-decay scheduler leaves numpy floats in ``param_groups`` and in
    the scheduler's ``_last_lr``; torch >= 2.6 loads checkpoints with ``weights_only=True``
    and rejects them, which breaks ns-eval and ns-viewer.
    """
    for opt in optimizers.optimizers.values():
        for group in opt.param_groups:
            group["lr"] = float(group["lr"])
    for scheduler in optimizers.schedulers.values():
        scheduler._last_lr = [float(lr) for lr in scheduler.get_last_lr()]


# ---------------------------------------------------------------------- batch scaling
@dataclass(frozen=True)
class AdamBatchScaling:
    """How Adam's hyper-parameters change for a step of ``E`` views:
    ``lr * lr_factor``, ``eps * eps_factor``, ``beta ** beta_power`` (both betas)."""

    lr_factor: float = 1.0
    eps_factor: float = 1.0
    beta_power: int = 1

    def betas(self, betas: Sequence[float]) -> tuple[float, ...]:
        return tuple(float(b) ** self.beta_power for b in betas)


def adam_batch_scaling(rule: BatchScalingRule, batch: int) -> AdamBatchScaling:
    """The published rules for a step of ``batch`` = R x B views.

    - ``sqrt``: ``lr * sqrt(E)``, ``eps / sqrt(E)``, ``betas ** E`` — Grendel-GS
      (nyu-systems/Grendel-GS, ``scene/gaussian_model.py``, ``training_setup`` with
      ``lr_scale_mode="sqrt"``, its default; gradients there are the batch mean). gsplat's
      ``examples/simple_trainer.py`` (``create_splats_with_optimizers``, ``BS = batch_size *
      world_size``) uses the same lr and eps and the first-order form of the betas,
      ``1 - E * (1 - beta)``; ``beta ** E`` is the exact one (E single-view steps of
      momentum decay per batched step) and stays in (0, 1) for every E.
    - ``linear``: ``lr * E``, eps and betas unchanged — Grendel-GS ``lr_scale_mode="linear"``.
    - ``none``: unchanged (splatfacto's single-view hyper-parameters).
    """
    if rule not in BATCH_SCALING_RULES:
        raise ValueError(f"batch scaling must be one of {BATCH_SCALING_RULES}, got {rule!r}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if rule == "sqrt":
        root = math.sqrt(batch)
        return AdamBatchScaling(lr_factor=root, eps_factor=1.0 / root, beta_power=int(batch))
    if rule == "linear":
        return AdamBatchScaling(lr_factor=float(batch))
    return AdamBatchScaling()


def apply_batch_scaling(
    optimizers: Optimizers, rule: BatchScalingRule, batch: int
) -> AdamBatchScaling:
    """Scale every optimizer of ``optimizers`` (and its scheduler) in place for ``batch``.

    Call once, right after the optimizers are built and before a checkpoint is loaded (a
    checkpoint's saved param groups and schedulers already hold the scaled values). The
    scheduler's ``base_lrs`` are scaled too, so the whole schedule (warm-up, decay, final
    lr) is multiplied by ``lr_factor``; the runtime reads lr, betas and eps from here.
    """
    scaling = adam_batch_scaling(rule, batch)
    if scaling == AdamBatchScaling():
        return scaling
    for opt in optimizers.optimizers.values():
        for group in opt.param_groups:
            group["lr"] = float(group["lr"]) * scaling.lr_factor
            if "initial_lr" in group:
                group["initial_lr"] = float(group["initial_lr"]) * scaling.lr_factor
            if "eps" in group:
                group["eps"] = float(group["eps"]) * scaling.eps_factor
            if "betas" in group:
                group["betas"] = scaling.betas(group["betas"])
    for scheduler in optimizers.schedulers.values():
        scheduler.base_lrs = [float(lr) * scaling.lr_factor for lr in scheduler.base_lrs]
        scheduler._last_lr = [float(lr) * scaling.lr_factor for lr in scheduler.get_last_lr()]
    return scaling
