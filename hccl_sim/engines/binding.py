"""Where a node's ranks outnumber its CPUs, each rank's thread is bound to one of them, round-robin
by the rank's index among the node's ranks (what `mpiexec --bind-to core` does, oversubscribed).

Why: a rank of a loop of small ops waits for its peers' control round by yielding its CPU
(hcomm.control.shm). Unbound, 8 ranks on 2 CPUs drift between them and one CPU often holds more
of the ranks that have not arrived yet than the other, while its waiters yield to each other;
bound four to a CPU, each CPU runs its four in turn. Measured on 8 Ray ranks on 2 CPUs, an 8-byte
AllReduce, unbound against bound in the same runs (experiments/small_op_profile.py; RESULTS.md,
"Issue 38, third step"): per rank and op, sched_yield calls 3.9-7.6 -> 1.5-1.9, context switches
3.3-4.6 -> 1.6-2.0, CPU 66-94 -> 52-60 us; the op after a barrier, median of five runs, 340 -> 296 us.

Only the rank's own thread (the one that runs the user's function and its collectives) is bound;
threads it starts later inherit the CPU. HCCL_SIM_BIND=none leaves every thread unbound;
HCCL_SIM_BIND=core (the default) binds as above.
"""
from __future__ import annotations

import os

from topologies.errors import Cause, HcclError

ENV = "HCCL_SIM_BIND"
_CPUS = sorted(os.sched_getaffinity(0))     # this process's CPUs, before any thread was bound
_bound = False                              # whether this process bound a thread (to set it back)


def requested() -> bool:
    """Whether HCCL_SIM_BIND asks for binding (read where the run starts: its driver)."""
    value = os.environ.get(ENV, "core")
    if value not in ("core", "none"):
        raise HcclError("E_PARA", f"{ENV}={value!r} is invalid; expected core or none", cause=Cause.BAD_INPUT)
    return value == "core"


def bind_rank_thread(index: int, count: int, bind: bool = True):
    """Bind the calling thread to CPU `index` mod this process's CPUs when `bind` and the node's
    `count` ranks outnumber them; else leave it (or set it back) unbound. Returns the CPU or None."""
    global _bound
    if bind and count > len(_CPUS):
        cpu = _CPUS[index % len(_CPUS)]
        os.sched_setaffinity(0, {cpu})
        _bound = True
        return cpu
    if _bound:
        os.sched_setaffinity(0, _CPUS)
        _bound = False
    return None
