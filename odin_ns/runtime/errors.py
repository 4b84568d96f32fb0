"""Errors of the primitive-sync runtime: a dead or stuck peer ends the job with one line."""

from __future__ import annotations


class SyncError(RuntimeError):
    """Base class: synchronization with a peer failed; the run cannot continue."""

    def __init__(self, rank: int, peer: int, step: int | None, what: str):
        where = f"step {step}" if step is not None else "no step"
        msg = f"rank {rank}: peer {peer} ({where}): {what}"
        super().__init__(" ".join(msg.split()))
        self.rank = rank
        self.peer = peer
        self.step = step
        self.what = what


class PeerFailure(SyncError):
    """The peer is gone: the transport to it failed (it crashed or closed its connection),
    or its process stopped pulsing (``liveness.PeerSilence``)."""


class SyncTimeout(SyncError):
    """A blocking wait passed its deadline (``SyncConfig.timeout_s``)."""
