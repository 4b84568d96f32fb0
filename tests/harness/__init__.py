"""Test harness of the runtime (not shipped): toy plans and model, a single-process
reference, an in-process loopback transport, a helper that starts gloo ranks as fresh
processes (``spawn_ranks``).

``tests/conftest.py`` puts ``tests/`` on ``sys.path``; the ranks, forked from
``multiprocessing``'s forkserver, inherit the ``sys.path`` it was started with.
"""

from harness.toy import (
    WEAK_SCALE,
    ListPlan,
    LoopbackHub,
    LoopbackTransport,
    Phase,
    ToyRank,
    ToyRun,
    assert_same_ids,
    grow_groups,
    random_footprints,
    reference_train,
    replicated_engine,
    run_threads,
    run_toy_rank,
    spawn_ranks,
    toy_grads,
    toy_groups,
    toy_outcome_worker,
    toy_result,
    toy_runs_worker,
    train_step,
)

__all__ = [
    "WEAK_SCALE",
    "ListPlan",
    "LoopbackHub",
    "LoopbackTransport",
    "Phase",
    "ToyRank",
    "ToyRun",
    "assert_same_ids",
    "grow_groups",
    "random_footprints",
    "reference_train",
    "replicated_engine",
    "run_threads",
    "run_toy_rank",
    "spawn_ranks",
    "toy_grads",
    "toy_groups",
    "toy_outcome_worker",
    "toy_result",
    "toy_runs_worker",
    "train_step",
]
