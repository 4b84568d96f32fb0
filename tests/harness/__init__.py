"""Test harness of the runtime (not shipped): toy plans and model, a single-process
reference, an in-process loopback transport, a spawn helper for gloo ranks.

``tests/conftest.py`` puts ``tests/`` on ``sys.path``; ranks spawned with
``multiprocessing``'s spawn start method inherit the parent's ``sys.path``.
"""

from harness.toy import (
    WEAK_SCALE,
    ListPlan,
    LoopbackHub,
    LoopbackTransport,
    Phase,
    ToyRank,
    ToyRun,
    grow_groups,
    random_footprints,
    reference_train,
    run_threads,
    run_toy_rank,
    spawn_ranks,
    toy_grads,
    toy_groups,
    toy_outcome_worker,
    toy_result,
    toy_runs_worker,
)

__all__ = [
    "WEAK_SCALE",
    "ListPlan",
    "LoopbackHub",
    "LoopbackTransport",
    "Phase",
    "ToyRank",
    "ToyRun",
    "grow_groups",
    "random_footprints",
    "reference_train",
    "run_threads",
    "run_toy_rank",
    "spawn_ranks",
    "toy_grads",
    "toy_groups",
    "toy_outcome_worker",
    "toy_result",
    "toy_runs_worker",
]
