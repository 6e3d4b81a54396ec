"""MPI-3 shared-memory windows among the processes of one node (`MPI.Win.Allocate_shared` on
`comm.Split_type(MPI.COMM_TYPE_SHARED)`): an arena of windows, a region per process in each,
every process's regions mapped in every process, so ranks of one node can read and write each
other's buffers in place (the MPI engine's "window" data plane runs the central data program on
them, and hands out results that live there).

A process allocates from its own regions without talking to anyone (`alloc`: a bump pointer per
window, never freed one by one: callers keep what they allocate and reuse it). When nothing
fits, the arena grows by a new window (`grow`, collective: every process calls it in the same
place, each with its own size, 0 for none), at least as large as this process's regions so
far (the arena doubles), so a loop of ops of one size grows once. Old windows stay mapped:
arrays user code holds (results) point into them. `close` frees, collectively, every window
no process still holds an array in (the others go with MPI_Finalize); MPI owns the memory,
nothing is left in /dev/shm.

`MPI_Win_allocate_shared` has no nonblocking form and so no deadline of its own: callers agree to
grow in a control round that has one (every process has then reached the call), and the call
itself is a local mmap plus MPICH's short internal barrier among processes that are all in it.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import HcclError

_ALIGN = 4096          # a page: each array starts on its own page (no false sharing between processes)


def _aligned(n: int) -> int:
    return -(-int(n) // _ALIGN) * _ALIGN


class _Gen:
    """One window of the arena: its regions (a buffer per process) and this process's bump pointer."""
    __slots__ = ("win", "bufs", "bases", "sizes", "top")

    def __init__(self, win, bufs, sizes):
        self.win, self.bufs, self.sizes, self.top = win, bufs, sizes, 0
        self.bases = [np.frombuffer(b, dtype=np.uint8).ctypes.data if s else 0 for b, s in zip(bufs, sizes)]


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
        self.me = self.node.Get_rank()
        self.gens: list[_Gen] = []

    @property
    def capacity(self) -> int:
        """Bytes of this process's regions, over every window."""
        return sum(g.sizes[self.me] for g in self.gens)

    def alloc(self, nbytes: int):
        """(window, offset) of `nbytes` of this process's own region, or None when nothing fits
        (the caller then agrees with its peers to `grow`). Not collective."""
        need = _aligned(max(int(nbytes), 1))
        for g, gen in reversed(list(enumerate(self.gens))):
            if gen.sizes[self.me] - gen.top >= need:
                at = gen.top
                gen.top += need
                return g, at
        return None

    def grow(self, nbytes: int) -> None:
        """A new window, this process's region at least `nbytes` and at least what it has so far
        (the arena doubles: ops of growing sizes grow it a few times); nothing for 0.
        Collective: every process of the node calls it at the same point."""
        size = 0 if nbytes <= 0 else _aligned(max(int(nbytes), self.capacity))
        with self.lock:
            win = self.MPI.Win.Allocate_shared(size, 1, comm=self.node)
            bufs, sizes = [], []
            for q in range(self.node.Get_size()):
                buf, _ = win.Shared_query(q)
                bufs.append(buf)
                sizes.append(len(buf))
        self.gens.append(_Gen(win, bufs, sizes))

    def array(self, g: int, proc: int, offset: int, shape, dtype) -> np.ndarray:
        """Process `proc`'s region of window `g` at `offset` (bytes) as an array (one that owns
        its view: a view of it keeps it referenced, which the result pool counts on)."""
        return np.ndarray(shape, dtype=dtype, buffer=self.gens[g].bufs[proc], offset=offset)

    def locate(self, arr: np.ndarray):
        """(window, process, offset) of a C-contiguous array lying wholly in one region, else None."""
        if not arr.flags.c_contiguous:
            return None
        at, n = arr.ctypes.data, arr.nbytes
        for g, gen in enumerate(self.gens):
            for q, (base, size) in enumerate(zip(gen.bases, gen.sizes)):
                if base <= at and at + n <= base + size and size:
                    return g, q, at - base
        return None

    def close(self, held_windows=(), agree=None) -> None:
        """Free the windows (collective). `held_windows`: windows this process still has arrays
        handed to user code in; `agree(flags)`: the element-wise max of every process's flags (a
        uint8 per window; a deadline-bounded exchange); a window held anywhere is left to
        MPI_Finalize (freeing it would unmap memory user code can still read)."""
        keep = np.zeros(len(self.gens), dtype=np.uint8)
        keep[list(held_windows)] = 1
        if agree is not None and len(keep):
            keep = agree(keep)
        with self.lock:
            for gen, held in zip(self.gens, keep):
                gen.bufs = []
                if not held:
                    gen.win.Free()
            self.gens = []
            self.node.Free()
