"""Odin for nerfstudio: distributed 3D Gaussian Splatting with primitive-level synchronization."""

import os

# Reproducible CPU arithmetic. With MKL's dynamic threading (its default) a matrix product
# may run on fewer threads than requested when the machine is busy, and then sums in another
# order: the same rasterizer call, repeated in one process with 2 threads, gave colour
# gradients that differ in the last bits. MKL reads this at its first call, so setting it
# when nerfstudio loads the plugin suffices. (Two *processes* with 2 threads each still
# differ for a reason not yet found; with 1 thread per process, runs are bitwise repeatable.)
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

__version__ = "0.1.0"
