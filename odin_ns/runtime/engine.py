"""The primitive-sync engine of both layouts (DESIGN 3.4-3.6, 3.11): owners hold rows and
moments, readers cache.

A rank's table is its ownership map's local table (``layout.ShardLayout``): the sharded
layout (``--pipeline.parallel sharded``) gives each row one owner and a rank caches the
non-owned rows its phase reads; the replicated layout gives every row ``EVERY_RANK``, so a
rank holds the whole model, caches nothing, sends its gradient rows to every peer and
applies every update: one step path, two maps.

Per step ``t`` (all sizes and peers known from the plan: ``step_tables``, each step's
made as the step nears):

- **before**: wait until (a) every owned row of the read set has its last planned update
  before ``t`` applied here, and (b) every *push* for ``t`` has arrived: owner ``o`` sends
  reader ``r`` the rows ``r`` reads at ``t`` that some rank wrote earlier in the phase, as
  soon as the last of those rows' updates is applied and its earlier pushes to ``r`` are
  sent (pushes per pair go in ``r``'s step order, so FIFO receives match), once ``o`` has
  registered it: a rank registers the pushes of the steps up to ``PUSH_LEAD`` past its
  last finished one, so no rank needs a phase's tables to know a pair's order;
- **after backward**: send the gradient rows of non-owned rows to their owners, one
  message per owner; file the own rows' gradients;
- **apply** (owner, per row in version order): row p's step-``s`` update once every
  writer of p at ``s`` has arrived and p's previous planned write is applied, summed in
  rank order and applied with selective Adam: the owner's ``UpdateLog`` over its owned
  rows (its "footprints" are, per writer, the owned rows it wrote), so bitwise the same
  update whoever owns the row. A push leaves once every row in it has its last update
  before the read applied.

**Barrier** (``sync.mode``, with a ``StepSignal``): step ``t`` waits, besides the above,
until every rank has finished step ``t - 1`` (the signal) and every update of this rank's
owned rows from the steps before ``t`` is applied: the synchronous baseline. Parameters
equal quality-first's; only when steps start differs.

**ddp** (``sync.mode``, replicated layout only): the baseline users have. Every step one
dense all-reduce of every row's gradient and visible flag (``[N, W]``; a rank's part is its
read rows only), filed whole (``UpdateLog.add_sum``); a step waits until every earlier
step's sum is applied.

**Throughput-first** (``sync.mode``): ``before_step`` decides on the step's pending
sources (owned rows still waiting for a writer's gradient, cached rows whose push is late)
with ``sharded_admission``; a step reads around the admitted ones, and pushes carry one
more column, the rows' evidence.

Gradients and pushes travel on two ``P2PTransport`` instances (two gloo groups), so each
stream is FIFO per peer in the sender's order and neither blocks the other. Only
point-to-point messages on the step path; phase starts use collectives.

**Credits** (``max_inflight_bytes``): per peer and stream, the bytes sent but not yet taken
by the peer stay under a cap (one message is always allowed, however large). A gradient
message waits in ``after_backward``, receiving, applying and pushing meanwhile. A push that
does not fit is packed (its rows' values at its ready step) and queued behind the pair's
earlier ones, and goes when the reader takes what is in flight; the owner keeps applying.
So no rank's progress waits on credits except a gradient send, and that waits only on an
owner at least two steps behind (its receives for the sender's earlier steps are not
posted yet): the rank furthest behind never waits on credits, and its peers' pushes to it
go out as it posts their receives (each pair's FIFO order), so it always advances. Holding
a push unsent and stopping the owner's applies instead would need no copy, but can
deadlock with three ranks: the owner stops for a reader that waits on a third rank that
waits on the owner.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from odin_ns.runtime.config import ParamGroupState, SyncConfig
from odin_ns.runtime.layout import ShardLayout
from odin_ns.runtime.ledger import RunLedger, StepMetrics
from odin_ns.runtime.liveness import Awaited, PeerSilence, wait_until
from odin_ns.runtime.sharded_admission import PendingSource, ShardedAdmission, TakenPush
from odin_ns.runtime.step_kernels import StepKernels
from odin_ns.runtime.step_signal import StepSignal
from odin_ns.runtime.step_tables import (
    TABLES_AHEAD,
    PhaseSteps,
    Push,
    Step,
    groups_ahead,
    step_rows,
)
from odin_ns.runtime.transport import ALL_PEERS, Transport, has_credits
from odin_ns.runtime.update_log import ApplyHook, UpdateLog, VersionTest
from odin_ns.runtime.uploads import upload, upload_together

GRAD, PUSH = 0, 1
NOTHING_LEFT = np.iinfo(np.int64).max  # the step a reader's next push waits on: none left
# How many steps past its last finished one a rank registers pushes (``_register_pushes``):
# an owner sends, and a reader posts receives for, the pushes read up to there, so a reader
# runs at most PUSH_LEAD steps ahead of an owner whose push it reads, and a rank holds the
# tables of about PUSH_LEAD steps (TABLES_AHEAD more beside an accelerator), not a phase's
PUSH_LEAD = 4


@dataclass
class StepPath:
    """What the step path reads of one step, made once (``Engine._path``): its id lists on
    the parameters' device (moved in one copy, a list shared by several uses once) and the
    test of its owned reads."""

    reads: Tensor  # [M] local ids of the read set
    reads_global: Tensor  # [M] their global ids (the same tensor where they are the same)
    # [G] local ids: every distinct list of gradient rows sent, then the owned reads (where
    # they are not one of those), one after the other, so that the step packs its gradient
    # rows in one operation and each send and the log's own rows are a slice of the result
    grad_rows: Tensor
    # (start, stop, the owners rows grad_rows[start:stop] go to): one entry per distinct
    # list (rows every rank owns: to every peer)
    grad_sends: list[tuple[int, int, list[int]]]
    own_slice: slice  # where grad_rows holds the owned reads
    own_test: VersionTest  # the owned reads against their last update before the step
    # per push the step's tables give (``Step.pushes_out``, ``pushes_in``), in their order:
    # its id list on the device; an outgoing one's rows against their last update before
    # the read
    push_rows_out: list[Tensor]
    push_tests: list[VersionTest]
    push_rows_in: list[Tensor]

    @property
    def own_rows(self) -> Tensor:
        """Owned local ids of the reads (a slice of ``grad_rows``)."""
        return self.grad_rows[self.own_slice]


class Engine:
    """The step path of one rank, in either layout (see the module docstring).

    Args:
        groups: the rank's parameter groups: ``param`` is the local table [L, ...] (owned
            prefix [O]); ``exp_avg`` / ``exp_avg_sq`` are [O, ...] (owned rows only).
        layout: the phase's ``ShardLayout``.
        plan: the phase's plan.
        rank, world_size: this rank and R.
        grads: transport of gradient rows (its own gloo group).
        pushes: transport of pushed parameter rows (another gloo group).
        step_offset: global step of the plan's local step 0.
        versions: [O] int64 last applied global step of each owned row (brought up to date
            at every ``drain``).
        timeout_s: deadline of every wait (of peers' silence, with ``silence``).
        silence: the session's ``PeerSilence``: a wait lasts while a peer says it is busy
            (rank 0 evaluating, writing a checkpoint, a paused viewer); None: plain deadlines.
        stop: local steps >= stop never run (the end of training): nothing is pushed for
            them, so no send waits on a reader that will never post its receive.
        max_inflight_bytes: credits (module docstring): the most bytes of one stream's
            messages to one peer not yet taken by it; None: no bound.
        sync: the run's ``SyncConfig``; mode ``throughput-first`` reads around lagging
            rows that ``sharded_admission`` admits (pushes then carry one more column: the
            rows' evidence); any other mode (or None) reads exactly (quality-first).
        step_signal: barrier mode's ``StepSignal`` (module docstring); None: no global wait.
        ledger: where steps, waits and admission decisions are recorded (the session's, one
            for every phase's engine); default a new ``RunLedger``.
        hook: the update log's ``ApplyHook`` (MCMC's noise); None: none.
        tables_thread: whether a thread of their own makes the step tables beside the
            engine's, ``TABLES_AHEAD`` steps past the newest one asked for (``PhaseSteps``),
            each with its ``StepPath`` (``PhaseSteps.derived``); a layout with pushes then
            has each step's cut on another thread while the next step's record is made
            (``step_rows``' ``aside``). Else each step's tables are made when first needed.
            None: beside an accelerator, not on CPU ranks (the host runs the kernels there;
            a second thread would take a core from them).
    """

    def __init__(
        self,
        groups: Sequence[ParamGroupState],
        layout: ShardLayout,
        plan,
        rank: int,
        world_size: int,
        grads: Transport | None,
        pushes: Transport | None,
        step_offset: int,
        versions: Tensor,
        timeout_s: float = 120.0,
        stop: int | None = None,
        silence: PeerSilence | None = None,
        max_inflight_bytes: int | None = None,
        sync: SyncConfig | None = None,
        step_signal: StepSignal | None = None,
        ledger: RunLedger | None = None,
        hook: ApplyHook | None = None,
        tables_thread: bool | None = None,
    ):
        self.groups = list(groups)
        self.step_signal = step_signal
        self.layout = layout
        self.plan = plan
        self.rank = rank
        self.world = world_size
        self.grads_tx = grads
        self.push_tx = pushes
        self.offset = int(step_offset)
        self.versions = versions  # [O] int64 (parameters' device)
        self.timeout_s = float(timeout_s)
        self.silence = silence
        self.max_inflight_bytes = max_inflight_bytes
        self.device = self.groups[0].param.device
        self.dims = [g.row_dim for g in self.groups]
        self.width = sum(self.dims) + 1  # gradient rows: groups' columns, then visible flag
        self.dense = sync is not None and sync.mode == "ddp"
        if self.dense and not layout.identity:
            raise ValueError("ddp (a dense all-reduce) needs every rank to own every row")
        self.admission = None
        if sync is not None and sync.mode == "throughput-first":
            self.admission = ShardedAdmission(
                sync, layout.num_local, layout.num_owned, step_offset, self.device
            )
        # pushed rows: parameters (and throughput-first: the rows' evidence)
        self.pwidth = sum(self.dims) + (self.admission is not None)
        num_steps = plan.num_steps if stop is None else min(plan.num_steps, max(0, stop))
        if tables_thread is None:  # beside an accelerator's kernels the host has time
            tables_thread = self.device.type != "cpu"
        # each step's tables made as the step nears (its pushes registered PUSH_LEAD steps
        # ahead, ``_register_pushes``): beside an accelerator on a thread of their own
        # TABLES_AHEAD steps further, each with its step path; a layout with owners then
        # cuts each step's tables on another thread while the next step's record is made
        steps = step_rows(
            plan, layout, world_size, num_steps, aside=tables_thread, device=self.device,
            group_writers=groups_ahead(layout, world_size, tables_thread),
        )  # fmt: skip
        # the host kernels of the update log and of the step's version tests
        self.kernels = StepKernels.resolve()
        ahead = TABLES_AHEAD if tables_thread else 0
        self.steps = PhaseSteps(
            steps, num_steps, ahead=ahead, derive=self._make_path if ahead else None
        )
        # the peers this rank may push to and be pushed by (a layout with owners)
        self._readers = [] if layout.replicated else [q for q in range(world_size) if q != rank]
        self.num_steps = num_steps
        # the owned rows' pending updates, applied per row in version order
        o = layout.num_owned
        owned = [dataclasses.replace(g, param=g.param.data[:o]) for g in self.groups]
        self.log = UpdateLog(
            owned,  # the table's owned prefix (views: applied in place)
            self.steps,
            world_size,
            step_offset,
            versions if versions.device.type == "cpu" else versions.cpu(),
            hook=hook,
            observe_sum=None if self.admission is None else self.admission.observe_apply,
            versions_on_take=bool(self._readers),  # pushes ask as rows are applied
            kernels=self.kernels,
        )
        self._versions = self.log.versions.numpy()  # [O] host view (``settle_versions``)
        self._row_ops = self.log.row_ops  # pack and scatter, resolved for the device once
        self.config = sync if sync is not None else SyncConfig(mode=self._mode())
        self.ledger = ledger if ledger is not None else RunLedger()
        self.ledger.phases += 1
        self.done = -1  # own steps finished (gradients filed)
        self.readable = -1  # the last step ``before_step`` made readable
        self.posted = -1  # gradient receives posted for local steps up to this one
        self._prepare_step_path()
        self._prepare_pushes()

    def _prepare_step_path(self) -> None:
        """What the step path would otherwise rebuild at every message, made once per
        phase: the table's per-group [L, d] views and what a push carries of a row. A step's
        own id lists and its pushes' (``_path``) are made with its tables on their thread
        (made ahead) or when the step is first needed."""
        device, num_local = self.device, self.layout.num_local
        self._table = [
            g.param.data.view(num_local, d) for g, d in zip(self.groups, self.dims, strict=True)
        ]
        # what a push carries of a row: its columns (throughput-first: then its evidence)
        self._pushed_columns = self._table + (
            [] if self.admission is None else [self.admission.evidence.strength]
        )
        self._paths: dict[int, StepPath] = {}  # the steps in flight
        # throughput-first: local step -> [K] local rows its reads went around (read stale)
        self._read_around: dict[int, np.ndarray] = {}
        # visible rows outside their step's read set, summed over the phase on the device
        # where reading it would synchronize the step (``_check_visible``)
        self._outside = torch.zeros((), dtype=torch.int64, device=device)

    def _prepare_pushes(self) -> None:
        """Each pair's push stream, empty until ``_register_pushes`` adds each step's: per
        reader each registered push's id list on the parameters' device and the test of
        its rows (``out``; None once sent); per owner each registered push and its id list
        on the device (``inn``; None once taken), each step's index in it (``_push_of``);
        counts sent and received; pushes queued for credits; what each reader's next
        unsent push waits on."""
        self.out: dict[int, list[tuple[Tensor, VersionTest] | None]] = {
            q: [] for q in self._readers
        }
        self.inn: dict[int, list[tuple[Push, Tensor] | None]] = {o: [] for o in self._readers}
        self._push_of: dict[tuple[int, int], int] = {}  # (owner, local step) -> its index
        self.registered = -1  # the pushes of local steps up to this one are registered
        self.push_sent = dict.fromkeys(self._readers, 0)  # per reader: pushes sent (count)
        self.push_recv = dict.fromkeys(self._readers, 0)  # per owner: pushes received (count)
        self._deferred = {q: deque() for q in self._readers}  # per reader: (k, packed push)
        # per reader (``self._readers[i]``), what its next unsent push waits on: a row and
        # the step it needs (``VersionTest.waiting_on``; none registered: NOTHING_LEFT), so
        # that ``_flush_pushes`` tests only the pushes whose awaited row has its step, in
        # one array read
        self._awaited_rows = np.zeros(len(self._readers), dtype=np.int64)
        self._awaited_steps = np.full(len(self._readers), NOTHING_LEFT, dtype=np.int64)

    def _upload(self, lists: list[np.ndarray]) -> list[Tensor]:
        """Host id lists on the parameters' device, moved in one copy."""
        return upload_together([torch.from_numpy(rows) for rows in lists], self.device)

    def _path(self, t: int) -> StepPath:
        """Local step t's ``StepPath``: made with its tables where a thread makes them ahead
        (``PhaseSteps.derived``), else when the step is first needed; forgotten once the
        step ran."""
        path = self._paths.get(t)
        if path is None:
            st = self.steps[t]
            path = self.steps.derived(t)
            if path is None:
                path = self._make_path(st)
            self._paths[t] = path
        return path

    def _make_path(self, st: Step) -> StepPath:
        """A step's ``StepPath`` from its tables (on the tables' thread too: it reads only
        the tables and what the engine fixed at its start)."""
        # the gradient rows' lists, each distinct one once, then the owned reads (where they
        # are none of those)
        owners: dict[int, tuple[np.ndarray, list[int]]] = {}
        for o, rows in st.grad_out.items():
            owners.setdefault(id(rows), (rows, []))[1].append(o)
        owners.setdefault(id(st.own_rows), (st.own_rows, []))
        lists = [rows for rows, _ in owners.values()]
        stops = np.cumsum([rows.size for rows in lists]).tolist()
        starts = [0, *stops[:-1]]
        grad_rows = lists[0] if len(lists) == 1 else np.concatenate(lists)
        shared = [st.reads, st.reads_global, grad_rows]
        distinct = list({id(rows): rows for rows in shared}.values())  # a shared list once
        pushes = [p.rows for p in st.pushes_out] + [p.rows for p in st.pushes_in]
        moved = self._upload(distinct + pushes)
        on_device = {id(rows): m for rows, m in zip(distinct, moved[: len(distinct)], strict=True)}
        pushed = moved[len(distinct) :]
        sent = len(st.pushes_out)
        i = list(owners).index(id(st.own_rows))
        return StepPath(
            reads=on_device[id(st.reads)],
            reads_global=on_device[id(st.reads_global)],
            grad_rows=on_device[id(grad_rows)],
            grad_sends=[
                (start, stop, sent_to)
                for start, stop, (_, sent_to) in zip(starts, stops, owners.values(), strict=True)
                if sent_to
            ],
            own_slice=slice(starts[i], stops[i]),
            own_test=self._version_test(*st.own_waits),
            push_rows_out=pushed[:sent],
            push_tests=[self._version_test(p.rows, p.prev) for p in st.pushes_out],
            push_rows_in=pushed[sent:],
        )

    def _version_test(self, rows: np.ndarray, prev: np.ndarray) -> VersionTest:
        """The test of owned local ``rows`` against their last planned update before a read
        (``prev``: local steps, each >= 0: rows that wait, a step's ``own_waits`` or a
        push's rows)."""
        return VersionTest(rows, self.offset + prev, self.kernels)

    # ------------------------------------------------------------ keys and posting
    def _key(self, kind: int, t: int) -> int:
        """Arrival.step of a message: gradients the global step of local step t, pushes
        their index t in the pair's push list of the phase (each stream has its own
        transport). A transport's failure names it as the message's step."""
        return (self.offset + t) if kind == GRAD else t

    def _tag(self, kind: int, t: int) -> int:
        return self._key(kind, t) % (1 << 30)

    def _post(self, t: int) -> None:
        """Post gradient receives for local steps <= t, each step's once: from the peers
        that write rows this rank owns at the step; register the pushes read up to
        ``PUSH_LEAD`` steps past the last finished step."""
        for s in range(self.posted + 1, t + 1):
            if not self.dense:  # the all-reduce arrives without a posted receive
                for q, rows in enumerate(self.steps[s].writes.positions):
                    if q != self.rank and rows.numel():  # (a writer with no row sends none)
                        self.grads_tx.post_recv(q, self._key(GRAD, s), self._tag(GRAD, s),
                                                rows.numel(), self.width)  # fmt: skip
        self.posted = max(self.posted, t)
        self._register_pushes(self.done + PUSH_LEAD)

    def _register_pushes(self, through: int) -> None:
        """Add the pushes of local steps up to ``through`` to their pairs' streams, in step
        order: post a receive for each push in and send each push out that is current. Both
        sides of a pair register at the same point of their own progress (``_post``: the
        last finished step plus ``PUSH_LEAD``), so an owner sends only what its reader has
        registered by the same step, and after a drain at step t (every rank finished t)
        both know the same streams without any step's tables past t + PUSH_LEAD."""
        through = min(through, self.num_steps - 1)
        if not self._readers:
            return
        added = False
        for s in range(self.registered + 1, through + 1):
            st, path = self.steps[s], self._path(s)
            for p, rows, test in zip(
                st.pushes_out, path.push_rows_out, path.push_tests, strict=True
            ):
                self.out[p.peer].append((rows, test))
                added = True
            for p, rows in zip(st.pushes_in, path.push_rows_in, strict=True):
                k = len(self.inn[p.peer])
                self._push_of[(p.peer, s)] = k
                self.inn[p.peer].append((p, rows))
                self.push_tx.post_recv(p.peer, self._key(PUSH, k), self._tag(PUSH, k),
                                       p.rows.size, self.pwidth)  # fmt: skip
        self.registered = max(self.registered, through)
        # a reader whose stream had nothing unsent waits on its new push now, which may be
        # current (a stream with pushes unsent waits on its oldest: nothing to test)
        idle = np.flatnonzero(self._awaited_steps == NOTHING_LEFT).tolist() if added else []
        for i in idle:
            self._await_next_push(i)
        if any(self._awaited_steps[i] != NOTHING_LEFT for i in idle):
            self._flush_pushes()

    # ------------------------------------------------------------ progress
    def _poll(self, timeout: float = 0.0) -> int:
        """Take in every arrived gradient (filed in the log) and push (written to the
        table); waits up to ``timeout`` seconds for a push if no gradient came (without a
        push transport, for a gradient: a waiting rank sleeps until something arrives
        rather than spin). Returns how many arrived."""
        if self.push_tx is None:
            return self._take(self.grads_tx, GRAD, timeout)
        got = self._take(self.grads_tx, GRAD, 0.0)
        return got + self._take(self.push_tx, PUSH, timeout if got == 0 else 0.0)

    def _take(self, tx: Transport, kind: int, timeout: float) -> int:
        """Take in what ``tx`` (``kind``: GRAD or PUSH) has received, waiting up to
        ``timeout`` seconds for the first; raise its transport's failure. Returns the count."""
        if tx is None:  # a single rank, or (every rank owns every row) no pushes
            return 0
        arrived = tx.take(timeout)
        pushes: list[TakenPush] = []  # in arrival order
        for a in arrived:
            self.ledger.current.bytes_recv += a.buf.numel() * a.buf.element_size()
            if a.peer == ALL_PEERS:  # ddp: every rank's gradient rows of a step, summed
                self.log.add_sum(a.step - self.offset, upload(a.buf, self.device))
            elif kind == GRAD:
                self.log.add(a.step - self.offset, a.peer, upload(a.buf, self.device))
            else:
                pushes.append(self._absorb_push(a.peer, a.step, a.buf))
        if pushes:  # the table's cache rows, in one operation (a later push of a row wins)
            self._row_ops.scatter_rows(
                self._table, [p.rows_data for p in pushes], [p.values for p in pushes]
            )
            if self.admission is not None:
                self.admission.observe_pushes(pushes)
        err = tx.failure()
        if err is not None:
            raise err
        return len(arrived)

    def _absorb_push(self, owner: int, k: int, buf: Tensor) -> TakenPush:
        """Owner ``owner``'s push k, taken in order, its values on the parameters' device
        (for the caller to write into the table and note the evidence of)."""
        if k != self.push_recv[owner]:
            raise RuntimeError(f"rank {self.rank}: push {k} from {owner} out of order")
        self.push_recv[owner] += 1
        push, rows = self.inn[owner][k]
        self.inn[owner][k] = None  # (taken: not kept)
        return TakenPush(owner, push.step, push.rows, rows, upload(buf, self.device))

    def lagging_owned_reads(self, t: int) -> tuple[np.ndarray, int | None]:
        """Local step t's owned reads whose last planned update before t is not applied yet
        ([K] local ids), and the oldest local step of an update they lack (None: K = 0)."""
        test = self._path(t).own_test
        through = self.log.settle_versions(self.offset + t)
        rows = test.rows[test.lacking(self._versions, through)]
        if rows.size == 0:
            return rows, None
        return rows, self.log.oldest_unapplied(t, torch.from_numpy(rows))

    def read_versions(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Local step t's owned reads as they are now (after ``before_step(t)``): ([K]
        global ids, [K] the global step each row has applied, [K] the step quality-first
        reads it at: its last planned update before t, or the one it has if the phase
        planned none). Throughput-first's reads around an admitted update have the first
        below the second. The applied steps are the apply op's exact vector, a read of the
        parameters' device: for inspection (tests, reports), not called on the step path
        (which asks ``current_reads``)."""
        st = self.steps[t]
        exact = self.log.versions_data.index_select(0, self._path(t).own_rows)
        have = exact.cpu().numpy()
        need = np.where(st.own_prev >= 0, self.offset + st.own_prev, have)
        return self.layout.gids[st.own_rows], have, need

    def read_around(self, t: int) -> np.ndarray:
        """[K] local rows that local step t reads around a pending update (throughput-first's
        admitted reads, after ``before_step(t)`` and until its ``after_backward``): with
        ``SyncConfig.stale_gradients`` "drop" they carry no update from this rank at t.
        Empty when every row is read current."""
        return self._read_around.get(t, np.zeros(0, dtype=np.int64))

    def current_reads(self, t: int) -> Tensor:
        """[K] int64 host global ids: local step t's owned reads at the version
        quality-first reads them at (all of them, except where throughput-first reads
        around a pending update)."""
        st = self.steps[t]
        through = self.log.settle_versions(self.offset + t)
        need = self.offset + st.own_prev
        current = (st.own_prev < 0) | (need <= through) | (self._versions[st.own_rows] >= need)
        return torch.from_numpy(self.layout.gids[st.own_rows][current])

    @torch.no_grad()
    def _apply_ready(self) -> None:
        """Apply every owned row whose writers all arrived (in version order), then send
        the pushes that became current."""
        self._send_deferred()  # queued pushes, if credits came back
        tic = time.perf_counter()
        applied = self.log.apply_ready()
        if applied:
            self.ledger.current.rows_applied += applied
            self._flush_pushes()
            self.ledger.current.apply_s += time.perf_counter() - tic

    @torch.no_grad()
    def _flush_pushes(self) -> None:
        """Send every push, in each pair's order, whose rows are current (their last update
        before the read applied): at once while the reader has credits, else packed now
        (the rows change at a later apply) and queued behind the pair's earlier pushes
        (``_send_deferred``). The pushes that became current together are packed in one
        operation, each a slice of the result."""
        if not self._readers:  # (every rank owns every row, say: no pushes)
            return
        # every applied row's host version: a push may need any step applied so far
        through = self.log.settle_versions(NOTHING_LEFT)
        versions = self._versions
        # (a reader's next push waits on a row's step: moved if applied, by either rule)
        moved = np.maximum(versions[self._awaited_rows], through) >= self._awaited_steps
        current: list[tuple[int, int]] = []  # (reader, its push), in sending order
        for i in np.flatnonzero(moved).tolist():
            q = self._readers[i]
            stream = self.out[q]
            k = self.push_sent[q]
            while k < len(stream) and stream[k][1].current(versions, through):
                current.append((q, k))
                k += 1
            self.push_sent[q] = k
            self._await_next_push(i)
        if current:
            self._send_current_pushes(current)

    def _send_current_pushes(self, pushes: list[tuple[int, int]]) -> None:
        """Pack the rows of ``pushes`` ((reader, push index), current now) in one operation
        and send each (or queue it behind the pair's earlier ones)."""
        parts = [self.out[q][k][0] for q, k in pushes]
        rows = parts[0] if len(parts) == 1 else torch.cat(parts)
        packed = self._row_ops.pack_rows(rows, self._pushed_columns)
        for q, k in pushes:  # (packed: not kept)
            self.out[q][k] = None
        start = 0
        for (q, k), part in zip(pushes, parts, strict=True):
            stop = start + part.numel()
            buf, start = packed[start:stop], stop
            queue = self._deferred[q]
            if queue or not self._has_credits(self.push_tx, q, buf.numel() * 4):
                queue.append((k, buf))
                self.ledger.current.pushes_deferred += 1
                queued = sum(b.numel() * b.element_size() for _, b in queue)
                self.ledger.current.deferred_bytes_max = max(
                    self.ledger.current.deferred_bytes_max, queued
                )
            else:
                self._send_push(q, k, buf)

    def _await_next_push(self, i: int) -> None:
        """Note what reader ``self._readers[i]``'s next unsent push waits on (nothing left:
        a step no row reaches)."""
        q = self._readers[i]
        k = self.push_sent[q]
        stream = self.out[q]
        row, step = stream[k][1].waiting_on() if k < len(stream) else (0, NOTHING_LEFT)
        self._awaited_rows[i], self._awaited_steps[i] = row, step

    def _send_deferred(self) -> None:
        """Send queued pushes, oldest first, while their readers have credits."""
        for q, queue in self._deferred.items():
            while queue and self._has_credits(self.push_tx, q, queue[0][1].numel() * 4):
                k, buf = queue.popleft()
                self._send_push(q, k, buf)

    def _send_push(self, q: int, k: int, buf: Tensor) -> None:
        self.push_tx.send(q, self._key(PUSH, k), self._tag(PUSH, k), buf)
        self.ledger.current.bytes_sent += buf.numel() * buf.element_size()
        self._note_inflight(self.push_tx, q)

    def _has_credits(self, tx: Transport, peer: int, nbytes: int) -> bool:
        if self.max_inflight_bytes is None:
            return True
        return has_credits(tx.inflight_bytes(peer)[0], nbytes, self.max_inflight_bytes)

    def _note_inflight(self, tx: Transport, peer: int) -> None:
        self.ledger.in_flight(tx.inflight_bytes(peer)[0])

    def _wait(self, awaited: Callable[[], Awaited], what: str) -> None:
        """Receive and apply until ``awaited()`` (the (peer, global step) still missing) is
        None (``liveness.wait_until``); times out after ``timeout_s`` in which no peer was
        heard from (``silence``: busy peers' heartbeats extend the deadline: a sharded rank
        often waits on a peer that waits on a third), naming what it waited for."""
        peers = [q for q in range(self.world) if q != self.rank]
        begun = time.perf_counter()
        try:
            wait_until(
                awaited,
                self._poll,
                self._apply_ready,
                lambda peer, start: self._deadline(peers, start),
                self.rank,
                what,
                self.timeout_s,
                begun,
                0.002,
                self._describe,
            )
        finally:  # a wait a busy peer's beats extended: counted (also when it times out)
            if self.silence is not None and self.silence.heard_since(begun):
                self.ledger.busy_s += time.perf_counter() - begun

    def _missing_before(self, t: int) -> Awaited:
        """What local step t still needs before it reads (quality-first and barrier): the
        oldest gradient its owned reads lack, a push of its cached reads, or (barrier)
        every rank's step t - 1; None when nothing."""
        through = self.log.settle_versions(self.offset + t)
        if not self._path(t).own_test.current(self._versions, through):
            return self.log.first_missing(t)
        if self.dense and self.log.oldest_unapplied(t) is not None:
            return self.log.first_missing(t)  # ddp: the sum of every earlier step, applied
        for p in self.steps[t].pushes_in:
            if self.push_recv[p.peer] <= self._push_of[(p.peer, t)]:
                return p.peer, self.offset + t
        if not self._everyone_finished_before(t):
            return -1, self.offset + t - 1
        return None

    # ------------------------------------------------------------ step path
    def before_step(self, t: int) -> float:
        """Block until local step t's read set is current (throughput-first: current, or
        lagging where ``sharded_admission`` admits it); returns the seconds waited for
        peers (the apply of what arrived meanwhile, and the step's own bookkeeping before
        it, its tables made and pushes registered, are the rank's work, not in it)."""
        if t != self.done + 1 or self.readable != self.done:
            raise ValueError(f"before_step({t}): expected local step {self.done + 1}")
        if t >= self.num_steps:
            raise ValueError(f"before_step({t}): outside the bound plan's {self.num_steps} steps")
        cur = self.ledger.begin_step(self.offset + t)
        # the step's own bookkeeping first, outside its wait (the seconds spent waiting for
        # peers): receives posted, pushes registered, the tables and id lists made
        self._post(t)
        self._path(t)
        start = time.perf_counter()
        what = f"before_step({self.offset + t}) waiting for owners' rows"
        if self.admission is None:
            # what arrived is applied here only if the step waits for it or a reader may
            # (this rank's pushes); else with the step's own rows, after its backward: one
            # apply a step, not two, where the peers' rows of step t come before step t
            self._poll()
            if self._readers or self._missing_before(t) is not None:
                self._wait(lambda: self._missing_before(t), what)
        else:
            self._admit(t, what)
        cur.wait_s = time.perf_counter() - start - cur.apply_s
        self.readable = t
        return cur.wait_s

    def _everyone_finished_before(self, t: int) -> bool:
        """Barrier mode: every rank finished local step t - 1 and this rank applied every
        update of its owned rows before t. Other modes (and a phase's first step, which
        follows the phase start's collectives): True."""
        if self.step_signal is None or t == 0:
            return True
        return (
            self.step_signal.everyone_finished(self.offset + t - 1)
            and self.log.oldest_unapplied(t) is None
        )

    def _pending(self, t: int) -> list[PendingSource]:
        """Throughput-first: local step t's pending sources (``sharded_admission``): owned
        reads whose last planned update is not applied yet, and each owner's push for t not
        arrived yet."""
        st = self.steps[t]
        out = []
        rows, s = self.lagging_owned_reads(t)
        if rows.size:
            own = self._path(t).own_test
            need = own.need[np.searchsorted(own.rows, rows)]
            lagging = VersionTest(rows, need, self.kernels)
            step = self.offset + t
            out.append(
                PendingSource(
                    self.rank,
                    rows,
                    s,
                    lambda lagging=lagging: (
                        lagging.lacking(self._versions, self.log.settle_versions(step)).size
                        < lagging.rows.size
                    ),
                )
            )
        for p in st.pushes_in:
            o, k = p.peer, self._push_of[(p.peer, t)]
            if self.push_recv[o] <= k:
                s = self.admission.oldest_missing(p.rows)
                out.append(PendingSource(o, p.rows, s, lambda o=o, k=k: self.push_recv[o] > k))
        return out

    def _admit(self, t: int, what: str) -> None:
        """Throughput-first: decide on every pending source; wait for the fallbacks' sources
        to move and decide again, until every remaining source is admitted."""
        assert self.admission is not None
        read_rows = int(self.steps[t].reads.size)
        while True:
            self._poll()
            self._apply_ready()
            sources = self._pending(t)
            decisions = self.admission.decide(t, read_rows, sources)
            waits = [src for src, d in zip(sources, decisions, strict=True) if not d.admitted]
            if not waits:
                self.ledger.count(decisions)
                self.ledger.read_delayed(sum(d.overlap_rows for d in decisions))  # may lag
                if sources:  # disjoint: owned rows, then each owner's cached rows
                    self._read_around[t] = np.concatenate([s.rows for s in sources])
                return
            self.ledger.count([d for d in decisions if not d.admitted])
            self._wait(lambda waits=waits: self._missing_source(t, waits), what)

    def _missing_source(self, t: int, waits: list[PendingSource]) -> Awaited:
        """None once one of the fallbacks' sources moved, else what the first one waits
        for: its owner's push, or (owned rows) the oldest gradient they lack."""
        if any(src.caught_up() for src in waits):
            return None
        src = waits[0]
        if src.peer == self.rank:
            return self.log.first_missing(t)
        return src.peer, self.offset + src.pub_step

    @torch.no_grad()
    def after_backward(self, t: int, grads: Sequence[Tensor | None], visible: Tensor) -> None:
        """Send non-owned gradient rows to their owners, file the own rows, apply (ddp:
        start the step's dense all-reduce instead). Rows the step read around a pending
        update (throughput-first) are sent as they are when ``SyncConfig.stale_gradients``
        is "apply" (the default: where they are most of a view's rows, as in an object
        capture, dropping them drops most of its signal), and carry no update from this
        rank at t when it is "drop" (a gradient of values read stale, applied after the
        update it lacked, repeats that update's evidence: street, 2 ranks, impact rule at
        tau 0.2, five paired seeds, PSNR against barrier's from -0.57 to -0.21 dB median).

        Args:
            grads: per group the local [L, ...] gradient (None: zero).
            visible: [L] bool rows visible in this rank's view (all of them read at t).
        """
        if t != self.readable or t == self.done:
            raise ValueError(f"after_backward({t}): before_step({t}) must come first, once")
        n = self.layout.num_local
        if visible.shape != (n,) or visible.dtype != torch.bool:
            raise ValueError(f"visible must be a [{n}] bool mask of the local table")
        columns = []
        for d, grad in zip(self.dims, grads, strict=True):
            columns.append(
                torch.zeros(n, d, device=self.device)
                if grad is None
                else grad.reshape(n, d)  # (under no_grad: nothing recorded)
            )
        columns.append(visible.to(torch.float32).unsqueeze(1))
        self._check_visible(t, visible)
        around = self._read_around.pop(t, None)
        if around is not None and self.config.stale_gradients == "drop":
            # no update from values read stale: zero rows, not visible
            idx = upload(torch.from_numpy(around), self.device)
            columns = [c.index_fill(0, idx, 0.0) for c in columns]
        if self.dense:
            self._all_reduce(t, columns)
        else:
            self._send_gradients(t, columns)
        self.done = t
        if self.step_signal is not None:
            self.step_signal.finished(self.offset + t)
        self._poll()
        self._apply_ready()
        self.steps.forget_through(t)  # (the update log keeps what it still needs)
        for s in [s for s in self._paths if s <= t]:
            del self._paths[s]
        self.steps.make_ahead()  # last: beside an accelerator, while it runs the next step

    def _check_visible(self, t: int, visible: Tensor) -> None:
        """Refuse a step whose visible rows leave its read set (a rank reads and writes
        only the rows the plan gave it). On the host at once; on an accelerator the count
        is added up on the device and read at the drain (reading it here would synchronize
        the step): two reductions and two in-place adds a step."""
        reads = self._path(t).reads
        if self.device.type == "cpu":
            # numpy's count of a bool mask: 30 us at 1M rows, torch's 220 us
            mask = visible.numpy()
            if np.count_nonzero(mask) != np.count_nonzero(mask[reads.numpy()]):
                self._raise_outside(f"step {self.offset + t}")
            return
        self._outside.add_(visible.sum(dtype=torch.int64))
        self._outside.sub_(visible.index_select(0, reads).sum(dtype=torch.int64))

    def _raise_outside(self, where: str) -> None:
        raise ValueError(
            f"{where}: visible rows outside the step's read set; a rank may only read and "
            "write the rows its plan gives it"
        )

    def _all_reduce(self, t: int, columns: list[Tensor]) -> None:
        """ddp: the step's dense [N, W] buffer (every row; only the read rows carry this
        rank's part: a gradient on a row the rank did not draw is no rank's update in any
        mode), summed over every rank by one all-reduce and filed whole."""
        reads = self._path(t).reads
        buf = torch.zeros(self.layout.num_local, self.width, device=self.device)
        buf[reads] = self._row_ops.pack_rows(reads, columns)
        if self.grads_tx is None:
            self.log.add_sum(t, buf)
            return
        self.log.record(t)
        self.grads_tx.all_reduce(self._key(GRAD, t), buf)
        self.ledger.current.bytes_sent += buf.numel() * buf.element_size()

    def _send_gradients(self, t: int, columns: list[Tensor]) -> None:
        """Send the step's gradient rows to their owners (credits permitting), file the
        own rows in the log."""
        st, path = self.steps[t], self._path(t)
        packed = (
            self._row_ops.pack_rows(path.grad_rows, columns) if path.grad_rows.numel() else None
        )
        for start, stop, owners in path.grad_sends:
            buf = packed[start:stop]
            nbytes = buf.numel() * buf.element_size()
            for o in owners:
                self._send_gradient(t, o, buf, nbytes)
        if st.own_rows.size:
            self.log.add(t, self.rank, packed[path.own_slice])
        elif t > self.log.created:  # the step's record exists (drain and admission read it)
            self.log.record(t)  # (a step already retired: every row applied, nothing to do)

    def _send_gradient(self, t: int, o: int, buf: Tensor, nbytes: int) -> None:
        """Send local step t's packed gradient rows ``buf`` to owner ``o`` once it has
        credits (receiving, applying and pushing meanwhile)."""
        if not self._has_credits(self.grads_tx, o, nbytes):
            tic = time.perf_counter()
            try:
                self._wait(
                    lambda: (
                        None
                        if self._has_credits(self.grads_tx, o, nbytes)
                        else (o, self.offset + t)
                    ),
                    f"after_backward({self.offset + t}) waiting for credits to rank {o} "
                    f"(max_inflight_bytes {self.max_inflight_bytes})",
                )
            finally:  # counted also when it times out
                self.ledger.credit_waited(time.perf_counter() - tic)
        self.grads_tx.send(o, self._key(GRAD, t), self._tag(GRAD, t), buf)
        self.ledger.current.bytes_sent += nbytes
        self._note_inflight(self.grads_tx, o)

    def step_reads(self, t: int) -> tuple[Tensor, Tensor]:
        """Local step t's reads on the parameters' device: (local ids, global ids), uploaded
        once for the step path (the same tensor where local ids are global ids)."""
        path = self._path(t)
        return path.reads, path.reads_global

    def poll(self) -> None:
        """Non-blocking: take in what has arrived, apply what is ready, send the pushes that
        became current."""
        self._poll()
        self._apply_ready()

    def drain(self) -> None:
        """Apply every step of the phase run so far; wait for this rank's sends. The seconds
        it waits for peers (its applies and its own bookkeeping left out) count in the
        current step's ``drain_wait_s``."""
        if self.readable != self.done:
            raise ValueError("drain() between before_step() and after_backward() of a step")
        tic = time.perf_counter()
        if self.device.type != "cpu" and int(self._outside):  # ``_check_visible``'s count
            self._raise_outside(f"a step in {self.offset}..{self.offset + self.done}")
        last = self.done
        self._post(last)  # (pushes registered through last + PUSH_LEAD, as every rank's)
        cur = self.ledger.current
        applied_s, waiting = cur.apply_s, time.perf_counter()
        self._wait(
            lambda: (
                None
                if self.log.oldest_unapplied(last + 1) is None
                else self.log.first_missing(last + 1)
            ),
            f"drain after step {self.offset + last}",
        )

        def unsent() -> Awaited:
            for tx in (self.grads_tx, self.push_tx):
                oldest = None if tx is None else tx.oldest_unsent()  # (peer, message key)
                if oldest is not None:
                    return oldest[0], self.offset + last
            for q, queue in self._deferred.items():
                if queue:
                    return q, self.offset + last
            if self.step_signal is not None and not self.step_signal.settled():
                return -1, self.offset + last
            return None

        self._wait(unsent, f"drain after step {self.offset + last} (sends)")
        self.ledger.drain_waited(time.perf_counter() - waiting - (cur.apply_s - applied_s))
        self.log.settle_after_drain()
        if self.versions is not self.log.versions:  # the caller's copy on the device
            self.versions.copy_(self.log.versions)
        self.ledger.drains += 1
        self.ledger.drain_s += time.perf_counter() - tic

    def absorb_sent_pushes(self, t: int) -> None:
        """After every rank drained at local step t: take in every push the owners sent in
        their drains, and nothing else: no gradient is filed or applied, so an in-place
        change of the table made next (the opacity reset) comes after them and before any
        later update. Each pair's stream is registered through t + ``PUSH_LEAD`` on both
        sides and every update through t, and none after, is applied at its owner, so the
        owner sent the stream up to its first push with a row current only after t
        (``Push.ready > t``), packed before its change. Pushes sent since (packed after
        their owner's change) may be taken in too."""
        want = {}
        for o, pushes in self.inn.items():
            k = self.push_recv[o]  # (a push taken was current: its ready <= t)
            while k < len(pushes) and pushes[k][0].ready <= t:
                k += 1
            want[o] = k

        def owners_missing() -> list[int]:
            return [o for o, n in want.items() if self.push_recv[o] < n]

        def awaited() -> Awaited:
            owners = owners_missing()
            return (owners[0], self.offset + t) if owners else None

        wait_until(
            awaited,
            lambda timeout: self._take(self.push_tx, PUSH, timeout),
            lambda: None,  # nothing applied (see the docstring)
            lambda peer, start: self._deadline(owners_missing(), start),
            self.rank,
            f"taking in the pushes drained at step {self.offset + t}",
            self.timeout_s,
            time.perf_counter(),
            0.002,
            self._describe,
        )

    def _describe(self, peer: int) -> str:
        """What a timeout adds about ``peer`` (its last busy notice, if any)."""
        return "" if self.silence is None else self.silence.describe(peer)

    def _deadline(self, peers: list[int], start: float) -> float:
        """When a wait on ``peers`` that began at ``start`` times out (busy peers' beats
        extend it)."""
        if self.silence is None:
            return start + self.timeout_s
        return self.silence.latest_deadline(peers, start)

    def _mode(self) -> str:
        if self.admission is not None:
            return "throughput-first"
        return "barrier" if self.step_signal is not None else "quality-first"

    @property
    def metrics(self) -> list[StepMetrics]:
        """Every step's record so far (the ledger's: every phase's engine that used it)."""
        return self.ledger.steps

    def summary(self) -> dict:
        """Run totals of the ledger (every phase's engine that used it)."""
        return self.ledger.summary(self.config)


__all__ = ["Engine", "StepPath"]
