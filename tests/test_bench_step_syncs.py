"""``bench.step_syncs``' counter: what torch's sync debug mode warns between a counted step's
first and last training callbacks is counted per step by the line that made it; warm-up
steps are not, and other warnings are shown as usual."""

from __future__ import annotations

import warnings

from odin_ns.bench.step_syncs import SYNC_WARNING, StepSyncs


def test_a_steps_synchronizations_are_counted_by_line_after_the_warmup():
    def step_work(step: int) -> None:  # what the callbacks and train_iteration run
        for _ in range(step):
            warnings.warn(SYNC_WARNING, stacklevel=1)  # one line, step times
        warnings.warn(SYNC_WARNING, stacklevel=1)  # another line, once
        warnings.warn("something else", stacklevel=1)

    counted = StepSyncs(warmup=1, cuda=False)
    first, last = counted.callbacks()
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        for step in (5, 2, 3):
            first.run_callback_at_location(step, first.where_to_run[0])
            step_work(step)
            last.run_callback_at_location(step, last.where_to_run[0])
    # the warm-up step's seven warnings and each counted step's other one pass through
    assert len(outside) == 9 and sum("something else" in str(w.message) for w in outside) == 3
    assert [sum(c.values()) for c in counted.per_step] == [3, 4]
    assert [sorted(c.values()) for c in counted.per_step] == [[1, 2], [1, 3]]
    assert all(line.startswith("tests/test_bench_step_syncs.py:") for line in counted.per_step[0])
    assert len(counted.seconds) == 2 and counted.steps == 3
