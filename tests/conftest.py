"""Shared fixtures: tiny built-in scenes, generated once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The test harness (tests/harness) is imported as ``harness``; its ranks inherit sys.path.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# Subprocesses (ns-train, odin-ns-train) inherit this: OpenMP threads that spin while the
# other core is busy make CPU training many times slower on small machines.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Two cores: keep each test process (and the ranks it spawns) from oversubscribing them.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def object_scene(tmp_path_factory):
    from odin_ns.data.synthetic import make_scene

    return make_scene(
        tmp_path_factory.mktemp("object_scene"),
        layout="object",
        num_views=12,
        num_eval_views=3,
        seed=0,
    )


@pytest.fixture(scope="session")
def street_scene(tmp_path_factory):
    from odin_ns.data.synthetic import make_scene

    return make_scene(
        tmp_path_factory.mktemp("street_scene"),
        layout="street",
        num_views=16,
        num_eval_views=3,
        seed=0,
    )


# ------------------------------------------------------------ shared multi-rank runs
# Trained once per session, side by side (tests/harness/street_runs.py says what each run
# is); the first test that asks for a family pays for it, so such tests get a longer
# deadline below.
SHARED_RUNS_TIMEOUT_S = 1200


@pytest.fixture(scope="session")
def fork_server():
    """The suite's ``odin-ns-train`` runs start forked from one interpreter that imported
    nerfstudio once (``tests/harness/fork_server.py``); pass it to ``train_side_by_side``."""
    from harness.fork_server import ForkServer

    server = ForkServer(dict(os.environ))
    yield server
    server.close()


@pytest.fixture(scope="session")
def street_runs_2(street_scene, fork_server, tmp_path_factory) -> dict[str, Path]:
    """The 2-rank family: barrier, quality-first, throughput-first, sharded, sharded-tf
    (tau 0), sharded-rebalance; name -> run folder."""
    from harness.street_runs import train_family

    return train_family(street_scene, tmp_path_factory.mktemp("street2"), 2, fork_server)


@pytest.fixture(scope="session")
def street_runs_3(street_scene, fork_server, tmp_path_factory) -> dict[str, Path]:
    """The 3-rank family: barrier, sharded (random owners, 1-byte credits),
    sharded-rebalance; name -> run folder."""
    from harness.street_runs import train_family

    return train_family(street_scene, tmp_path_factory.mktemp("street3"), 3, fork_server)


@pytest.fixture(scope="session")
def street_resumed(street_scene, street_runs_2, street_runs_3, fork_server, tmp_path_factory):
    """Runs resumed from the families' step-28 checkpoints, side by side; name -> result:

    - ``quality-first``: replicated quality-first on 2 ranks, from its own checkpoint;
    - ``sharded``: sharded on 2 ranks, from its own checkpoint;
    - ``sharded-as-barrier`` / ``barrier-as-sharded``: the sharded checkpoint resumed in
      replicated barrier mode, and the replicated one in sharded mode;
    - ``3-on-2``: the 3-rank sharded checkpoint resumed sharded on 2 ranks.
    """
    from harness.runs import train_side_by_side
    from harness.street_runs import BARRIER, QUALITY_FIRST, SHARDED, resume_job

    out = tmp_path_factory.mktemp("resumed")
    two, three = street_runs_2, street_runs_3
    jobs = [
        resume_job(street_scene, out, "quality-first", 2, two["quality-first"], *QUALITY_FIRST),
        resume_job(street_scene, out, "sharded", 2, two["sharded"], *SHARDED),
        resume_job(street_scene, out, "sharded-as-barrier", 2, two["sharded"], *BARRIER),
        resume_job(street_scene, out, "barrier-as-sharded", 2, two["barrier"], *SHARDED),
        resume_job(street_scene, out, "3-on-2", 2, three["sharded"], *SHARDED),
    ]
    return train_side_by_side(jobs, out / "logs", server=fork_server)


def pytest_collection_modifyitems(config, items):
    shared = {"street_runs_2", "street_runs_3", "street_resumed"}
    for item in items:
        if shared & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker(
            "timeout"
        ):
            item.add_marker(pytest.mark.timeout(SHARED_RUNS_TIMEOUT_S))
