"""The MPI engine's "window" data plane: every rank's buffers of an op in MPI-3 shared-memory
windows (hcomm.mpi_window), so that each rank runs its 1/p share of the op's data program on all
ranks' buffers in place (the central data program, hcomm.exec.run_share), as the Ray engine's
shm plane does: no message per schedule step, no copy through a socket or MPI's eager buffers.

A rank's device arrays live in the windows as well: its simulated HBM is its region of the HBM
window (hcomm.mpi_window's `reserve_hbm`, reserved at job start and committed only where
written: per rank its HBM capacity, capped by `hbm_share` at a share of the node's free shared
memory, which Open MPI checks), a device array's bytes at its own HBM address there
(`device_storage`, the rank's Device.storage; past the region, host memory). An op on device
arrays so copies nothing in, and `out=` a device array is written in place, as on the Ray
engine's shm plane.

Results live in the windows too (a pool per rank, `result_array`, as the Ray plane's result
segments): peers write a rank's output where user code then reads it, so nothing is copied out;
an input that already lies in a window (an earlier result, fed back) is read where it is, a host
input is copied into the rank's staging area. A pooled result is reused only once user code has
dropped it (and every view of it).

Per op larger than the eager size: each rank places its input, output and scratch (its own
region, no talking; buffers already in a window stay where they are) and copies a host input in;
a control round carries every rank's places (so every rank can map every other's buffers) and
whether it ran out of room; if any did, every process grows the arena by one window, agreed in
that round (so MPI_Win_allocate_shared, which has no deadline of its own, is entered by every
process together), and a second round carries the new places; every rank runs its share; a
control round (every share is done); a staged output is copied out. Three control rounds per op, the rendezvous included; the rounds carry the
deadline (HCCL_EXEC_TIMEOUT) and abort as every control round does.
"""
from __future__ import annotations

import math
import os
import struct
import sys
import threading
import weakref

import numpy as np

from hcomm.mpi_window import HBM, NodeWindows
from topologies.errors import HcclError

from hcomm.exec import run_share

from .base import RankBuffers

RESULT_POOL_BYTES = 1 << 20
"""Results at least this large live in the windows (smaller ones are staged and copied out:
their copy costs less than the pages a pooled slot pins)."""
RESULT_POOL_SPARE = 4
"""Pooled window results per rank; past that (user code holds them all) results are host arrays."""

_PLACE = struct.Struct("<q" + "iiq" * 3)       # bytes short; (window, process, offset) of input, output, scratch
_NOWHERE = (-1, -1, -1)
_ALIGN = 4096


def _aligned(n: int) -> int:
    return -(-int(n) // _ALIGN) * _ALIGN


def _free(entry) -> bool:
    """A pooled result user code no longer holds: only the pool's entry and getrefcount's argument
    refer to it (a view of it refers to it too, as its base)."""
    return sys.getrefcount(entry[3]) <= 2


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
    return max(_ALIGN, min(hbm_bytes, share // _ALIGN * _ALIGN))


class WindowPlane:
    """One process's windows; `execute` is called by each of its ranks for each larger op."""

    def __init__(self, hub, topo, config):
        self.hub, self.topo, self.config, self.k = hub, topo, config, hub.k
        self.base = hub.proc * hub.k
        self.windows = NodeWindows(hub.comm, hub.lock)
        # every rank's HBM, capped (hbm_share); every process constructs the job together
        self.hbm_bytes = hbm_share(topo.device_model.hbm_bytes, self.k, self.windows.node.Get_size())
        try:
            self.windows.reserve_hbm(self.k * self.hbm_bytes)
        except HcclError:
            self.windows.close()
            raise
        self._hbm_top = [0] * self.k    # per local rank: the HBM bytes below it were written before
        self._hbm_arrays = []           # weakrefs to the device arrays' storage handed out
        self._hbm_closed = False
        self._lock = threading.Lock()
        self._staging = {}              # (local rank, kind) -> (window, offset, bytes)
        self._results = {}              # local rank -> [[window, offset, bytes, array]]
        self._grown = -1                # the last collective this process grew the arena for

    # ---- device memory -------------------------------------------------------------------------
    def device_storage(self, rank: int):
        """Device.storage for `rank`: a device array at HBM address `ptr` is the rank's HBM region
        at `ptr`, zero-filled. Fresh pages are zero already (and are not touched: the reservation
        stays uncommitted); only bytes some earlier array may have written (below the rank's
        high-water mark) are zeroed. Once the job is closed, device arrays are host memory."""
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

    def _hbm_held(self, runtimes) -> bool:
        """Whether user code may still reach a device array's bytes in the HBM window: a storage
        array (or a view of it) referred to by more than its DeviceArray; a live DeviceArray with
        data referred to by more than its device; or such a device reachable by more than its own
        bookkeeping (a communicator, a runtime, a stream, an event user code holds). Counts are
        sys.getrefcount's, less the references this function makes itself."""
        live = [a for a in (r() for r in self._hbm_arrays) if a is not None]
        if not live:
            return False
        ids = {id(a) for a in live}
        owners = {}                      # id(storage) -> its live DeviceArray
        for rt in runtimes:
            dev = rt.device
            if dev is None:
                continue
            for da in dev._arrays.values():
                if da._data is not None and id(da._data) in ids:
                    owners[id(da._data)] = da
        for a in live:                   # refs: `live`, the loop variable, the argument, its DeviceArray
            if sys.getrefcount(a) > 3 + (id(a) in owners):
                return True
        if not owners:
            return False
        for da in owners.values():       # refs: the device's dict, `owners`, the loop variable, the argument
            if sys.getrefcount(da) > 4:
                return True
        for rt in runtimes:              # refs: the job's dict of runtimes, `runtimes`, the loop variable, the argument
            dev = rt.device
            if sys.getrefcount(rt) > 4:
                return True
            if dev is None or not any(da.device is dev for da in owners.values()):
                continue
            for st in dev._streams:   # refs: the device's list (and default_stream), the loop variable, the argument
                if sys.getrefcount(st) > 3 + (st is dev.default_stream):
                    return True
            # refs: the runtime, its streams, its arrays, the local variable, the argument
            if sys.getrefcount(dev) > 3 + len(dev._streams) + len(dev._arrays):
                return True
        return False

    # ---- results ---------------------------------------------------------------------------------
    def result_array(self, rank: int, shape, dtype):
        """A pooled result in this process's window region, or None (the caller makes a host
        array; the op stages its output in a new pooled slot, growing the arena if need be, and
        copies it out: the next op's result is then pooled)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < RESULT_POOL_BYTES:
            return None
        local, shape = rank - self.base, tuple(shape)
        with self._lock:
            pool = self._results.setdefault(local, [])
            fit = None
            for entry in pool:
                if _free(entry):
                    if entry[3].shape == shape and entry[3].dtype == dtype:
                        return entry[3]
                    if fit is None and entry[2] >= nbytes:
                        fit = entry
            if fit is not None:
                fit[3] = self.windows.array(fit[0], self.windows.me, fit[1], shape, dtype)
                return fit[3]
            if len(pool) >= RESULT_POOL_SPARE:
                return None
            got = self.windows.alloc(nbytes)
            if got is None:
                return None                # no room: the op stages its output in a new pooled slot
            pool.append([got[0], got[1], _aligned(nbytes), self.windows.array(got[0], self.windows.me, got[1],
                                                                               shape, dtype)])
            return pool[-1][3]

    def held_windows(self) -> set:
        return {e[0] for pool in self._results.values() for e in pool if not _free(e)}

    # ---- one op ------------------------------------------------------------------------------------
    def _slot(self, local, kind, nbytes):
        """This rank's staging place for `kind` (reused while big enough), or None (no room)."""
        got = self._staging.get((local, kind))
        if got is not None and got[2] >= nbytes:
            return got[:2]
        place = self.windows.alloc(nbytes)
        if place is not None:
            self._staging[(local, kind)] = (place[0], place[1], _aligned(nbytes))
        return place

    def _output_slot(self, local, out):
        """Where a host output is staged: a free pooled result's slot (a new one while the pool
        has room, so the next op's result is pooled), or None (no room)."""
        if out.nbytes < RESULT_POOL_BYTES:
            return self._slot(local, "output", out.nbytes)
        pool = self._results.setdefault(local, [])
        free = [entry for entry in pool if _free(entry)]
        for entry in free:
            if entry[2] >= out.nbytes:
                return entry[:2]
        if len(pool) >= RESULT_POOL_SPARE:
            if not free:                                   # user code holds every one
                return self._slot(local, "output", out.nbytes)
            pool.remove(min(free, key=lambda e: e[2]))     # too small for the sizes now in use
        del free
        got = self.windows.alloc(out.nbytes)
        if got is not None:
            pool.append([got[0], got[1], _aligned(out.nbytes),
                         self.windows.array(got[0], self.windows.me, got[1], out.shape, out.dtype)])
        return got

    def _place(self, local, arrays):
        """(bytes short, every buffer's (window, process, offset), which were staged) for this
        rank's (input, output, scratch bytes or None): arrays already in a window stay where they
        are. Short of room for a staged output, it asks for two (a loop holding its last result
        while the next one is made needs a second pooled slot: one growth, not two)."""
        short, places, staged = 0, [], []
        me = self.windows.me
        for kind, arr in zip(("input", "output", "scratch"), arrays):
            if arr is None:
                places.append(_NOWHERE)
                staged.append(False)
                continue
            at = None if isinstance(arr, int) else self.windows.locate(arr)
            if at is not None:
                places.append(at)
                staged.append(False)
                continue
            nbytes = arr if isinstance(arr, int) else arr.nbytes
            slot = self._output_slot(local, arr) if kind == "output" else self._slot(local, kind, nbytes)
            if slot is None:
                short += _aligned(nbytes) * (2 if kind == "output" and nbytes >= RESULT_POOL_BYTES else 1)
                places.append(_NOWHERE)
            else:
                places.append((slot[0], me, slot[1]))
            staged.append(kind != "scratch")
        return short, places, staged

    def execute(self, group, rank, seq, data, buffers, steps=None) -> None:
        """`rank`'s part of the op; with `steps`, a rank the fault plan crashes in it: with 0 it
        takes no part at all (the survivors' places round meets its LOST marker, before anyone
        could agree to grow the windows); otherwise it places its buffers and grows with the
        others (MPI_Win_allocate_shared needs every process), runs only its share of the program
        before its step `steps`, and the survivors' shares round meets its LOST marker."""
        if steps == 0:
            return
        x, out = buffers.input, buffers.output
        p, local = self.topo.num_ranks, rank - self.base
        scratch, op = data.scratch_shape, data.name
        arrays = (x, out, None if scratch is None else math.prod(scratch) * x.itemsize)
        with self._lock:
            short, places, staged = self._place(local, arrays)
        if staged[0] and places[0] != _NOWHERE:
            np.copyto(self._view(places[0], x.shape, x.dtype), x)
        raws = group._allgather(_PLACE.pack(short, *places[0], *places[1], *places[2]),
                                f"the other ranks' inputs of {op} (collective #{seq})", op)
        every = [_PLACE.unpack(r) for r in raws]
        if any(e[0] for e in every):
            with self._lock:           # the first of the process's ranks to get here grows it for all
                if self._grown != seq:
                    self._grown = seq
                    self.windows.grow(sum(every[r][0] for r in range(self.base, self.base + self.k)))
                if short:
                    short, places, staged = self._place(local, arrays)
            if staged[0] and places[0] != _NOWHERE and every[rank][1:4] == _NOWHERE:
                np.copyto(self._view(places[0], x.shape, x.dtype), x)
            raws = group._allgather(_PLACE.pack(short, *places[0], *places[1], *places[2]),
                                    f"the other ranks' inputs of {op} (collective #{seq}, after growing the "
                                    f"shared windows)", op)
            every = [_PLACE.unpack(r) for r in raws]
            if any(e[0] for e in every):     # every rank sees the same rounds: all fail alike
                raise HcclError("E_MEMORY", f"{op} (collective #{seq}): the shared windows grew but rank "
                                f"{next(r for r, e in enumerate(every) if e[0])} still found no room", rank=rank, op=op)
        views = [RankBuffers(self._view(e[1:4], x.shape, x.dtype), self._view(e[4:7], out.shape, out.dtype),
                             None if scratch is None else self._view(e[7:10], scratch, x.dtype)) for e in every]
        run_share(data, views, rank, p, until=None if steps is None else (rank, steps))
        if steps is not None:
            return
        group._allgather(b"", f"the other ranks' shares of {op} (collective #{seq})", op)
        if staged[1]:
            np.copyto(out, views[rank].output)

    def _view(self, place, shape, dtype):
        g, q, off = place
        return self.windows.array(g, q, off, shape, dtype)

    def close(self, deadline=None, runtimes=()) -> None:
        """Free the windows (collective); windows user code still holds results in, or device
        arrays' data (on any process: `runtimes`, this process's ranks' runtimes), stay mapped
        until MPI_Finalize. Device arrays made after this are host memory."""
        held = self.held_windows()
        if self._hbm_held(runtimes):
            held.add(HBM)
        self._hbm_closed = True
        self._hbm_arrays = []
        self._results.clear()
        self._staging.clear()
        node, MPI, hub = self.windows.node, self.windows.MPI, self.hub

        def agree(flags):
            every = np.empty_like(flags)
            with hub.lock:
                req = node.Iallreduce([flags, MPI.UINT8_T], [every, MPI.UINT8_T], op=MPI.MAX)
            hub._wait_closing(req, deadline, "the shared windows' closing exchange")
            return every

        self.windows.close(held, agree)
