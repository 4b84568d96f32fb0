"""Print the metrics of an ``ns-eval`` JSON file as one table (used by ``make demo``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main(path: str) -> None:
    results = json.loads(Path(path).read_text())["results"]
    table = Table(title=f"ns-eval: {path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("psnr", "ssim", "lpips", "num_rays_per_sec", "fps"):
        if key in results:
            table.add_row(key, f"{results[key]:.4f}")
    if "lpips" not in results:
        table.add_row("lpips", "skipped (AlexNet weights not cached)")
    Console().print(table)


if __name__ == "__main__":
    main(sys.argv[1])
