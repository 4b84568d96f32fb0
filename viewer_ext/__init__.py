"""Viser viewer panels for Odin's sync statistics (installed as ``odin_ns.viewer_ext``)."""
