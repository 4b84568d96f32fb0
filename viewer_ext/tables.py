"""Markdown text of the panels (pure functions of a snapshot, so they are easy to test).

Every number the charts show also appears here as text: it is what a reader copies, and
what the headless-browser test reads from the DOM.
"""

from __future__ import annotations

from .snapshot import (
    MISSING,
    RankStats,
    as_float,
    as_int,
    fallback_counts,
    fmt_bytes,
    fmt_int,
    fmt_num,
    staleness_counts,
    wait_hidden,
)

PLAN_ROWS = (
    ("phase", "phase"),
    ("views_per_rank", "views per rank"),
    ("predicted_conflict", "predicted conflict"),
    ("predicted_previous_step_reads", "reads of a peer's last step"),
    ("rebuilt_at_step", "rebuilt at step"),
    ("start_step", "start step"),
    ("num_steps", "steps in phase"),
)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def header_markdown(snapshot: dict, note: str = "") -> str:
    """Step, mode and world size in one line, plus an optional status note."""
    mode = snapshot.get("mode")
    text = (
        f"**Step** {fmt_int(snapshot.get('step'))} · "
        f"**mode** {mode if isinstance(mode, str) and mode else MISSING} · "
        f"**ranks** {fmt_int(snapshot.get('world_size'))}"
    )
    return f"{text}\n\n{note}" if note else text


def compute_wait_markdown(stats: list[RankStats]) -> str:
    """Per-rank mean compute and wait over the recent window."""
    if not stats:
        return f"Per-rank compute / wait: {MISSING}"
    rows = [
        (
            str(r.rank),
            fmt_num(r.mean_compute_s, 1, 1e3),
            fmt_num(r.mean_wait_s, 1, 1e3),
            fmt_num(r.wait_fraction, 1, 100.0, " %"),
            str(len(r.steps)),
        )
        for r in stats
    ]
    return _table(("rank", "compute ms", "wait ms", "wait share", "steps"), rows)


def wait_hidden_markdown(snapshot: dict) -> str:
    """The share of a barrier's wait hidden so far: Odin's wait against the wait a barrier
    would have made of the same steps' compute (``wait_hidden``; both are per-rank means of
    the ranks' summed waits, not critical-path waits)."""
    hidden = wait_hidden(snapshot)
    waits = _table(
        ("Odin wait s", "barrier estimate s"),
        [
            (
                fmt_num(snapshot.get("odin_wait_s"), 3),
                fmt_num(snapshot.get("barrier_wait_estimate_s"), 3),
            )
        ],
    )
    note = snapshot.get("wait_note")
    note = f"\n\n*{note}*" if isinstance(note, str) and note else ""
    share = fmt_num(hidden, 1, 100.0, " %")
    return f"**Wait hidden vs a barrier:** {share}\n\n{waits}\n\n*means over ranks*{note}"


def wait_hidden_percent(snapshot: dict) -> float:
    """Progress-bar value in [0, 100] (0 when unknown or negative)."""
    hidden = wait_hidden(snapshot)
    return 0.0 if hidden is None else min(100.0, max(0.0, 100.0 * hidden))


def delayed_reads_markdown(snapshot: dict) -> str:
    """Admitted delayed reads, fallbacks by reason, and the staleness histogram as text."""
    admitted = as_int(snapshot.get("admitted"))
    fallbacks = fallback_counts(snapshot)
    known = [c for c in fallbacks.values() if c is not None]
    total_fb = sum(known) if known else None
    rows = [("admitted", fmt_int(admitted))]
    rows += [(f"fallback: {reason}", fmt_int(count)) for reason, count in fallbacks.items()]
    rows.append(("fallback: total", fmt_int(total_fb)))
    pairs = staleness_counts(snapshot)
    hist = ", ".join(f"{k}: {c}" for k, c in pairs) if pairs else MISSING
    tau = fmt_num(snapshot.get("tau"), 2)
    window = fmt_int(snapshot.get("staleness_window"))
    return (
        _table(("delayed reads", "count"), rows)
        + f"\n\n**Staleness** (steps: reads) {hist}\n\n**tau** {tau} · **K** {window}"
    )


def publications_markdown(stats: list[RankStats]) -> str:
    """Mean publication bytes per step and applied-version lag, per rank."""
    if not stats:
        return f"Publications: {MISSING}"
    rows = [
        (
            str(r.rank),
            fmt_bytes(r.mean_bytes),
            fmt_bytes(r.bytes_sent[-1] if r.bytes_sent else None),
            fmt_int(r.version_lag),
        )
        for r in stats
    ]
    return _table(("rank", "mean bytes/step", "last step", "version lag"), rows)


def plan_markdown(snapshot: dict) -> str:
    """The current phase's plan; keys beyond the contract are listed after it."""
    plan = snapshot.get("plan")
    plan = plan if isinstance(plan, dict) else {}
    rows = []
    for key, label in PLAN_ROWS:
        value = plan.get(key)
        if key in ("predicted_conflict", "predicted_previous_step_reads"):
            rows.append((label, fmt_num(value, 3)))
        else:
            rows.append((label, fmt_int(value)))
    known = {key for key, _ in PLAN_ROWS}
    for key, value in plan.items():
        if key in known:
            continue
        num = as_float(value)
        text = MISSING if num is None else (f"{num:.0f}" if num == int(num) else f"{num:.3f}")
        rows.append((str(key).replace("_", " "), text))
    return _table(("plan", "value"), rows)


def controls_markdown(snapshot: dict, pending: dict) -> str:
    """What is in effect and what has been requested (applied at the next phase boundary)."""
    in_effect = (
        f"in effect: **tau** {fmt_num(snapshot.get('tau'), 2)} · "
        f"**K** {fmt_int(snapshot.get('staleness_window'))}"
    )
    if not pending:
        return f"{in_effect}\n\nNo change requested."
    asked = " · ".join(
        f"**{k}** {fmt_num(v, 2) if k == 'tau' else fmt_int(v)}" for k, v in sorted(pending.items())
    )
    return f"{in_effect}\n\nRequested: {asked} (applied at the next phase boundary)"


__all__ = [
    "compute_wait_markdown",
    "controls_markdown",
    "delayed_reads_markdown",
    "header_markdown",
    "plan_markdown",
    "publications_markdown",
    "wait_hidden_markdown",
    "wait_hidden_percent",
]
