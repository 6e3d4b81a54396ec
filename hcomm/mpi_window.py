"""MPI-3 shared-memory windows among the processes of one node (`MPI.Win.Allocate_shared` on
`comm.Split_type(MPI.COMM_TYPE_SHARED)`): one window, a region per process, every process's
region mapped in every process, so ranks of one node can read and write each other's buffers in
place (the MPI engine's "window" data plane runs the central data program on them).

The window grows, never shrinks: `ensure(nbytes)` is collective (every process calls it with the
same size, which every rank derives from the same plan) and reallocates only when a larger op
comes, doubling, so a loop of ops of one size allocates once. MPI owns the memory: `close`
frees the window, and nothing is left in /dev/shm.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import HcclError

_ALIGN = 4096


class NodeWindows:
    def __init__(self, comm, lock):
        from mpi4py import MPI
        self.MPI, self.lock = MPI, lock
        with lock:
            self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        n, world = self.node.Get_size(), comm.Get_size()
        if n != world:
            with lock:
                self.node.Free()
            raise HcclError("E_NOT_SUPPORT", f"data plane 'window' needs every MPI process on one node: {n} of the "
                            f"job's {world} processes share this one (use data_plane 'p2p')")
        self.win, self.capacity, self.regions = None, 0, []

    def ensure(self, nbytes: int) -> None:
        """Make every process's region at least `nbytes` (collective when it grows)."""
        if nbytes <= self.capacity:
            return
        cap = max(nbytes, 2 * self.capacity)
        cap = -(-cap // _ALIGN) * _ALIGN
        with self.lock:
            self.regions = []
            if self.win is not None:
                self.win.Free()
            self.win = self.MPI.Win.Allocate_shared(cap, 1, comm=self.node)
            for q in range(self.node.Get_size()):
                buf, _ = self.win.Shared_query(q)
                self.regions.append(np.frombuffer(buf, dtype=np.uint8, count=cap))
        self.capacity = cap

    def array(self, proc: int, offset: int, shape, dtype) -> np.ndarray:
        """A view of process `proc`'s region at `offset` (bytes) as an array."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self.regions[proc][offset:offset + n].view(dtype).reshape(shape)

    def close(self) -> None:
        with self.lock:
            self.regions = []
            if self.win is not None:
                self.win.Free()
                self.win = None
            self.node.Free()
