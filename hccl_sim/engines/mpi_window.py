"""The MPI engine's "window" data plane: every rank's buffers of an op in MPI-3 shared-memory
windows (hcomm.mpi_window), so that each rank runs its 1/p share of the op's data program on all
ranks' buffers in place (the central data program, dataplane.move_share), as the Ray engine's
shm plane does: no message per schedule step, no copy through a socket or MPI's eager buffers.

Per op larger than the eager size: the window grows if the op needs more (collective, the same
decision on every process, from the plan); each rank copies its input into its region; a control
round (every input is in place); every rank runs its share; a control round (every share is
done); each rank copies its output out. Three control rounds per op, the rendezvous included;
the rounds carry the deadline (HCCL_EXEC_TIMEOUT) and abort as every control round does.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from hcomm.mpi_window import NodeWindows

from . import executors
from .base import RankBuffers
from ..planner import op_loops

_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class WindowPlane:
    """One process's windows; `execute` is called by each of its ranks for each larger op."""

    def __init__(self, hub, topo, config):
        self.hub, self.topo, self.config, self.k = hub, topo, config, hub.k
        self.windows = NodeWindows(hub.comm, hub.lock)
        self._lock = threading.Lock()

    def _layout(self, plan, x, out):
        p = self.topo.num_ranks
        scratch = plan.collective.scratch_shape(p, op_loops(plan.signature, p, x.itemsize, self.config))
        sizes = (_aligned(x.nbytes), _aligned(out.nbytes),
                 _aligned(0 if scratch is None else math.prod(scratch) * x.itemsize))
        return scratch, sizes, sum(sizes)

    def _buffers(self, rank, x, out, scratch, sizes, per_rank) -> RankBuffers:
        proc, local = divmod(rank, self.k)
        at = local * per_rank
        w = self.windows
        return RankBuffers(w.array(proc, at, x.shape, x.dtype), w.array(proc, at + sizes[0], out.shape, out.dtype),
                           None if scratch is None else w.array(proc, at + sizes[0] + sizes[1], scratch, x.dtype))

    def execute(self, group, rank, seq, plan, buffers, redop, op, steps=None) -> None:
        """`rank`'s part of the op; with `steps`, a rank the fault plan crashes in it: the window's
        growth (collective), then only its share of the program before its step `steps` (none,
        nor the inputs' round, with 0); the survivors' next round meets its LOST marker."""
        x, out = buffers.input, buffers.output
        scratch, sizes, per_rank = self._layout(plan, x, out)
        with self._lock:             # the first of the process's ranks to get here grows it for all
            self.windows.ensure(per_rank * self.k)
        if steps == 0:
            return
        every = [self._buffers(r, x, out, scratch, sizes, per_rank) for r in range(self.topo.num_ranks)]
        np.copyto(every[rank].input, x)
        group._allgather(b"", f"the other ranks' inputs of {op} (collective #{seq})", op)
        executors.central_share(plan, every, redop, rank, self.topo.num_ranks,
                                until=None if steps is None else (rank, steps))
        if steps is not None:
            return
        group._allgather(b"", f"the other ranks' shares of {op} (collective #{seq})", op)
        np.copyto(out, every[rank].output)

    def close(self) -> None:
        self.windows.close()
