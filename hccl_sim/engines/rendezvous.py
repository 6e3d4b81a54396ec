"""Rendezvous bookkeeping shared by every engine: deadlines, the signature check and the plan,
and the wording of every failure a waiting rank can be told about.

Engines differ in how ranks meet (a condition variable among threads, a hub over sockets, shared
memory among processes, MPI); what they decide when they meet, and what they tell a rank that
waits in vain, is the same and lives here, so that every engine reports the same errors.
The stall watch (every live rank waiting and nothing moving: a deadlock) is hcomm's Watch.
Which of several ranks' errors is the job's error (`root_cause`) is decided here too, for every
engine, from the errors' fields (topologies.errors.Cause).
"""
from __future__ import annotations

import time

from topologies.errors import Cause, HcclError

from .. import collectives as colls
from ..faults.progress import FaultProgress
from ..plan.faulted import late_entry_error
from ..plan.planner import ShiftedPlan, check_signatures, make_plan, merge_signatures


def deadline(config):
    """The monotonic time by which a wait on peers must end (None: HCCL_EXEC_TIMEOUT=0, never)."""
    return None if not config.wait_timeout_s else time.monotonic() + config.wait_timeout_s


def expired(limit) -> bool:
    return limit is not None and time.monotonic() >= limit


def opname(sig) -> str:
    return colls.of(sig.name).method


def plan_calls(calls: list, topo, config, progress: FaultProgress | None = None):
    """The shared plan of one collective from every rank's Call (rank order), or an HcclError
    (E_PARA) naming who called what when the calls differ. `progress`: the communicator's fault
    progress (hccl_sim.faults.progress), read for this op and advanced by its plan."""
    calls = merged_calls(calls)
    problem = check_signatures([c.signature for c in calls])
    if problem:
        raise HcclError("E_PARA", problem, cause=Cause.MISMATCH)
    first = calls[0]
    now = None if progress is None else progress.before([c.sent for c in calls])
    plan = make_plan(first.signature, topo, config, [c.clock for c in calls], first.itemsize, faults_now=now)
    if progress is not None:
        progress.after(plan, now)
    return plan


def merged_calls(calls: list) -> list:
    """The calls with a variable-size op's rows of counts merged (planner.merge_signatures)."""
    sigs = [c.signature for c in calls]
    merged = merge_signatures(sigs)
    return calls if merged is sigs else [c._replace(signature=s) for c, s in zip(calls, merged)]


# ---- what a waiting rank is told -------------------------------------------------------------------

def missing_error(rank, op: str, seq, missing, config) -> HcclError:
    return HcclError("E_TIMEOUT", f"ranks {missing} did not call {op} (collective #{seq}) within "
                     f"{config.wait_timeout_s} s (HCCL_EXEC_TIMEOUT)", rank=rank, op=op, cause=Cause.TIMEOUT,
                     peers=missing)


def peer_failed_error(rank, op: str, seq, failed_rank, cause) -> HcclError:
    return HcclError("E_REMOTE", f"aborted while waiting in {op} (collective #{seq}): rank {failed_rank} failed: "
                     f"{cause}", rank=rank, op=op, cause=Cause.PEER_FAILED, peers=(failed_rank,))


def returned_early_reason(op: str, seq, gone_rank) -> str:
    return (f"rank {gone_rank} returned without calling {op} (collective #{seq}): "
            "ranks made different sequences of collective calls")


def returned_early_error(rank, op: str, seq, gone_rank) -> HcclError:
    return HcclError("E_PARA", returned_early_reason(op, seq, gone_rank), rank=rank, op=op,
                     cause=Cause.PEER_RETURNED, peers=(gone_rank,), detail={"missed": "call"})


def describe_failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---- the job's error -------------------------------------------------------------------------------

def is_consequence(exc: BaseException) -> bool:
    """Whether a rank's error is a consequence of another rank's (HcclError.consequence: told that
    a peer failed, returned or was lost, or that the op was aborted); any other exception is not."""
    return isinstance(exc, HcclError) and exc.consequence


def root_cause(failures):
    """The job's error among its failed ranks', every engine's rule: `failures` are (rank,
    exception, at) with `at` the wall-clock time (time.time()) the rank caught it; returns the
    entry chosen. The earliest error that is not a consequence of another's (is_consequence); only
    when every error is one (a rank returned early, the communicator was aborted), the earliest of
    them; ties by rank. A rank the fault plan crashed is no failure (its result is None): its
    survivors' RANK_LOST errors are the job's error, not a peer's PEER_RETURNED or PEER_LOST."""
    failures = list(failures)
    if not failures:
        raise ValueError("root_cause of no failures")
    return min(failures, key=lambda f: (is_consequence(f[1]), f[2], f[0]))


class PlanCache:
    """Plans by (call, relative entry clocks): a rank that plans every op itself (engines without a
    planning hub) plans each distinct call once. Timing is shift-invariant, so a cached plan moved
    by the earliest entry clock is exactly the plan of the shifted call. It also keeps this rank's
    copy of the communicator's fault progress (every rank advances it by the same plans)."""

    def __init__(self, topo, config, limit: int = 1024):
        self.topo, self.config, self.limit = topo, config, limit
        self._plans = {}
        self.progress = FaultProgress(config.faults)

    def __len__(self) -> int:
        """How many plans the cache holds."""
        return len(self._plans)

    def plan(self, calls: list):
        calls = merged_calls(calls)
        first = calls[0]
        if any(c.signature != first.signature or c.itemsize != first.itemsize for c in calls):
            return plan_calls(calls, self.topo, self.config)     # raises the mismatch error
        return self.agreed(first.signature, first.itemsize, [c.clock for c in calls], [c.sent for c in calls])

    def agreed(self, sig, itemsize: int, clocks: list, sent=None, key=None):
        """The plan when every rank made the same call (`sig`), entered at `clocks`, having sent
        `sent` (every rank's Call.sent). `key`: a hashable standing for (sig, itemsize) alone, if
        the caller has one (bytes cache their hash; a signature tuple is hashed anew each time)."""
        merged = merge_signatures([sig] * len(clocks))[0]       # a variable-size op's rows of counts
        if merged is not sig:
            sig, key = merged, None
        late = late_entry_error(sig.name, self.config, clocks)     # at the real clocks, not the cache's
        if late is not None:
            raise late
        faults = self.config.faults
        now = self.progress.before(sent)
        if (faults is not None and faults.link_state) or now.corrupt or now.starved:
            # link changes are at absolute times: prices are not shift-invariant, nothing is cached;
            # nor is an op that may hold a corrupted transfer (which one depends on the ops before),
            # or whose link setup a pressure may starve (that depends on the ops set up before)
            plan = make_plan(sig, self.topo, self.config, list(clocks), itemsize, faults_now=now)
        else:
            base = min(clocks)
            rel = tuple([c - base for c in clocks])
            key = ((sig, itemsize) if key is None else key, rel, now.backup)
            plan = self._plans.get(key)
            if plan is None:
                if len(self._plans) >= self.limit:
                    self._plans.clear()
                plan = self._plans[key] = make_plan(sig, self.topo, self.config, list(rel), itemsize, faults_now=now)
            plan = ShiftedPlan(plan, base) if base else plan
        if faults is not None:          # without a fault plan there is no progress to advance
            self.progress.after(plan, now)
        return plan
