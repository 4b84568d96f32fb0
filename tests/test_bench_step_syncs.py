"""``bench.step_syncs``' counter: what torch's sync debug mode warns during a counted step is
counted per step by the line that made it; warm-up steps and other warnings are not."""

from __future__ import annotations

import warnings

from odin_ns.bench.step_syncs import SYNC_WARNING, StepSyncs


def test_a_steps_synchronizations_are_counted_by_line_after_the_warmup():
    def train_iteration(step: int) -> int:
        for _ in range(step):
            warnings.warn(f"called a {SYNC_WARNING}", stacklevel=1)  # one line, step times
        warnings.warn(f"called a {SYNC_WARNING}", stacklevel=1)  # another line, once
        warnings.warn("something else", stacklevel=1)
        return step

    counted = StepSyncs(train_iteration, warmup=1, cuda=False)
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        assert [counted(s) for s in (5, 2, 3)] == [5, 2, 3]
    assert len(outside) == 7  # the warm-up step's warnings pass through
    assert [sum(c.values()) for c in counted.per_step] == [3, 4]
    assert [sorted(c.values()) for c in counted.per_step] == [[1, 2], [1, 3]]
    assert all(line.startswith("test_bench_step_syncs.py:") for line in counted.per_step[0])
    assert len(counted.seconds) == 2 and counted.calls == 3
