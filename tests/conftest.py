"""Shared fixtures: tiny built-in scenes, generated once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The test harness (tests/harness) is imported as ``harness``; spawned ranks inherit sys.path.
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
