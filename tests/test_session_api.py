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


def test_a_steps_compute_time_ends_where_the_device_finished_the_backward():
    """On a GPU ``backward()`` returns with its kernels queued: the step's compute time runs
    until the gradients' finite check has read the device (stood in for by a sleep), not
    until the host returned, so the panels' compute and wait compare like for like."""
    import time
    from types import SimpleNamespace

    from odin_ns.distributed.session_api import StepTiming
    from odin_ns.model import RenderedView

    recorded = {}

    def gradients(step, views):
        time.sleep(0.05)  # the finite check's read: the device finishes the backward
        return {}

    def record(step, views, timing, compute_s, *rest):
        recorded["compute_s"] = compute_s

    session = SimpleNamespace(
        engine=SimpleNamespace(metrics=[None], layout=None, offset=0,
                               after_backward=lambda *args: None),
        _rows=torch.arange(3), _global_rows=torch.arange(3), num_rows=3, _gradients=gradients,
        densifier=SimpleNamespace(accumulate=lambda *args: None, is_structural=lambda s: False),
        _plan_dependencies=lambda step: (0, []), _record_step=record,
    )  # fmt: skip
    view = RenderedView(torch.ones(3, dtype=torch.bool), {}, pixels=1)
    timing = StepTiming(started=time.time(), wait_s=0.0, compute_started=time.perf_counter())
    compute_s = SessionFlow.after_backward(session, 0, [view], timing)
    assert compute_s >= 0.05 and recorded["compute_s"] == compute_s


def test_a_phase_starts_wait_for_peers_is_the_steps_wait():
    """A rank that ran ahead waits for the others in the phase start's drain and rendezvous
    (counted by the ledger in the last step's record): the step's wait is that and its read
    gate's; a step without a phase start waits at the gate alone."""
    from types import SimpleNamespace

    from odin_ns.runtime.ledger import RunLedger

    ledger = RunLedger()
    ledger.begin_step(9)  # the last step, logged already

    def start_phase(step):  # the drain and the rendezvous wait 0.25 s for the peers
        ledger.drain_waited(0.25)

    session = SimpleNamespace(
        ledger=ledger, phases=SimpleNamespace(due=lambda step: step == 10),
        _start_phase=start_phase, noise=None,
        engine=SimpleNamespace(offset=10, before_step=lambda t: 0.01,
                               step_reads=lambda t: (torch.arange(2), torch.arange(2))),
    )  # fmt: skip
    assert SessionFlow.before_step(session, 10).wait_s == pytest.approx(0.26)
    assert SessionFlow.before_step(session, 11).wait_s == 0.01
    assert ledger.steps[-1].drain_wait_s == 0.25  # (the ledger's total counts it once)


def test_a_steps_losses_and_gradients_are_checked_finite_in_one_read(monkeypatch):
    """Each view's loss flag (``RenderedView.loss_finite``, set by the trainer without
    reading it) is read with the gradients' flags after the backward, in one copy; a
    non-finite loss is named before a gradient, and a finite step returns the gradients."""
    from types import SimpleNamespace

    from odin_ns.model import GAUSSIAN_GROUPS, RenderedView

    params = {}
    for name in GAUSSIAN_GROUPS:
        params[name] = torch.zeros(4, 3, requires_grad=True)
        params[name].grad = torch.ones(4, 3)
    model = SimpleNamespace(gauss_params=params)
    session = SimpleNamespace(rank=1, _rows=torch.tensor([0, 2]), model=model)

    def views(*finite: bool) -> list:
        mask = torch.ones(4, dtype=torch.bool)
        return [RenderedView(mask, {}, 1, loss_finite=torch.tensor(f)) for f in finite]

    stacked = []  # the flags of each read: one stack, copied to the host once
    stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda flags: stacked.append(len(flags)) or stack(flags))
    grads = SessionFlow._gradients(session, 5, views(True, True))
    assert stacked == [2 + len(GAUSSIAN_GROUPS)] and grads["means"] is params["means"].grad
    params["means"].grad[2, 1] = float("nan")  # a drawn row: refused, the losses named first
    with pytest.raises(FloatingPointError, match="rank 1: non-finite loss at step 5"):
        SessionFlow._gradients(session, 5, views(True, False))
    with pytest.raises(FloatingPointError, match="non-finite gradient of 'means' at step 5"):
        SessionFlow._gradients(session, 5, views(True, True))
    params["means"].grad[2, 1] = 1.0
    params["means"].grad[1, 1] = float("nan")  # a row the step did not draw: not read
    assert SessionFlow._gradients(session, 5, views(True))["means"] is params["means"].grad
    unflagged = RenderedView(torch.ones(4, dtype=torch.bool), {}, 1)  # no flag: no check
    with pytest.raises(ValueError, match="every view needs its loss's finite flag"):
        SessionFlow._gradients(session, 5, [unflagged])
