"""Live "Odin sync" panels in a viser server, fed by a snapshot source.

The panels run in their own daemon thread: it calls ``source()``, renders, and sleeps. The
training thread never waits on it (the source must be cheap and must not take locks the
training step holds: the intended source returns a dict the pipeline replaces wholesale,
never mutates, e.g. ``lambda: pipeline.sync_snapshot``). Errors in the source or in
rendering are logged and shown in the panel, never raised.

The controls cannot change training directly. "Pause display" stops polling the source.
The tau and K sliders only record a *request*: ``requested_settings()`` returns it, the
pipeline applies it at its next phase boundary (where no delayed read is in flight), and the
request is cleared once a snapshot reports the requested values in effect.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .figures import bytes_figure, compute_wait_figure, delayed_reads_figure, staleness_figure
from .snapshot import as_float, as_int, fallback_counts, rank_stats, staleness_counts
from .tables import (
    compute_wait_markdown,
    controls_markdown,
    delayed_reads_markdown,
    header_markdown,
    plan_markdown,
    publications_markdown,
    wait_hidden_markdown,
    wait_hidden_percent,
)

LOG = logging.getLogger(__name__)

Snapshot = dict[str, Any]


@dataclass
class PanelOptions:
    """Look and limits of the panels."""

    label: str = "Odin sync"  # folder title
    max_points: int = 200  # points per chart series (longer series are binned)
    tau_default: float = 1.0  # slider position until a snapshot reports tau (SyncConfig's)
    k_default: int = 4  # slider position until a snapshot reports staleness_window
    tau_max: float = 2.0
    k_max: int = 16
    charts: bool = True  # plotly charts (needs the plotly package); False: tables only
    chart_aspect: float = 0.62  # chart height / width
    expand_by_default: bool = True
    order: float | None = None  # position among the server's top-level GUI elements


class OdinPanels:
    """The "Odin sync" folder: charts, tables and request-only controls.

    server: a ``viser.ViserServer`` (nerfstudio's ``ViewerState.viser_server``).
    source: ``() -> dict`` snapshot (see ``odin_ns.viewer_ext.snapshot.SNAPSHOT_KEYS``);
        called only from the panel thread.
    refresh_s: seconds between polls.
    start: start the polling thread now (False: call ``render`` / ``refresh`` yourself).
    """

    def __init__(
        self,
        server,
        source: Callable[[], Snapshot],
        refresh_s: float = 0.5,
        options: PanelOptions | None = None,
        start: bool = True,
    ):
        if not callable(source):
            raise ValueError(f"source must be callable, got {type(source).__name__}")
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        self.server = server
        self.source = source
        self.refresh_s = float(refresh_s)
        self.options = options or PanelOptions()
        if self.options.max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {self.options.max_points}")

        self._lock = threading.Lock()  # guards _pending, _snapshot, counters
        self._render_lock = threading.Lock()  # one render at a time
        self._pending: dict[str, float | int] = {}
        self._snapshot: Snapshot = {}
        self._sent: dict[int, Any] = {}  # id(handle) -> last content sent (skip repeats)
        self._last_error: str | None = None
        self._error_count = 0
        self.updates = 0  # successful renders
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._build()
        if start:
            self.start()

    # ------------------------------------------------------------------ GUI layout
    def _build(self) -> None:
        gui, opt = self.server.gui, self.options
        self.folder = gui.add_folder(
            opt.label, order=opt.order, expand_by_default=opt.expand_by_default
        )
        with self.folder:
            self._header = gui.add_markdown(header_markdown({}, "waiting for the first snapshot"))
            charts = opt.charts and _plotly_available()
            with gui.add_folder("Compute vs wait"):
                self._cw_plot = self._add_plot(compute_wait_figure([])) if charts else None
                self._cw_table = gui.add_markdown(compute_wait_markdown([]))
            with gui.add_folder("Wait hidden"):
                self._hidden_text = gui.add_markdown(wait_hidden_markdown({}))
                self._hidden_bar = gui.add_progress_bar(0.0, color="green")
            with gui.add_folder("Delayed reads"):
                self._stale_plot = self._add_plot(staleness_figure([])) if charts else None
                self._reads_plot = (
                    self._add_plot(delayed_reads_figure(None, fallback_counts({})))
                    if charts
                    else None
                )
                self._reads_text = gui.add_markdown(delayed_reads_markdown({}))
            with gui.add_folder("Publications"):
                self._bytes_plot = self._add_plot(bytes_figure([])) if charts else None
                self._pub_table = gui.add_markdown(publications_markdown([]))
            with gui.add_folder("Plan"):
                self._plan_table = gui.add_markdown(plan_markdown({}))
            with gui.add_folder("Controls"):
                self.pause = gui.add_checkbox(
                    "Pause display", False, hint="Stop polling sync statistics (training goes on)"
                )
                self.tau_slider = gui.add_slider(
                    "tau (request)",
                    min=0.0,
                    max=float(opt.tau_max),
                    step=0.01,
                    initial_value=float(opt.tau_default),
                    hint="Admission threshold; applied at the next phase boundary",
                )
                self.k_slider = gui.add_slider(
                    "K (request)",
                    min=0,
                    max=int(opt.k_max),
                    step=1,
                    initial_value=int(opt.k_default),
                    hint="Staleness window in steps; applied at the next phase boundary",
                )
                self.clear_button = gui.add_button("Clear request")
                self._controls_text = gui.add_markdown(controls_markdown({}, {}))
        self.tau_slider.on_update(lambda event: self._on_request(event, "tau", float))
        self.k_slider.on_update(lambda event: self._on_request(event, "K", int))
        self.clear_button.on_click(lambda _event: self._clear_request())
        self.pause.on_update(lambda _event: self._on_pause())

    def _add_plot(self, figure):
        handle = self.server.gui.add_plotly(figure, aspect=self.options.chart_aspect)
        self._sent[id(handle)] = figure.to_json()
        return handle

    # ------------------------------------------------------------------ controls
    def _on_request(self, event, key: str, cast) -> None:
        if getattr(event, "client_id", None) is None:
            return  # the panel itself moved the slider to the value in effect
        with self._lock:
            self._pending[key] = cast(round(event.target.value, 6))
            snapshot = self._snapshot
        with self._render_lock:
            self._set_markdown(
                self._controls_text, controls_markdown(snapshot, self.requested_settings())
            )

    def _clear_request(self) -> None:
        with self._lock:
            self._pending.clear()
            snapshot = self._snapshot
        with self._render_lock:
            self._sync_sliders(snapshot)
            self._set_markdown(self._controls_text, controls_markdown(snapshot, {}))

    def _on_pause(self) -> None:
        with self._lock:
            snapshot = self._snapshot
        note = "display paused" if self.pause.value else "display resumed"
        with self._render_lock:
            self._set_markdown(self._header, header_markdown(snapshot, note))

    def requested_settings(self) -> dict[str, float | int]:
        """Pending change requests, e.g. ``{"tau": 0.1, "K": 2}`` (only keys the user moved).

        Does not consume the request: the pipeline may call it at every phase boundary and
        apply what it returns; the request is cleared once a snapshot reports its values
        (``tau``, ``staleness_window``) in effect, or by the "Clear request" button.
        """
        with self._lock:
            return dict(self._pending)

    def _settle_requests(self, snapshot: Snapshot) -> None:
        """Drop requests the snapshot shows are in effect."""
        in_effect = {
            "tau": as_float(snapshot.get("tau")),
            "K": as_int(snapshot.get("staleness_window")),
        }
        with self._lock:
            for key, value in list(self._pending.items()):
                current = in_effect[key]
                if current is not None and abs(current - value) < 1e-9:
                    del self._pending[key]

    def _sync_sliders(self, snapshot: Snapshot) -> None:
        """Move sliders without a pending request to the values in effect."""
        pending = self.requested_settings()
        tau, k = as_float(snapshot.get("tau")), as_int(snapshot.get("staleness_window"))
        if tau is not None and "tau" not in pending and self.tau_slider.value != tau:
            self.tau_slider.value = min(max(tau, 0.0), float(self.options.tau_max))
        if k is not None and "K" not in pending and self.k_slider.value != k:
            self.k_slider.value = min(max(k, 0), int(self.options.k_max))

    # ------------------------------------------------------------------ rendering
    def _set_markdown(self, handle, text: str) -> None:
        if self._sent.get(id(handle)) != text:
            handle.content = text
            self._sent[id(handle)] = text

    def _set_plot(self, handle, figure) -> None:
        if handle is None:
            return
        text = figure.to_json()
        if self._sent.get(id(handle)) != text:
            handle.figure = figure
            self._sent[id(handle)] = text

    def render(self, snapshot: Snapshot, note: str = "") -> None:
        """Show ``snapshot`` now (any thread). Raises ValueError if it is not a dict."""
        if not isinstance(snapshot, dict):
            raise ValueError(f"snapshot must be a dict, got {type(snapshot).__name__}")
        if self.pause.value:
            note = f"display paused · {note}" if note else "display paused"
        with self._render_lock:
            with self._lock:
                self._snapshot = snapshot
            # Build everything first, then send in one burst (no server.atomic(): its lock
            # would defer messages nerfstudio's own threads queue meanwhile).
            stats = rank_stats(snapshot)
            mp = self.options.max_points
            plots = (
                (self._cw_plot, compute_wait_figure(stats, mp)),
                (self._stale_plot, staleness_figure(staleness_counts(snapshot))),
                (
                    self._reads_plot,
                    delayed_reads_figure(
                        as_int(snapshot.get("admitted")), fallback_counts(snapshot)
                    ),
                ),
                (self._bytes_plot, bytes_figure(stats, mp)),
            )
            texts = (
                (self._header, header_markdown(snapshot, note)),
                (self._cw_table, compute_wait_markdown(stats)),
                (self._hidden_text, wait_hidden_markdown(snapshot)),
                (self._reads_text, delayed_reads_markdown(snapshot)),
                (self._pub_table, publications_markdown(stats)),
                (self._plan_table, plan_markdown(snapshot)),
            )
            percent = wait_hidden_percent(snapshot)
            self._settle_requests(snapshot)
            for handle, text in texts:
                self._set_markdown(handle, text)
            for handle, figure in plots:
                self._set_plot(handle, figure)
            if self._hidden_bar.value != percent:
                self._hidden_bar.value = percent
            self._sync_sliders(snapshot)
            self._set_markdown(
                self._controls_text, controls_markdown(snapshot, self.requested_settings())
            )
            self.updates += 1

    def refresh(self) -> bool:
        """Poll the source once and render; errors are logged and shown, never raised.

        Returns True if a snapshot was rendered (False when paused or on error).
        """
        if self.pause.value:
            return False
        try:
            self.render(self.source(), note=self._error_note())
            return True
        except Exception as exc:  # the display must never take training down
            message = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._error_count += 1
                first = message != self._last_error
                self._last_error = message
                snapshot = self._snapshot
            if first:
                LOG.exception("Odin sync panel update failed")
            else:
                LOG.debug("Odin sync panel update failed again: %s", message)
            try:
                with self._render_lock:
                    self._set_markdown(self._header, header_markdown(snapshot, self._error_note()))
            except Exception:
                LOG.debug("could not show the panel error", exc_info=True)
            return False

    def _error_note(self) -> str:
        with self._lock:
            if self._last_error is None:
                return ""
            return f"last source error ({self._error_count}x): `{self._last_error[:200]}`"

    @property
    def last_error(self) -> str | None:
        with self._lock:
            return self._last_error

    @property
    def snapshot(self) -> Snapshot:
        """The last snapshot rendered."""
        with self._lock:
            return self._snapshot

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        """Start polling in a daemon thread (no-op if running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="odin-sync-panels", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self.refresh()
            next_tick = max(next_tick + self.refresh_s, time.monotonic())
            self._stop.wait(next_tick - time.monotonic())

    def stop(self, remove: bool = False) -> None:
        """Stop the thread; ``remove`` also deletes the folder from the GUI."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if remove:
            self.folder.remove()


def _plotly_available() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        LOG.warning("plotly is not installed: Odin sync panels show tables only")
        return False
    return True


def attach_to_viewer(
    viewer_state, source: Callable[[], Snapshot], refresh_s: float = 0.5, **options
) -> OdinPanels:
    """Add the Odin panels to nerfstudio's viewer (call on rank 0 after the viewer is up).

    viewer_state: nerfstudio's ``ViewerState`` (uses its ``.viser_server``) or a
        ``viser.ViserServer``.
    options: ``PanelOptions`` fields (``label``, ``max_points``, ...).
    """
    server = getattr(viewer_state, "viser_server", None)
    if server is None and hasattr(viewer_state, "gui"):
        server = viewer_state
    if server is None:
        raise ValueError(
            f"attach_to_viewer needs a nerfstudio ViewerState or a viser server, got {type(viewer_state).__name__}"
        )
    return OdinPanels(server, source, refresh_s=refresh_s, options=PanelOptions(**options))


__all__ = ["OdinPanels", "PanelOptions", "attach_to_viewer"]
