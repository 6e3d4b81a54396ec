"""The local engine: every rank is a thread of this process, with real data.

Ranks share one zero-copy in-process transport (a receiver reads or reduces straight from the
sender's numpy buffer) and one rendezvous table. The rendezvous is where cross-rank checks
happen: the last rank to arrive compares every rank's call, plans the op once for all, and
wakes the others. If a rank's function raises or returns early, the group is aborted so that
every other rank gets an HcclError naming the cause instead of waiting forever.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
import time

from hcomm.transports.inprocess import InProcessTransport
from topologies.errors import HcclError


from ..communicator import Communicator, make_scratch
from ..dataplane import move_share
from ..device import Runtime
from ..planner import COLLECTIVE_NAMES, check_signatures, make_plan

_POLL_S = 0.05
_SWITCH_INTERVAL_S = 50e-6
_PARALLEL_MIN_BYTES = 4 << 20   # below this an op's data moves on one thread


class _Slot:
    __slots__ = ("signatures", "clocks", "data", "arrived", "taken", "done", "plan", "error")

    def __init__(self, p):
        self.signatures = [None] * p
        self.clocks = [None] * p
        self.data = [None] * p
        self.arrived = self.taken = 0
        self.done = False
        self.plan = self.error = None


class LocalGroup:
    """Rendezvous and transport shared by the threads of one local run."""

    def __init__(self, topo, config, dataplane: str = "central"):
        if dataplane not in ("central", "threads"):
            raise ValueError(f"dataplane must be central or threads, got {dataplane!r}")
        self.dataplane = dataplane
        self.topo = topo
        self.config = config
        self.size = topo.num_ranks
        self.transport = InProcessTransport(self.size, config.wait_timeout_s)
        self._cond = threading.Condition()
        self._slots = {}
        self._exited = set()
        self._failure = None       # (rank, exception) of the first failure
        self._workers = max(1, os.cpu_count() or 1)
        self._executor = None

    def rendezvous(self, rank, seq, sig, clock, itemsize, data=None):
        """Meet the other ranks for collective #seq; returns (plan, whether the data has moved).

        With the central data plane the last rank to arrive moves every rank's data (reading
        each sender's arrays in place) before releasing the others: one hand-off per rank per
        op instead of several per schedule step.
        """
        opname = COLLECTIVE_NAMES.get(sig.name, sig.name)
        deadline = None if not self.config.wait_timeout_s else time.monotonic() + self.config.wait_timeout_s
        with self._cond:
            slot = self._slots.get(seq)
            if slot is None:
                slot = self._slots[seq] = _Slot(self.size)
            slot.signatures[rank] = sig
            slot.clocks[rank] = clock
            slot.data[rank] = data
            slot.arrived += 1
            watch = self.transport.watch
            watch.progress()
            if slot.arrived == self.size:
                self._plan(slot, itemsize)
                for r in range(self.size):
                    watch.done(r)           # every rank's wait is satisfied
                self._cond.notify_all()
            try:
                self._wait_slot(rank, seq, slot, opname, deadline, watch)
            finally:
                watch.done(rank)
            slot.taken += 1
            if slot.taken == self.size:
                del self._slots[seq]
        if slot.error is not None:
            raise HcclError(slot.error.code, slot.error.reason, rank=rank, op=opname)
        return slot.plan, self.dataplane == "central"

    def _wait_slot(self, rank, seq, slot, opname, deadline, watch):
        """Called with the condition held: wait until the collective's plan is ready."""
        while not slot.done:
            self._check_waiting(rank, seq, slot, opname)
            watch.waiting(rank, f"{opname} (collective #{seq})")
            watch.check(rank, opname)
            if deadline is not None and time.monotonic() >= deadline:
                missing = [r for r, s in enumerate(slot.signatures) if s is None]
                raise HcclError("E_TIMEOUT", f"ranks {missing} did not call {opname} (collective #{seq}) within "
                                f"{self.config.wait_timeout_s} s (HCCL_EXEC_TIMEOUT)", rank=rank, op=opname)
            self._cond.wait(_POLL_S)

    def _plan(self, slot, itemsize):
        try:
            problem = check_signatures(slot.signatures)
            if problem:
                raise HcclError("E_PARA", problem)
            slot.plan = make_plan(slot.signatures[0], self.topo, self.config, slot.clocks, itemsize)
            if self.dataplane == "central":
                self._move_all(slot)
        except HcclError as exc:
            slot.error = exc
        slot.done = True
        slot.data = None

    def _move_all(self, slot):
        plan, sig, p = slot.plan, slot.plan.signature, self.size
        if sig.name == "barrier":
            return
        x0 = slot.data[0][0]
        redop = slot.data[0][2]
        buffers = [(x, out, make_scratch(sig, plan, x, p)) for x, out, _ in slot.data]
        nbytes = x0.nbytes * (p if sig.name == "allgather" else 1) * p
        parts = min(self._workers, max(1, nbytes // _PARALLEL_MIN_BYTES))
        if parts == 1:
            move_share(plan, buffers, redop)
            return
        futures = [self._pool().submit(move_share, plan, buffers, redop, part, parts) for part in range(1, parts)]
        move_share(plan, buffers, redop, 0, parts)
        for f in futures:
            f.result()

    def _pool(self):
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self._workers - 1, thread_name_prefix="hccl-dataplane")
        return self._executor

    def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _check_waiting(self, rank, seq, slot, opname):
        if self._failure is not None:
            fr, exc = self._failure
            raise HcclError("E_REMOTE", f"aborted while waiting in {opname} (collective #{seq}): rank {fr} failed: "
                            f"{type(exc).__name__}: {exc}", rank=rank, op=opname)
        gone = [r for r in self._exited if slot.signatures[r] is None]
        if gone:
            raise HcclError("E_PARA", f"rank {gone[0]} returned without calling {opname} (collective #{seq}): "
                            "ranks made different sequences of collective calls", rank=rank, op=opname)

    def fail(self, rank, exc):
        with self._cond:
            if self._failure is None:
                self._failure = (rank, exc)
            self._cond.notify_all()
        self.transport.abort("E_REMOTE", f"rank {rank} failed: {type(exc).__name__}: {exc}")

    def exit(self, rank):
        with self._cond:
            self._exited.add(rank)
            self._cond.notify_all()
        self.transport.mark_exited(rank)

    @property
    def failure(self):
        return self._failure


def run_local(fn, topo, config, args=(), kwargs=None, dataplane="central"):
    """Run fn(comm, *args, **kwargs) on every rank of `topo` as threads; results by rank."""
    kwargs = kwargs or {}
    group = LocalGroup(topo, config, dataplane=dataplane)
    p = group.size
    results = [None] * p

    leaks = [None] * p

    def body(rank):
        runtime = Runtime(rank, topo).init()
        try:
            comm = Communicator(rank, group, runtime.set_device(topo.device_of[rank]))
            comm.runtime = runtime
            results[rank] = fn(comm, *args, **kwargs)
        except BaseException as exc:   # noqa: BLE001 - reported to the caller below
            group.fail(rank, exc)
        finally:
            group.exit(rank)
            if runtime.state == "ready":
                leaks[rank] = runtime.finalize()

    try:
        _start_ranks(body, p)
    finally:
        group.close()
    if group.failure is not None:
        rank, exc = group.failure
        if isinstance(exc, HcclError):
            raise exc
        raise HcclError("E_INTERNAL", f"{type(exc).__name__}: {exc}", rank=rank) from exc
    for rank, leaked in enumerate(leaks):
        if leaked:
            warnings.warn(f"rank {rank}: {len(leaked)} device allocation(s) never freed: "
                          + ", ".join(f"{tag} {nbytes} B at 0x{ptr:x}" for tag, nbytes, ptr in leaked[:4]),
                          ResourceWarning, stacklevel=2)
    return results


def _start_ranks(body, p):
    if p == 1:
        body(0)
    else:
        # Ranks hand work to each other at every step; with CPython's default 5 ms GIL switch
        # interval a woken rank can wait that long for the interpreter, so shorten it while ranks run.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, _SWITCH_INTERVAL_S))
        try:
            threads = [threading.Thread(target=body, args=(r,), name=f"hccl-rank-{r}", daemon=True) for r in range(p)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
