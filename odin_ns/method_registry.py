"""nerfstudio's method registry (``nerfstudio.configs.method_configs``), imported cheaply.

On import the registry builds a placeholder config for each of nerfstudio's 26 external
methods, and each placeholder asks ``inspect.stack()`` whether the registry itself made it
(so as not to offer an install). ``inspect.stack()`` reads every frame's source and, for
each frame without a module file (the import machinery's), walks all of ``sys.modules``;
imported from inside another module's import (``nerfstudio.scripts.train``'s, as a spawned
rank, ``ns-eval`` in process or ``bench.methods`` do) that is 3-5 CPU-seconds here. While
the registry is imported, ``inspect.stack`` lists the frames without source context
(function names, files and lines: all the placeholders read); it is restored right after.
The launcher's own import (from a function, few frames) was never slow.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


def _stack_without_source(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` with no source lines: the caller's frame first."""
    frame, frames = sys._getframe(1), []
    while frame is not None:
        code = frame.f_code
        frames.append(
            inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None)
        )
        frame = frame.f_back
    return frames


@contextmanager
def stacks_without_source() -> Iterator[None]:
    """Within: ``inspect.stack`` is ``_stack_without_source``."""
    full = inspect.stack
    inspect.stack = _stack_without_source
    try:
        yield
    finally:
        inspect.stack = full


def method_registry() -> ModuleType:
    """``nerfstudio.configs.method_configs`` (``AnnotatedBaseConfigUnion``, ``all_methods``),
    imported without the source-reading stacks if this process has not imported it yet."""
    name = "nerfstudio.configs.method_configs"
    if name not in sys.modules:
        with stacks_without_source():
            import nerfstudio.configs.method_configs  # noqa: F401
    return sys.modules[name]


__all__ = ["method_registry", "stacks_without_source"]
