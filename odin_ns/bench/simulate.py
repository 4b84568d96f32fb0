"""Discrete-event replay of plans: how long ranks wait under each synchronization mode.

Two entry points:

``simulate(plan, costs, mode)`` is the small model the scheduler benchmark uses: step
(t, r) takes ``cost[t, r]`` seconds; rank q's publication of step s arrives
``comm_latency + seconds_per_row * message_rows[s, q]`` after q finishes s.

- ``barrier``: rank r starts step t once every rank's step t - 1 publication has arrived.
- ``odin``: rank r starts step t once its own step t - 1 is done and, for every peer q
  with ``dependency[t, r, q] = s >= 0``, q's step s publication has arrived; optionally
  no rank runs more than ``max_lead`` steps ahead of the slowest (bounded buffers).

``replay(phases, mode, network, ...)`` replays a whole run: a list of ``Phase`` (a plan
with its dependency table, per-step compute and overhead seconds, the phase start's cost),
modes ``ddp`` / ``barrier`` / ``quality-first`` / ``throughput-first``, a ``Network``
(latency + bandwidth) or a ``Topology`` (ranks in nodes, host-staged or device-resident)
for the point-to-point publications, optionally another for ddp's dense all-reduce (``collective``: on one CPU host, gloo's all-reduce is measured by
``odin_ns.bench.allreduce``, not the publications' fitted delay), and an ``Ownership``
(who sends which bytes to whom; ``Replicated`` today, a sharded ownership plugs in through
the same ``traffic`` hook). See ``replay``.

Wait is idle time between a rank's consecutive steps. ``critical_path_wait`` is the
makespan minus the busiest rank's compute: wait that lengthens the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import scipy.sparse as sp

from odin_ns.schedule.plan import Plan


@dataclass
class SimResult:
    total_time: float  # makespan, seconds
    wait_per_rank: np.ndarray  # [R] seconds idle
    compute_per_rank: np.ndarray  # [R] seconds busy
    critical_path_wait: float  # total_time - max(compute_per_rank)
    start: np.ndarray  # [T, R]
    finish: np.ndarray  # [T, R]


def _step_costs(plan: Plan, costs: np.ndarray) -> np.ndarray:
    costs = np.asarray(costs, dtype=np.float64)
    T, R, _ = plan.views.shape
    if costs.ndim == 2:
        if costs.shape != (T, R):
            raise ValueError(f"per-step costs must be [T, R] = {[T, R]}, got {list(costs.shape)}")
        out = costs
    elif costs.ndim == 1:
        if costs.shape[0] != plan.footprints.shape[0]:
            raise ValueError(
                f"view costs have {costs.shape[0]} entries but the plan has "
                f"{plan.footprints.shape[0]} views"
            )
        out = costs[plan.views].sum(axis=2)
    else:
        raise ValueError("costs must be [V] (per view) or [T, R] (per step and rank)")
    if not np.isfinite(out).all() or (out < 0).any():
        raise ValueError("costs must be finite and non-negative")
    return out


def simulate(
    plan: Plan,
    costs: np.ndarray,  # [V] seconds per view, or [T, R] seconds per (step, rank)
    mode: Literal["barrier", "odin"] = "odin",
    comm_latency: float = 0.0,
    seconds_per_row: float = 0.0,
    max_lead: int | None = None,
) -> SimResult:
    """Replay ``plan`` with the given compute costs; see the module docstring."""
    if mode not in ("barrier", "odin"):
        raise ValueError(f"mode must be 'barrier' or 'odin', got {mode!r}")
    if comm_latency < 0 or seconds_per_row < 0:
        raise ValueError("comm_latency and seconds_per_row must be >= 0")
    if max_lead is not None and max_lead < 0:
        raise ValueError(f"max_lead must be >= 0, got {max_lead}")
    cost = _step_costs(plan, costs)
    T, R = cost.shape
    start = np.zeros((T, R))
    finish = np.zeros((T, R))
    if T == 0:
        z = np.zeros(R)
        return SimResult(0.0, z, z.copy(), 0.0, start, finish)
    arrive = np.zeros((T, R))  # when q's step-s publication reaches its peers
    delay = comm_latency + seconds_per_row * plan.message_rows
    cols = np.arange(R)[None, :]
    for t in range(T):
        if t == 0:
            s = np.zeros(R)
        elif mode == "barrier":
            s = np.full(R, arrive[t - 1].max())
        else:
            s = finish[t - 1].copy()
            dep = plan.dependency[t]  # [R, R]
            need = np.where(dep >= 0, arrive[np.maximum(dep, 0), cols], 0.0)
            s = np.maximum(s, need.max(axis=1))
            if max_lead is not None and t - 1 - max_lead >= 0:
                s = np.maximum(s, finish[t - 1 - max_lead].max())
        start[t] = s
        finish[t] = s + cost[t]
        arrive[t] = finish[t] + delay[t]
    compute = cost.sum(axis=0)
    total = float(finish[-1].max())
    wait = finish[-1] - compute  # each rank's idle time (it starts at 0 and never pauses otherwise)
    return SimResult(
        total_time=total,
        wait_per_rank=wait,
        compute_per_rank=compute,
        critical_path_wait=total - float(compute.max()),
        start=start,
        finish=finish,
    )


# ---------------------------------------------------------------------------- replay

SIM_MODES = ("ddp", "barrier", "quality-first", "throughput-first")
ROW_FLOATS = 59  # splatfacto gradient floats per Gaussian (SH degree 3)
PUBLICATION_ROW_BYTES = 4 * (ROW_FLOATS + 1)  # float32 row + the visible flag


@dataclass(frozen=True)
class Network:
    """Point-to-point link per rank: ``latency_s`` per message, ``bandwidth_Bps`` bytes/s
    per direction, shared by everything a rank sends (egress) or receives (ingress)."""

    name: str
    latency_s: float
    bandwidth_Bps: float
    source: str = ""


@dataclass(frozen=True)
class Topology:
    """Ranks in nodes of ``per_node`` consecutive ranks: a message between two ranks of one
    node travels on ``intra``, between nodes on ``inter`` (each rank its own link of that
    kind: one NIC per GPU, as DGX nodes have). ``copy_Bps`` > 0: a host-staged transport
    (gloo on GPUs): the sender copies what it publishes device -> host and the receiver
    host -> device at that rate, on top of the wire; 0: device-resident (NCCL)."""

    name: str
    intra: Network
    inter: Network
    per_node: int
    copy_Bps: float = 0.0
    source: str = ""

    def nodes(self, ranks: int) -> np.ndarray:
        """[R] node of every rank."""
        return np.arange(ranks) // max(1, self.per_node)


def as_topology(net: Network | Topology) -> Topology:
    """A single ``Network`` as a one-node topology (every pair on ``net``)."""
    if isinstance(net, Topology):
        return net
    return Topology(net.name, net, net, per_node=1 << 30, source=net.source)


def message_seconds(traffic: np.ndarray, topo: Topology, copied: np.ndarray) -> np.ndarray:
    """[T, q, r] seconds from q's publication leaving to its arrival at r.

    ``traffic``: [T, q, r] bytes; ``copied``: [T, q] bytes q copies off its device (host-
    staged only). A message takes its link's latency plus the larger of the sender's egress
    and the receiver's ingress on that kind of link (everything a rank sends or receives in
    the step shares its link), plus, host-staged, the sender's device -> host copy and the
    receiver's host -> device copy of the message."""
    T, R, _ = traffic.shape
    node = topo.nodes(R)
    same = node[:, None] == node[None, :]  # [q, r]
    out = np.empty_like(traffic, dtype=np.float64)
    for mask, link in ((same, topo.intra), (~same, topo.inter)):
        part = traffic * mask
        egress = part.sum(axis=2) / link.bandwidth_Bps  # [T, q]
        ingress = part.sum(axis=1) / link.bandwidth_Bps  # [T, r]
        dur = link.latency_s + np.maximum(egress[:, :, None], ingress[:, None, :])
        out = np.where(mask[None], dur, out)
    if topo.copy_Bps > 0:
        out = out + (copied[:, :, None] + traffic) / topo.copy_Bps
    return out


def allreduce_seconds(num_bytes: float, ranks: int, net: Network | Topology) -> float:
    """Ring all-reduce on ``net``; on a topology spanning nodes, NCCL's rings (one per NIC
    rail) each cross between nodes on one rank's NIC: the ring moves at the inter-node
    links' latency and at min(intra bandwidth, per_node x inter bandwidth) (the rails in
    parallel); on one node, at the intra-node link's."""
    if isinstance(net, Network):
        return ring_allreduce_seconds(num_bytes, ranks, net)
    if ranks <= net.per_node:
        return ring_allreduce_seconds(num_bytes, ranks, net.intra)
    rails = Network(
        f"{net.name} rings",
        max(net.intra.latency_s, net.inter.latency_s),
        min(net.intra.bandwidth_Bps, net.per_node * net.inter.bandwidth_Bps),
    )
    return ring_allreduce_seconds(num_bytes, ranks, rails)


class PlanLike(Protocol):
    views: np.ndarray  # int64 [T, R, B]
    footprints: sp.csr_matrix  # [V, N] bool
    dependency: np.ndarray  # int64 [T, R, R]
    dependency_rows: np.ndarray  # int64 [T, R, R]
    message_rows: np.ndarray  # int64 [T, R]


@dataclass
class StepPlan:
    """A plan rebuilt from recorded views (``dependency_table`` of ``footprints``)."""

    views: np.ndarray
    footprints: sp.csr_matrix
    dependency: np.ndarray
    message_rows: np.ndarray
    dependency_rows: np.ndarray

    @classmethod
    def from_views(cls, footprints: sp.csr_matrix, views: np.ndarray) -> StepPlan:
        from odin_ns.schedule import dependency_table

        dep, rows, msg = dependency_table(footprints, views)
        return cls(views, footprints, dep, msg, rows)


def read_set(plan: PlanLike, t: int, r: int) -> np.ndarray:
    """[M] sorted unique rows rank r reads (and writes) at step t: its views' footprints."""
    F = plan.footprints
    parts = [F.indices[F.indptr[v] : F.indptr[v + 1]] for v in plan.views[t, r]]
    return np.unique(np.concatenate(parts))


def dependency_share(plan: PlanLike) -> float:
    """Share of the rows steps read that a peer wrote at the step before: rows of rank r's
    step-t read set in some peer's step t - 1 read set (a step writes what it reads), over
    every row read, steps t >= 1 and all ranks. At two ranks stepping together this is
    what the training runs report (``mean_dependency_rows_per_step`` over
    ``mean_footprint_rows_per_step``); each row counts once however many peers wrote it."""
    T, R, _ = plan.views.shape
    N = plan.footprints.shape[1]
    writers = np.zeros(N, dtype=np.int32)  # how many ranks wrote each row at t - 1
    own = np.zeros(N, dtype=np.int32)
    prev = [read_set(plan, 0, r) for r in range(R)]
    dependent = read = 0
    for t in range(1, T):
        writers[:] = 0
        for rows in prev:
            writers[rows] += 1
        cur = [read_set(plan, t, r) for r in range(R)]
        for r in range(R):
            own[prev[r]] = 1
            dependent += int(np.count_nonzero(writers[cur[r]] - own[cur[r]] > 0))
            read += cur[r].size
            own[prev[r]] = 0
        prev = cur
    return dependent / max(1, read)


class Ownership(Protocol):
    """Who holds which rows, seen by the simulator as traffic: ``traffic(plan, row_bytes)``
    is ``[T, R, R]`` bytes that rank r sends to rank q at step t (sender, receiver);
    ``copied(traffic)`` the [T, R] bytes a sender takes off its device for them."""

    name: str

    def traffic(self, plan: PlanLike, row_bytes: float) -> np.ndarray: ...

    def copied(self, traffic: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Replicated:
    """Every rank holds every row and sends its whole publication to every peer."""

    name: str = "replicated"

    def traffic(self, plan: PlanLike, row_bytes: float) -> np.ndarray:
        T, R = plan.message_rows.shape
        out = np.repeat((plan.message_rows * row_bytes)[:, :, None], R, axis=2).astype(np.float64)
        out[:, np.arange(R), np.arange(R)] = 0.0
        return out

    def copied(self, traffic: np.ndarray) -> np.ndarray:
        """One publication, the same bytes to every peer: copied once."""
        return traffic.max(axis=2)


@dataclass(frozen=True)
class Sharded:
    """Each row has one owner (``owner[N]``, e.g. ``odin_ns.schedule.ownership``): a rank
    sends the gradient rows of the non-owned rows it wrote to their owners, and owners push
    the updated rows back to the readers; owned rows cost nothing. Every update of a
    non-owned row therefore takes two hops (reader -> owner -> reader, ``hops = 2``, applied
    to every message: pessimistic where the owner is the reader), and a rank that sent rows
    to owners at step t - 1 waits for their round trip before step t."""

    owner: np.ndarray  # [N] int64 owner rank per primitive
    name: str = "sharded"
    hops: int = 2

    def traffic(self, plan: PlanLike, row_bytes: float) -> np.ndarray:
        T, R = plan.message_rows.shape
        out = np.zeros((T, R, R))
        for t in range(T):
            for r in range(R):
                owners = self.owner[read_set(plan, t, r)]
                remote = np.bincount(owners[owners != r], minlength=R) * row_bytes
                out[t, r, :] += remote  # gradient rows to their owners
                out[t, :, r] += remote  # updated rows pushed back to the reader
        return out

    def copied(self, traffic: np.ndarray) -> np.ndarray:
        """Different rows to every peer: all of them."""
        return traffic.sum(axis=2)


@dataclass
class Phase:
    """One phase of a run to replay.

    ``compute[t, r]``: forward/backward seconds (the publication leaves when it ends);
    ``overhead[t, r]``: seconds after it before the rank may start its next step (publish,
    apply, loop); ``phase_start_s``: drain-to-first-step cost paid by every rank at once;
    ``num_rows``: primitives (ddp all-reduces ``num_rows`` rows of ``PUBLICATION_ROW_BYTES``:
    the engine's dense ``[N, 60]`` float32 buffer, gradients and the visible flag).
    """

    plan: PlanLike
    compute: np.ndarray
    overhead: np.ndarray
    num_rows: int
    phase_start_s: float = 0.0
    # a measured throughput-first run's admitted reads (``trace_admissions``); None: the rule
    admitted: set[tuple[int, int, int, int]] | None = None
    tf_need: tuple[np.ndarray, int] | None = None  # cached ``tf_needs`` result


@dataclass
class Replay:
    mode: str
    total_time: float
    views: int
    wait_per_rank: np.ndarray  # [R] seconds idle (phase starts excluded)
    busy_per_rank: np.ndarray  # [R] compute + overhead seconds
    # how much later the run ended than if no rank had waited: every rank's idle and busy
    # time span the same run (phase starts aside), so the busiest rank's idle (the least)
    critical_path_wait: float
    bytes_per_rank_per_step: float  # mean bytes a rank sends per step
    admitted_reads: int  # throughput-first: delayed reads the admission rule let through

    @property
    def views_per_second(self) -> float:
        return self.views / self.total_time if self.total_time > 0 else 0.0


def ring_allreduce_seconds(num_bytes: float, ranks: int, net: Network) -> float:
    """Ring all-reduce (reduce-scatter then all-gather): 2 (R - 1) messages of
    ``num_bytes / R`` per rank, each ``latency + bytes / bandwidth``. gloo's default CPU
    all-reduce is a ring; NCCL's ring moves the same bytes (its "bus bandwidth" is
    ``2 (R - 1) / R x bytes / time``, nccl-tests PERFORMANCE.md)."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * (net.latency_s + num_bytes / ranks / net.bandwidth_Bps)


def lagged_overlaps(plan: PlanLike, window: int) -> np.ndarray:
    """``[T, R, R, window + 1]``: ``|F(r, t) ∩ F(q, t - k)|`` for k = 0..window (0 before
    the plan's first step)."""
    T, R, B = plan.views.shape
    F = plan.footprints.tocsr().astype(np.float32)
    sel = sp.csr_matrix(
        (np.ones(T * R * B, np.float32), plan.views.reshape(-1), np.arange(0, T * R * B + 1, B)),
        shape=(T * R, F.shape[0]),
    )
    S = (sel @ F).astype(bool).astype(np.float32).tocsr()  # [T*R, N] step footprints
    out = np.zeros((T, R, R, window + 1), dtype=np.int64)
    chunk = max(1, 512 // max(R, 1))
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        lo = max(0, t0 - window)
        block = (S[t0 * R : t1 * R] @ S[lo * R : t1 * R].T).toarray()  # [(t1-t0)R, (t1-lo)R]
        block = block.reshape(t1 - t0, R, t1 - lo, R)
        for k in range(window + 1):
            ts = np.arange(t0, t1)
            ok = ts - k >= lo
            out[ts[ok], :, :, k] = block[np.flatnonzero(ok), :, ts[ok] - k - lo, :]
    return out


def tf_needs(
    plan: PlanLike,
    tau: float,
    window: int,
    evidence: float = 0.0,
    recorded: set[tuple[int, int, int, int]] | None = None,
) -> tuple[np.ndarray, int]:
    """Per (t, r, q) the newest publication of q that rank r must wait for under
    throughput-first on the plan's real overlaps, and how many delayed reads are admitted.

    Without ``recorded``, the admission rule decides (``odin_ns.runtime.admission.
    fallback_reason``); ``evidence`` stands for E (gradient evidence, not known from
    footprints): 0 admits every read the overlap and staleness conditions allow (an upper
    bound on admissions). ``recorded``: the (t, r, q, s) delayed reads a measured run
    admitted (local steps; ``trace_admissions``): exactly those are read around, so a
    replay of that run's trace waits where the run waited.
    """
    from odin_ns.runtime.admission import fallback_reason

    dep = plan.dependency
    T, R, _ = dep.shape
    ov = lagged_overlaps(plan, window)
    read_rows = ov[:, np.arange(R), np.arange(R), 0]  # [T, R] |F(r, t)|
    need = np.minimum(dep, np.arange(T)[:, None, None] - window - 1)  # older: stale, FIFO
    need = np.where(dep >= 0, np.maximum(need, -1), -1)
    admitted = 0
    for t, r, q in zip(*np.nonzero(dep >= 0), strict=True):
        for s in range(int(dep[t, r, q]), max(-1, t - window - 1), -1):
            overlap = int(ov[t, r, q, t - s])
            if overlap == 0:
                continue
            if recorded is not None:
                admit = (int(t), int(r), int(q), s) in recorded
            else:
                reason, _ = fallback_reason(
                    t, s, 0, overlap, int(read_rows[t, r]), lambda: evidence, tau, window
                )
                admit = reason is None
            if not admit:
                need[t, r, q] = s
                break
            admitted += 1
    return need, admitted


def trace_admissions(admitted: np.ndarray, steps: np.ndarray) -> set[tuple[int, int, int, int]]:
    """A measured run's admitted delayed reads as ``tf_needs``'s ``recorded`` set.

    Args:
        admitted: [K, 4] int64 (global step, reading rank, peer, global step of the peer's
            publication read around), from the run log (``bench.trace.step_table``).
        steps: [T] int64 the global step of each local step of the replayed phase.
    Reads whose step or publication is outside ``steps`` are left out.
    """
    local = {int(g): t for t, g in enumerate(steps)}
    return {
        (local[int(g)], int(r), int(q), local[int(s)])
        for g, r, q, s in np.asarray(admitted, dtype=np.int64).reshape(-1, 4)
        if int(g) in local and int(s) in local
    }


def replay(
    phases: list[Phase],
    mode: str,
    network: Network | Topology,
    ownership: Ownership | None = None,
    tau: float = 0.2,
    window: int = 4,
    evidence: float = 0.0,
    row_bytes: float = PUBLICATION_ROW_BYTES,
    collective: Network | Topology | None = None,
    host_s: float = 0.0,
    tables_s: float = 0.0,
) -> Replay:
    """Replay ``phases`` in order under ``mode``.

    Rank r's step t starts when its previous step (compute + overhead) is done and:
    ``ddp``: every rank finished step t - 1 and the dense ring all-reduce of step t - 1
    (``num_rows x PUBLICATION_ROW_BYTES``) completed, priced by ``ring_allreduce_seconds``
    on ``collective`` (default ``network``). It overlaps neither backward (gsplat's
    backward produces the gradients at its end) nor the step's overhead (packing the dense
    buffer comes before it, applying the sum after it, and on one CPU host the rest shares
    the cores with gloo's threads: started at the end of compute instead, the all-reduce
    made the validation predict ddp 7.5-13 points too fast);
    ``barrier``: every peer's step t - 1 publication
    arrived; ``quality-first``: the publications of ``dependency[t, r, q]`` arrived;
    ``throughput-first``: those the admission rule does not let through (``tf_needs``), or
    the phase's recorded admissions (``Phase.admitted``) read around. A publication of q (step s) leaves when q's compute ends and reaches r after
    ``latency + max(q's egress bytes, r's ingress bytes) / bandwidth`` of that step, in
    FIFO order per peer pair (``message_seconds``: on a ``Topology``, each pair on its
    node's or the inter-node links, host-staged copies added). ``host_s``: the engine's
    host work per step (``bench.control_plane``), added after every step of every mode
    but ddp (ddp stands for the dense all-reduce users run, torch's DDP, which keeps no
    per-row bookkeeping). ``tables_s``: a step's tables made ahead on a thread of the rank's
    own (the replicated layout beside a GPU), off the step's path but at that pace: a
    rank starts step t no sooner than ``tables_s`` after it started step t - 1, and the
    phase's first step makes its own. A phase starts once every rank ended its last step
    and every message arrived (drain), plus ``phase_start_s``.
    """
    if mode not in SIM_MODES:
        raise ValueError(f"mode must be one of {SIM_MODES}, got {mode!r}")
    own = ownership if ownership is not None else Replicated()
    clock = 0.0
    R = phases[0].compute.shape[1]
    busy, idle = np.zeros(R), np.zeros(R)
    views, sent, steps, admitted = 0, 0.0, 0, 0
    for ph in phases:
        T = ph.compute.shape[0]
        traffic = own.traffic(ph.plan, row_bytes)  # [T, R, R]
        dur = message_seconds(traffic, as_topology(network), own.copied(traffic))  # [T, q, r]
        hops = int(getattr(own, "hops", 1))  # sharded: every update goes through its owner
        dur = dur * hops
        need = ph.plan.dependency
        if mode == "throughput-first":
            if ph.tf_need is None:
                ph.tf_need = tf_needs(ph.plan, tau, window, evidence, ph.admitted)
            need, n_adm = ph.tf_need
            admitted += n_adm
        dense_bytes = ph.num_rows * PUBLICATION_ROW_BYTES
        allreduce = allreduce_seconds(dense_bytes, R, collective or network)
        after = ph.overhead + (0.0 if mode == "ddp" else host_s)  # [T, R]
        start_phase = clock + ph.phase_start_s
        ready = np.full(R, start_phase + tables_s)  # own previous step done
        started = np.full(R, -np.inf)  # when each rank started its previous step
        arrive = np.zeros((T, R, R))  # [s, q, r]
        cols = np.arange(R)[None, :]
        for t in range(T):
            s = ready.copy()
            if t > 0:
                if mode == "ddp":
                    s[:] = ready.max() + allreduce
                elif mode == "barrier":
                    s = np.maximum(s, arrive[t - 1].max(axis=0))
                else:
                    d = need[t]  # [r, q]
                    got = arrive[np.maximum(d, 0), cols, np.arange(R)[:, None]]  # [r, q]
                    s = np.maximum(s, np.where(d >= 0, got, -np.inf).max(axis=1))
                    if hops > 1:  # sharded: its own non-owned rows return from the owners
                        sent_any = traffic[t - 1].sum(axis=1) > 0  # [r]
                        s = np.maximum(s, np.where(sent_any, np.diagonal(arrive[t - 1]), -np.inf))
            s = np.maximum(s, started + tables_s)  # its tables are made
            started = s
            idle += s - ready
            done = s + ph.compute[t]
            prev = arrive[t - 1] if t > 0 else np.zeros((R, R))
            arrive[t] = np.maximum(prev, done[:, None] + dur[t])
            if hops == 1:  # replicated: a rank's own update is local
                arrive[t, np.arange(R), np.arange(R)] = 0.0
            ready = done + after[t]
            busy += ph.compute[t] + after[t]
        end = ready.max()
        if mode == "ddp":
            end += allreduce
            sent += T * R * 2 * (R - 1) / R * dense_bytes
        else:
            end = max(end, float(arrive[-1].max()))
            sent += float(traffic.sum())
        idle += end - ready
        clock = float(end)
        views += int(ph.plan.views.shape[0] * R * ph.plan.views.shape[2])
        steps += T
    return Replay(
        mode=mode,
        total_time=clock,
        views=views,
        wait_per_rank=idle,
        busy_per_rank=busy,
        critical_path_wait=float(idle.min()),
        bytes_per_rank_per_step=sent / max(1, steps * R),
        admitted_reads=admitted,
    )


# ------------------------------------------------------------------ Grendel-style baseline

# What Grendel-GS moves per step (github.com/nyu-systems/Grendel-GS, read at 6e50e9a):
# gaussian_renderer/__init__.py all_to_all_communication_final sends every Gaussian a
# rank owns to every rank whose image part it touches, as 9 float32 (means2D 2, rgb 3,
# conic and opacity 4, differentiable) plus 2 (radii, depth); autograd sends the 9
# gradients back. scene/gaussian_model.py redistribute_gaussians moves Gaussians to
# uniformly random ranks with their 59 parameters and both Adam moments when the counts
# drift apart (checked every 10th densification, densification every 100 steps).
GRENDEL_FORWARD_BYTES = 4 * (9 + 2)  # per (Gaussian, destination rank)
GRENDEL_BACKWARD_BYTES = 4 * 9
GRENDEL_MOVED_BYTES = 4 * 59 * 3  # a redistributed Gaussian: parameters + exp_avg(_sq)
GRENDEL_REDISTRIBUTE_EVERY = 1000  # steps between redistributions (upper bound on their rate)


def owned_reads(plan: PlanLike, owner: np.ndarray) -> np.ndarray:
    """[T, q, r]: rows of rank r's step-t read set that rank q owns (q != r; 0 on the
    diagonal)."""
    T, R, _ = plan.views.shape
    out = np.zeros((T, R, R))
    for t in range(T):
        for r in range(R):
            out[t, :, r] = np.bincount(owner[read_set(plan, t, r)], minlength=R)
            out[t, r, r] = 0.0
    return out


def replay_grendel(
    phase: Phase,
    compute: np.ndarray,
    network: Network | Topology,
    owner: np.ndarray,
    row_scale: float = 1.0,
    num_rows: int | None = None,
) -> Replay:
    """Grendel-style training of ``phase``'s views: every rank owns ``owner``'s rows
    (random), renders its part of the step's views, and in lockstep every step (a) gathers
    the send counts (one all-gather, latency-bound), (b) receives the projected Gaussians of
    its part from their owners (all-to-all, ``GRENDEL_FORWARD_BYTES`` per row and
    destination), (c) renders, and (d) returns their gradients (``GRENDEL_BACKWARD_BYTES``);
    each all-to-all ends when its slowest message arrives. ``compute[t, r]``: the rank's
    forward/backward seconds (Grendel balances pixels across ranks by measured time: pass
    the balanced cost). Redistribution: every ``GRENDEL_REDISTRIBUTE_EVERY`` steps,
    (R - 1) / R of ``num_rows`` Gaussians move, amortized per step. ``row_scale``: bytes
    per footprint row are scaled by it (footprints of a small scene standing for a larger
    one)."""
    topo = as_topology(network)
    T, R = compute.shape
    reads = owned_reads(phase.plan, owner) * row_scale  # [T, q, r] rows
    nothing = np.zeros((T, R))
    forward = message_seconds(reads * GRENDEL_FORWARD_BYTES, topo, nothing)
    backward = message_seconds(np.swapaxes(reads, 1, 2) * GRENDEL_BACKWARD_BYTES, topo, nothing)
    forward = np.where(reads > 0, forward, 0.0).max(axis=(1, 2))  # [T]
    backward = np.where(np.swapaxes(reads, 1, 2) > 0, backward, 0.0).max(axis=(1, 2))
    latency = topo.intra.latency_s if R <= topo.per_node else topo.inter.latency_s
    counts = (R - 1) * latency  # ring all-gather of the send counts
    n = phase.num_rows if num_rows is None else num_rows
    moved = n / R * (R - 1) / R * GRENDEL_MOVED_BYTES  # bytes each rank sends
    redistribute = (latency + moved / topo.inter.bandwidth_Bps) / GRENDEL_REDISTRIBUTE_EVERY
    if R <= topo.per_node:
        redistribute = (latency + moved / topo.intra.bandwidth_Bps) / GRENDEL_REDISTRIBUTE_EVERY
    step = compute.max(axis=1) + forward + backward + counts + redistribute  # [T]
    total = float(step.sum() + phase.phase_start_s)
    busy = compute.sum(axis=0)
    wait = total - busy
    return Replay(
        mode="grendel",
        total_time=total,
        views=int(phase.plan.views.shape[0] * R * phase.plan.views.shape[2]),
        wait_per_rank=wait,
        busy_per_rank=busy,
        critical_path_wait=float(wait.min()),
        bytes_per_rank_per_step=float(
            (reads.sum() * (GRENDEL_FORWARD_BYTES + GRENDEL_BACKWARD_BYTES)) / (T * R)
        ),
        admitted_reads=0,
    )
