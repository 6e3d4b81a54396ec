"""Shared memory as POSIX segments (hcomm.memory.segments), for ranks that are one process each
(the Ray engine's actors of one node, a torchrun job on one host).

A rank owns a staging segment per kind (grown by replacement), a segment per device array (its
simulated HBM's bytes, so collectives on device arrays copy nothing in) and its pooled results
(a segment each, unlinked once dropped from the pool and by user code). Peers attach segments by
name and keep them mapped while they are in use, so their pages fault in once.

Across a host's ranks that run the per-rank executor (the socket plane, whose peers on other
hosts share nothing), `where(view)` says which of the rank's segments holds a slice it sends, so
the transport sends a peer on this host the slice's place instead of its bytes, and the peer reads
it in place (`peer_view`), as the shared plane's ranks do.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from . import segments
from .pool import ResultPool
from .provider import MemoryProvider

RESULT_POOL_SPARE = 8
"""Pooled result segments a rank keeps, held or free (a training loop's few)."""
PEER_SEGMENTS_MAPPED = 64
"""Peers' segments a rank keeps mapped for `peer_view` before it lets the least recent go."""


class SegmentProvider(MemoryProvider):
    """One rank's segments (see the module docstring); a place is `(segment name,)`."""

    plane = "shm"

    def __init__(self, session: str, rank: int):
        self.session, self.rank = session, rank
        self.owned = segments.OwnedSegments(session, rank)
        self.attached = segments.AttachedSegments()
        self.pool = ResultPool(RESULT_POOL_SPARE, self._new_result)
        self._shared = {}               # id(array) -> (segment name, weakref): arrays peers can map
        self._purge_at = 64
        self._owned_at = {}             # staging segment name -> its address here
        self._peer_lock = threading.Lock()
        self._peer_order = {}           # peer segment names mapped by peer_view, least recent first

    def _share(self, name, arr):
        if len(self._shared) >= self._purge_at:         # drop the dead ones now and then
            self._shared = {k: v for k, v in self._shared.items() if v[1]() is not None}
            self._purge_at = max(64, 2 * len(self._shared))
        self._shared[id(arr)] = (name, weakref.ref(arr))
        return arr

    def device_storage(self, ptr, shape, dtype):
        """Storage for the rank's device arrays (the Device's `storage`; `ptr`, the HBM address,
        is not needed): a segment each."""
        name, arr = segments.PrivateSegment.array(self.session, self.rank, "hbm", shape, dtype)
        return self._share(name, arr)

    def _new_result(self, nbytes, shape, dtype):
        name, arr = segments.PrivateSegment.array(self.session, self.rank, "result", shape, dtype)
        return name, self._share(name, arr)

    def result(self, local, shape, dtype):
        return self.pool.get(shape, dtype)

    def locate(self, arr):
        got = self._shared.get(id(arr))
        return (got[0],) if got is not None and got[1]() is arr else None

    def stage(self, local, kind, nbytes):
        return (self.owned.get(kind, nbytes).name,)

    def view(self, place, shape, dtype):
        return self.attached.array(place[0], shape, dtype)

    def ranks_here(self, size):
        return range(self.rank, self.rank + 1)

    def forget(self, live):
        names = {p[0] for p in live}
        self.attached.forget(keep=names | self.attached.recent)
        self.attached.recent = names

    # ---- slices sent to peers of this host by place -------------------------------------------------
    def where(self, view):
        """(segment name, byte offset) of a contiguous array lying wholly in one of this rank's
        segments (staging, pooled results, device arrays), else None."""
        if not view.flags.c_contiguous:
            return None
        addr = view.__array_interface__["data"][0]
        end = addr + view.nbytes
        for seg in self.owned.segments():
            start = self._owned_at.get(seg.name)
            if start is None:
                start = self._owned_at[seg.name] = np.frombuffer(seg.buf, np.uint8, count=1).ctypes.data
            if start <= addr and end <= start + seg.size:
                return seg.name, addr - start
        for name, ref in list(self._shared.values()):
            arr = ref()
            if arr is not None:
                start = arr.__array_interface__["data"][0]
                if start <= addr and end <= start + arr.nbytes:
                    return name, addr - start
        return None

    def peer_view(self, name, offset, shape, dtype):
        """A peer's slice, read in place: `shape` of `dtype` at `offset` of its segment `name`
        (mapped once, kept while recent). From the transport's reader threads."""
        with self._peer_lock:
            self._peer_order.pop(name, None)
            self._peer_order[name] = True
            if len(self._peer_order) > PEER_SEGMENTS_MAPPED:
                old = next(iter(self._peer_order))
                del self._peer_order[old]
                self.attached.forget(keep=set(self._peer_order) | self.attached.recent)
            return self.attached.array(name, shape, dtype, offset)

    def close(self):
        self.pool.clear()               # the segments' finalizers unlink them
        self.owned.close()
        self.attached.close()

