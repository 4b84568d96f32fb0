"""Both layouts' sessions implement the trainer's ``TrainingSession`` interface, whole."""

import inspect

import pytest
import torch

from odin_ns.distributed.session import ReplicatedSession
from odin_ns.distributed.session_api import TrainingSession
from odin_ns.distributed.session_flow import SessionFlow
from odin_ns.distributed.sharded_session import ShardedSession

METHODS = [
    name
    for name, member in vars(TrainingSession).items()
    if callable(member) and not name.startswith("_")
]


def test_the_interface_names_what_the_trainer_calls():
    assert set(METHODS) >= {"before_step", "after_backward", "drain", "evaluation"}
    assert set(METHODS) >= {"save_checkpoint", "finish", "close", "busy", "set_paused"}


@pytest.mark.parametrize("layout", [ReplicatedSession, ShardedSession])
def test_each_layout_implements_every_method_with_its_parameters(layout):
    for name in METHODS:
        declared = inspect.signature(getattr(TrainingSession, name)).parameters
        implemented = inspect.signature(getattr(layout, name)).parameters
        assert list(implemented) == list(declared), (layout.__name__, name)
    # nothing is left to the shared base's "not implemented" (the step, busy, rendezvous
    # and the engine's summary are the base's own: one engine, liveness and ledger)
    for name in ("drain", "replica_hash", "_start_phase", "_apply_structural_change"):
        assert getattr(layout, name) is not getattr(SessionFlow, name), (layout.__name__, name)


def test_step_records_counts_are_read_once_in_one_copy():
    """A step's counts are recorded as 0-d tensors (no step waits to read one); the log's
    readers get ints, read in one copy and kept, so a live panel's every look at the
    window reads nothing again."""
    from odin_ns.distributed.telemetry import _plain

    records = [{"step": s, "visible_rows": torch.tensor(10 * s), "pixels": 7} for s in range(3)]
    records[1]["rows_on_meta"] = torch.empty((), device="meta")  # a second device: read apart
    with pytest.raises(NotImplementedError):  # (meta has no values: its copy is refused)
        _plain(records)
    del records[1]["rows_on_meta"]
    plain = _plain(records)
    assert plain == [{"step": s, "visible_rows": 10 * s, "pixels": 7} for s in range(3)]
    assert all(type(r["visible_rows"]) is int for r in records)  # kept read
    plain[0]["pixels"] = 0  # copies: the log itself unchanged
    assert records[0]["pixels"] == 7
