"""The DataPlane every engine's group holds exactly one of (the shared plane is in shared_plane.py): how a rank moves the data of an op
(a DataProgram) whose input did not travel with its call. Every member is declared here, so a
group never asks which plane it holds.

Three implementations:

| plane            | ranks                                      | how                                                   | names            |
|------------------|--------------------------------------------|-------------------------------------------------------|------------------|
| `SharedPlane`    | processes that map each other's memory      | each runs its share of the central program in place   | shm, window      |
| `HostedPlane`    | some peers on this host, others across      | own schedule; host peers' slices read in place        | socket           |
| `PerRankPlane`   | processes that share no memory              | own schedule over the transport                       | socket, object, p2p |

A plane's `name` is what `comm.data_plane` reports and what the engine registry lists: the shared
plane's is its memory provider's (`shm`: POSIX segments, `window`: MPI windows), the others' their
transport's (`Transport.plane`).
"""
from __future__ import annotations

import abc
import contextlib
from typing import Optional

import numpy as np

from ..memory.pool import ResultPool
from .per_rank import run_rank, run_rank_in

HOST_RESULT_SPARE = 4              # pooled host results per rank (a plane that keeps no shared memory)
_NO_WATCH = contextlib.nullcontext()


def _unwatched(what: str):
    return _NO_WATCH


class DataPlane(abc.ABC):
    """One rank's data plane. `name`: the engine registry's name for it."""

    name: str

    @abc.abstractmethod
    def run(self, seq: int, data, buffers, steps: Optional[int] = None) -> None:
        """Move this rank's part of op #seq (`data`, a DataProgram) on its RankBuffers; returns
        when its output is complete. `steps`: a rank a fault plan crashes in this op moves only
        the data of its first `steps` steps (those its peers wait for) and returns."""

    @abc.abstractmethod
    def run_lost(self, seq: int, data, buffers, dead: int) -> None:
        """This rank's part of an op in which rank `dead` dies: as `run`, until the plane finds
        `dead` gone (its LOST marker in a round, or every wait failing once it is lost)."""

    def result(self, shape, dtype) -> Optional[np.ndarray]:
        """An array for a large result that the plane keeps (peers may write it in place, or it
        is reused once user code drops it), or None: the caller makes a plain one."""
        return None

    def holds(self, arr: np.ndarray) -> bool:
        """Whether `arr` lies where peers can write it in place (an op's `out=`)."""
        return False


class PerRankPlane(DataPlane):
    """This rank's own schedule over `transport` (hcomm.exec.per_rank); `waiting(what)`, a
    context recording each wait for a stall watch (GroupRounds.waiting); results from a small
    pool of host arrays, reused once user code has dropped them."""

    def __init__(self, transport, rank: int, waiting=_unwatched):
        self.transport, self.rank, self.waiting = transport, rank, waiting
        self.name = transport.plane
        self._results = None

    def run(self, seq, data, buffers, steps=None):
        if steps == 0:
            return                      # a rank dying on entry sends nothing
        with self.waiting(f"{data.name} (collective #{seq}) data"):
            run_rank(data, self.rank, buffers, self.transport, steps=steps)

    def run_lost(self, seq, data, buffers, dead):
        self.transport.watch_peer(dead)
        try:
            self.run(seq, data, buffers)
        finally:
            self.transport.unwatch_peer(dead)

    def result(self, shape, dtype):
        if self._results is None:
            self._results = ResultPool(HOST_RESULT_SPARE, lambda n, sh, dt: (None, np.empty(sh, dtype=dt)))
        return self._results.get(shape, dtype)


class HostedPlane(PerRankPlane):
    """This rank's own schedule with its buffers in `memory`'s segments (a SegmentProvider), its
    host peers reading its slices in place (hcomm.exec.hosted, `transport.share_host`); results
    from the segments' pool, which those peers then read in place."""

    def __init__(self, transport, rank: int, memory, waiting=_unwatched):
        super().__init__(transport, rank, waiting)
        self.memory = memory

    def run(self, seq, data, buffers, steps=None):
        # a rank dying on entry still takes part: its host peers wait on its step words
        with self.waiting(f"{data.name} (collective #{seq}) data"):
            run_rank_in(self.memory, data, self.rank, buffers, self.transport, seq, steps=steps)

    def result(self, shape, dtype):
        return self.memory.result(0, shape, dtype)
