"""What every benchmark reports the same way: medians with their spread, the JSON, the PNG.

Benchmarks run variants interleaved over rounds and report, per figure, the median over
rounds with ``<key>_min`` / ``<key>_max`` (``put_spread``); the result goes to one JSON
file (``write_json``) and its picture to a PNG beside it (``save_figure``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, min and max of the rounds' values; all None when a value is missing (e.g.
    LPIPS without its weights) or there is none."""
    if not values or any(v is None for v in values):
        return {"median": None, "min": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def put_spread(results: dict, key: str, values: Sequence[float | None]) -> None:
    """``results[key]`` = the median of ``values``, ``key_min`` / ``key_max`` their range."""
    s = spread(values)
    results[key], results[f"{key}_min"], results[f"{key}_max"] = s["median"], s["min"], s["max"]


def write_json(path: Path, result: dict) -> None:
    """The benchmark's result as indented JSON (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a matplotlib figure: a PNG of at most 256 colours, which a
    plot's lines and text fill without a visible change at about a third of the bytes of
    matplotlib's RGBA file (the tree's few hundred figures travel with it to a lent GPU
    machine, under that machine's size limit)."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig.tight_layout()
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=dpi)
    plt.close(fig)
    with Image.open(rgba) as image:
        palette = image.convert("RGB").quantize(
            256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    palette.save(path, format="PNG", optimize=True)
