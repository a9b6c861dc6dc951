"""The exceptions of mpicoll."""

from __future__ import annotations

__all__ = ["CollectiveTimeout", "ArgumentMismatch"]


class CollectiveTimeout(TimeoutError):
    """A collective did not finish in time on this rank; ``peers`` are the ranks it waited for."""

    def __init__(self, what: str, step: int, nsteps: int, peers: list[int]):
        self.what, self.step, self.nsteps, self.peers = what, step, nsteps, list(peers)
        super().__init__(f"{what}: timed out in step {step} of {nsteps} waiting for rank(s) "
                         f"{self.peers}")


class ArgumentMismatch(ValueError):
    """Ranks called a collective with arguments that do not agree."""
