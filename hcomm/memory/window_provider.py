"""Shared memory as MPI-3 windows (hcomm.memory.windows), for the MPI processes of one node and
the ranks each runs (`k` per process, threads).

- Staging: a place per (rank, kind) in the process's window regions, reused while big enough.
- Results: a pool per rank (hcomm.memory.pool) of slots in the windows, so peers write a rank's
  output where user code then reads it. A free slot at least as large is reused for another
  shape: window memory is never freed piece by piece. A large host output is staged in a pooled
  slot, which the next op then hands out as its result.
- Device arrays: a rank's simulated HBM is its region of the HBM window, reserved at job start
  and committed only where written (`hbm_share` caps it), a device array's bytes at its own HBM
  address there (`device_storage`); past the region, host memory.
- Growth: when a rank finds no room, every process adds a window in the same control round
  (MPI_Win_allocate_shared is collective), the first of the process's ranks for all of them.

A place is `(window, process, offset)`; the HBM window's index is `windows.HBM`.
"""
from __future__ import annotations

import math
import os
import threading
import weakref

import numpy as np

from topologies.errors import HcclError

from .pool import ResultPool
from .provider import MemoryProvider
from .windows import HBM, NodeWindows, aligned

RESULT_POOL_BYTES = 1 << 20
"""Results at least this large live in the windows (smaller ones are staged and copied out:
their copy costs less than the pages a pooled slot pins)."""
RESULT_POOL_SPARE = 4
"""Pooled window results per rank, held or free; past that results are host arrays."""


def hbm_share(hbm_bytes: int, k: int, node_procs: int) -> int:
    """Bytes of each rank's HBM region in the HBM window: its whole HBM, capped at an equal share
    of half the node's free shared memory (/dev/shm). The reservation is only address space, but
    Open MPI refuses a shared window larger than that file system can back (measured: 4 processes
    x 4 GiB map at once, x 8 GiB abort the job on a 24 GiB /dev/shm; MPICH does not check). A
    device array past its rank's region lives in host memory and is staged per op, as a host array."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return hbm_bytes
    share = st.f_bavail * st.f_frsize // (2 * max(1, node_procs) * k)
    return max(4096, min(hbm_bytes, share // 4096 * 4096))


class WindowProvider(MemoryProvider):
    """One MPI process's windows (see the module docstring), over the job's `hub`
    (hcomm.transports.mpi: its communicator, the lock every MPI call of the process takes, the
    process's `k` ranks); `hbm_bytes` is each rank's HBM capacity. Collective: every process
    constructs it together."""

    plane = "window"

    def __init__(self, hub, hbm_bytes: int):
        self.hub, self.base, k = hub, hub.proc * hub.k, hub.k
        self.k = k
        self.windows = NodeWindows(hub.comm, hub.lock)
        self.hbm_bytes = hbm_share(hbm_bytes, k, self.windows.node.Get_size())
        try:
            self.windows.reserve_hbm(k * self.hbm_bytes)
        except HcclError:
            self.windows.close()
            raise
        self._lock = threading.Lock()
        self._hbm_top = [0] * k         # per local rank: the HBM bytes below it were written before
        self._hbm_arrays = []           # weakrefs to the device arrays' storage handed out
        self._hbm_closed = False
        self._staging = {}              # (local rank, kind) -> (window, offset, bytes)
        self._pools = [ResultPool(RESULT_POOL_SPARE, self._new_result, self._refit) for _ in range(k)]
        self._grown = -1                # the last op this process grew the windows for

    # ---- device memory -------------------------------------------------------------------------
    def device_storage(self, rank: int):
        """The Device's `storage` for `rank`: a device array at HBM address `ptr` is the rank's
        HBM region at `ptr`, zero-filled. Fresh pages are zero already (and are not touched: the
        reservation stays uncommitted); only bytes an earlier array may have written (below the
        rank's high-water mark) are zeroed. Once the job is closed, device arrays are host memory."""
        local = rank - self.base
        start = local * self.hbm_bytes

        def storage(ptr, shape, dtype):
            dtype = np.dtype(dtype)
            nbytes = math.prod(shape) * dtype.itemsize
            if self._hbm_closed or ptr + nbytes > self.hbm_bytes:   # past the window: host memory
                return np.zeros(shape, dtype=dtype)
            arr = self.windows.array(HBM, self.windows.me, start + ptr, shape, dtype)
            top = self._hbm_top[local]
            if ptr < top and nbytes:
                arr.reshape(-1).view(np.uint8)[:min(nbytes, top - ptr)] = 0
            self._hbm_top[local] = max(top, ptr + nbytes)
            with self._lock:
                if len(self._hbm_arrays) >= 64:       # drop the dead ones now and then
                    self._hbm_arrays = [r for r in self._hbm_arrays if r() is not None]
                self._hbm_arrays.append(weakref.ref(arr))
            return arr
        return storage

    def hbm_arrays(self) -> list:
        """The device arrays' storage arrays handed out and still alive."""
        return [a for a in (r() for r in self._hbm_arrays) if a is not None]

    # ---- results -------------------------------------------------------------------------------
    def _new_result(self, nbytes, shape, dtype):
        got = self.windows.alloc(nbytes)
        if got is None:
            return None                 # no room: the op stages its output, asking for room for both
        return got, self.windows.array(got[0], self.windows.me, got[1], shape, dtype)

    def _refit(self, handle, shape, dtype):
        return self.windows.array(handle[0], self.windows.me, handle[1], shape, dtype)

    def result(self, local, shape, dtype):
        if math.prod(shape) * np.dtype(dtype).itemsize < RESULT_POOL_BYTES:
            return None
        with self._lock:
            return self._pools[local].get(shape, dtype)

    # ---- the plane's places ----------------------------------------------------------------------
    def locate(self, arr):
        return self.windows.locate(arr)

    def stage(self, local, kind, nbytes):
        with self._lock:
            me, pool = self.windows.me, self._pools[local]
            if kind == "output" and nbytes >= RESULT_POOL_BYTES and not pool.all_held():
                # a host output is staged in a pooled slot (a new one while the pool has room), so
                # the next op's result is pooled there: a loop that holds its last result while
                # the next is made then has two
                got = pool.slot(nbytes)
                return None if got is None else (got[0], me, got[1])
            got = self._staging.get((local, kind))
            if got is not None and got[2] >= nbytes:
                return got[0], me, got[1]
            place = self.windows.alloc(nbytes)
            if place is None:
                return None
            self._staging[(local, kind)] = (place[0], place[1], aligned(nbytes))
            return place[0], me, place[1]

    def view(self, place, shape, dtype):
        return self.windows.array(place[0], place[1], place[2], shape, dtype)

    def footprint(self, nbytes):
        return aligned(nbytes)

    def ranks_here(self, size):
        return range(self.base, self.base + self.k)

    def grow(self, seq, shorts):
        with self._lock:                # the first of the process's ranks to get here grows for all
            if self._grown != seq:
                self._grown = seq
                self.windows.grow(sum(shorts))

    # ---- the end ---------------------------------------------------------------------------------
    def close(self, deadline, hbm_held: bool) -> None:
        """Free the windows (collective, by `deadline`). Windows user code still holds results in,
        or device arrays' data (`hbm_held`, on any process), stay mapped until MPI_Finalize.
        Device arrays made after this are host memory."""
        held = {h[0] for pool in self._pools for h in pool.handles(held_only=True)}
        if hbm_held:
            held.add(HBM)
        self._hbm_closed = True
        self._hbm_arrays = []
        for pool in self._pools:
            pool.clear()
        self._staging.clear()
        node, MPI, hub = self.windows.node, self.windows.MPI, self.hub

        def agree(flags):               # the element-wise max of every process's flags
            every = np.empty_like(flags)
            with hub.lock:
                req = node.Iallreduce([flags, MPI.UINT8_T], [every, MPI.UINT8_T], op=MPI.MAX)
            hub.wait_closing(req, deadline, "the shared windows' closing exchange")
            return every

        self.windows.close(held, agree)
