"""MPI-3 shared-memory windows among the processes of one node (`MPI.Win.Allocate_shared` on
`comm.Split_type(MPI.COMM_TYPE_SHARED)`): an arena of windows, a region per process in each,
every process's regions mapped in every process, so ranks of one node can read and write each
other's buffers in place (a data plane over them can run the central data program on every
rank's buffers, and hand out results that live there).

A process allocates from its own regions without talking to anyone (`alloc`: a bump pointer per
window, never freed one by one: callers keep what they allocate and reuse it). When nothing
fits, the arena grows by a new window (`grow`, collective: every process calls it in the same
place, each with its own size, 0 for none), at least as large as this process's regions so
far (the arena doubles), so a loop of ops of one size grows once. Old windows stay mapped:
arrays user code holds (results) point into them. `close` frees, collectively, every window
no process still holds an array in (the others go with MPI_Finalize); MPI owns the memory,
nothing is left in /dev/shm.

Apart from the arena, one more window holds the ranks' simulated HBM (`reserve_hbm`, collective,
once at job start): a region per process as large as its ranks' HBM regions together (the
caller sizes them). `MPI_Win_allocate_shared` maps it without committing a page (tmpfs pages
come into being when first written), so the reservation is only address space; a device array's
bytes then lie at their own HBM address in it, where peers read them in place.
`alloc` never hands out its bytes; `locate` finds arrays in it as in the arena (window `HBM`).
A process alone on its node maps a memfd instead (MPICH would back its window with private
memory, which the kernel refuses to reserve past RAM + swap).

`MPI_Win_allocate_shared` has no nonblocking form and so no deadline of its own: callers agree to
grow in a control round that has one (every process has then reached the call), and the call
itself is a local mmap plus MPICH's short internal barrier among processes that are all in it.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from topologies.errors import HcclError

_ALIGN = 4096          # a page: each array starts on its own page (no false sharing between processes)
HBM = -2               # the window index of the HBM window in places (-1 is nowhere)


def aligned(n: int) -> int:
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
        self.hbm: _Gen | None = None

    def _window(self, size: int) -> _Gen:
        with self.lock:
            win = self.MPI.Win.Allocate_shared(size, 1, comm=self.node)
            bufs, sizes = [], []
            for q in range(self.node.Get_size()):
                buf, _ = win.Shared_query(q)
                bufs.append(buf)
                sizes.append(len(buf))
        return _Gen(win, bufs, sizes)

    def reserve_hbm(self, nbytes: int) -> None:
        """The HBM window, this process's region `nbytes` (address space: no page is committed
        until written). Collective: every process of the node calls it at the same point."""
        if self.hbm is not None:
            raise HcclError("E_INTERNAL", "the HBM window is reserved once per job")
        if self.node.Get_size() > 1:
            try:
                self.hbm = self._window(aligned(nbytes))
            except self.MPI.Exception as exc:
                total = self.node.Get_size() * aligned(nbytes)
                raise HcclError("E_MEMORY", f"cannot map the shared HBM window: {total / 2**40:.2f} TiB of address "
                                f"space in every process ({self.node.Get_size()} processes x {nbytes / 2**30:.0f} GiB "
                                f"of HBM each; MPI: {str(exc).splitlines()[-1].strip()}); use data_plane 'p2p' or fewer "
                                f"ranks per node") from None
            return
        # Alone on the node, MPICH backs a shared window with private memory, which the kernel's
        # overcommit check refuses past RAM + swap (64 GiB: "Out of memory"); nobody else maps
        # it, so a memfd (sparse shmem, in no file system) gives the same lazily committed bytes.
        fd = os.memfd_create("hccl-sim-hbm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, aligned(nbytes))
            buf = mmap.mmap(fd, aligned(nbytes))
        except OSError as exc:
            raise HcclError("E_MEMORY", f"cannot map the HBM window: {nbytes / 2**30:.0f} GiB of address space "
                            f"({exc}); use data_plane 'p2p' or fewer ranks per process") from None
        finally:
            os.close(fd)
        self.hbm = _Gen(None, [buf], [len(buf)])

    def _gen(self, g: int) -> _Gen:
        return self.hbm if g == HBM else self.gens[g]

    @property
    def capacity(self) -> int:
        """Bytes of this process's regions, over every window."""
        return sum(g.sizes[self.me] for g in self.gens)

    def alloc(self, nbytes: int):
        """(window, offset) of `nbytes` of this process's own region, or None when nothing fits
        (the caller then agrees with its peers to `grow`). Not collective."""
        need = aligned(max(int(nbytes), 1))
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
        size = 0 if nbytes <= 0 else aligned(max(int(nbytes), self.capacity))
        self.gens.append(self._window(size))

    def array(self, g: int, proc: int, offset: int, shape, dtype) -> np.ndarray:
        """Process `proc`'s region of window `g` (`HBM`: the HBM window) at `offset` (bytes) as an
        array (one that owns its view: a view of it keeps it referenced, which the result pool
        and the HBM window's closing count on)."""
        return np.ndarray(shape, dtype=dtype, buffer=self._gen(g).bufs[proc], offset=offset)

    def locate(self, arr: np.ndarray):
        """(window, process, offset) of a C-contiguous array lying wholly in one region (of the
        arena or the HBM window), else None."""
        if not arr.flags.c_contiguous:
            return None
        at, n = arr.ctypes.data, arr.nbytes
        gens = list(enumerate(self.gens)) + ([(HBM, self.hbm)] if self.hbm is not None else [])
        for g, gen in gens:
            for q, (base, size) in enumerate(zip(gen.bases, gen.sizes)):
                if base <= at and at + n <= base + size and size:
                    return g, q, at - base
        return None

    def close(self, held_windows=(), agree=None) -> None:
        """Free the windows (collective). `held_windows`: windows this process still has arrays
        handed to user code in (`HBM` for the HBM window); `agree(flags)`: the element-wise max
        of every process's flags (a uint8 per window; a deadline-bounded exchange); a window held
        anywhere is left to MPI_Finalize (freeing it would unmap memory user code can still read)."""
        gens = self.gens + ([self.hbm] if self.hbm is not None else [])
        keep = np.zeros(len(gens), dtype=np.uint8)
        keep[[len(self.gens) if g == HBM else g for g in held_windows]] = 1
        if agree is not None and len(keep):
            keep = agree(keep)
        with self.lock:
            for gen, held in zip(gens, keep):
                bufs, gen.bufs = gen.bufs, []
                if held:
                    continue
                if gen.win is not None:
                    gen.win.Free()
                else:                     # the memfd HBM: unmapped now, or by the last array that maps it
                    try:
                        bufs[0].close()
                    except BufferError:
                        pass
            self.gens, self.hbm = [], None
            self.node.Free()
