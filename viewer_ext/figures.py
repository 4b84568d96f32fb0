"""Plotly figures for the panels, built as plain dicts.

``plotly.graph_objects.Figure`` validates every property in Python: about 45 ms per small
figure, all of it holding the GIL that the training thread needs. A plain dict with the same
JSON costs about 1 ms, so the panel thread stays out of training's way. viser's
``add_plotly`` only calls ``figure.to_json()``, which ``PlotlyJSON`` provides.
"""

from __future__ import annotations

import json

from .snapshot import FALLBACK_REASONS, RankStats

# Colour per rank (plotly's default qualitative palette), cycled for more ranks.
RANK_COLORS = (
    "#636efa",
    "#ef553b",
    "#00cc96",
    "#ab63fa",
    "#ffa15a",
    "#19d3f3",
    "#ff6692",
    "#b6e880",
    "#ff97ff",
    "#fecb52",
)
GREY = "#888888"
GRID = "rgba(136,136,136,0.25)"


class PlotlyJSON(dict):
    """A plotly figure as a dict ({"data", "layout"}) with the ``to_json`` viser calls.

    Build it complete, then treat it as read-only: the JSON is computed once and cached.
    """

    def to_json(self) -> str:
        cached = getattr(self, "_json", None)
        if cached is None:
            cached = self._json = json.dumps(self, separators=(",", ":"), allow_nan=False)
        return cached


def _round(values: list[float | None], scale: float = 1.0, digits: int = 3) -> list[float | None]:
    """``values * scale`` rounded (shorter JSON: plots need no 17-digit floats)."""
    return [None if v is None else round(v * scale, digits) for v in values]


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def _layout(title: str, x_title: str, y_title: str, empty: bool) -> dict:
    """Compact layout readable on nerfstudio's dark panel and on a light one."""
    axis = {"gridcolor": GRID, "zerolinecolor": GRID, "color": GREY, "automargin": True}
    layout = {
        "title": {"text": title, "font": {"size": 12}, "x": 0.02, "xanchor": "left"},
        "margin": {"l": 40, "r": 8, "t": 28, "b": 24},
        "font": {"size": 10, "color": GREY},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "xaxis": {**axis, "title": {"text": x_title}},
        "yaxis": {**axis, "title": {"text": y_title}},
        "legend": {"orientation": "h", "y": -0.12, "yanchor": "top", "x": 0, "font": {"size": 9}},
        "showlegend": True,
    }
    if empty:
        layout["annotations"] = [
            {
                "text": "no data yet",
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 12, "color": GREY},
            }
        ]
    return layout


def bin_series(
    steps: list[int], values: list[float | None], max_points: int
) -> tuple[list[float], list[float | None]]:
    """Mean of consecutive chunks so a series has at most ``max_points`` points.

    steps: [W], values: [W] (None: not reported). Returns (x [P], y [P]) with P <= max_points;
    x is each chunk's mean step, y its mean value over reported entries (None if none).
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    n = min(len(steps), len(values))
    if n <= max_points:
        return [float(s) for s in steps[:n]], list(values[:n])
    xs, ys = [], []
    for k in range(max_points):
        lo, hi = k * n // max_points, (k + 1) * n // max_points
        chunk = [v for v in values[lo:hi] if v is not None]
        xs.append(sum(steps[lo:hi]) / (hi - lo))
        ys.append(sum(chunk) / len(chunk) if chunk else None)
    return xs, ys


def compute_wait_figure(stats: list[RankStats], max_points: int = 200) -> PlotlyJSON:
    """Per-rank compute (solid) and wait (dotted) time per step, in milliseconds."""
    data = []
    for r in stats:
        for name, series, dash in (("compute", r.compute_s, "solid"), ("wait", r.wait_s, "dot")):
            if not any(v is not None for v in series):
                continue
            x, y = bin_series(r.steps, series, max_points)
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"r{r.rank}",
                    "legendgroup": f"r{r.rank}",
                    "showlegend": name == "compute",  # one legend entry per rank (colour)
                    "hovertemplate": f"r{r.rank} {name}: %{{y:.1f}} ms<extra></extra>",
                    "x": _round(x, digits=1),
                    "y": _round(y, 1e3),
                    "line": {"color": rank_color(r.rank), "dash": dash, "width": 1.5},
                }
            )
    title = "Compute (solid) / wait (dotted)"
    return PlotlyJSON(data=data, layout=_layout(title, "", "ms", empty=not data))


def bytes_figure(stats: list[RankStats], max_points: int = 200) -> PlotlyJSON:
    """Publication bytes each rank sent per step (KiB)."""
    data = []
    for r in stats:
        if not any(v is not None for v in r.bytes_sent):
            continue
        x, y = bin_series(r.steps, r.bytes_sent, max_points)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"r{r.rank}",
                "x": _round(x, digits=1),
                "y": _round(y, 1.0 / 1024.0),
                "line": {"color": rank_color(r.rank), "width": 1.5},
            }
        )
    return PlotlyJSON(
        data=data, layout=_layout("Publication bytes per step", "", "KiB", empty=not data)
    )


def staleness_figure(pairs: list[tuple[int, int]]) -> PlotlyJSON:
    """Histogram of admitted delayed reads by staleness (steps behind)."""
    data = []
    if pairs:
        data.append(
            {
                "type": "bar",
                "name": "reads",
                "x": [k for k, _ in pairs],
                "y": [c for _, c in pairs],
                "marker": {"color": "#636efa"},
            }
        )
    layout = _layout("Staleness histogram", "staleness (steps)", "reads", empty=not data)
    layout["showlegend"] = False
    layout["xaxis"]["dtick"] = 1
    return PlotlyJSON(data=data, layout=layout)


def delayed_reads_figure(admitted: int | None, fallbacks: dict[str, int | None]) -> PlotlyJSON:
    """Admitted delayed reads next to fallbacks (reads that waited), by reason."""
    labels, counts, colors = [], [], []
    if admitted is not None:
        labels.append("admitted")
        counts.append(admitted)
        colors.append("#00cc96")
    for reason, count in fallbacks.items():
        if count is not None:
            labels.append(reason if reason in FALLBACK_REASONS else f"{reason}")
            counts.append(count)
            colors.append("#ef553b")
    data = []
    if labels:
        data.append(
            {"type": "bar", "x": labels, "y": counts, "marker": {"color": colors}, "name": "reads"}
        )
    layout = _layout("Admitted vs fallback by reason", "", "reads", empty=not data)
    layout["showlegend"] = False
    return PlotlyJSON(data=data, layout=layout)


__all__ = [
    "PlotlyJSON",
    "bin_series",
    "bytes_figure",
    "compute_wait_figure",
    "delayed_reads_figure",
    "rank_color",
    "staleness_figure",
]
