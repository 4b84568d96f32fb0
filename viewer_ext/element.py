"""The Odin panels as a nerfstudio ``ViewerElement``.

nerfstudio's ``ViewerState`` installs every ``ViewerElement`` it finds on the pipeline. An
``OdinPanelsElement`` attribute on the pipeline therefore puts the panels into the viewer
that ``ns-train`` starts (live, on rank 0) *and* into the one ``ns-viewer --load-config``
starts (from the finished run's ``odin_run.json``), with no change to nerfstudio.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from nerfstudio.viewer.viewer_elements import ViewerElement

from .panels import OdinPanels
from .snapshot import snapshot_from_run


class OdinPanelsElement(ViewerElement):
    """Installs :class:`OdinPanels` fed by ``source`` when the viewer starts."""

    def __init__(self, source: Callable[[], dict], refresh_s: float = 0.5):
        super().__init__(name="Odin sync")
        self.source = source
        self.refresh_s = refresh_s
        self.panels: OdinPanels | None = None

    @classmethod
    def from_run_json(cls, path: Path) -> OdinPanelsElement:
        """Panels of a finished run, from the ``odin_run.json`` it wrote."""
        snapshot = snapshot_from_run(json.loads(Path(path).read_text()))
        return cls(lambda: snapshot, refresh_s=5.0)

    def _create_gui_handle(self, viser_server) -> None:
        self.panels = OdinPanels(viser_server, self.source, refresh_s=self.refresh_s)

    def install(self, viser_server) -> None:
        self._create_gui_handle(viser_server)

    def requested_settings(self) -> dict:
        return self.panels.requested_settings() if self.panels is not None else {}
