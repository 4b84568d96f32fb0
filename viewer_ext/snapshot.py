"""Sync-statistics snapshots: the dict the panels render, and how to read one.

A snapshot is a plain dict (see ``SNAPSHOT_KEYS``); every field may be missing early in a
run, so the readers here return None instead of raising. ``snapshot_from_run`` turns a
finished run's ``odin_run.json`` into the same dict, so live and saved runs share panels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from odin_ns.runtime.admission import FALLBACK_REASONS

SNAPSHOT_KEYS = (
    "step",  # int: latest global step
    "mode",  # "barrier" | "quality-first" | "throughput-first"
    "world_size",  # int
    "ranks",  # [{"rank", "steps", "compute_s", "wait_s", "bytes_sent", "version_lag"}]
    # (a rank may carry "mean_bytes_sent" instead of a "bytes_sent" series: saved runs)
    "wait_hidden",  # float | None: 1 - Odin's wait / a barrier's estimated wait (rank means)
    "barrier_wait_estimate_s",  # float | None
    "wait_note",  # str, optional: how the two waits were obtained
    "odin_wait_s",  # float | None
    "staleness_hist",  # {"0": int, "1": int, ...} (throughput-first)
    "admitted",  # int: delayed reads admitted
    "fallbacks",  # {"overlap", "evidence", "staleness", "phase": int}
    "plan",  # {"phase", "start_step", "num_steps", "views_per_rank", "predicted_conflict",
    # "predicted_previous_step_reads", "rebuilt_at_step"}
    "tau",  # float: admission threshold in use
    "staleness_window",  # int: K in use
)


MISSING = "—"


# ---------------------------------------------------------------------- scalar readers


def as_float(value: Any) -> float | None:
    """A finite float, or None for missing / non-numeric / NaN / inf."""
    if type(value) is float:  # the common case, fast
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def step_wait(record: dict) -> float | None:
    """A step record's seconds waiting for peers: at its read gate (``wait_s``) and in the
    drains and rendezvous after it (``drain_wait_s``, 0 in logs without it); None without
    ``wait_s``."""
    gate = as_float(record.get("wait_s"))
    if gate is None:
        return None
    return gate + (as_float(record.get("drain_wait_s")) or 0.0)


def as_int(value: Any) -> int | None:
    """An int, or None for missing / non-numeric values."""
    out = as_float(value)
    return None if out is None else int(out)


def fmt_num(value: Any, digits: int = 3, scale: float = 1.0, suffix: str = "") -> str:
    """``value * scale`` with ``digits`` decimals, or the missing mark."""
    out = as_float(value)
    if out is None:
        return MISSING
    return f"{out * scale:.{digits}f}{suffix}"


def fmt_int(value: Any) -> str:
    out = as_int(value)
    return MISSING if out is None else str(out)


def fmt_bytes(value: Any) -> str:
    """Bytes in B / KiB / MiB / GiB."""
    out = as_float(value)
    if out is None:
        return MISSING
    for unit in ("B", "KiB", "MiB"):
        if abs(out) < 1024.0:
            return f"{out:.0f} {unit}" if unit == "B" else f"{out:.1f} {unit}"
        out /= 1024.0
    return f"{out:.2f} GiB"


def float_list(value: Any) -> list[float | None]:
    """A list of floats (None where an entry is not a finite number); [] if not a list."""
    if not isinstance(value, (list, tuple)):
        return []
    return [as_float(v) for v in value]


# ---------------------------------------------------------------------- derived stats


@dataclass
class RankStats:
    """One rank's numbers over the snapshot's recent window (None: not reported)."""

    rank: int
    steps: list[int]  # [W]
    compute_s: list[float | None]  # [W]
    wait_s: list[float | None]  # [W]
    bytes_sent: list[float | None]  # [W]
    version_lag: int | None
    mean_compute_s: float | None
    mean_wait_s: float | None
    wait_fraction: float | None  # wait / (compute + wait) over the window
    mean_bytes: float | None


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def rank_stats(snapshot: dict) -> list[RankStats]:
    """Per-rank window statistics, sorted by rank; malformed entries are skipped."""
    ranks = snapshot.get("ranks")
    if not isinstance(ranks, (list, tuple)):
        return []
    out = []
    for i, entry in enumerate(ranks):
        if not isinstance(entry, dict):
            continue
        rank = as_int(entry.get("rank"))
        compute = float_list(entry.get("compute_s"))
        wait = float_list(entry.get("wait_s"))
        sent = float_list(entry.get("bytes_sent"))
        steps = (
            [as_int(s) for s in entry.get("steps") or []]
            if isinstance(entry.get("steps"), (list, tuple))
            else []
        )
        steps = [s for s in steps if s is not None]
        length = max(len(compute), len(wait), len(sent))
        if len(steps) < length:  # no step ids: number the window's entries
            steps = list(range(length))
        mc, mw = _mean(compute), _mean(wait)
        frac = mw / (mc + mw) if mc is not None and mw is not None and mc + mw > 0 else None
        out.append(
            RankStats(
                rank=rank if rank is not None else i,
                steps=steps,
                compute_s=compute,
                wait_s=wait,
                bytes_sent=sent,
                version_lag=as_int(entry.get("version_lag")),
                mean_compute_s=mc,
                mean_wait_s=mw,
                wait_fraction=frac,
                mean_bytes=_mean(sent) if sent else as_float(entry.get("mean_bytes_sent")),
            )
        )
    return sorted(out, key=lambda r: r.rank)


def wait_hidden(snapshot: dict) -> float | None:
    """The snapshot's ``wait_hidden``, else ``1 - odin_wait_s / barrier_wait_estimate_s``."""
    given = as_float(snapshot.get("wait_hidden"))
    if given is not None:
        return given
    odin = as_float(snapshot.get("odin_wait_s"))
    barrier = as_float(snapshot.get("barrier_wait_estimate_s"))
    if odin is None or barrier is None or barrier <= 0:
        return None
    return 1.0 - odin / barrier


def staleness_counts(snapshot: dict) -> list[tuple[int, int]]:
    """``(staleness, count)`` pairs sorted by staleness; non-numeric keys are skipped."""
    hist = snapshot.get("staleness_hist")
    if not isinstance(hist, dict):
        return []
    pairs = []
    for key, count in hist.items():
        k, c = as_int(key), as_int(count)
        if k is not None and c is not None:
            pairs.append((k, c))
    return sorted(pairs)


def fallback_counts(snapshot: dict) -> dict[str, int | None]:
    """Fallback (waited instead of delayed) counts per reason, known reasons first."""
    fb = snapshot.get("fallbacks")
    fb = fb if isinstance(fb, dict) else {}
    out: dict[str, int | None] = {reason: as_int(fb.get(reason)) for reason in FALLBACK_REASONS}
    for reason, count in fb.items():
        if reason not in out:
            out[str(reason)] = as_int(count)
    return out


# ---------------------------------------------------------------------- saved runs


def _sum_opt(values: list[Any]) -> int | None:
    nums = [as_int(v) for v in values]
    nums = [n for n in nums if n is not None]
    return sum(nums) if nums else None


def _barrier_estimate(ranks: list[dict]) -> tuple[float | None, float | None]:
    """(a barrier's estimated wait, Odin's wait) from per-step logs, in seconds.

    Over the steps every rank logged: a barrier makes rank r wait ``max_q compute_q -
    compute_r`` at each step; Odin's wait is the logged one (``step_wait``). Both are averaged over
    ranks and summed over steps (communication time is not modelled).
    """
    per_rank: list[dict[int, tuple[float, float]]] = []
    for entry in ranks:
        steps = entry.get("steps")
        table = {}
        for rec in steps if isinstance(steps, list) else []:
            if not isinstance(rec, dict):
                continue
            s, c, w = (
                as_int(rec.get("step")),
                as_float(rec.get("compute_s")),
                step_wait(rec),
            )
            if s is not None and c is not None and w is not None:
                table[s] = (c, w)
        per_rank.append(table)
    if len(per_rank) < 2:
        return None, None
    common = set.intersection(*(set(t) for t in per_rank))
    if not common:
        return None, None
    barrier = odin = 0.0
    for s in common:
        computes = [t[s][0] for t in per_rank]
        slowest = max(computes)
        barrier += sum(slowest - c for c in computes) / len(computes)
        odin += sum(t[s][1] for t in per_rank) / len(per_rank)
    return barrier, odin


def snapshot_from_run(run: dict) -> dict:
    """Snapshot of a finished run from its ``odin_run.json`` dict (missing keys tolerated).

    Per-rank series are the whole run (the panels bin long series). Delayed-read counts and
    the staleness histogram are summed over the ranks' ``engine`` summaries when present.
    If the run carries no ``barrier_wait_estimate_s`` / ``odin_wait_s``, they are estimated
    from the step logs (see ``_barrier_estimate``).
    """
    if not isinstance(run, dict):
        raise ValueError(f"odin run must be a JSON object, got {type(run).__name__}")
    ranks = run.get("ranks", [])
    if ranks is None:
        ranks = []
    if not isinstance(ranks, list):
        raise ValueError(f"odin run 'ranks' must be a list, got {type(ranks).__name__}")
    ranks = [r for r in ranks if isinstance(r, dict)]
    engines = [r.get("engine") if isinstance(r.get("engine"), dict) else {} for r in ranks]

    sync = run.get("sync")
    mode = sync.get("mode") if isinstance(sync, dict) else sync
    if mode is None and engines:
        mode = engines[0].get("mode")
    snap: dict[str, Any] = {}
    world_size = as_int(run.get("world_size")) or len(ranks)
    if world_size:
        snap["world_size"] = world_size
    if mode is not None:
        snap["mode"] = str(mode)

    out_ranks, last_step = [], None
    for i, entry in enumerate(ranks):
        records = [s for s in entry.get("steps") or [] if isinstance(s, dict)]
        steps = [as_int(s.get("step")) for s in records]
        series: dict[str, Any] = {
            "rank": as_int(entry.get("rank")) if as_int(entry.get("rank")) is not None else i,
            "steps": [s if s is not None else j for j, s in enumerate(steps)],
            "compute_s": [as_float(s.get("compute_s")) for s in records],
            "wait_s": [step_wait(s) for s in records],
        }
        if any("bytes_sent" in s for s in records):
            series["bytes_sent"] = [as_float(s.get("bytes_sent")) for s in records]
        else:  # only the engine's run total: show its mean per step
            total, count = as_float(engines[i].get("bytes_sent")), as_int(engines[i].get("steps"))
            if total is not None and count:
                series["mean_bytes_sent"] = total / count
        lag = as_int(engines[i].get("max_version_lag"))
        if lag is not None:
            series["version_lag"] = lag
        out_ranks.append(series)
        known = [s for s in steps if s is not None]
        if known:
            last_step = max(known) if last_step is None else max(last_step, max(known))
    if out_ranks:
        snap["ranks"] = out_ranks
    if last_step is not None:
        snap["step"] = last_step

    for key in ("wait_hidden", "barrier_wait_estimate_s", "odin_wait_s", "tau", "staleness_window"):
        value = run.get(key, engines[0].get(key) if engines else None)
        if as_float(value) is not None:
            snap[key] = as_float(value)
    if "barrier_wait_estimate_s" not in snap or "odin_wait_s" not in snap:
        barrier, odin = _barrier_estimate(ranks)
        if barrier is not None:
            snap.setdefault("barrier_wait_estimate_s", barrier)
            snap.setdefault("odin_wait_s", odin)
            snap["wait_note"] = (
                "estimated from step logs: a barrier's wait = compute imbalance (no communication)"
            )
    if "staleness_window" in snap:
        snap["staleness_window"] = int(snap["staleness_window"])

    hist: dict[str, int] = {}
    for engine in engines:
        for key, count in (engine.get("staleness_hist") or {}).items():
            c = as_int(count)
            if c is not None:
                hist[str(key)] = hist.get(str(key), 0) + c
    if hist:
        snap["staleness_hist"] = hist
    admitted = _sum_opt([e.get("admitted") for e in engines])
    if admitted is not None:
        snap["admitted"] = admitted
    fallbacks: dict[str, int] = {}
    for engine in engines:
        fb = engine.get("fallbacks")
        for reason, count in fb.items() if isinstance(fb, dict) else []:
            c = as_int(count)
            if c is not None:
                fallbacks[str(reason)] = fallbacks.get(str(reason), 0) + c
    if fallbacks:
        snap["fallbacks"] = fallbacks

    phases = ranks[0].get("phases") if ranks else None
    phases = [p for p in phases if isinstance(p, dict)] if isinstance(phases, list) else []
    if phases:
        last = phases[-1]
        plan = dict(last)  # contract keys plus whatever the run logged (num_gaussians, ...)
        start = last.get("rebuilt_at_step", last.get("start_step"))
        if start is not None:
            plan["rebuilt_at_step"] = start
        snap["plan"] = plan
    return snap


__all__ = [
    "FALLBACK_REASONS",
    "MISSING",
    "SNAPSHOT_KEYS",
    "RankStats",
    "as_float",
    "as_int",
    "fallback_counts",
    "float_list",
    "fmt_bytes",
    "fmt_int",
    "fmt_num",
    "rank_stats",
    "snapshot_from_run",
    "staleness_counts",
    "wait_hidden",
]
