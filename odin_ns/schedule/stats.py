"""Plan statistics: cross-rank conflict and per-step load balance."""

from __future__ import annotations

import numpy as np

from odin_ns.schedule.plan import (
    Plan,
    _all_step_rows,
    _relabel_by_first_touch,
    _step_dtype,
)


def conflict_rows(plan: Plan, window: int = 4) -> np.ndarray:
    """[T, R] int64: rows of ``step_footprint(t, r)`` that some peer q != r wrote in
    steps ``t - window .. t - 1`` (the rows rank r may have to wait for)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    F, views = plan.footprints, plan.views
    T, R, _ = views.shape
    out = np.zeros((T, R), dtype=np.int64)
    ids, offs = _all_step_rows(F, views)
    ids = _relabel_by_first_touch(ids, F.shape[1]).astype(np.int64)
    lens_all = np.diff(offs).reshape(T, R)
    # last[p, q] = latest step < t at which rank q wrote p (never: -window - 1).
    last = np.full((F.shape[1], R), -window - 1, dtype=_step_dtype(T + window + 1))
    never = -window - 1
    rank_ids = np.arange(R)
    for t in range(T):
        o0, o1 = offs[t * R], offs[(t + 1) * R]
        if o1 == o0:
            continue
        ids_t = ids[o0:o1]
        seg = np.repeat(rank_ids, lens_all[t])
        block = last[ids_t]
        block[np.arange(ids_t.size), seg] = never  # a rank does not conflict with itself
        hot = block.max(axis=1) >= t - window
        out[t] = np.bincount(seg, weights=hot, minlength=R).astype(np.int64)
        last[ids_t, seg] = t
    return out


def plan_conflict(plan: Plan, window: int = 4) -> np.ndarray:
    """[T] float64: fraction of step t's read rows (all ranks) that a peer wrote within
    the last ``window`` steps. 0 = ranks never touch each other's recent work."""
    rows = conflict_rows(plan, window).sum(axis=1)
    total = plan.message_rows.sum(axis=1)
    return rows / np.maximum(total, 1)


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
