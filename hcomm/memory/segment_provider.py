"""Shared memory as POSIX segments (hcomm.memory.segments), for ranks that are one process each
(the Ray engine's actors of one node, a torchrun job on one host).

A rank owns a staging segment per kind (grown by replacement), a segment per device array (its
simulated HBM's bytes, so collectives on device arrays copy nothing in) and its pooled results
(a segment each, unlinked once dropped from the pool and by user code). Peers attach segments by
name and keep them mapped while they are in use, so their pages fault in once.
"""
from __future__ import annotations

import weakref

from . import segments
from .pool import ResultPool
from .provider import MemoryProvider

RESULT_POOL_SPARE = 8
"""Pooled result segments a rank keeps, held or free (a training loop's few)."""


class SegmentProvider(MemoryProvider):
    """One rank's segments (see the module docstring); a place is `(segment name,)`."""

    def __init__(self, session: str, rank: int):
        self.session, self.rank = session, rank
        self.owned = segments.OwnedSegments(session, rank)
        self.attached = segments.AttachedSegments()
        self.pool = ResultPool(RESULT_POOL_SPARE, self._new_result)
        self._shared = {}               # id(array) -> (segment name, weakref): arrays peers can map
        self._purge_at = 64

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

    def close(self):
        self.pool.clear()               # the segments' finalizers unlink them
        self.owned.close()
        self.attached.close()

