"""Discrete-event replay of a plan: how long ranks wait under barrier vs Odin sync.

Each rank runs its steps in order; step (t, r) takes ``cost[t, r]`` seconds. Rank q's
publication of step s arrives ``comm_latency + seconds_per_row * message_rows[s, q]``
after q finishes s.

- ``barrier``: rank r starts step t once every rank's step t - 1 publication has arrived.
- ``odin``: rank r starts step t once its own step t - 1 is done and, for every peer q
  with ``dependency[t, r, q] = s >= 0``, q's step s publication has arrived; optionally
  no rank runs more than ``max_lead`` steps ahead of the slowest (bounded buffers).

Wait is idle time between a rank's consecutive steps. ``critical_path_wait`` is the
makespan minus the busiest rank's compute: wait that lengthens the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from odin_ns.schedule.plan import Plan


@dataclass
class SimResult:
    total_time: float  # makespan, seconds
    wait_per_rank: np.ndarray  # [R] seconds idle
    compute_per_rank: np.ndarray  # [R] seconds busy
    critical_path_wait: float  # total_time - max(compute_per_rank)
    start: np.ndarray  # [T, R]
    finish: np.ndarray  # [T, R]


def _step_costs(plan: Plan, costs: np.ndarray) -> np.ndarray:
    costs = np.asarray(costs, dtype=np.float64)
    T, R, _ = plan.views.shape
    if costs.ndim == 2:
        if costs.shape != (T, R):
            raise ValueError(f"per-step costs must be [T, R] = {[T, R]}, got {list(costs.shape)}")
        out = costs
    elif costs.ndim == 1:
        if costs.shape[0] != plan.footprints.shape[0]:
            raise ValueError(
                f"view costs have {costs.shape[0]} entries but the plan has "
                f"{plan.footprints.shape[0]} views"
            )
        out = costs[plan.views].sum(axis=2)
    else:
        raise ValueError("costs must be [V] (per view) or [T, R] (per step and rank)")
    if not np.isfinite(out).all() or (out < 0).any():
        raise ValueError("costs must be finite and non-negative")
    return out


def simulate(
    plan: Plan,
    costs: np.ndarray,  # [V] seconds per view, or [T, R] seconds per (step, rank)
    mode: Literal["barrier", "odin"] = "odin",
    comm_latency: float = 0.0,
    seconds_per_row: float = 0.0,
    max_lead: int | None = None,
) -> SimResult:
    """Replay ``plan`` with the given compute costs; see the module docstring."""
    if mode not in ("barrier", "odin"):
        raise ValueError(f"mode must be 'barrier' or 'odin', got {mode!r}")
    if comm_latency < 0 or seconds_per_row < 0:
        raise ValueError("comm_latency and seconds_per_row must be >= 0")
    if max_lead is not None and max_lead < 0:
        raise ValueError(f"max_lead must be >= 0, got {max_lead}")
    cost = _step_costs(plan, costs)
    T, R = cost.shape
    start = np.zeros((T, R))
    finish = np.zeros((T, R))
    if T == 0:
        z = np.zeros(R)
        return SimResult(0.0, z, z.copy(), 0.0, start, finish)
    arrive = np.zeros((T, R))  # when q's step-s publication reaches its peers
    delay = comm_latency + seconds_per_row * plan.message_rows
    cols = np.arange(R)[None, :]
    for t in range(T):
        if t == 0:
            s = np.zeros(R)
        elif mode == "barrier":
            s = np.full(R, arrive[t - 1].max())
        else:
            s = finish[t - 1].copy()
            dep = plan.dependency[t]  # [R, R]
            need = np.where(dep >= 0, arrive[np.maximum(dep, 0), cols], 0.0)
            s = np.maximum(s, need.max(axis=1))
            if max_lead is not None and t - 1 - max_lead >= 0:
                s = np.maximum(s, finish[t - 1 - max_lead].max())
        start[t] = s
        finish[t] = s + cost[t]
        arrive[t] = finish[t] + delay[t]
    compute = cost.sum(axis=0)
    total = float(finish[-1].max())
    wait = finish[-1] - compute  # each rank's idle time (it starts at 0 and never pauses otherwise)
    return SimResult(
        total_time=total,
        wait_per_rank=wait,
        compute_per_rank=compute,
        critical_path_wait=total - float(compute.max()),
        start=start,
        finish=finish,
    )
