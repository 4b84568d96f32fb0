"""Viser viewer panels for Odin's sync statistics (installed as ``odin_ns.viewer_ext``).

Live:  ``attach_to_viewer(viewer_state, source)`` on rank 0, ``source() -> dict`` snapshot.
Saved: ``ns-viewer --load-config outputs/.../config.yml`` (the pipeline carries an
``OdinPanelsElement``), or ``python -m odin_ns.viewer_ext --run-json .../odin_run.json``.
"""

from .element import OdinPanelsElement
from .panels import OdinPanels, PanelOptions, attach_to_viewer
from .snapshot import SNAPSHOT_KEYS, snapshot_from_run

__all__ = [
    "SNAPSHOT_KEYS",
    "OdinPanels",
    "OdinPanelsElement",
    "PanelOptions",
    "attach_to_viewer",
    "snapshot_from_run",
]
