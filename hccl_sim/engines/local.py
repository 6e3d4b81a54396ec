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
import time
import warnings
from concurrent.futures import ThreadPoolExecutor


from hcomm.transports.inprocess import InProcessTransport
from topologies.errors import Cause, HcclError


from ..faults.progress import FaultProgress
from ..faults.fault_plan import RankCrashed
from hcomm.exec import run_rank, run_share, with_scratch
from . import rendezvous as rdv
from ..comm.rank_group import RankGroup
from .bootstrap import communicator, start_runtime
from .registry import ENGINES

PLANES = ENGINES["local"].data_planes     # the registry's: "central" (the central data program), "threads" (per-rank executors)

_POLL_S = 0.05
_SWITCH_INTERVAL_PER_RANK_S = 50e-6
_PARALLEL_MIN_BYTES = 4 << 20   # below this an op's data moves on one thread


class _Slot:
    """One phase (rendezvous or execution) of one collective, as the ranks meet in it."""
    __slots__ = ("items", "arrived", "taken", "done", "plan", "error")

    def __init__(self, p):
        self.items = [None] * p           # every rank's Call (rendezvous) or RankBuffers (execution)
        self.arrived = self.taken = 0
        self.done = False
        self.plan = self.error = None


class LocalGroup(RankGroup):
    """The engine contract (comm/rank_group.py) for the threads of one local run.

    The rendezvous carries no data: the last rank to arrive plans the op once for all. Execution
    is the central data program: ranks register their buffers, and the last to arrive moves
    every rank's data (reading each sender's arrays in place, on a worker pool for large ops)
    before releasing the others: one hand-off per rank per phase instead of several per schedule
    step (data plane "central"). With data_plane="threads" each rank runs its own schedule over the
    in-process transport instead (the per-rank executor)."""

    engine = "local"
    eager_bytes = 0                 # ranks share memory: nothing needs to travel with the call

    def __init__(self, topo, config, data_plane: str = "central"):
        if data_plane not in PLANES:
            raise ValueError(f"data_plane must be central or threads, got {data_plane!r}")
        self.data_plane = data_plane
        self.topo = topo
        self.config = config
        self.size = topo.num_ranks
        self.ranks_per_process = self.size      # a sub-communicator's group: its parent's (set below)
        self.transport = InProcessTransport(self.size, config.wait_timeout_s)
        self._cond = threading.Condition()
        self._slots = {}                  # (phase, seq) -> _Slot
        self._exited = set()
        self._failure = None       # (rank, exception) of the first failure (what waiting peers are told)
        self._failures = []        # (rank, exception, time.time()) of every failure (the job's error: root_cause)
        self._aborted = None       # why, once a rank called comm.abort()
        self._workers = max(1, os.cpu_count() or 1)
        self._executor = None
        self.members = tuple(range(self.size))   # in the parent group (a sub-communicator's group)
        self._children = {}        # scope -> LocalGroup of a sub-communicator
        self.fault_progress = FaultProgress(config.faults)   # planned once for all: one copy

    def rendezvous(self, rank, call):
        """Meet the other ranks for collective #call.seq; returns the shared plan."""
        slot = self._meet(rank, "plan", call.seq, rdv.opname(call.signature), call, self._plan)
        return slot.plan

    def execute(self, rank, seq, data, buffers):
        if self.data_plane == "threads":
            run_rank(data, rank, buffers, self.transport)
            return
        self._meet(rank, "data", seq, data.name, buffers, lambda slot: self._move_all(slot, data))

    def _meet(self, rank, phase, seq, op, item, last):
        """Wait until every rank has brought its item to (phase, seq); the last to arrive runs `last`."""
        limit = rdv.deadline(self.config)
        key = (phase, seq)
        with self._cond:
            if self._aborted is not None:
                raise HcclError("E_REMOTE", f"aborted: {self._aborted}", rank=rank, op=op, cause=Cause.ABORTED)
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot(self.size)
            slot.items[rank] = item
            slot.arrived += 1
            watch = self.transport.watch
            watch.progress()
            if slot.arrived == self.size:
                try:
                    last(slot)
                except HcclError as exc:
                    slot.error = exc
                slot.done = True
                slot.items = None
                for r in range(self.size):
                    watch.done(r)           # every rank's wait is satisfied
                self._cond.notify_all()
            try:
                self._wait_slot(rank, seq, slot, op, limit, watch)
            finally:
                watch.done(rank)
            slot.taken += 1
            if slot.taken == self.size:
                del self._slots[key]
        if slot.error is not None:
            raise slot.error.replace(rank=rank, op=op)
        return slot

    def _wait_slot(self, rank, seq, slot, op, limit, watch):
        """Called with the condition held: wait until the phase is complete."""
        while not slot.done:
            self._check_waiting(rank, seq, slot, op)
            watch.waiting(rank, f"{op} (collective #{seq})")
            watch.check(rank, op)
            if rdv.expired(limit):
                missing = [r for r, s in enumerate(slot.items) if s is None]
                raise rdv.missing_error(rank, op, seq, missing, self.config)
            self._cond.wait(_POLL_S)

    def _plan(self, slot):
        slot.plan = rdv.plan_calls(slot.items, self.topo, self.config, self.fault_progress)

    def _move_all(self, slot, data):
        if not data.carries_data:
            return
        buffers = [with_scratch(data, b) for b in slot.items]
        x, out = buffers[0].input, buffers[0].output
        nbytes = max(x.nbytes, out.nbytes) * self.size       # the op's size as nccl-tests counts it, every rank's
        parts = min(self._workers, max(1, nbytes // _PARALLEL_MIN_BYTES))
        if parts == 1:
            run_share(data, buffers)
            return
        futures = [self._pool().submit(run_share, data, buffers, part, parts) for part in range(1, parts)]
        run_share(data, buffers, 0, parts)
        for f in futures:
            f.result()

    def _pool(self):
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self._workers - 1, thread_name_prefix="hccl-data-plane")
        return self._executor

    def close(self):
        for child in self._children.values():
            child.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _check_waiting(self, rank, seq, slot, op):
        if self._aborted is not None:
            raise HcclError("E_REMOTE", f"aborted: {self._aborted}", rank=rank, op=op, cause=Cause.ABORTED)
        if self._failure is not None:
            fr, exc = self._failure
            raise rdv.peer_failed_error(rank, op, seq, fr, rdv.describe_failure(exc))
        gone = [r for r in self._exited if slot.items[r] is None]
        if gone:
            raise rdv.returned_early_error(rank, op, seq, gone[0])

    def fail(self, rank, exc):
        with self._cond:
            if self._failure is None:
                self._failure = (rank, exc)
            self._failures.append((rank, exc, time.time()))
            self._cond.notify_all()
            children = list(self._children.values())
        self.transport.abort("E_REMOTE", f"rank {rank} failed: {rdv.describe_failure(exc)}")
        for child in children:
            if rank in child.members:
                child.fail(child.members.index(rank), exc)

    def exit(self, rank):
        with self._cond:
            self._exited.add(rank)
            self._cond.notify_all()
            children = list(self._children.values())
        self.transport.mark_exited(rank)
        for child in children:
            if rank in child.members:
                child.exit(child.members.index(rank))

    def abort(self, rank, reason):
        with self._cond:
            if self._aborted is None:
                self._aborted = reason
            self._cond.notify_all()
        self.transport.abort("E_REMOTE", reason)

    def subgroup(self, rank, members, scope, topo, config):
        """The one group every member of the sub-communicator shares (made by the first to ask)."""
        members = tuple(members)
        with self._cond:
            child = self._children.get(scope)
            if child is None:
                child = self._children[scope] = LocalGroup(topo, config, data_plane=self.data_plane)
                child.members = members
                child.ranks_per_process = self.ranks_per_process
                for r in self._exited:
                    if r in members:
                        child.exit(members.index(r))
        if child.members != members:
            raise HcclError("E_PARA", f"ranks disagree on the members of a new communicator: rank "
                            f"{child.members[0]}'s view is {list(child.members)[:16]}, this rank's is "
                            f"{list(members)[:16]}", rank=rank, cause=Cause.MISMATCH)
        return child

    @property
    def failure(self):
        """(rank, exception) of the job's error (rdv.root_cause of every failure), or None."""
        return rdv.root_cause(self._failures)[:2] if self._failures else None


def run_local(fn, topo, config, args=(), kwargs=None, data_plane="central"):
    """Run fn(comm, *args, **kwargs) on every rank of `topo` as threads; results by rank."""
    kwargs = kwargs or {}
    group = LocalGroup(topo, config, data_plane=data_plane)
    p = group.size
    results = [None] * p

    leaks = [None] * p

    def body(rank):
        runtime = start_runtime(rank, topo)
        try:
            comm = communicator(rank, group, runtime)
            results[rank] = fn(comm, *args, **kwargs)
        except RankCrashed:
            results[rank] = None       # the fault plan killed it: the survivors' results are returned
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
        # interval a woken rank can wait that long for the interpreter, so shorten it while ranks
        # run. Not below 50 us per rank: every thread waiting for the GIL wakes once per interval,
        # so with hundreds of runnable ranks a 50 us interval was millions of futile wake-ups a
        # second (the run's time mostly system time); per rank, they stay near 20,000 a second.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, _SWITCH_INTERVAL_PER_RANK_S * p))
        try:
            threads = [threading.Thread(target=body, args=(r,), name=f"hccl-rank-{r}", daemon=True) for r in range(p)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
