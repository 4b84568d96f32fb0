"""Saved-run mode: ``python -m odin_ns.viewer_ext --run-json PATH/odin_run.json [--port N]``.

Serves the Odin panels for a finished run's ``odin_run.json``. The file is re-read when it
changes, so a run that rewrites it periodically is shown live too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .panels import OdinPanels, PanelOptions
from .snapshot import snapshot_from_run


def load_run(path: str | Path) -> dict:
    """Parse ``odin_run.json``; ValueError with the reason if it is missing or invalid."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"run JSON not found: {path}")
    try:
        run = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"run JSON {path} is not valid JSON: {exc}") from None
    if not isinstance(run, dict):
        raise ValueError(f"run JSON {path} must hold an object, got {type(run).__name__}")
    return run


class RunFileSource:
    """Snapshot source reading ``odin_run.json``; re-parsed only when its mtime changes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mtime: float | None = None
        self._snapshot: dict = {}

    def __call__(self) -> dict:
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            raise ValueError(f"run JSON not readable: {self.path} ({exc.strerror})") from None
        if mtime != self._mtime:
            self._snapshot = snapshot_from_run(load_run(self.path))
            self._mtime = mtime
        return self._snapshot


def serve_run(
    path: str | Path, host: str = "127.0.0.1", port: int = 8080, refresh_s: float = 2.0
) -> tuple:
    """Start a viser server showing the panels for ``path``; returns (server, panels)."""
    source = RunFileSource(path)
    source()  # fail early, with the reason, on a bad file
    import viser

    server = viser.ViserServer(host=host, port=port, label="Odin run", verbose=False)
    server.gui.configure_theme(
        control_width="large"
    )  # show_share_button=False crashes viser 0.2.7's client
    panels = OdinPanels(
        server, source, refresh_s=refresh_s, options=PanelOptions(label="Odin sync")
    )
    return server, panels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m odin_ns.viewer_ext", description="Show a saved Odin run's sync panels."
    )
    parser.add_argument("--run-json", required=True, help="path to odin_run.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--seconds", type=float, default=None, help="stop after this long (default: Ctrl-C)"
    )
    args = parser.parse_args(argv)
    try:
        server, panels = serve_run(args.run_json, args.host, args.port)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(
        f"Odin sync panels for {args.run_json}: http://{args.host}:{server.get_port()}", flush=True
    )
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        panels.stop()
        server.stop()


if __name__ == "__main__":
    main()
