"""The interface the shared-memory data plane (hcomm.exec.shared_plane) uses over one process's
shared memory, whichever kind it is (`SegmentProvider`: POSIX segments; `WindowProvider`: MPI-3
windows).

A place is a small tuple naming bytes every process of the node can map (a segment's name; a
window, process and offset). Places travel in the plane's control rounds.
"""
from __future__ import annotations

from abc import ABC, abstractmethod


class MemoryProvider(ABC):
    """One process's shared memory, for the plane's ranks there (`local`: a rank's index among
    the process's ranks). Every method but `grow` is local to the process. The abstract methods
    are what each kind of memory must say for itself; the others have a default."""

    plane: str
    """The name of the shared plane over this memory (comm.data_plane, the engine registry's)."""

    @abstractmethod
    def locate(self, arr):
        """The place of an array that already lies in shared memory (a device array, a pooled
        result), or None."""

    @abstractmethod
    def stage(self, local: int, kind: str, nbytes: int):
        """The place of `local`'s staging area for `kind` ("input", "output", "scratch"), at
        least `nbytes` (reused while big enough), or None when there is no room."""

    @abstractmethod
    def view(self, place, shape, dtype):
        """The array of `shape` and `dtype` at `place` (any process's), mapped here."""

    @abstractmethod
    def result(self, local: int, shape, dtype):
        """A pooled result array in shared memory (hcomm.memory.pool), or None."""

    def footprint(self, nbytes: int) -> int:
        """The bytes `nbytes` of staging take, as a growth must count them."""
        return nbytes

    def grow(self, seq: int, shorts: list) -> None:
        """Collective among the node's processes: more room, at least the sum of `shorts` (the
        bytes each of this process's ranks lacked in op `seq`). Called by each of the process's
        ranks; the first to call it for `seq` grows for all. Memory that never runs short
        (segments) never needs it."""

    @abstractmethod
    def ranks_here(self, size: int) -> range:
        """The ranks (of `size`) whose memory this process's provider holds."""

    def forget(self, live: set) -> None:
        """Drop mappings of peers' memory not among the `live` places (replaced or freed buffers)."""
