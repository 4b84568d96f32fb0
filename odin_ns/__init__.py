"""Odin for nerfstudio: distributed 3D Gaussian Splatting with primitive-level synchronization."""

__version__ = "0.1.0"
