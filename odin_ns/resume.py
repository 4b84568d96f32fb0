"""Exact resume: the state a checkpoint needs beyond nerfstudio's model and optimizers.

nerfstudio's checkpoint holds the parameters, the optimizers' moments and step counts and
the schedulers. For the resumed run to continue *exactly* as the uninterrupted one, the
next step also depends on:

- the densification strategy's running statistics (``grad2d``, ``count``, ``radii``);
- every random generator the run draws from, per rank (torch CPU and CUDA: splatfacto's
  random background; Python's ``random`` and numpy's global generators);
- single process: the data manager's epoch (views not yet trained, its sampler's state);
- distributed: the plan's epoch position (``Plan.resume``) and the phase count. A
  checkpoint step always ends a phase (``PhaseController``), so the resumed run starts a
  phase where the uninterrupted one does, from the same parameters: same footprints, same
  plan.

Replicated and sharded checkpoints carry the same ``"odin"`` entry (:func:`resume_entry`),
marked with the mode that wrote it (``"parallel"``). A sharded checkpoint is merged (the
whole model, every owner's rows and moments) and a sharded rank's statistics are [N] over
global ids of the views it trained, as a replicated rank's, so either mode resumes either
checkpoint; on the same world size the resumed run continues exactly where the math of the
two modes agrees (sharded quality-first is bitwise replicated barrier).

Everything here is stored as tensors, lists and numbers, so checkpoints still load with
``torch.load(weights_only=True)`` (ns-eval, ns-viewer).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

FORMAT = 1


def capture_rank_state(strategy_state: dict[str, Any], datamanager=None) -> dict[str, Any]:
    """One rank's part of the resume state: its generators, its strategy statistics and
    (single process only: pass the data manager) the data manager's epoch."""
    return {
        "rng": capture_rng_state(),
        "strategy": capture_strategy_state(strategy_state),
        "datamanager": None if datamanager is None else capture_datamanager_state(datamanager),
    }


def resume_entry(
    ranks: list[dict[str, Any]] | None, phase: dict | None, parallel: str
) -> dict[str, Any]:
    """A checkpoint's ``"odin"`` entry: every rank's ``capture_rank_state`` (rank order; None
    on a rank that does not write the checkpoint), the
    phase controller's ``resume_state`` (None for one process) and the mode that wrote it
    (``"replicated"`` or ``"sharded"``; informative: either mode resumes either)."""
    return {"format": FORMAT, "parallel": parallel, "ranks": ranks, "phase": phase}


def capture_rng_state() -> dict[str, Any]:
    """This process's random generators (torch CPU, its current CUDA device's, Python,
    numpy). Only its own device's: a run resumed where fewer GPUs are visible, or with its
    ranks on other devices, has no generator of the same index for every saved one."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if cuda else [],
        "python": list(_listify(random.getstate())),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    saved = state["cuda"]
    if saved and torch.cuda.is_available():
        # into the current device's generator; a checkpoint written before 2026-12-07 holds
        # every visible device's: the one of this device's index, or the last there is
        index = torch.cuda.current_device() if len(saved) > 1 else 0
        torch.cuda.set_rng_state(saved[min(index, len(saved) - 1)])
    random.setstate(_tuplify(state["python"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))


def capture_strategy_state(state: dict[str, Any]) -> dict[str, Any]:
    """The strategy's running statistics (tensors on CPU; None where not allocated)."""
    return {
        key: (value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value)
        for key, value in state.items()
    }


def restore_strategy_state(state: dict[str, Any], saved: dict[str, Any], device) -> None:
    """Put saved statistics back into the model's strategy state dict, in place."""
    for key, value in saved.items():
        state[key] = value.to(device) if isinstance(value, torch.Tensor) else value


def merge_strategy_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One state from several ranks', as the refine step combines them: sums of ``grad2d``
    and ``count``, max of ``radii``; other entries from the first rank."""
    out = dict(states[0])
    for key, combine in (("grad2d", torch.add), ("count", torch.add), ("radii", torch.maximum)):
        values = [s.get(key) for s in states]
        if all(isinstance(v, torch.Tensor) for v in values):
            merged = values[0]
            for v in values[1:]:
                merged = combine(merged, v)
            out[key] = merged
    return out


def zeros_like_strategy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def capture_datamanager_state(datamanager) -> dict[str, Any]:
    """Single-process epoch state of nerfstudio's FullImageDatamanager."""
    out: dict[str, Any] = {"train_unseen_cameras": list(datamanager.train_unseen_cameras)}
    sampler = getattr(datamanager, "random_generator", None)
    if sampler is not None:
        out["random_generator"] = list(_listify(sampler.getstate()))
    return out


def restore_datamanager_state(datamanager, saved: dict[str, Any]) -> None:
    datamanager.train_unseen_cameras = list(saved["train_unseen_cameras"])
    if "random_generator" in saved and getattr(datamanager, "random_generator", None):
        datamanager.random_generator.setstate(_tuplify(saved["random_generator"]))


def _listify(value):
    """Nested tuples -> nested lists (weights-only checkpoints allow lists, ints, floats)."""
    if isinstance(value, tuple):
        return [_listify(v) for v in value]
    return value


def _tuplify(value):
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value
