"""The same-host data plane of ranks that are processes (Ray actors of one node, a torchrun job on
one host): every rank's buffers in shared memory, so that each rank can run its share of the op's
data program on all ranks' buffers in place (no pickling, no copy through another process).

`SharedPlane` is the Group side (mixed into a PeerGroup): ranks name their segments in an
allgather of the control plane, every rank runs its 1/p share of the central data program on all
ranks' buffers, and an allgather closes the op (nobody reuses a segment a peer still reads).

A rank's device arrays and pooled results already live in segments of their own and are shared
as they are; a host input is copied into the rank's CCL input segment. Results come from a pool
of segments, a segment being reused only once user code has dropped its array (or any view of
it), so peers write results in place and nobody copies them out; a few free ones are kept, the
least recently used beyond that unlinked.
"""
from __future__ import annotations

import math
import pickle
import sys
import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hcomm import shm

from hcomm.exec import run_share


@dataclass(frozen=True)
class SharedBuffers:
    input: tuple                        # (segment name, shape)
    output: tuple
    scratch: Optional[tuple]
    dtype: str

    def encode(self) -> bytes:
        return pickle.dumps((self.input, self.output, self.scratch, self.dtype), protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(raw: bytes) -> "SharedBuffers":
        return SharedBuffers(*pickle.loads(raw))


class SharedPlane:
    """The shared-memory data plane of a PeerGroup subclass that sets `self.shared` (a SharedArea)
    and routes `_execute_data` to `_shared_shares` when its ranks share a host."""

    def _shared_shares(self, rank, seq, data, buffers):
        bufs, descs, copy_back = self._shared_buffers(rank, seq, data, buffers)
        run_share(data, bufs, rank, self.size)
        self._allgather(b"", f"the other ranks' shares of {data.name} (collective #{seq})", data.name)
        if copy_back is not None:
            np.copyto(buffers.output, copy_back)
        self.shared.forget_except(descs)

    def _shared_buffers(self, rank, seq, data, buffers):
        """Every rank's buffers of the op, mapped here (ranks name their segments in an allgather);
        the segment names; this rank's output view to copy back, or None."""
        op = data.name
        desc, copy_back = self.shared.describe(buffers, data.scratch_shape)
        descs = [type(desc).decode(r) for r in
                 self._allgather(desc.encode(), f"{op} (collective #{seq}) buffers", op)]
        return [self.shared.attach(d) for d in descs], descs, copy_back

    def _shared_result(self, shape, dtype):
        """A result array peers can write in place (a pooled segment), or a plain one for an op
        small enough to travel eagerly."""
        dtype = np.dtype(dtype)
        if math.prod(shape) * dtype.itemsize <= self.inline_bytes:
            return np.empty(shape, dtype=dtype)
        return self.shared.result_array(shape, dtype)


RESULT_POOL_SPARE = 8
"""Free pooled result segments a rank keeps for reuse, over all shapes (a training loop's few)."""


class SharedArea:
    """One rank's shared segments: owned (CCL input/output/scratch), pooled results, peers' attached."""

    def __init__(self, session: str, rank: int):
        self.session, self.rank = session, rank
        self.owned = shm.OwnedSegments(session, rank)
        self.attached = shm.AttachedSegments()
        self.result_pool = {}           # (shape, dtype) -> [(segment name, array)]
        self._shared = {}               # id(array) -> (segment name, weakref): arrays peers can map

    def share(self, name, arr):
        self._shared[id(arr)] = (name, weakref.ref(arr))
        return arr

    def device_storage(self, ptr, shape, dtype):
        """Storage for the rank's device arrays (Device.storage; `ptr`, the HBM address, is not
        needed): a segment each, so collectives on them are zero-copy."""
        name, arr = shm.PrivateSegment.array(self.session, self.rank, "hbm", shape, dtype)
        return self.share(name, arr)

    def result_array(self, shape, dtype):
        dtype = np.dtype(dtype)
        key = (tuple(shape), dtype.str)
        pool = self.result_pool.pop(key, [])
        self.result_pool[key] = pool               # the most recently used shape last
        for entry in pool:
            if sys.getrefcount(entry[1]) <= 2:     # only the pool's tuple and getrefcount's argument
                return entry[1]
        self._trim()
        name, arr = shm.PrivateSegment.array(self.session, self.rank, "result", shape, dtype)
        pool.append((name, arr))
        self.result_pool[key] = pool               # _trim may have dropped the key while its pool was empty
        return self.share(name, arr)

    def _trim(self):
        """Drop free pooled results past RESULT_POOL_SPARE, least recently used shapes first (their
        finalizers unlink the segments): ops of ever new shapes must not grow /dev/shm without end."""
        spare = 0
        for key in reversed(list(self.result_pool)):
            kept = []
            for entry in self.result_pool[key]:
                if sys.getrefcount(entry[1]) > 2:  # user code holds it
                    kept.append(entry)
                elif spare < RESULT_POOL_SPARE:
                    spare += 1
                    kept.append(entry)
            if kept:
                self.result_pool[key] = kept
            else:
                del self.result_pool[key]
        self._shared = {k: v for k, v in self._shared.items() if v[1]() is not None}

    def _segment_of(self, arr):
        got = self._shared.get(id(arr))
        return got[0] if got is not None and got[1]() is arr else None

    def describe(self, buffers, scratch_shape):
        """(SharedBuffers naming this rank's segments, the output view to copy back or None)."""
        x, out = buffers.input, buffers.output
        in_name = self._segment_of(x)
        if in_name is None:                     # a host array: register it by copying into the CCL input
            in_name, xin = self.owned.array("input", x.shape, x.dtype)
            np.copyto(xin, x)
        out_name, copy_back = self._segment_of(out), None
        if out_name is None:
            out_name, copy_back = self.owned.array("output", out.shape, out.dtype)
        sc = None
        if scratch_shape is not None:
            sc_name, _ = self.owned.array("scratch", scratch_shape, x.dtype)
            sc = (sc_name, scratch_shape)
        return SharedBuffers((in_name, x.shape), (out_name, out.shape), sc, x.dtype.str), copy_back

    def attach(self, desc: SharedBuffers):
        from .base import RankBuffers
        a = self.attached
        return RankBuffers(a.array(desc.input[0], desc.input[1], desc.dtype),
                           a.array(desc.output[0], desc.output[1], desc.dtype),
                           None if desc.scratch is None else a.array(desc.scratch[0], desc.scratch[1], desc.dtype))

    def forget_except(self, descs):
        """Drop mappings of segments that are gone (replaced or freed arrays); the persistent ones
        stay mapped, so their pages fault in once."""
        live = {n for d in descs for n in (d.input[0], d.output[0], d.scratch[0] if d.scratch else None) if n}
        self.attached.forget(keep=live | self.attached.recent)
        self.attached.recent = live

    def close(self):
        self.result_pool.clear()        # their finalizers unlink the segments
        self.owned.close()
        self.attached.close()
