"""Ahead-of-time scheduler (DESIGN 3.1, 3.3): footprints, locality graph, plan, dependencies.

Typical use, once per phase and identically on every rank::

    F = compute_footprints(means, scales, quats, opacities, viewmats, Ks, W, H)
    plan = build_plan(F, num_ranks=R, num_steps=T, seed=seed, **prev_plan.resume(t))
"""

from odin_ns.schedule.footprint import compute_footprints
from odin_ns.schedule.locality import locality_graph, partition_views
from odin_ns.schedule.plan import (
    Plan,
    PlanOptions,
    build_plan,
    dependency_table,
    locality_ratio,
)
from odin_ns.schedule.stats import (
    conflict_rows,
    load_imbalance,
    plan_conflict,
    previous_step_reads,
    step_costs,
)

__all__ = [
    "Plan",
    "PlanOptions",
    "build_plan",
    "compute_footprints",
    "conflict_rows",
    "dependency_table",
    "load_imbalance",
    "locality_graph",
    "locality_ratio",
    "partition_views",
    "plan_conflict",
    "previous_step_reads",
    "step_costs",
]
