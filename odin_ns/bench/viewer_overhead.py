"""Cost of the live panels to a busy training-like loop.

``python -m odin_ns.bench.viewer_overhead --out bench/viewer_overhead.json``

A one-thread torch loop (small matmuls plus Python work, like a training step) runs for a
fixed time under each variant; throughput is compared with the baseline (see ``run`` for
how trials are paired):

- ``baseline``: no panels, no browser;
- ``panels``: the panel thread polling a synthetic 8-rank source every 0.5 s;
- ``client idle``: a headless Chromium shows the (static) panels, thread stopped;
- ``panels+client``: the panel thread plus that browser. The browser is pinned to the other
  cores (it normally runs on the user's machine); this process, with the loop, the panel
  thread and viser's server threads, is pinned to one core;
- ``panels+client@0.1s``: refresh every 0.1 s (stress).

Reports throughput ratios, the browser's CPU use and the panel's render time; writes JSON
and a PNG bar chart.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from odin_ns.bench.headless import ChromiumOptions, HeadlessChromium, find_chromium
from odin_ns.bench.report import save_figure, write_json
from odin_ns.viewer_ext.panels import OdinPanels

READY = "document.body && document.body.innerText.includes('Critical-path wait hidden')"


@dataclass
class BenchConfig:
    seconds: float = 1.0  # timed length of one trial
    repeats: int = 10  # alternations of each paired comparison
    page_pairs: int = 3  # baseline / idle-client pairs (each needs a page load)
    world_size: int = 8
    window: int = 200  # steps per rank in each snapshot
    matmul_size: int = 128
    refresh_s: float = 0.5
    stress_refresh_s: float = 0.1


def synthetic_snapshot(step: int, world_size: int, window: int) -> dict:
    """A full snapshot (every panel populated) whose numbers change with ``step``."""
    steps = list(range(max(0, step - window), step))
    ranks = [
        {
            "rank": r,
            "steps": steps,
            "compute_s": [0.05 + 0.01 * math.sin(s / 7 + r) for s in steps],
            "wait_s": [0.004 + 0.003 * abs(math.sin(s / 3 + r)) for s in steps],
            "bytes_sent": [20_000 + 1_000 * r + 300 * (s % 7) for s in steps],
            "version_lag": (step + r) % 3,
        }
        for r in range(world_size)
    ]
    return {
        "step": step,
        "mode": "throughput-first",
        "world_size": world_size,
        "ranks": ranks,
        "barrier_wait_estimate_s": 0.02 * step + 0.01,
        "odin_wait_s": 0.004 * step,
        "staleness_hist": {str(k): (step * (5 - k)) // 5 for k in range(5)},
        "admitted": 3 * step,
        "fallbacks": {"overlap": step // 3, "evidence": step // 7, "staleness": 1, "phase": 2},
        "plan": {
            "phase": step // 100,
            "start_step": 100 * (step // 100),
            "num_steps": 100,
            "views_per_rank": 1,
            "predicted_conflict": 0.03,
            "predicted_previous_step_reads": 0.25,
            "rebuilt_at_step": 100 * (step // 100),
        },
        "tau": 0.2,
        "staleness_window": 4,
    }


class CountingSource:
    """Advances one step per call."""

    def __init__(self, world_size: int, window: int):
        self.world_size, self.window, self.calls = world_size, window, 0

    def __call__(self) -> dict:
        self.calls += 1
        return synthetic_snapshot(self.window + self.calls, self.world_size, self.window)


def busy_loop(seconds: float, size: int) -> float:
    """Iterations per second of a step-like loop: a few matmuls and some Python."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    iters, total, start = 0, 0.0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            c = torch.tanh(a @ b) * 0.5 + a
            total += float(c[0, 0])  # a host read and some Python, as a training step has
            iters += 1
        now = time.perf_counter()
        if now >= deadline:
            return iters / (now - start)


def render_ms(panels: OdinPanels, source: CountingSource, calls: int = 30) -> float:
    """Mean wall time of one poll + render (source included), in ms."""
    start = time.perf_counter()
    for _ in range(calls):
        panels.render(source())
    return (time.perf_counter() - start) / calls * 1e3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _browser_cpu_s(browser: HeadlessChromium | None) -> float:
    """CPU seconds used so far by the browser's processes."""
    if browser is None:
        return 0.0
    import psutil

    try:
        root = psutil.Process(browser.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run(cfg: BenchConfig, out: Path) -> dict:
    """Paired, interleaved trials; ratios are medians of per-pair ratios.

    Background load on a shared machine swings throughput by 2x over a minute, so each
    variant is compared with the trial right next to it, never with a distant one:
    1. browser blank: baseline / panels, alternating;
    2. browser showing the panels: client idle (panel thread stopped) / panels+client /
       panels+client@0.1s, alternating;
    3. baseline / client idle across page loads (few pairs: each costs a page load).
    panels+client vs baseline = (client idle / baseline) x (panels+client / client idle).
    """
    import viser
    from nerfstudio.utils.rich_utils import CONSOLE
    from rich.progress import Progress

    torch.set_num_threads(1)
    source = CountingSource(cfg.world_size, cfg.window)
    server = viser.ViserServer(host="127.0.0.1", port=_free_port(), verbose=False)
    panels = OdinPanels(server, source, refresh_s=cfg.refresh_s, start=False)
    url = f"http://127.0.0.1:{server.get_port()}"
    # Pin the browser to other cores than this process (loop, panel thread, viser server):
    # the browser normally runs on the user's machine, not on the training node.
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2
    if pinned:
        os.sched_setaffinity(0, cores[1:])  # the browser inherits this
    browser = HeadlessChromium("about:blank", ChromiumOptions()) if find_chromium() else None
    if pinned:
        os.sched_setaffinity(0, cores[:1])
    if browser is None:
        CONSOLE.print("[yellow]chromium not found: client variants skipped")
    trials: dict[str, list[float]] = {}
    browser_cpu: dict[str, list[float]] = {}

    def trial(name: str, refresh_s: float | None) -> float:
        if refresh_s is not None:
            panels.refresh_s = refresh_s
            panels.start()
        cpu0 = _browser_cpu_s(browser)
        rate = busy_loop(cfg.seconds, cfg.matmul_size)
        browser_cpu.setdefault(name, []).append((_browser_cpu_s(browser) - cpu0) / cfg.seconds)
        panels.stop()
        trials.setdefault(name, []).append(rate)
        return rate

    def show_page(on: bool) -> None:
        if on:
            browser.navigate(url)
            browser.wait_for(READY, timeout_s=90)
            time.sleep(1.0)  # let the first render settle
        else:
            browser.navigate("about:blank")
            time.sleep(0.5)

    pairs: dict[str, list[float]] = {}
    try:
        ms = render_ms(panels, source)
        busy_loop(0.5, cfg.matmul_size)  # warm up
        steps = cfg.repeats * (2 + (3 if browser else 0)) + (cfg.page_pairs * 2 if browser else 0)
        with Progress(console=CONSOLE) as progress:
            task = progress.add_task("viewer overhead", total=steps)
            for _ in range(cfg.repeats):
                base = trial("baseline", None)
                pairs.setdefault("panels", []).append(trial("panels", cfg.refresh_s) / base)
                progress.advance(task, 2)
            if browser is not None:
                show_page(True)
                for _ in range(cfg.repeats):
                    idle = trial("client idle", None)
                    live = trial("panels+client", cfg.refresh_s)
                    stress = trial("panels+client@0.1s", cfg.stress_refresh_s)
                    pairs.setdefault("panels+client / client idle", []).append(live / idle)
                    pairs.setdefault("stress / client idle", []).append(stress / idle)
                    progress.advance(task, 3)
                for _ in range(cfg.page_pairs):
                    show_page(False)
                    base = trial("baseline (page pairs)", None)
                    show_page(True)
                    idle = trial("client idle (page pairs)", None)
                    pairs.setdefault("client idle / baseline", []).append(idle / base)
                    progress.advance(task, 2)
    finally:
        panels.stop()
        if browser is not None:
            browser.close()
        server.stop()
        os.sched_setaffinity(0, cores)

    med = {k: statistics.median(v) for k, v in pairs.items()}
    ratios = {"baseline": 1.0, "panels": med["panels"]}
    if "client idle / baseline" in med:
        idle = med["client idle / baseline"]
        ratios["client idle"] = idle
        ratios["panels+client"] = idle * med["panels+client / client idle"]
        ratios["panels+client@0.1s"] = idle * med["stress / client idle"]
    result = {
        "config": asdict(cfg),
        "cpu_count": os.cpu_count(),
        "browser_on_other_cores": pinned,
        "render_ms": ms,
        "ratio_to_baseline": ratios,
        "pair_ratios": pairs,
        "iters_per_s": trials,
        "browser_cpu_cores": {k: statistics.median(v) for k, v in browser_cpu.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    _plot(result, out.with_suffix(".png"))
    for name, ratio in ratios.items():
        cpu = result["browser_cpu_cores"].get(name)
        extra = f"  (browser used {cpu:.2f} cores)" if cpu else ""
        CONSOLE.print(f"{name:>20}: ratio {ratio:.3f}{extra}")
    CONSOLE.print(f"render (poll + build + send): {ms:.2f} ms per refresh; wrote {out}")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["ratio_to_baseline"])
    ratios = [result["ratio_to_baseline"][n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bars = ax.bar(names, ratios, color=["#888888"] + ["#636efa"] * (len(names) - 1))
    ax.tick_params(axis="x", labelsize=8)
    ax.bar_label(bars, fmt="%.3f")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0, max(1.1, max(ratios) * 1.1))
    ax.set_ylabel("busy-loop throughput / baseline")
    ax.set_title(f"Odin panels overhead (render {result['render_ms']:.1f} ms per refresh)")
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m odin_ns.bench.viewer_overhead",
        description="Cost of the live Odin panels to a busy training-like loop (JSON + PNG).",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/viewer_overhead.json"))
    parser.add_argument("--seconds", type=float, default=BenchConfig.seconds)
    parser.add_argument("--repeats", type=int, default=BenchConfig.repeats)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.repeats < 1:
        raise ValueError(
            f"--seconds must be > 0 and --repeats >= 1, got {args.seconds}, {args.repeats}"
        )
    run(BenchConfig(seconds=args.seconds, repeats=args.repeats), args.out)


if __name__ == "__main__":
    main()
