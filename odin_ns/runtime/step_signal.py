"""Barrier mode's global step signal for the engine (both layouts).

A sharded rank hears only from the peers whose rows it shares, so nothing on its data
plane says that every rank has finished a step. Barrier mode adds that signal: after its
step s a rank starts a one-element all-reduce on a gloo group of its own
(:meth:`StepSignal.finished`), and it may start step s + 1 once that all-reduce has
completed (:meth:`StepSignal.everyone_finished`), that is, once every rank has started it.
The all-reduce is asynchronous, so a waiting rank keeps receiving, applying and pushing
rows, which its peers may need to finish step s. All ranks run the same steps, so they
start the same all-reduces in the same order, as a collective requires.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class StepSignal:
    """One rank's side of the signal.

    Args:
        group: a process group used for nothing else (gloo: its all-reduces run on gloo's
            own threads while the rank polls its point-to-point streams).
    """

    def __init__(self, group) -> None:
        self.group = group
        self._pending: dict[int, dist.Work] = {}  # global step -> its all-reduce, oldest first

    def finished(self, step: int) -> None:
        """This rank has finished global ``step``: start its all-reduce."""
        flag = torch.zeros(1)
        self._pending[step] = dist.all_reduce(flag, group=self.group, async_op=True)

    def everyone_finished(self, step: int) -> bool:
        """Whether every rank has finished global ``step`` (and every step before it that
        this rank signalled); never blocks. Raises the all-reduce's failure."""
        for s in list(self._pending):  # insertion order: oldest first
            if s > step:
                break
            work = self._pending[s]
            if not work.is_completed():
                return False
            work.wait()  # completed: returns at once, or raises what failed
            del self._pending[s]
        return True

    def settled(self) -> bool:
        """Whether every all-reduce this rank started has completed (nothing in flight)."""
        return self.everyone_finished(max(self._pending, default=-1))
