"""The shared-memory data plane: ranks whose buffers every rank of the node can map run the
central data program together, each its 1/p share over every rank's buffers in place (no
message per schedule step, no copy through a socket or MPI's eager buffers).

The memory is a provider's (hcomm.memory.provider: POSIX segments or MPI windows); the plane
is the same over either. One op, for one rank:

1. Place. The rank's input, output and scratch each get a place in shared memory. A buffer
   already there (a device array, a pooled result) stays where it is; a host input is copied
   into the rank's staging place; a host output is staged and copied out at the end.
2. The places round (a control round). Every rank's places go to every rank, so each can map
   every other's buffers. A rank whose places and shapes are those of its last op sends a
   one-byte "unchanged" instead, and its peers keep the views they made then: a training loop
   pays no encoding and no mapping after its first op.
3. Growth, only if some rank found no room (MPI windows are allocated collectively). Every
   process grows its memory at the same point, agreed in that round; a second places round
   follows.
4. Every rank runs its share of the program.
5. The closing round (a control round): every share is done, so no rank reuses a buffer a peer
   still reads, and every output is complete.
6. A staged output is copied out.

The rounds are `rounds.allgather`'s (hcomm.control.rounds): each carries the deadline and the
abort of every control round.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
from topologies.errors import HcclError

from .central import run_share
from .planes import DataPlane

UNCHANGED = b"="
"""A rank's places payload when its places and shapes are those it sent in its last op."""

_KINDS = ("input", "output", "scratch")


def _empty_of(shape, dtype):
    """A buffer of no bytes needs no place: an empty array of its shape (None where there is none)."""
    return None if shape is None else np.empty(shape, dtype)


class SharedPlane(DataPlane):
    """One rank's use of the plane (see the module docstring), over `memory` (a MemoryProvider)
    and `rounds` (its group's GroupRounds, whose waits record themselves); `local` is the rank's
    index among the ranks of its process, which share `memory`. Its name is the memory's
    (`MemoryProvider.plane`: shm, window)."""

    def __init__(self, rounds, memory, rank: int, size: int, local: int = 0):
        self.rounds, self.memory, self.rank, self.size, self.local = rounds, memory, rank, size, local
        self._sent = None                   # what this rank's last places round said (its key)
        self._heard = [None] * size         # per rank: the key its last places round said
        self._views = [None] * size         # per rank: (its key, its (input, output, scratch) views)

    @property
    def name(self) -> str:
        return self.memory.plane

    def run_lost(self, seq, data, buffers, dead) -> None:
        """As `run`: a control round of the op meets `dead`'s LOST marker."""
        self.run(seq, data, buffers)

    def result(self, shape, dtype):
        """A result array peers can write in place (the provider's pool), or None."""
        return self.memory.result(self.local, shape, dtype)

    def holds(self, arr: np.ndarray) -> bool:
        """Whether `arr` lies in the plane's shared memory (an op may write it in place)."""
        return self.memory.locate(arr) is not None

    def run(self, seq: int, data, buffers, steps=None) -> None:
        """This rank's part of the op `data` on its (input, output, scratch) `buffers`.

        `steps`: a rank a fault plan crashes in this op. With 0 it takes no part at all (the
        survivors' places round meets its LOST marker, before anyone could agree to grow);
        otherwise it places its buffers and grows with the others (growth needs every process),
        runs only its share of the moves before its step `steps`, and returns (the survivors'
        closing round meets its LOST marker)."""
        if steps == 0:
            return
        try:
            self._run(seq, data, buffers, steps)
        except BaseException:
            self._sent = None               # a failed round: peers may not have the last places
            raise

    def _run(self, seq, data, buffers, steps):
        x, out = buffers[0], buffers[1]
        op, scratch = data.name, data.scratch_shape
        shapes = (x.shape, out.shape, scratch)
        arrays = (x, out, None if scratch is None else math.prod(scratch) * x.itemsize)
        short, places, staged = self._place(arrays)
        if staged[0] and places[0] is not None:
            np.copyto(self.memory.view(places[0], x.shape, x.dtype), x)
        key = (places, shapes, x.dtype.str)
        what = f"the other ranks' inputs of {op} (collective #{seq})"
        every = self._exchange(short, key, what, op)
        if any(s for s, _ in every):
            self.memory.grow(seq, [every[r][0] for r in self.memory.ranks_here(self.size)])
            if short:
                was_staged = places[0] is not None
                short, places, staged = self._place(arrays)
                if staged[0] and places[0] is not None and not was_staged:
                    np.copyto(self.memory.view(places[0], x.shape, x.dtype), x)
                key = (places, shapes, x.dtype.str)
            every = self._exchange(short, key, what + " after growing the shared memory", op)
            if any(s for s, _ in every):    # every rank sees the same rounds: all fail alike
                late = next(r for r, (s, _) in enumerate(every) if s)
                raise HcclError("E_MEMORY", f"{op} (collective #{seq}): the shared memory grew but rank {late} "
                                f"still found no room", rank=self.rank, op=op)
        views = [self._views_of(r, k) for r, (_, k) in enumerate(every)]
        run_share(data, views, self.rank, self.size, until=None if steps is None else (self.rank, steps))
        if steps is not None:
            return
        self.rounds.allgather(b"", f"the other ranks' shares of {op} (collective #{seq})", op)
        if staged[1]:
            np.copyto(out, views[self.rank][1])

    def _place(self, arrays):
        """(bytes short, a place per buffer (None: none, or no room), which were staged) for this
        rank's (input, output, scratch bytes or None)."""
        memory, short, places, staged = self.memory, 0, [], []
        for kind, arr in zip(_KINDS, arrays):
            if arr is None or (arr if isinstance(arr, int) else arr.nbytes) == 0:
                places.append(None)          # nothing (or nothing to hold: an AlltoAllV's idle expert)
                staged.append(False)
                continue
            at = None if isinstance(arr, int) else memory.locate(arr)
            if at is not None:
                places.append(at)
                staged.append(False)
                continue
            nbytes = arr if isinstance(arr, int) else arr.nbytes
            at = memory.stage(self.local, kind, nbytes)
            if at is None:
                # short of room for a staged output, ask for two: the next op's pooled result
                # then fits too (one growth, not two)
                short += memory.footprint(nbytes) * (2 if kind == "output" else 1)
            places.append(at)
            staged.append(kind != "scratch")
        return short, tuple(places), staged

    def _exchange(self, short, key, what, op) -> list:
        """Every rank's (bytes short, key) by a places round; this rank's payload is UNCHANGED
        when its key is the one it sent last (and it has room)."""
        payload = UNCHANGED if not short and key == self._sent else pickle.dumps((short, key), pickle.HIGHEST_PROTOCOL)
        raws = self.rounds.allgather(payload, what, op)
        every, changed = [], False
        for r, raw in enumerate(raws):
            if raw == UNCHANGED:
                # what rank r said last, which may be newer than the views built for it: a round
                # that found a rank short of room is said again after growing
                got = self._heard[r]
                if got is None:
                    raise HcclError("E_INTERNAL", f"{op}: rank {r} says its buffers are where they were, but this "
                                    f"rank never saw them (a communicator used after a failed op)",
                                    rank=self.rank, op=op)
                every.append((0, got))
            else:
                every.append(pickle.loads(raw))
                self._heard[r] = every[-1][1]
                changed = True
        self._sent = None if short else key
        if changed and not any(s for s, _ in every):
            live = {p for _, k in every for p in k[0] if p is not None}
            self.memory.forget(live)
        return every

    def _views_of(self, r: int, key):
        """Rank r's (input, output, scratch) arrays, mapped here; kept while its key holds."""
        got = self._views[r]
        if got is not None and got[0] == key:
            return got[1]
        places, shapes, dtype = key
        view = self.memory.view
        bufs = tuple(view(p, s, dtype) if p is not None else _empty_of(s, dtype) for p, s in zip(places, shapes))
        self._views[r] = (key, bufs)
        return bufs
