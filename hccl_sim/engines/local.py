"""The local engine: every rank is a thread of this process, with real data.

Ranks share one zero-copy in-process transport (a receiver reads or reduces straight from the
sender's numpy buffer) and one rendezvous table. The rendezvous is where cross-rank checks
happen: the last rank to arrive compares every rank's call, plans the op once for all, and
wakes the others. If a rank's function raises or returns early, the group is aborted so that
every other rank gets an HcclError naming the cause instead of waiting forever.
"""
from __future__ import annotations

import threading
import time

from hcomm.transport import InProcessTransport
from topologies.errors import HcclError

from ..communicator import Communicator
from ..planner import COLLECTIVE_NAMES, check_signatures, make_plan

_POLL_S = 0.05


class _Slot:
    __slots__ = ("signatures", "clocks", "arrived", "taken", "done", "plan", "error")

    def __init__(self, p):
        self.signatures = [None] * p
        self.clocks = [None] * p
        self.arrived = self.taken = 0
        self.done = False
        self.plan = self.error = None


class LocalGroup:
    """Rendezvous and transport shared by the threads of one local run."""

    def __init__(self, topo, config, trace: bool = False):
        self.topo = topo
        self.config = config
        self.size = topo.num_ranks
        self.transport = InProcessTransport(self.size, config.wait_timeout_s)
        self.trace = trace
        self.traced = []           # plans with events, when tracing
        self._cond = threading.Condition()
        self._slots = {}
        self._exited = set()
        self._failure = None       # (rank, exception) of the first failure

    def rendezvous(self, rank, seq, sig, clock, itemsize):
        opname = COLLECTIVE_NAMES.get(sig.name, sig.name)
        deadline = None if not self.config.wait_timeout_s else time.monotonic() + self.config.wait_timeout_s
        with self._cond:
            slot = self._slots.get(seq)
            if slot is None:
                slot = self._slots[seq] = _Slot(self.size)
            slot.signatures[rank] = sig
            slot.clocks[rank] = clock
            slot.arrived += 1
            if slot.arrived == self.size:
                self._plan(slot, itemsize)
                self._cond.notify_all()
            while not slot.done:
                self._check_waiting(rank, seq, slot, opname)
                if deadline is not None and time.monotonic() >= deadline:
                    missing = [r for r, s in enumerate(slot.signatures) if s is None]
                    raise HcclError("E_TIMEOUT", f"ranks {missing} did not call {opname} (collective #{seq}) within "
                                    f"{self.config.wait_timeout_s} s (HCCL_EXEC_TIMEOUT)", rank=rank, op=opname)
                self._cond.wait(_POLL_S)
            slot.taken += 1
            if slot.taken == self.size:
                del self._slots[seq]
        if slot.error is not None:
            raise HcclError(slot.error.code, slot.error.reason, rank=rank, op=opname)
        return slot.plan

    def _plan(self, slot, itemsize):
        try:
            problem = check_signatures(slot.signatures)
            if problem:
                raise HcclError("E_PARA", problem)
            slot.plan = make_plan(slot.signatures[0], self.topo, self.config, slot.clocks, itemsize, trace=self.trace)
            if self.trace:
                self.traced.append(slot.plan)
        except HcclError as exc:
            slot.error = exc
        slot.done = True

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


def run_local(fn, topo, config, args=(), kwargs=None, trace=False, group_out=None):
    """Run fn(comm, *args, **kwargs) on every rank of `topo` as threads; results by rank."""
    kwargs = kwargs or {}
    group = LocalGroup(topo, config, trace=trace)
    if group_out is not None:
        group_out.append(group)
    p = group.size
    results = [None] * p

    def body(rank):
        comm = Communicator(rank, group)
        try:
            results[rank] = fn(comm, *args, **kwargs)
        except BaseException as exc:   # noqa: BLE001 - reported to the caller below
            group.fail(rank, exc)
        finally:
            group.exit(rank)

    if p == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,), name=f"hccl-rank-{r}", daemon=True) for r in range(p)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if group.failure is not None:
        rank, exc = group.failure
        if isinstance(exc, HcclError):
            raise exc
        raise HcclError("E_INTERNAL", f"{type(exc).__name__}: {exc}", rank=rank) from exc
    return results
