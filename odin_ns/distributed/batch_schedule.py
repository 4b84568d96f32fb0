"""Step-based schedules read in training views, converted to optimizer steps.

splatfacto's schedules (warm-up, refine interval, opacity reset, split / screen-size stops,
SH degree interval, resolution schedule), its optimizers' learning-rate schedules and
``--max-num-iterations`` count optimizer steps, and one single-process step trains one
view. A step of R ranks with B views per rank trains ``E = R * B`` views (the effective
batch). With ``--pipeline.schedule-in-views`` (the default) those numbers are read as
*training views*, as in single-process training, and converted here once at set-up to
optimizer steps of the effective batch, so the same command line trains the same number of
views, and refines / resets / decays at the same view counts, on 1 or R ranks.

This is gsplat's ``--steps_scaler`` (``simple_trainer.py``, ``Config.adjust_steps``:
``int(steps * factor)`` with ``factor = 1 / (world_size * batch_size)``), done for the user:
intervals are rounded to the nearest step (at least 1), thresholds to the nearest step, and
the training budget up (so at least the asked-for views are trained). A schedule point is
exact when ``E`` divides it; otherwise it moves by less than half a step (``E / 2`` views).

Not converted: ``reset_alpha_every`` (it counts refinements, so it follows
``refine_every``), ``max_phase_steps`` (a bound on footprint staleness in steps), logging
intervals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# Model config fields (splatfacto; MCMC fields when present) that count steps.
MODEL_INTERVALS = ("refine_every", "sh_degree_interval", "resolution_schedule")
MODEL_THRESHOLDS = (
    "warmup_length",
    "stop_split_at",
    "stop_screen_size_at",
    "refine_start_iter",
    "refine_stop_iter",
    "noise_injection_stop_iter",
)
# Trainer config fields that count steps (0 means "never" and stays 0).
TRAINER_INTERVALS = (
    "steps_per_save",
    "steps_per_eval_batch",
    "steps_per_eval_image",
    "steps_per_eval_all_images",
)
# Scheduler config fields (ExponentialDecay, CosineDecay, MultiStep) that count steps.
SCHEDULER_THRESHOLDS = ("max_steps", "warmup_steps", "warm_up_end")


@dataclass(frozen=True)
class Conversion:
    """One converted setting: ``name`` was ``views`` training views, is now ``steps``."""

    name: str
    views: int
    steps: int


def effective_batch(world_size: int, views_per_rank: int) -> int:
    """E = R * B: views trained by one optimizer step of the whole run."""
    if world_size < 1 or views_per_rank < 1:
        raise ValueError(
            f"need world_size >= 1 and views_per_rank >= 1, got {world_size}, {views_per_rank}"
        )
    return int(world_size) * int(views_per_rank)


def threshold_steps(views: int, batch: int) -> int:
    """The step whose first view is nearest view ``views`` (round half up): ``v / E``."""
    return int(math.floor(views / batch + 0.5)) if views > 0 else int(views)


def interval_steps(views: int, batch: int) -> int:
    """An interval of ``views`` views in steps (nearest, at least 1; <= 0 stays as is)."""
    return max(1, threshold_steps(views, batch)) if views > 0 else int(views)


def budget_steps(views: int, batch: int) -> int:
    """Steps that train at least ``views`` views: ``ceil(v / E)``."""
    return -(-int(views) // batch) if views > 0 else int(views)


def pause_refine_after_reset_steps(
    num_train_views: int, refine_every_steps: int, batch: int
) -> int:
    """splatfacto's pause after an opacity reset, ``num_train_data + refine_every`` steps
    (one epoch of views plus one refine interval), for a step of ``batch`` views."""
    return threshold_steps(num_train_views, batch) + int(refine_every_steps)


def _convert_fields(obj, prefix: str, fields: Iterable[str], fn, batch: int, out: list) -> None:
    for name in fields:
        value = getattr(obj, name, None)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        steps = fn(value, batch)
        setattr(obj, name, steps)
        out.append(Conversion(f"{prefix}{name}", value, steps))


def convert_trainer_config(config, batch: int) -> list[Conversion]:
    """Convert ``config`` (an ``OdinTrainerConfig``) in place from views to steps of
    ``batch`` views; returns what changed (every converted field, in a fixed order).

    Converted: ``max_num_iterations`` (rounded up), the trainer's save / eval intervals, the
    model's step fields (``MODEL_INTERVALS``, ``MODEL_THRESHOLDS``) and every optimizer's
    scheduler step fields (``SCHEDULER_THRESHOLDS``, MultiStep ``milestones``). Call on a
    copy of the parsed config, once, before the pipeline and optimizers are built.
    """
    out: list[Conversion] = []
    if batch == 1:
        return out
    _convert_fields(config, "", ("max_num_iterations",), budget_steps, batch, out)
    _convert_fields(config, "", TRAINER_INTERVALS, interval_steps, batch, out)
    model = config.pipeline.model
    _convert_fields(model, "pipeline.model.", MODEL_INTERVALS, interval_steps, batch, out)
    _convert_fields(model, "pipeline.model.", MODEL_THRESHOLDS, threshold_steps, batch, out)
    for group, entry in sorted(config.optimizers.items()):
        scheduler = entry.get("scheduler") if isinstance(entry, dict) else None
        if scheduler is None:
            continue
        prefix = f"optimizers.{group}.scheduler."
        _convert_fields(scheduler, prefix, SCHEDULER_THRESHOLDS, threshold_steps, batch, out)
        milestones = getattr(scheduler, "milestones", None)
        if milestones is not None:
            scheduler.milestones = tuple(threshold_steps(int(m), batch) for m in milestones)
    return out


def format_conversions(conversions: list[Conversion], world_size: int, views_per_rank: int) -> str:
    """The lines printed once at start (rank 0)."""
    batch = world_size * views_per_rank
    head = (
        f"schedule in views: {world_size} rank(s) x {views_per_rank} view(s) = {batch} views per "
        "optimizer step; step-based settings converted (views -> steps):"
    )
    width = max((len(c.name) for c in conversions), default=0)
    lines = [f"  {c.name:<{width}}  {c.views:>8} -> {c.steps}" for c in conversions]
    return "\n".join([head, *lines])
