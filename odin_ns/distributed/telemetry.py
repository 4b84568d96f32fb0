"""Sync telemetry: what the viewer panels, nerfstudio's writer and ``odin_run.json`` read.

Each rank logs one record per step (compute and wait seconds, timestamps, footprint and
visible rows, pixels, bytes) and one per phase start. Peers' recent steps reach rank 0 in
the phase-start exchange, which also carries the panels' tau / K requests from rank 0 to
every rank. Every derived figure (wait hidden, the barrier estimate, staleness) comes from
one function, ``odin_ns.viewer_ext.snapshot.snapshot_from_run``: the live panels call it
on the recent window, ``ns-viewer`` on the saved run, so both show the same numbers.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from nerfstudio.utils import writer

from odin_ns.viewer_ext.snapshot import snapshot_from_run, step_wait, wait_hidden


def _plain(records: list[dict]) -> list[dict]:
    """Copies of step records with their tensor counts as ints. The counts are recorded as
    0-d device tensors (a step never waits for the device to read one) and read here once:
    all of them in one copy per device, kept as ints in the records, so a live panel that
    shows the last window every few steps reads each count once, not at every look."""
    by_device: dict[torch.device, list[tuple[dict, str]]] = {}
    for r in records:
        for k, v in r.items():
            if isinstance(v, torch.Tensor):
                by_device.setdefault(v.device, []).append((r, k))
    for at in by_device.values():
        values = torch.stack([r[k].reshape(()) for r, k in at]).tolist()
        for (r, k), v in zip(at, values, strict=True):
            r[k] = int(v)
    return [dict(r) for r in records]


def _json_scalar(value):
    """numpy scalars and 0-d tensors in a summary (ownership reports, counts) as numbers."""
    if isinstance(value, np.generic | torch.Tensor):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def mean_rows_per_step(ranks: list[dict], key: str) -> float | None:
    """Mean over global steps of the step records' ``key`` summed over ranks (e.g.
    ``dependency_rows``: the rows of the plan's ``dependency_rows[t]`` [R, R] a step waits
    for, all ranks together); None when the records lack ``key`` (older run logs)."""
    per_step: dict[int, int] = {}
    for rank in ranks:
        for record in rank["steps"]:
            if key not in record:
                return None
            per_step[record["step"]] = per_step.get(record["step"], 0) + int(record[key])
    return float(np.mean(list(per_step.values()))) if per_step else None


def gather_to_first(obj, rank: int, world_size: int, group=None) -> list | None:
    """``obj`` of every rank, in rank order, on rank 0; None on the others (a gather over
    ``group``: call on every rank). Where only rank 0 writes what is gathered (the run
    summary, a checkpoint's statistics), an all-gather would give each of R ranks R copies."""
    parts: list | None = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, parts, dst=0, group=group)
    return parts


class SyncTelemetry:
    """One rank's step and phase logs, and rank 0's view of its peers for the panels.

    Args:
        rank, world_size: this rank and R.
        mode: the sync mode (for the summaries).
        window: steps per rank the live panels look at (keeps their cost independent of the
            run's length).
    """

    def __init__(self, rank: int, world_size: int, mode: str, window: int = 200):
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.window = int(window)
        self.steps: list[dict] = []  # this rank's step records, whole run
        self.phases: list[dict] = []  # this rank's phase records
        self.structural: list[dict] = []  # this rank's structural changes (refine steps)
        self._sent_upto = 0  # steps already shipped to rank 0
        self._peer_steps = {q: deque(maxlen=self.window) for q in range(world_size)}
        self._peer_engines: dict[int, dict] = {}
        self.snapshot: dict = {}  # replaced wholesale; read by the panels' thread

    # ------------------------------------------------------------ records
    def record_step(self, record: dict) -> None:
        """Log one step (values may be 0-d tensors: they are read when the log is read)."""
        self.steps.append(record)

    def record_phase(self, record: dict) -> None:
        self.phases.append(record)

    def record_structural(self, record: dict) -> None:
        """Log one structural step (Gaussians before / after; MCMC: relocated, added)."""
        self.structural.append(record)

    # ------------------------------------------------------------ exchange
    def exchange_at_phase_start(
        self,
        request: dict,
        engine: dict,
        plan_check: tuple | None = None,
        with_steps: bool = True,
        group=None,
    ) -> tuple[dict, list]:
        """All-gather (every rank, at a drain point): peers' new steps and engine counters
        go to rank 0; every rank gets rank 0's panel request ({} or {"tau", "K"}) and every
        rank's ``plan_check`` (the session compares them: one collective for both).

        ``with_steps`` False (no live panels to show them): the steps stay here until an
        exchange that ships them (the last window of them), so rank 0's view at that
        exchange is the same; only their pickling leaves this phase start."""
        new = []
        if with_steps:
            new = _plain(self.steps[self._sent_upto :][-self.window :])
            self._sent_upto = len(self.steps)
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, (new, engine, request, plan_check), group=group)
        if self.rank == 0:
            for q, (steps, counters, _, _) in enumerate(parts):
                self._peer_steps[q].extend(steps)
                self._peer_engines[q] = counters
        return parts[0][2], [p[3] for p in parts]

    def start_phase(
        self,
        panels,
        counters: dict,
        plan_check: tuple,
        step: int,
        with_steps: bool,
        group=None,
    ) -> dict:
        """A phase start's exchange (every rank, after the drain): ``exchange_at_phase_start``
        with the panels' request and this rank's ``plan_check`` (plan hash, Gaussians);
        raises if the ranks' checks differ (the replicas or the plans diverged). Returns the
        panels' tau / K request, which every rank applies now ({} for none). ``group``: the
        process group of the collectives (the session's gloo group: host objects, which the
        default group would stage through the GPU on NCCL; None: the default group)."""
        request, checks = self.exchange_at_phase_start(
            panels.requested_settings() if panels is not None else {},
            counters,
            plan_check=plan_check,
            with_steps=with_steps,
            group=group,
        )
        if len(set(checks)) != 1:
            raise RuntimeError(
                f"rank {self.rank}: ranks hold different (plan hash, Gaussians) {checks} at "
                f"step {step}; the replicas have diverged"
            )
        return request

    def snapshot_due(self, step: int, panels, every: int) -> bool:
        """Whether rank 0's live panels want a new snapshot after ``step``."""
        return panels is not None and panels.panels is not None and step % every == 0

    # ------------------------------------------------------------ views
    def live_run(self, engine: dict) -> dict:
        """Rank 0: the run so far as an ``odin_run.json``-shaped dict, recent window only
        (this rank live, peers as of the last exchange)."""
        ranks = []
        for q in range(self.world_size):
            if q == self.rank:
                steps = _plain(self.steps[-self.window :])
                counters = engine
            else:
                steps = list(self._peer_steps[q])
                counters = self._peer_engines.get(q, {})
            ranks.append(
                {"rank": q, "steps": steps, "engine": counters, "phases": self.phases[-1:]}
            )
        return {"world_size": self.world_size, "sync": self.mode, "ranks": ranks}

    def refresh_snapshot(self, step: int, engine: dict) -> None:
        """Rank 0: rebuild the panels' snapshot from the recent window."""
        snap = snapshot_from_run(self.live_run(engine))
        snap["step"] = step
        self.snapshot = snap

    def run_summary(
        self,
        engine_summary: dict,
        replica_hash: str,
        rank_extra: dict | None = None,
        group=None,
    ) -> dict | None:
        """Every rank's logs and engine summary, on rank 0 (a gather over ``group``; call on
        every rank; None on the others). ``rank_extra``: more per-rank entries (sharded
        mode: ownership, rows held)."""
        mine = {
            "rank": self.rank,
            "replica_hash": replica_hash,
            "engine": engine_summary,
            "steps": _plain(self.steps),
            "phases": self.phases,
            "structural_changes": self.structural,
            **(rank_extra or {}),
        }
        ranks = gather_to_first(mine, self.rank, self.world_size, group)
        if ranks is None:
            return None
        return {
            "world_size": self.world_size,
            "sync": self.mode,
            "mean_dependency_rows_per_step": mean_rows_per_step(ranks, "dependency_rows"),
            "mean_footprint_rows_per_step": mean_rows_per_step(ranks, "footprint_rows"),
            "ranks": ranks,
        }

    def finish(
        self,
        counters: dict,
        engine_summary: dict,
        replica_hash: str,
        path: Path,
        rank_extra: dict | None = None,
        group=None,
        **run_extra,
    ) -> dict | None:
        """End of training (every rank, after the last drain): peers' last steps reach
        rank 0, whose panels get a final snapshot of the whole end; every rank's logs are
        gathered to rank 0, which writes ``odin_run.json`` (``run_extra``: more top-level
        keys) and returns it (the others: None). ``group`` as in ``start_phase``."""
        self.exchange_at_phase_start({}, counters, group=group)
        if self.rank == 0 and self.steps:
            self.refresh_snapshot(self.steps[-1]["step"], counters)
        summary = self.run_summary(engine_summary, replica_hash, rank_extra, group)
        if summary is None:
            return None
        summary = {**summary, **run_extra}
        self.write_run_summary(summary, path)
        return summary

    def write_run_summary(self, summary: dict, path: Path) -> None:
        """Rank 0: write ``odin_run.json`` (with the live snapshot the panels last showed)
        and the run's headline figures to nerfstudio's writer."""
        if self.rank != 0:
            return
        out = dict(summary, live_snapshot=self.snapshot)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=_json_scalar))
        waits = [sum(step_wait(s) for s in r["steps"]) for r in summary["ranks"]]
        writer.put_scalar("odin/total_wait_s_max_rank", max(waits), step=0)
        hidden = wait_hidden(snapshot_from_run(summary))
        if hidden is not None:
            writer.put_scalar("odin/wait_hidden", hidden, step=0)
