"""Sharded distributed step (``--pipeline.parallel sharded``): the trainer's
``session_api.TrainingSession`` over owner-sharded Gaussians (``odin_ns.runtime.sharded``, DESIGN 3.11).

Storage per rank: ``model.gauss_params`` is the local table (owned rows, then the phase's
cache); Adam moments exist for owned rows only (held here, not in the optimizers' state).
Phase start (collectives): drain; footprints of every view over each rank's owned rows,
gathered; the plan; ownership (first phase: ``schedule.ownership`` on the plan; later:
carried, new rows belong to their parent's owner, or rebalanced by
``ownership.rebalance_ownership``, the moved rows migrating with their moments and
versions, ``_migrate_rows``); cache fill (owners send each reader the rows its phase
reads); bind the engine. Step path: point-to-point only.

Densification (``sharded_densify``): an all-reduce of the [N] statistics at structural
steps (as replicated training does), flags and the post-grow renumbering all-reduced, rows
made on owners. Checkpoints (``sharded_checkpoint``): drained, every rank sends its owned
rows and moments to rank 0 a chunk at a time, which lands them in file-backed tensors and
writes one nerfstudio checkpoint of the whole model with the replicated resume entry
(``odin_ns.resume``). Resume: each rank reads its contiguous range of the checkpoint's
rows through a memory map (the trainer); the first phase start moves them to their owners.
Evaluation during training and the live viewer: rank 0 gathers a copy of the model's
parameters (``sharded_eval``) at evaluation steps and, with the viewer, at phase starts.
Slow is not dead: rank 0's evaluation, checkpoint write or viewer pause is a busy section
(``runtime.liveness``); the engine's waits and the rendezvous before every collective wait
as long as a peer beats.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.utils.rich_utils import CONSOLE

from odin_ns.distributed.densify import (
    ReplicatedDensifier,
    all_reduce_statistics,
    reset_opacities_in_place,
)
from odin_ns.distributed.optimizer_binding import learning_rate_at
from odin_ns.distributed.phase import GaussianRows, PhaseController
from odin_ns.distributed.session_api import CheckpointState
from odin_ns.distributed.session_flow import SessionFlow
from odin_ns.distributed.sharded_checkpoint import merge_owned_rows, range_owner, remove_row_files
from odin_ns.distributed.sharded_densify import (
    OwnedRows,
    balance_new_rows,
    grow_and_prune,
    reset_opacities,
)
from odin_ns.distributed.sharded_eval import (
    EvalCopy,
    gather_eval_copy,
    pack_param_rows,
    unpack_param_rows,
)
from odin_ns.errors import OdinInputError
from odin_ns.model import GAUSSIAN_GROUPS
from odin_ns.preflight import check_sharded_config
from odin_ns.runtime import ParamGroupState
from odin_ns.runtime.engine import Engine
from odin_ns.runtime.layout import ShardLayout, cache_of, phase_read_sets
from odin_ns.schedule.ownership import (
    assign_ownership,
    ownership_report,
    rebalance_ownership,
    stream_read_counts,
)


def _row_columns(rows: OwnedRows) -> list[torch.Tensor]:
    """Per-row tensors of ``rows`` in a fixed order: parameters, exp_avg, exp_avg_sq, each
    in ``GAUSSIAN_GROUPS`` order ([O, ...] each)."""
    return [t[n] for t in (rows.params, rows.exp_avg, rows.exp_avg_sq) for n in GAUSSIAN_GROUPS]


def _row_dims(columns: list[torch.Tensor]) -> list[int]:
    """Floats per row of each tensor of ``_row_columns``."""
    return [int(np.prod(c.shape[1:])) for c in columns]


def _rows_of_columns(columns: list[torch.Tensor]) -> OwnedRows:
    """Inverse of ``_row_columns``."""
    k = len(GAUSSIAN_GROUPS)
    tables = [
        dict(zip(GAUSSIAN_GROUPS, columns[i * k : (i + 1) * k], strict=True)) for i in range(3)
    ]
    return OwnedRows(*tables)


class ShardedPhaseController(PhaseController):
    """Phases whose footprints come from the owners' rows.

    The replicated controller's rules on the same global reference (every rank holds the
    [N] reference rows, 5 floats each, indexed by global id, so ownership changes leave it
    valid); only a rank's share differs: each owner decides whether its rows' footprints
    hold and computes those of its rows that do not (all views), gathered by global id.
    The first phase, where every rank still holds the whole model, is the replicated
    controller's.
    """

    owned: np.ndarray | None = None  # [O] global ids of the model's first O rows
    num_rows: int = 0  # N

    def _num_rows(self, model) -> int:
        return model.num_points if self.owned is None else self.num_rows

    def _share(self, rows: np.ndarray) -> np.ndarray:
        if self.owned is None:
            return super()._share(rows)
        return np.intersect1d(rows, self.owned, assume_unique=True, return_indices=True)[1]

    def _gaussians(self, model, ids: np.ndarray) -> GaussianRows:
        if self.owned is None:
            return super()._gaussians(model, ids)
        table = torch.from_numpy(np.searchsorted(self.owned, ids))  # owned rows lead the table
        return GaussianRows.of(model, table.to(model.means.device))


class ShardedSession(SessionFlow):
    """The sharded distributed step of one rank (a ``TrainingSession``).

    Args:
        pipeline, optimizers, checkpoint_every: as ``SessionFlow``.
        resumed_phase: a checkpoint's ``PhaseController.resume_state`` (same world size:
            the first phase continues the plan's epoch where the checkpointed run was), or
            None.
        checkpoint_rows: N of the checkpoint this run resumes from, or None (a fresh run, whose
            ranks all hold the whole initial model). On resume each rank's model and
            optimizers hold only its contiguous range of the checkpoint's rows and their
            moments (``sharded_checkpoint.row_ranges``, the trainer's load); the first
            phase start moves every row to its owner.
        stop_step: the trainer's ``max_num_iterations`` (no push for steps never run).
        ownership: "locality" (from the plan) or "random" (Grendel-style baseline).
        live_panels: as ``SessionFlow``; rank 0 also refreshes its copy of the model
            (``sharded_eval``) at every phase start, for the live viewer.
    """

    def __init__(
        self,
        pipeline,
        optimizers: Optimizers,
        checkpoint_every: int = 0,
        resumed_phase: dict | None = None,
        stop_step: int | None = None,
        ownership: str = "locality",
        live_panels: bool = False,
        checkpoint_rows: int | None = None,
    ):
        super().__init__(pipeline, optimizers, checkpoint_every, resumed_phase, live_panels)
        config = pipeline.config
        self.max_rows_per_rank = int(config.max_rows_per_rank)
        self.timeout_s = float(config.sync.timeout_s)
        self.ownership = ownership
        self.stop_step = stop_step
        self.eval_copy_max_rows = int(config.eval_copy_max_rows)
        # three gloo groups: gradients, pushes, phase-start collectives (cache fill, ...)
        self.group = dist.new_group(backend="gloo")
        grads_group = dist.new_group(backend="gloo")
        push_group = dist.new_group(backend="gloo")
        self.step_signal = self._barrier_signal()  # barrier mode: a fourth group
        choice = self._choose_transport(transports=2)
        self.grads_tx = self._open_transport(choice, grads_group)
        self.push_tx = self._open_transport(choice, push_group)
        self.phases = self._phase_controller(ShardedPhaseController, self.group)
        self.owner: np.ndarray | None = None  # [N] int64
        self.layout: ShardLayout | None = None
        self.moments: tuple[dict, dict] | None = None  # exp_avg, exp_avg_sq per group [O]
        self.versions: torch.Tensor | None = None  # [O] int64
        # rows of the resumed checkpoint this rank read (its range), None in a fresh run
        self.loaded_rows = None if checkpoint_rows is None else self.model.num_points
        if checkpoint_rows is not None:
            self._hold_loaded_range(int(checkpoint_rows))
        self.densifier = ReplicatedDensifier(
            self.model.strategy, self.model.strategy_state, self.seed
        )
        self.densifier.ensure_state(self.num_rows, self.model.means.device)
        self.engine: Engine | None = None
        self.reports: list[dict] = []
        # A resumed run's ranks read their Gaussians from the checkpoint already.
        loaded = self.model.gauss_params.values() if self.loaded_rows else ()
        self._start_from_rank0(frozenset(id(p) for p in loaded))

    @property
    def num_rows(self) -> int:
        return int(self.owner.size) if self.owner is not None else self.model.num_points

    @torch.no_grad()
    def _hold_loaded_range(self, num_rows: int) -> None:
        """A resumed run: this rank holds its contiguous range of the checkpoint's
        ``num_rows`` Gaussians (the trainer loaded just those rows and their moments). Until
        the first phase start picks owners from its plan, each range's rank owns it."""
        self.owner = range_owner(num_rows, self.world_size)
        held = int(np.count_nonzero(self.owner == self.rank))
        if self.model.num_points != held:
            raise RuntimeError(
                f"rank {self.rank}: the model holds {self.model.num_points} Gaussians, its "
                f"range of the checkpoint's {num_rows} has {held}"
            )
        rows = self._keep_owned_rows(np.arange(held))
        self.layout = ShardLayout(self.owner, self.rank, np.empty(0, dtype=np.int64))
        self.moments = (rows.exp_avg, rows.exp_avg_sq)
        for name in GAUSSIAN_GROUPS:
            self.optimizers.optimizers[name].state.clear()  # moments live in the session

    # ------------------------------------------------------------------ phases
    def _owned_rows(self) -> OwnedRows:
        """This rank's owned rows (copies of the table's owned prefix) with moments."""
        assert self.layout is not None and self.moments is not None
        o = self.layout.num_owned
        params = {n: self.model.gauss_params[n].data[:o].clone() for n in GAUSSIAN_GROUPS}
        return OwnedRows(params, dict(self.moments[0]), dict(self.moments[1]))

    @torch.no_grad()
    def _keep_owned_rows(self, o_ids: np.ndarray) -> OwnedRows:
        """Rows ``o_ids`` ([O] sorted positions in the model's table) with their Adam
        moments: in a fresh run's first phase this rank's owned rows of the whole model
        every rank holds, with zero moments (no optimizer has stepped; ``_bind_table`` then
        frees the whole model); on resume the loaded range with the loaded moments
        (nerfstudio's load put them in the optimizers' state)."""
        ids = torch.from_numpy(o_ids).to(self.model.means.device)
        params, exp_avg, exp_avg_sq = {}, {}, {}
        for name in GAUSSIAN_GROUPS:
            param = self.model.gauss_params[name]
            state = self.optimizers.optimizers[name].state.get(param, {})
            params[name] = param.data[ids].clone()
            for out, key in ((exp_avg, "exp_avg"), (exp_avg_sq, "exp_avg_sq")):
                moment = state.get(key)
                out[name] = (
                    moment[ids].clone() if moment is not None else torch.zeros_like(params[name])
                )
        return OwnedRows(params, exp_avg, exp_avg_sq)

    def _start_phase(self, step: int) -> None:
        tic = time.perf_counter()
        if self.engine is not None:
            self.engine.drain()
            self.rendezvous(f"phase start at step {step}")  # before the collectives below
        first = not self.telemetry.phases  # the run's first phase
        whole_model = self.owner is None  # a fresh run's first phase: every rank holds it
        if not whole_model:
            self.phases.owned = self.layout.owned
            self.phases.num_rows = self.num_rows
        plan, record = self._plan_phase(step, self.num_rows)
        device = self.model.means.device
        if whole_model:
            n = self.model.num_points
            self.owner = assign_ownership(plan, self.ownership, self.seed)
            o_ids = np.flatnonzero(self.owner == self.rank)
            rows = self._keep_owned_rows(o_ids)
            self.versions = torch.full((o_ids.size,), step - 1, dtype=torch.int64, device=device)
            assert n == self.owner.size
        elif first:  # resumed: each rank holds its loaded range; owners from this plan
            owner = assign_ownership(plan, self.ownership, self.seed)
            loaded = torch.full((self.layout.num_owned,), step - 1, dtype=torch.int64)
            moved = int(np.count_nonzero(owner != self.owner))
            rows, self.versions = self._migrate_rows(
                self._owned_rows(), loaded.to(device), self.owner, owner
            )
            self.owner = owner
        else:
            rows, rebalance = self._rebalance(plan, self._owned_rows())
        report = ownership_report(plan, self.owner, self.seed)
        report["start_step"] = step
        if not first:
            report["rebalance"] = rebalance
        elif not whole_model:
            report["moved_from_loaded_ranges"] = moved
        self.reports.append(report)
        self._bind_table(plan, rows, step)
        record.phase_start_s = time.perf_counter() - tic
        record.num_gaussians = self.num_rows  # the model's, not this rank's table
        entry = vars(record)
        if self.live_panels:  # after the record's time: the viewer's cost, not the phase's
            tic = time.perf_counter()
            copy = self.refresh_eval_copy(step)
            entry["eval_copy_s"] = time.perf_counter() - tic
            entry["eval_copy_rows"] = None if copy is None else int(copy.ids.size)
        self.telemetry.record_phase(entry)

    def _rebalance(self, plan, rows: OwnedRows) -> tuple[OwnedRows, dict]:
        """A later phase's owners: the carried ones, or a fresh assignment (locality, or a
        random deal for the random baseline) with the moved rows migrated
        (``ownership.rebalance_ownership``, ``--pipeline.rebalance``; the same decision on
        every rank). Returns this rank's rows and the decision's report.
        """
        mode = self.pipeline.config.rebalance
        width = sum(_row_dims([rows.params[n] for n in GAUSSIAN_GROUPS]))  # floats per row
        decision = rebalance_ownership(
            plan,
            self.owner,
            mode,
            read_row_bytes=4 * width,
            migrate_row_bytes=12 * width + 8,
            strategy=self.ownership,  # the random baseline re-deals randomly, never by locality
            seed=self.seed,
        )
        if decision.moved_rows:
            rows, self.versions = self._migrate_rows(
                rows, self.versions, self.owner, decision.owner
            )
            self.owner = decision.owner  # the footprint reference is by global id: it holds
        return rows, decision.report()

    def _check_resident_rows(self, caches: list[np.ndarray], step: int) -> None:
        """``--pipeline.max-rows-per-rank``: every rank's owned + cached rows of the phase
        starting at ``step``, before any is allocated. ``caches``: [C_q] ids per rank. The
        owners and the plan are global, so every rank makes the same decision."""
        cap = self.max_rows_per_rank
        if cap <= 0:
            return
        owned = np.bincount(self.owner, minlength=self.world_size)
        resident = [int(owned[q]) + int(c.size) for q, c in enumerate(caches)]
        worst = int(np.argmax(resident))
        if resident[worst] > cap:
            raise OdinInputError(
                f"--pipeline.max-rows-per-rank {cap}: at step {step} rank {worst} would hold "
                f"{resident[worst]} rows ({int(owned[worst])} owned + {caches[worst].size} "
                f"cached of {self.num_rows} Gaussians); raise the cap or train on more ranks"
            )

    @torch.no_grad()
    def _bind_table(self, plan, rows: OwnedRows, step: int) -> None:
        """New local table (owned rows + this phase's cache, filled by the owners)."""
        reads = phase_read_sets(plan, self.world_size)
        caches = [cache_of(self.owner, q, r) for q, r in enumerate(reads)]
        self._check_resident_rows(caches, step)
        layout = ShardLayout(self.owner, self.rank, caches[self.rank])
        fill = self._fill_cache(rows, layout.owned, caches)
        table = {}
        for name in GAUSSIAN_GROUPS:
            data = torch.cat([rows.params[name], fill[name]]).contiguous()
            table[name] = torch.nn.Parameter(data)
        for name in GAUSSIAN_GROUPS:
            self.model.gauss_params[name] = table[name]
            opt = self.optimizers.optimizers[name]
            opt.param_groups[0]["params"] = [table[name]]
            opt.state.clear()  # moments live in the session (owned rows only)
        self.layout = layout
        self.moments = (rows.exp_avg, rows.exp_avg_sq)
        groups = []
        for name in GAUSSIAN_GROUPS:
            pg = self.optimizers.optimizers[name].param_groups[0]
            groups.append(
                ParamGroupState(
                    name=name,
                    param=table[name],
                    exp_avg=rows.exp_avg[name],
                    exp_avg_sq=rows.exp_avg_sq[name],
                    lr_at=learning_rate_at(self.optimizers, name),
                    betas=tuple(pg["betas"]),
                    eps=float(pg["eps"]),
                )
            )
        stop = None if self.stop_step is None else self.stop_step - step
        self.engine = Engine(
            groups,
            layout,
            plan,
            self.rank,
            self.world_size,
            self.grads_tx,
            self.push_tx,
            step_offset=step,
            versions=self.versions,
            timeout_s=self.timeout_s,
            stop=stop,
            silence=self.silence,
            max_inflight_bytes=int(self.pipeline.config.sync.max_inflight_bytes),
            sync=self.pipeline.config.sync,
            step_signal=self.step_signal,
            ledger=self.ledger,
        )

    def _fill_cache(self, rows: OwnedRows, owned: np.ndarray, caches: list[np.ndarray]) -> dict:
        """Every owner sends each reader the rows of its cache it owns (isend / irecv on the
        phase group); returns this rank's cache rows per group, [C, ...] each."""
        device = rows.params["means"].device
        width = sum(int(np.prod(rows.params[n].shape[1:])) for n in GAUSSIAN_GROUPS)
        mine = caches[self.rank]
        works, recvs = [], []
        for q in range(self.world_size):
            if q == self.rank:
                continue
            need = caches[q][self.owner[caches[q]] == self.rank]  # q's cache rows I own
            if need.size:
                buf = pack_param_rows(rows.params, np.searchsorted(owned, need))
                works.append(dist.isend(buf, dst=q, group=self.group, tag=7))
            got = np.flatnonzero(self.owner[mine] == q)  # positions in my cache
            if got.size:
                buf = torch.empty(got.size, width)
                works.append(dist.irecv(buf, src=q, group=self.group, tag=7))
                recvs.append((got, buf))
        for w in works:
            w.wait()
        out = {
            n: torch.empty((mine.size, *rows.params[n].shape[1:]), device=device)
            for n in GAUSSIAN_GROUPS
        }
        for got, buf in recvs:
            pos = torch.from_numpy(got).to(device)
            for n, part in unpack_param_rows(buf, rows.params).items():
                out[n][pos] = part
        return out

    def _apply_structural_change(self, step: int) -> None:
        assert self.engine is not None
        self.engine.drain()
        self.rendezvous(f"structural step {step}")  # before the all-reduce below
        if not self.densifier.ends_phase(step):
            self._reset_opacities_in_place(step)
            return
        state = self.densifier.state
        self.densifier.ensure_state(self.num_rows, self.model.means.device)
        if self.densifier.is_refine_step(step):  # as the replicated densifier: summed once
            all_reduce_statistics(state, self.group)
        rows = self._owned_rows()
        before = self.num_rows
        sources = np.arange(before)  # each row's row before the change (footprint reuse)
        if self.densifier.is_refine_step(step):
            rows, owner, info = grow_and_prune(
                self.model.strategy,
                state,
                rows,
                self.layout.owned,
                self.owner,
                self.rank,
                step,
                self.seed,
                self.group,
            )
            plan = self.phases.plan
            counts = stream_read_counts(plan) if plan is not None else None
            prefer = counts[:, info["parent"]] if counts is not None else None
            target = balance_new_rows(owner, info["is_new"], prefer)
            sources = info["parent"]
            # new rows (zero moments) move; every version becomes ``step`` below anyway
            stamped = torch.full((rows.params["means"].shape[0],), step, dtype=torch.int64)
            rows, _ = self._migrate_rows(rows, stamped.to(self.model.means.device), owner, target)
            self.owner = target
            for key in ("grad2d", "count", "radii"):
                if key in state and state[key] is not None:
                    state[key] = torch.zeros(self.owner.size, device=self.model.means.device)
        if self.densifier.is_reset_step(step):
            reset_opacities(rows, self.model.strategy.prune_opa)  # fresh rows: in place
        o = rows.params["means"].shape[0]
        self.versions = torch.full((o,), step, dtype=torch.int64, device=self.model.means.device)
        # the table is the owned rows until the next phase start adds the cache
        self.layout = ShardLayout(self.owner, self.rank, np.empty(0, dtype=np.int64))
        for name in GAUSSIAN_GROUPS:
            self.model.gauss_params[name] = torch.nn.Parameter(rows.params[name].contiguous())
            self.optimizers.optimizers[name].param_groups[0]["params"] = [
                self.model.gauss_params[name]
            ]
        self.moments = (rows.exp_avg, rows.exp_avg_sq)
        self.engine = None
        self.phases.end_after(step, sources)
        self.telemetry.record_structural(
            {"step": step, "gaussians_before": before, "gaussians_after": self.num_rows}
        )
        self._log_densification(step, before, self.num_rows)

    def _reset_opacities_in_place(self, step: int) -> None:
        """An opacity reset alone (after the drain and the rendezvous): the phase runs on.
        Every push whose rows were current at ``step`` was sent in its owner's drain; once
        they are in the table (``absorb_sent_pushes``: nothing else is applied meanwhile),
        the reset clamps the whole table (owned rows and cache: a cached row then holds its
        owner's reset value) and zeroes the owned rows' opacity moments. Later pushes are
        packed after their owner's reset, and clamping twice changes nothing."""
        self.engine.absorb_sent_pushes(step - self.phases.start_step)
        moments = [m["opacities"] for m in self.moments]
        opacities = self.model.gauss_params["opacities"].data
        reset_opacities_in_place(opacities, moments, self.model.strategy.prune_opa)
        n = self.num_rows
        self.telemetry.record_structural(
            {"step": step, "gaussians_before": n, "gaussians_after": n}
        )

    @torch.no_grad()
    def _migrate_rows(
        self, rows: OwnedRows, versions: torch.Tensor, before: np.ndarray, after: np.ndarray
    ) -> tuple[OwnedRows, torch.Tensor]:
        """Send every owned row whose owner changes from ``before`` to ``after`` ([N] int64,
        same global ids, identical on every rank) to its new owner with its parameters, both
        Adam moments and its version; merge the arriving rows by global id.

        Point to point on the phase group (every rank calls it): per peer one float32
        message [K, 3W] (parameters, exp_avg, exp_avg_sq) and one int64 message [K].

        Args:
            rows: [O, ...] per group, the rows of ``flatnonzero(before == rank)`` in id order.
            versions: [O] int64 last applied step of each of those rows.

        Returns:
            the rows of ``flatnonzero(after == rank)`` in id order, and their [O'] versions.
        """
        mine = np.flatnonzero(before == self.rank)  # ids of ``rows``, sorted
        if np.array_equal(before, after):
            return rows, versions
        columns = _row_columns(rows)
        device = versions.device
        works, arrivals = [], []
        for q in range(self.world_size):
            if q == self.rank:
                continue
            out = np.flatnonzero((before == self.rank) & (after == q))
            if out.size:
                pos = torch.from_numpy(np.searchsorted(mine, out)).to(device)
                buf = torch.cat([c[pos].reshape(out.size, -1).cpu() for c in columns], dim=1)
                works.append(dist.isend(buf.contiguous(), dst=q, group=self.group, tag=11))
                works.append(dist.isend(versions[pos].cpu(), dst=q, group=self.group, tag=12))
            inc = np.flatnonzero((before == q) & (after == self.rank))
            if inc.size:
                buf = torch.empty(inc.size, sum(_row_dims(columns)))
                ver = torch.empty(inc.size, dtype=torch.int64)
                works.append(dist.irecv(buf, src=q, group=self.group, tag=11))
                works.append(dist.irecv(ver, src=q, group=self.group, tag=12))
                arrivals.append((inc, buf, ver))
        for w in works:
            w.wait()
        keep = np.flatnonzero(after[mine] == self.rank)  # positions in ``rows`` that stay
        ids = np.concatenate([mine[keep]] + [inc for inc, _, _ in arrivals])
        order = torch.from_numpy(np.argsort(ids, kind="stable")).to(device)
        keep_t = torch.from_numpy(keep).to(device)
        merged, off = [], 0
        for c, d in zip(columns, _row_dims(columns), strict=True):
            parts = [c[keep_t]] + [
                buf[:, off : off + d].reshape(inc.size, *c.shape[1:]).to(device)
                for inc, buf, _ in arrivals
            ]
            merged.append(torch.cat(parts)[order].contiguous())
            off += d
        parts = [versions[keep_t]] + [ver.to(device) for _, _, ver in arrivals]
        return _rows_of_columns(merged), torch.cat(parts)[order].contiguous()

    # ------------------------------------------------------------------ drains
    def drain(self) -> None:
        """Apply every step run so far (checkpoints, evaluation, the end); then every rank
        is here (``rendezvous``) before the collectives that follow every drain."""
        if self.engine is not None:
            self.engine.drain()
            self.rendezvous("drain")

    @torch.no_grad()
    def refresh_eval_copy(self, step: int) -> EvalCopy | None:
        """Rank 0's copy of the whole model at ``step`` (``sharded_eval``), installed as the
        model's ``eval_copy``; None on other ranks. Collective; call after a drain."""
        if self.layout is None:  # no phase yet: every rank still holds the whole model
            return None
        o = self.layout.num_owned
        owned = {n: self.model.gauss_params[n].data[:o] for n in GAUSSIAN_GROUPS}
        copy = gather_eval_copy(
            owned,
            self.layout.owned,
            self.num_rows,
            step,
            self.eval_copy_max_rows,
            self.rank,
            self.world_size,
            self.group,
        )
        if copy is not None:
            self.model.eval_copy = copy.params
        return copy

    def release_eval_copy(self) -> None:
        """Free rank 0's copy, unless the live viewer renders it."""
        if not self.live_panels:
            self.model.eval_copy = None

    @contextlib.contextmanager
    def evaluation(self, step: int) -> Iterator[bool]:
        """Rank 0 gathers a copy of the whole model (collective, after a drain) and
        evaluates it alone; the other ranks go on and wait for it at their next read. A
        copy bounded below the model (``--pipeline.eval-copy-max-rows``) is not evaluated:
        its metrics would not be the model's."""
        copy = self.refresh_eval_copy(step)
        if copy is None:  # not rank 0
            yield False
            return
        try:
            if not copy.complete:
                CONSOLE.print(
                    f"[yellow]step {step}: evaluation skipped: the model has {copy.num_rows} "
                    f"Gaussians and --pipeline.eval-copy-max-rows is "
                    f"{self.eval_copy_max_rows}; ns-eval on a checkpoint evaluates the whole "
                    "model[/yellow]"
                )
                yield False
                return
            with self.busy("evaluating"):  # peers wait for rank 0 without timing out
                yield True
        finally:
            self.release_eval_copy()

    @torch.no_grad()
    def merged_model(self, directory: Path) -> dict | None:
        """Rank 0: {group: (param [N, ...], exp_avg, exp_avg_sq)} of the whole model, rows
        in global order, in files under ``directory`` (``sharded_checkpoint.merge_owned_rows``:
        every rank sends its owned rows to rank 0 a chunk at a time; call after a drain, on
        every rank); None on other ranks."""
        if self.layout is None:  # no phase yet: every rank holds the whole model
            if self.rank != 0:
                return None
            return {
                n: (p.data.clone(), torch.zeros_like(p.data), torch.zeros_like(p.data))
                for n, p in self.model.gauss_params.items()
            }
        o, (exp_avg, exp_avg_sq) = self.layout.num_owned, self.moments
        owned = {  # views of the table's owned prefix and the moments: sent, never changed
            n: (self.model.gauss_params[n].data[:o], exp_avg[n], exp_avg_sq[n])
            for n in GAUSSIAN_GROUPS
        }
        return merge_owned_rows(
            owned,
            self.layout.owned,
            self.owner,
            self.rank,
            self.world_size,
            self.group,
            directory,
        )

    def save_checkpoint(
        self,
        path: Path,
        build_state: Callable[[], CheckpointState],
        write: Callable[[CheckpointState, Path], None],
    ) -> None:
        """One nerfstudio checkpoint of the whole model, written by rank 0 (collective;
        after a drain): every rank's owned rows and moments merged in global row order
        into ``build_state``'s checkpoint of rank 0's table, whose resume entry (every
        rank's generators and [N] statistics, the phase state) is the layout replicated
        checkpoints have, so either mode resumes it."""
        rows_dir = path.with_suffix(".rows")  # rank 0's merged rows, until the file is written
        merged = self.merged_model(rows_dir)
        if self.rank != 0:
            return
        state = build_state()
        applied = float(state["step"] + 1)  # Adam's step count after a drained step
        for name, (param, m, v) in merged.items():
            state["pipeline"][f"_model.gauss_params.{name}"] = param
            state["optimizers"][name]["state"] = {
                0: {"step": torch.tensor(applied), "exp_avg": m, "exp_avg_sq": v}
            }
        with self.busy("writing a checkpoint"):  # peers wait: slow is not dead
            write(state, path)
        del state, merged
        remove_row_files(rows_dir)

    def replica_hash(self) -> str:
        digest = hashlib.sha256()
        for name in GAUSSIAN_GROUPS:
            o = self.layout.num_owned if self.layout is not None else None
            digest.update(self.model.gauss_params[name].detach()[:o].cpu().numpy().tobytes())
        return digest.hexdigest()

    def _summary_extra(self) -> tuple[dict | None, dict]:
        """Per rank: ownership reports and the rows it holds; the run: its layout."""
        rows = {
            "ownership": self.reports,
            "owned_rows": self.layout.num_owned if self.layout is not None else None,
            "loaded_rows": self.loaded_rows,  # rows of a resumed checkpoint this rank read
            "resident_rows": self.model.num_points,
        }
        return rows, {"parallel": "sharded"}

    def close(self) -> None:
        self.grads_tx.close()
        self.push_tx.close()
        self.liveness.close()


def open_session(
    trainer, resumed_phase: dict | None = None, checkpoint_rows: int | None = None
) -> ShardedSession:
    """The trainer's sharded session, after the checks of what sharded mode refuses.

    ``resumed_phase``: the checkpoint's phase state when it resumes on the same world size.
    ``checkpoint_rows``: the checkpoint's N when the trainer loaded each rank's range of it.
    """
    check_sharded_config(trainer.config, trainer.pipeline.world_size)
    if trainer.pipeline.model.mcmc_noise is not None:
        raise OdinInputError("--pipeline.parallel sharded supports the default strategy only")
    return ShardedSession(
        trainer.pipeline,
        trainer.optimizers,
        checkpoint_every=trainer.config.steps_per_save,
        # nerfstudio trains steps [start, start + max_num_iterations); start > 0 on resume
        stop_step=trainer._start_step + trainer.config.max_num_iterations,
        ownership=trainer.pipeline.config.ownership,
        resumed_phase=resumed_phase,
        live_panels=trainer.viewer_on,
        checkpoint_rows=checkpoint_rows,
    )
