"""The step tables' threads beside a training thread that holds the GIL part of each step.

    python -m odin_ns.bench.tables_gil [--rows 1000000] [--ranks 8,64] [--busy 0,0.5,0.75] \
        [--switch-ms 5,1] [--period-ms 20] --out bench/tables_gil.json

Beside an accelerator an engine makes each step's tables on a thread of its own, two steps
ahead (``step_tables.PhaseSteps``; a layout with owners cuts them on a second thread,
``step_rows``' ``aside``), while the training thread launches the next step. All of them are
threads of one interpreter. The host kernels release the GIL, but a tables' thread needs it
back between two kernels, and a thread that asks for the GIL while another runs Python waits
until that one drops it: at a wait of its own, or when the switch interval (5 ms) forces it.
So how fast the tables come depends on how much of each step the training thread spends
running Python (launching kernels) rather than waiting on the device with the GIL released.
``bench.control_plane``'s ``tables_ms_per_step`` is their pace with no such thread beside
them; ``bench.scale`` prices that pace.

Here rank 0's engine of ``bench.control_plane`` (its plan of the synthetic city, N rows,
``--share`` of them per view; its data plane on the ``meta`` device) has its tables made by
its own threads as the engine makes them, and asked for step after step, as fast as they
come, by a consumer thread (what the engine's step does with them: take a step's tables and
its step path, drop the previous step's, start the next ones). The tables' threads and the
consumer run on a core of their own, the calling thread on another (as on a GPU host, which
has a core for each); the calling thread is the training thread: in every ``--period-ms`` it
runs Python for a share ``busy`` of the period and sleeps for the rest (a wait on the device,
the GIL released). A condition is a busy share and the interpreter's switch interval
(``--switch-ms``: how long a thread asking for the GIL waits before the holder must let it
go). Per variant (R, layout) and condition, ``--steps`` steps' tables in each of
``--rounds`` rounds, the conditions in a rotated order each round, the variants' order
reversed every other round:

- ``tables_ms_per_step_<key>_busy<share>_switch<ms>ms``: the consumer's wall time per step
  (median over the rounds, with ``_min`` / ``_max``): the pace the tables come at; at busy
  0 their pace alone. They keep up with a GPU step of ``--period-ms`` where it is below it;
- ``training_python_share_<key>_<condition>`` (busy above 0): the training thread's Python
  work per second it ran, against the same pattern run with nothing beside it right before
  (same core, same switch interval): what the tables' threads take of its GIL.

Linux with two cores or more (the threads pinned apart); elsewhere the threads share the
cores and the figures say so (``pinned``: false).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from odin_ns.bench.control_plane import RANKS_UNDER_TEST, city_footprints, helper_threads_apart
from odin_ns.bench.report import put_spread, save_figure, write_json
from odin_ns.runtime.step_tables import TABLES_AHEAD


def start_consumer(
    steps, first: int, count: int, cores: set[int] | None
) -> tuple[threading.Thread, dict]:
    """A thread (started; pinned to ``cores``, None: not pinned) that takes the steps of
    ``steps`` (the engine's ``PhaseSteps``) from ``first`` on as the engine's step path
    does, as fast as they come: a step's tables and step path taken, the older ones
    dropped, the next ones started. The ``steps.ahead`` steps made before it started are
    taken first, untimed; its dict gets the seconds the next ``count`` took ("s"), or the
    error it ended with ("error")."""
    out: dict = {}

    def take(t: int) -> None:
        steps[t]
        steps.derived(t)
        steps.forget_through(t)
        steps.make_ahead()

    def run() -> None:
        try:
            if cores is not None:
                os.sched_setaffinity(0, cores)
            for t in range(first, first + steps.ahead):  # (made already)
                take(t)
            tic = time.perf_counter()
            for t in range(first + steps.ahead, first + steps.ahead + count):
                take(t)
            out["s"] = time.perf_counter() - tic
        except BaseException as err:  # (raised again on the calling thread)
            out["error"] = err

    consumer = threading.Thread(target=run, name="odin-bench-consumer")
    consumer.start()
    return consumer, out


def hold_gil(busy: float, period_s: float, until: threading.Thread) -> tuple[int, float]:
    """The training thread: in each period, Python for ``busy`` of it, then a sleep (the
    GIL released) for the rest, until ``until`` ends. Returns (the Python work it did: loop
    iterations, the seconds it spent at it)."""
    done, spent = 0, 0.0
    while until.is_alive():
        start = time.perf_counter()
        while time.perf_counter() - start < busy * period_s:
            sum(range(50))  # (Python bytecode: the GIL held)
            done += 1
        spent += time.perf_counter() - start
        rest = period_s - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)
    return done, spent


def python_rate(busy: float, period_s: float, seconds: float = 0.2) -> float:
    """Loop iterations a second of ``hold_gil``'s Python with nothing beside it, in the same
    pattern (``busy`` of every ``period_s``), for about ``seconds``."""
    idle = threading.Thread(target=time.sleep, args=(seconds,))
    idle.start()
    done, spent = hold_gil(busy, period_s, idle)
    idle.join()
    return done / spent


@dataclass(frozen=True)
class Condition:
    """What the tables' threads run beside: the training thread's share of each period in
    Python, and the interpreter's switch interval (ms: how long a thread that asks for the
    GIL waits before the one holding it must let go)."""

    busy: float
    switch_ms: float

    @property
    def name(self) -> str:
        return f"busy{self.busy:g}_switch{self.switch_ms:g}ms"


def pace(rank, first: int, count: int, when: Condition, period_s: float, pin: bool) -> dict:
    """``rank``'s engine getting ``count`` steps' tables (after the ones made ahead, from
    ``first``) while the calling thread holds the GIL ``when.busy`` of every ``period_s``,
    under ``when.switch_ms``: {"tables_ms": ms per step, "training_share": the calling
    thread's Python work a second it spent at it, against the same with nothing beside it
    (measured first, on the same core and switch interval; None at busy 0), "pinned"}.
    ``pin``: the calling thread on a core of its own, the tables' threads and the consumer
    on the others (``control_plane.helper_threads_apart``). Affinities and switch interval
    given back after."""
    interval = sys.getswitchinterval()
    with helper_threads_apart(pin) as apart:
        cores = None if apart is None else set(apart["helper_cores"])
        sys.setswitchinterval(when.switch_ms / 1e3)
        try:
            alone = python_rate(when.busy, period_s) if when.busy > 0 else None
            consumer, out = start_consumer(rank.engine.steps, first, count, cores)
            done, spent = hold_gil(when.busy, period_s, consumer)
            consumer.join()
        finally:
            sys.setswitchinterval(interval)
    if "error" in out:
        raise out["error"]
    share = done / spent / alone if alone and spent else None
    return {"tables_ms": 1e3 * out["s"] / count, "training_share": share, "pinned": bool(apart)}


def measure(args, conditions: list[Condition]) -> dict:
    ranks = [int(r) for r in args.ranks.split(",")]
    layouts = args.layouts.split(",")
    F = city_footprints(args.rows, args.share, max(ranks) * 8, args.seed)
    # the steps one rank goes through: every round's every condition, each after the steps
    # made ahead of it, and the steps its engine made at its start
    total = args.rounds * len(conditions) * (args.steps + TABLES_AHEAD) + 8
    tested = {}
    for r in ranks:
        for layout in layouts:
            tic = time.perf_counter()
            key = f"r{r}_{layout}"
            tested[key] = RANKS_UNDER_TEST[layout](
                F, r, total, "quality-first", args.seed, "meta", tables_thread=True
            )
            print(f"{key}: plan and engine in {time.perf_counter() - tic:.0f} s")
    runs: dict[tuple[str, Condition], list[dict]] = {
        (key, when): [] for key in tested for when in conditions
    }
    taken = {key: rank.engine.steps.made for key, rank in tested.items()}
    for i in range(args.rounds):
        order = conditions[i % len(conditions) :] + conditions[: i % len(conditions)]
        for key in list(tested) if i % 2 == 0 else list(tested)[::-1]:
            rank = tested[key]
            for when in order:
                run = pace(rank, taken[key], args.steps, when, args.period_ms / 1e3, True)
                taken[key] += rank.engine.steps.ahead + args.steps
                runs[(key, when)].append(run)
                print(
                    f"round {i + 1}/{args.rounds} {key} {when.name}: {run['tables_ms']:.1f} ms/step"
                )
    result: dict = {
        "rows": args.rows,
        "share_per_view": float(np.diff(F.indptr).mean() / args.rows),
        "period_ms": args.period_ms,
        "conditions": [when.name for when in conditions],
        "busy_shares": sorted({when.busy for when in conditions}),
        "switch_intervals_ms": sorted({when.switch_ms for when in conditions}),
        "steps": args.steps,
        "rounds": args.rounds,
        "pinned": all(run["pinned"] for values in runs.values() for run in values),
        "source": "measured on cpu (rank 0's engine on meta, its own tables' threads)",
        "variants": list(tested),
    }
    for (key, when), values in runs.items():
        put_spread(
            result, f"tables_ms_per_step_{key}_{when.name}", [v["tables_ms"] for v in values]
        )
        if when.busy > 0:  # the training thread's Python, against its rate alone
            shares = [v["training_share"] for v in values]
            put_spread(result, f"training_python_share_{key}_{when.name}", shares)
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = result["busy_shares"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5))
    for i, key in enumerate(result["variants"]):
        color = f"C{i % 10}"
        label = key.replace("_", " ").replace("r", "R = ", 1)
        for j, switch in enumerate(result["switch_intervals_ms"]):
            style = ("-", "--", ":", "-.")[j % 4]
            what = f"{label}, switch {switch:g} ms"
            names = [f"{key}_{Condition(b, switch).name}" for b in shares]
            keys = [f"tables_ms_per_step_{n}" for n in names]
            median = np.array([result[k] for k in keys])
            low = median - np.array([result[f"{k}_min"] for k in keys])
            high = np.array([result[f"{k}_max"] for k in keys]) - median
            ax.errorbar(
                shares, median, yerr=[low, high], marker="o", capsize=3, color=color, ls=style,
                label=what,
            )  # fmt: skip
            busy = [
                (b, f"training_python_share_{n}")
                for b, n in zip(shares, names, strict=True)
                if b > 0
            ]
            bx.plot([b for b, _ in busy], [result[k] for _, k in busy], marker="o",
                    color=color, ls=style, label=what)  # fmt: skip
    ax.axhline(result["period_ms"], color="gray", ls="--", label="the GPU step modelled")
    ax.set(
        xlabel="share of each step the training thread runs Python (holds the GIL)",
        ylabel="ms per step the tables come at",
        title="the step tables' pace",
    )
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    bx.set(
        xlabel="share of each step the training thread runs Python",
        ylabel="its Python work a second, against alone",
        title="the training thread's own pace",
    )
    bx.legend(fontsize=7)
    fig.suptitle(
        f"bench.tables_gil: rank 0's step tables beside a GIL-holding training thread, "
        f"N = {result['rows']:,}, {result['period_ms']:g} ms steps (measured, cpu)"
    )
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m odin_ns.bench.tables_gil")
    parser.add_argument("--rows", type=int, default=1_000_000, help="N Gaussians")
    parser.add_argument("--share", type=float, default=0.05, help="rows per view, at most")
    parser.add_argument("--ranks", default="8,64", help="R values, interleaved")
    parser.add_argument("--layouts", default="replicated,sharded", help="interleaved too")
    parser.add_argument(
        "--busy", default="0,0.5,0.75", help="shares of each period the training thread "
        "holds the GIL, in [0, 1]",
    )  # fmt: skip
    parser.add_argument(
        "--switch-ms", default="5", help="the interpreter's switch intervals to run under, "
        "ms (5: Python's default)",
    )  # fmt: skip
    parser.add_argument("--period-ms", type=float, default=20.0, help="the GPU step modelled")
    parser.add_argument("--steps", type=int, default=20, help="steps' tables per measurement")
    parser.add_argument(
        "--rounds", type=int, default=3, help="each a pass over every variant and condition, "
        "the conditions in a rotated order, the variants' order reversed every other round",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/tables_gil.json"))
    args = parser.parse_args(argv)
    try:
        shares = [float(b) for b in args.busy.split(",")]
        switches = [float(s) for s in args.switch_ms.split(",")]
    except ValueError as err:
        parser.error(f"--busy and --switch-ms take numbers separated by commas ({err})")
    if any(not 0.0 <= b <= 1.0 for b in shares):
        parser.error(f"--busy: every share must lie in [0, 1], got {args.busy}")
    if any(s <= 0 for s in switches):
        parser.error(f"--switch-ms: every interval must be above 0, got {args.switch_ms}")
    unknown = set(args.layouts.split(",")) - {"replicated", "sharded"}
    if unknown:
        parser.error(f"--layouts: unknown {sorted(unknown)}; use replicated, sharded")
    torch.set_num_threads(1)
    result = measure(args, [Condition(b, sw) for sw in switches for b in shares])
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    for key in result["variants"]:
        figures = ", ".join(
            f"{name}: {result[f'tables_ms_per_step_{key}_{name}']:.1f}"
            for name in result["conditions"]
        )
        print(f"{key}: tables ms per step, {figures} (GPU step modelled: {args.period_ms:g})")
    return result


if __name__ == "__main__":
    main()
