"""Plan statistics: cross-rank conflict, reads of a peer's previous step, per-step load
balance."""

from __future__ import annotations

import numpy as np

from odin_ns.schedule.plan import CONFLICT_WINDOW, Plan, dependency_pass


def conflict_rows(plan: Plan, window: int = CONFLICT_WINDOW) -> np.ndarray:
    """[T, R] int64: rows of ``step_footprint(t, r)`` that some peer q != r wrote in
    steps ``t - window .. t - 1`` (the rows rank r may have to wait for). ``build_plan``
    counts them for its ``conflict_window`` (``Plan.conflict``); other windows take a pass
    over the plan."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if plan.conflict is not None and window == plan.conflict_window:
        return plan.conflict.copy()
    return dependency_pass(plan.footprints, plan.views, window)[3]


def plan_conflict(plan: Plan, window: int = CONFLICT_WINDOW) -> np.ndarray:
    """[T] float64: fraction of step t's read rows (all ranks) that a peer wrote within
    the last ``window`` steps. 0 = ranks never touch each other's recent work."""
    rows = conflict_rows(plan, window).sum(axis=1)
    total = plan.message_rows.sum(axis=1)
    return rows / np.maximum(total, 1)


def previous_step_reads(plan: Plan) -> np.ndarray:
    """[T] float64: share of step t's ranks whose read set shares a primitive with what a
    peer wrote at step t - 1 (0 at t = 0): the steps that a peer running one step late
    holds up under quality-first, what a low-conflict step order lowers
    (``PlanOptions.step_order``). Rows do not count here: one shared row is a wait."""
    t = np.arange(plan.num_steps)[:, None, None]
    reads = ((plan.dependency == t - 1) & (plan.dependency >= 0)).any(axis=2)  # [T, R]
    return reads.mean(axis=1)


def step_costs(plan: Plan, view_costs: np.ndarray) -> np.ndarray:
    """[T, R] cost of each (step, rank): sum of its views' costs (``view_costs`` [V])."""
    view_costs = np.asarray(view_costs, dtype=np.float64).reshape(-1)
    if view_costs.shape[0] != plan.footprints.shape[0]:
        raise ValueError(
            f"view_costs has {view_costs.shape[0]} entries but the plan has "
            f"{plan.footprints.shape[0]} views"
        )
    return view_costs[plan.views].sum(axis=2)


def load_imbalance(plan: Plan, view_costs: np.ndarray | None = None) -> np.ndarray:
    """[T] float64: ``max_r cost / mean_r cost - 1`` per step (0 = perfectly balanced).

    ``view_costs`` [V] defaults to footprint sizes.
    """
    if view_costs is None:
        view_costs = np.diff(plan.footprints.indptr)
    c = step_costs(plan, view_costs)
    mean = c.mean(axis=1)
    return np.where(mean > 0, c.max(axis=1) / np.maximum(mean, 1e-300) - 1.0, 0.0)
