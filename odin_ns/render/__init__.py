"""Rasterizer backends: gsplat's CUDA rasterizer and a differentiable CPU (torch) one.

``rasterize(...)`` mirrors ``gsplat.rasterization`` (the subset splatfacto uses) and returns
the same ``info`` dict, so gsplat's densification strategies work on either backend.
"""

from .api import BACKENDS, GSPLAT_NEEDS_CUDA, rasterize, resolve_backend

__all__ = ["BACKENDS", "GSPLAT_NEEDS_CUDA", "rasterize", "resolve_backend"]
