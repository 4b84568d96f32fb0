"""Odin sync panels (odin_ns.viewer_ext): snapshot conversion, text, and a real browser.

The browser test serves the panels with viser, opens them in Debian's headless Chromium
(driven over the DevTools protocol), and checks the numbers shown against values computed
here from the same synthetic source. It skips when Chromium is not installed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from odin_ns.viewer_ext import OdinPanels, attach_to_viewer, snapshot_from_run
from odin_ns.viewer_ext.figures import bin_series
from odin_ns.viewer_ext.snapshot import MISSING
from odin_ns.viewer_ext.tables import (
    compute_wait_markdown,
    controls_markdown,
    delayed_reads_markdown,
    header_markdown,
    plan_markdown,
    publications_markdown,
    wait_hidden_markdown,
)

from odin_ns.bench.headless import ChromiumOptions, HeadlessChromium, find_chromium

REPO = Path(__file__).resolve().parents[1]
WORLD, WINDOW = 3, 24


# ---------------------------------------------------------------------- synthetic data


def synthetic_snapshot(step: int, tau: float = 0.2, k: int = 4) -> dict:
    """A throughput-first snapshot whose every number is a function of ``step``."""
    steps = list(range(step - WINDOW + 1, step + 1))
    ranks = [
        {
            "rank": r,
            "steps": steps,
            "compute_s": [0.040 + 0.005 * r + 0.002 * ((s * 7 + r * 3) % 5) for s in steps],
            "wait_s": [0.001 * (1 + (s + r) % 4) for s in steps],
            "bytes_sent": [1000 * (10 + r) + 64 * (s % 5) for s in steps],
            "version_lag": (step + r) % 3,
        }
        for r in range(WORLD)
    ]
    return {
        "step": step,
        "mode": "throughput-first",
        "world_size": WORLD,
        "ranks": ranks,
        "barrier_wait_estimate_s": 0.01 * step + 0.02,
        "odin_wait_s": 0.002 * step,
        "staleness_hist": {"0": 50 + step, "1": 10 + step // 2, "2": 3},
        "admitted": 60 + step,
        "fallbacks": {"overlap": 5 + step // 3, "evidence": 2, "staleness": 1, "phase": 4},
        "plan": {
            "phase": step // 25,
            "start_step": 25 * (step // 25),
            "num_steps": 25,
            "views_per_rank": 1,
            "predicted_conflict": 0.0375,
            "predicted_previous_step_reads": 0.25,
            "rebuilt_at_step": 25 * (step // 25),
        },
        "tau": tau,
        "staleness_window": k,
    }


class LiveSource:
    """Advances one step per call; applies the panel's requests like the pipeline would."""

    def __init__(self, first_step: int = 30):
        self.calls = 0
        self.first_step = first_step
        self.panels: OdinPanels | None = None
        self.settings = {"tau": 0.2, "K": 4}
        self._lock = threading.Lock()

    def __call__(self) -> dict:
        with self._lock:
            self.calls += 1
            step = self.first_step + self.calls
            if self.panels is not None:  # "phase boundary" at every call
                self.settings.update(self.panels.requested_settings())
            return synthetic_snapshot(step, self.settings["tau"], self.settings["K"])


def saved_run() -> dict:
    """An odin_run.json as the pipeline writes it (2 ranks, 2 phases)."""
    rng = np.random.default_rng(0)
    compute = rng.uniform(0.02, 0.06, size=(2, 40))
    wait = rng.uniform(0.0, 0.004, size=(2, 40))
    return {
        "world_size": 2,
        "sync": "throughput-first",
        "ranks": [
            {
                "rank": r,
                "replica_hash": "abc",
                "steps": [
                    {"step": s, "compute_s": float(compute[r, s]), "wait_s": float(wait[r, s])}
                    for s in range(40)
                ],
                "engine": {
                    "steps": 40,
                    "bytes_sent": 40 * 2048 * (r + 1),
                    "max_version_lag": 2 + r,
                    "staleness_hist": {"0": 30 + r, "1": 7},
                    "admitted": 11 + r,
                    "fallbacks": {"overlap": 3, "evidence": r, "staleness": 0, "phase": 1},
                },
                "phases": [
                    {"phase": 0, "start_step": 0, "num_steps": 20, "num_gaussians": 900},
                    {
                        "phase": 1,
                        "start_step": 20,
                        "num_steps": 20,
                        "num_gaussians": 1234,
                        "plan_seconds": 0.25,
                        "mean_footprint_rows": 456.5,
                    },
                ],
            }
            for r in range(2)
        ],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server():
    import viser

    server = viser.ViserServer(host="127.0.0.1", port=free_port(), verbose=False)
    server.gui.configure_theme(
        control_width="large"
    )  # show_share_button=False crashes viser 0.2.7's client
    return server


# ---------------------------------------------------------------------- snapshots and text


def test_snapshot_from_run_matches_reference():
    run = saved_run()
    snap = snapshot_from_run(run)
    compute = np.array([[s["compute_s"] for s in r["steps"]] for r in run["ranks"]])  # [R, T]
    wait = np.array([[s["wait_s"] for s in r["steps"]] for r in run["ranks"]])  # [R, T]
    barrier = (compute.max(axis=0, keepdims=True) - compute).mean(axis=0).sum()
    assert snap["world_size"] == 2 and snap["mode"] == "throughput-first" and snap["step"] == 39
    assert snap["barrier_wait_estimate_s"] == pytest.approx(barrier, rel=1e-12)
    assert snap["odin_wait_s"] == pytest.approx(wait.mean(axis=0).sum(), rel=1e-12)
    assert snap["staleness_hist"] == {"0": 61, "1": 14}
    assert snap["admitted"] == 23
    assert snap["fallbacks"] == {"overlap": 6, "evidence": 1, "staleness": 0, "phase": 2}
    assert [r["version_lag"] for r in snap["ranks"]] == [2, 3]
    assert [r["mean_bytes_sent"] for r in snap["ranks"]] == [2048.0, 4096.0]
    np.testing.assert_allclose(snap["ranks"][1]["compute_s"], compute[1])
    assert snap["plan"]["phase"] == 1 and snap["plan"]["rebuilt_at_step"] == 20
    assert snap["plan"]["num_gaussians"] == 1234


def test_a_drains_wait_counts_as_the_steps_wait():
    """A rank that ran ahead waits at the next structural change's drain, after its step's
    read gate: the panels count that wait (``drain_wait_s``) with the read gate's."""
    run = saved_run()
    plain = snapshot_from_run(run)
    run["ranks"][1]["steps"][25]["drain_wait_s"] = 0.5  # rank 1 paid for its lead at step 25
    snap = snapshot_from_run(run)
    assert snap["odin_wait_s"] == pytest.approx(plain["odin_wait_s"] + 0.5 / 2, rel=1e-12)
    assert snap["ranks"][1]["wait_s"][25] == pytest.approx(
        run["ranks"][1]["steps"][25]["wait_s"] + 0.5
    )
    assert snap["ranks"][0]["wait_s"] == plain["ranks"][0]["wait_s"]


def test_snapshot_from_run_tolerates_missing_keys():
    assert snapshot_from_run({}) == {}
    snap = snapshot_from_run({"ranks": [{}, {"rank": 1, "steps": [{"step": 3}]}]})
    assert snap["world_size"] == 2 and snap["step"] == 3
    assert snap["ranks"][1]["compute_s"] == [None]
    assert "barrier_wait_estimate_s" not in snap  # no complete step records to estimate from
    for text in (
        header_markdown(snap),
        wait_hidden_markdown(snap),
        delayed_reads_markdown(snap),
        plan_markdown(snap),
    ):
        assert MISSING in text and "None" not in text


@pytest.mark.parametrize(
    "run, message",
    [([], "must be a JSON object"), ({"ranks": {"0": {}}}, "'ranks' must be a list")],
)
def test_snapshot_from_run_rejects_bad_input(run, message):
    with pytest.raises(ValueError, match=message):
        snapshot_from_run(run)


def test_bin_series_matches_numpy():
    steps = list(range(100, 1100))
    values = [float(v) for v in np.sin(np.arange(1000) / 17.0)]
    x, y = bin_series(steps, values, 250)
    np.testing.assert_allclose(x, np.arange(100, 1100).reshape(250, 4).mean(axis=1))
    np.testing.assert_allclose(y, np.array(values).reshape(250, 4).mean(axis=1))
    assert bin_series(steps[:5], values[:5], 250) == ([float(s) for s in steps[:5]], values[:5])
    with pytest.raises(ValueError, match="max_points"):
        bin_series(steps, values, 0)


def test_tables_show_dash_for_missing_and_numbers_for_present():
    empty = [
        header_markdown({}),
        compute_wait_markdown([]),
        wait_hidden_markdown({}),
        delayed_reads_markdown({}),
        publications_markdown([]),
        plan_markdown({}),
        controls_markdown({}, {}),
    ]
    for text in empty:
        assert MISSING in text and "None" not in text and "nan" not in text
    snap = synthetic_snapshot(40)
    assert "**Step** 40 · **mode** throughput-first · **ranks** 3" in header_markdown(snap)
    hidden = 1 - snap["odin_wait_s"] / snap["barrier_wait_estimate_s"]
    assert f"{100 * hidden:.1f} %" in wait_hidden_markdown(snap)
    assert "Requested: **K** 6" in controls_markdown(snap, {"K": 6})


# ---------------------------------------------------------------------- panel thread


def test_source_errors_are_logged_not_raised(caplog):
    server = start_server()
    calls = {"n": 0}

    def flaky() -> dict:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("stats not ready")
        return synthetic_snapshot(40)

    try:
        panels = OdinPanels(server, flaky, start=False)
        with caplog.at_level(logging.DEBUG, logger="odin_ns.viewer_ext.panels"):
            assert panels.refresh() is False
            assert panels.refresh() is False
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1  # a repeated error is logged once at ERROR level
        assert panels.last_error == "RuntimeError: stats not ready"
        assert "stats not ready" in panels._header.content
        assert panels.refresh() is True and panels.snapshot["step"] == 40
        with pytest.raises(ValueError, match="snapshot must be a dict"):
            panels.render([1, 2])
        with pytest.raises(ValueError, match="refresh_s"):
            OdinPanels(server, flaky, refresh_s=0)
    finally:
        server.stop()


def test_attach_to_viewer_polls_in_a_daemon_thread():
    server = start_server()

    class FakeViewerState:  # nerfstudio's ViewerState exposes .viser_server
        viser_server = server

    source = LiveSource()
    try:
        panels = attach_to_viewer(FakeViewerState(), source, refresh_s=0.05)
        deadline = time.monotonic() + 10
        while panels.updates < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert panels.updates >= 3 and panels._thread.daemon
        panels.stop()
        with pytest.raises(ValueError, match="ViewerState or a viser server"):
            attach_to_viewer(object(), source)
    finally:
        server.stop()


def test_cli_serves_a_saved_run_and_rejects_a_missing_one(tmp_path):
    cli = [sys.executable, "-m", "odin_ns.viewer_ext", "--run-json"]
    proc = subprocess.run(
        [*cli, str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "run JSON not readable" in proc.stderr
    (tmp_path / "odin_run.json").write_text(json.dumps(saved_run()))
    port = free_port()
    proc = subprocess.run(
        [*cli, str(tmp_path / "odin_run.json"), "--port", str(port), "--seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"http://127.0.0.1:{port}" in proc.stdout


# ---------------------------------------------------------------------- real browser

READY = "document.body && document.body.innerText.includes('Wait hidden vs a barrier')"
STEP = r"Step (\d+) · mode"
# The GUI element a viser label names (its ``for`` is the element's id).
BY_LABEL = (
    "(text => document.getElementById("
    "[...document.querySelectorAll('label')].find(l => l.innerText == text).htmlFor))"
)
FOLDER_RECT = """(() => {
  const label = [...document.querySelectorAll('*')].find(
    e => [...e.childNodes].some(n => n.nodeType == 3 && n.textContent.trim() == 'Odin sync'));
  if (!label) return null;
  const r = label.parentElement.getBoundingClientRect();
  return {x: r.x - 6, y: r.y - 16, width: r.width + 12, height: r.height + 22};
})()"""


def shown_step(text: str) -> int:
    match = re.search(STEP, text)
    assert match, f"no step in panel text: {text[:200]!r}"
    return int(match.group(1))


def expected_lines(snap: dict) -> list[str]:
    """Lines the panels must show for ``snap``, computed independently of the panel code."""
    lines = []
    for r in snap["ranks"]:
        c, w = np.mean(r["compute_s"]), np.mean(r["wait_s"])
        lines.append(
            f"{r['rank']}\t{c * 1e3:.1f}\t{w * 1e3:.1f}\t{100 * w / (c + w):.1f} %\t{WINDOW}"
        )
        lines.append(
            f"{r['rank']}\t{np.mean(r['bytes_sent']) / 1024:.1f} KiB\t"
            f"{r['bytes_sent'][-1] / 1024:.1f} KiB\t{r['version_lag']}"
        )
    hidden = 1 - snap["odin_wait_s"] / snap["barrier_wait_estimate_s"]
    lines.append(f"Wait hidden vs a barrier: {100 * hidden:.1f} %")
    lines.append(f"admitted\t{snap['admitted']}")
    lines.append(f"fallback: overlap\t{snap['fallbacks']['overlap']}")
    lines.append(f"fallback: total\t{sum(snap['fallbacks'].values())}")
    hist = snap["staleness_hist"]
    lines.append(", ".join(f"{k}: {hist[k]}" for k in sorted(hist, key=int)))
    lines.append(f"phase\t{snap['plan']['phase']}")
    lines.append(f"predicted conflict\t{snap['plan']['predicted_conflict']:.3f}")
    previous = snap["plan"]["predicted_previous_step_reads"]
    lines.append(f"reads of a peer's last step\t{previous:.3f}")
    lines.append(f"rebuilt at step\t{snap['plan']['rebuilt_at_step']}")
    return lines


def plotted_traces(browser) -> list[int]:
    """Traces per chart in the panel (viser keeps a hidden copy of each for its zoom modal)."""
    return browser.evaluate(
        "[...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent !== null)"
        ".map(p => p.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length)"
    )


@pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")
def test_panels_in_headless_chromium(tmp_path):
    from odin_ns.viewer_ext.__main__ import serve_run

    refresh = 0.15
    source = LiveSource()
    server = start_server()
    panels = OdinPanels(server, source, refresh_s=refresh)
    source.panels = panels
    run_path = tmp_path / "odin_run.json"
    run_path.write_text(json.dumps(saved_run()))
    run_server = run_panels = None
    try:
        url = f"http://127.0.0.1:{server.get_port()}"
        with HeadlessChromium(url, ChromiumOptions(height=2300)) as browser:
            browser.wait_for(READY, timeout_s=60)
            browser.wait_for("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4")

            # Live updates: two reads at different times differ, and the step advances.
            first = browser.text()
            step1 = shown_step(first)
            browser.wait_for(f"(document.body.innerText.match(/{STEP}/) || [0, 0])[1] > {step1}")
            second = browser.text()
            assert second != first and shown_step(second) > step1
            for label in ("Odin sync", "Compute vs wait", "Publications", "Plan", "Controls"):
                assert label in second
            assert plotted_traces(browser) == [2 * WORLD, 1, 1, WORLD]

            # Pause: the source is no longer polled, the numbers hold still.
            browser.evaluate(f"{BY_LABEL}('Pause display').click()")
            browser.wait_for("document.body.innerText.includes('display paused')")
            time.sleep(1.0)  # a poll that began before the click may still finish
            calls = source.calls
            time.sleep(3 * refresh)
            assert source.calls == calls
            paused = browser.text()
            snap = synthetic_snapshot(shown_step(paused))
            for line in expected_lines(snap):
                assert line in paused, f"{line!r} not shown"

            # The K slider only requests; the source (standing in for the pipeline) applies it.
            browser.evaluate(f"{BY_LABEL}('K (request)').querySelector('[role=slider]').focus()")
            browser.press_key("ArrowRight", "ArrowRight", 39)
            deadline = time.monotonic() + 10
            while panels.requested_settings() != {"K": 5} and time.monotonic() < deadline:
                time.sleep(0.05)
            assert panels.requested_settings() == {"K": 5}
            browser.wait_for("document.body.innerText.includes('Requested: K 5')")
            assert source.settings["K"] == 4  # nothing applied while paused
            browser.evaluate(f"{BY_LABEL}('Pause display').click()")
            browser.wait_for("document.body.innerText.includes('in effect: tau 0.20 · K 5')")
            browser.wait_for("document.body.innerText.includes('No change requested')")
            assert source.settings["K"] == 5 and panels.requested_settings() == {}

            clip = browser.evaluate(FOLDER_RECT)
            shot = browser.screenshot(tmp_path / "viewer_panels.png", clip=clip)
            assert shot.stat().st_size > 20_000
            readme_shot = REPO / "docs" / "viewer_panels.png"
            if not readme_shot.exists() or os.environ.get("ODIN_UPDATE_SCREENSHOT") == "1":
                shutil.copy(shot, readme_shot)  # the README's picture (not rewritten every run)

            # Saved-run mode (what `python -m odin_ns.viewer_ext --run-json` serves).
            run_server, run_panels = serve_run(run_path, port=free_port())
            browser.navigate(f"http://127.0.0.1:{run_server.get_port()}")
            browser.wait_for(READY, timeout_s=60)
            browser.wait_for("document.body.innerText.includes('num gaussians')")
            text = browser.text()
            snap = snapshot_from_run(saved_run())
            hidden = 1 - snap["odin_wait_s"] / snap["barrier_wait_estimate_s"]
            for line in (
                "Step 39 · mode throughput-first · ranks 2",
                f"Wait hidden vs a barrier: {100 * hidden:.1f} %",
                "admitted\t23",
                "phase\t1",
                "num gaussians\t1234",
                "1\t4.0 KiB\t—\t3",  # publications: mean bytes/step from the run total
                "mean footprint rows\t456.500",
                "0: 61, 1: 14",
            ):
                assert line in text, f"{line!r} not shown"
    finally:
        panels.stop()
        server.stop()
        if run_panels is not None:
            run_panels.stop()
            run_server.stop()
