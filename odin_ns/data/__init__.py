"""Built-in data: procedural multi-view scenes (see ``odin_ns.data.synthetic``)."""

from __future__ import annotations

from typing import Any

__all__ = ["make_scene"]


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m odin_ns.data.synthetic` does not import the module twice.
    if name == "make_scene":
        from odin_ns.data.synthetic import make_scene

        return make_scene
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
